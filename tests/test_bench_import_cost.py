"""bench/import_cost.py: a fresh interpreter's import costs, alternated, with what each import
adds to the one it builds on, written with the machine's record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import common  # noqa: E402  (bench/ is not a package)
import import_cost  # noqa: E402


def test_each_import_is_timed_in_fresh_interpreters_and_written_with_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    argv = ["import_cost.py", "--rounds", "2", "--only", "interpreter", "torch", "--name", "t"]
    monkeypatch.setattr(sys, "argv", argv)
    import_cost.main()
    result = json.loads((tmp_path / "t.json").read_text())
    interpreter, torch = result["medians"]["interpreter"], result["medians"]["torch"]
    assert len(interpreter["rounds"]) == len(torch["rounds"]) == 2
    # torch's import costs a fresh process more than an empty one: the difference is measured
    assert torch["cpu_s"] > interpreter["cpu_s"] > 0 and torch["wall_s"] > 0
    rows = {r["figure"]: r for r in result["summary"]}
    note = rows["import: torch"]["note"]
    assert "; +" in note and note.endswith(" on interpreter")
    assert result["machine"]["line"]  # the CPU, its bf16 instructions, the ISA variables, load


def test_a_failing_import_stops_with_its_statement() -> None:
    with pytest.raises(SystemExit, match="no_such_module"):
        import_cost.cost("import no_such_module")
