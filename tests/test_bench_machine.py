"""Every benchmark result records the machine it ran on (issue 38): ``bench/common.machine``
names the CPU, its family and model, whether it has AVX512-BF16 or AMX, the ISA variables set
(a figure measured under them is simulated) and the load; and every bench script that writes a
result JSON records it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402  (bench/common.py: bench/ is not a package)

# Scripts under bench/ that write JSON without a machine record, each with why.
EXEMPT = {
    "scaling_figures.py": "computes its figures from the model's shape; it measures nothing",
}

# A call of common.write (not ``sys.stderr.write(`` or ``.write_text(``).
WRITE_CALL = re.compile(r"(?<![\w.])write\(")
WRITES_JSON = re.compile(r"json\.dump|write_text\(\s*json")


def test_machine_names_the_cpu_and_its_bf16_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in common.ISA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    state = common.machine()
    for key in ("cores_available", "load_average", "torch_threads", "python", "torch"):
        assert key in state  # the keys it had before stay
    assert isinstance(state["cpu"], str) and state["cpu"]
    for key in ("cpu_family", "cpu_model"):
        assert state[key] is None or isinstance(state[key], int)
    assert isinstance(state["avx512_bf16"], bool)
    assert isinstance(state["amx"], bool)
    assert state["isa_env"] == {}
    assert state["simulated"] is False
    assert len(state["load_average"]) == 3
    assert state["gpu"] is None or isinstance(state["gpu"], str)
    line = state["line"]
    assert isinstance(line, str) and "\n" not in line
    assert state["cpu"] in line
    assert "not simulated" in line
    assert f"avx512_bf16 {'yes' if state['avx512_bf16'] else 'no'}" in line
    assert f"AMX {'yes' if state['amx'] else 'no'}" in line
    if state["cpu_family"] is not None:
        assert f"family {state['cpu_family']}" in line


def test_an_isa_variable_makes_the_record_simulated(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in common.ISA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    state = common.machine()
    assert state["isa_env"] == {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    assert state["simulated"] is True
    assert "MKL_ENABLE_INSTRUCTIONS=AVX2" in state["line"]
    assert "(simulated" in state["line"]


def test_the_line_without_cpuinfo_numbers() -> None:
    state = {
        "cpu": "Some CPU",
        "cpu_family": None,
        "cpu_model": None,
        "avx512_bf16": False,
        "amx": True,
        "isa_env": {},
        "load_average": [1.0, 2.0, 3.0],
        "cores_available": 4,
        "gpu": "A GPU",
    }
    assert common.machine_line(state) == (
        "Some CPU; avx512_bf16 no, AMX yes; ISA variables: none (not simulated); "
        "load 1.00 2.00 3.00 on 4 cores; GPU A GPU"
    )


def test_write_records_the_machine_and_prints_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    path = common.write("probe", {"x": 1}, [common.row("a figure", 1.0, "s")])
    recorded = json.loads(path.read_text())["machine"]
    assert recorded["cpu"] and "line" in recorded
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"machine: {recorded['line']}"


def test_every_bench_that_writes_json_records_the_machine() -> None:
    """Read as text: a new benchmark that writes JSON must go through ``common.write`` or
    ``common.save_experiment`` (both record :func:`common.machine`) or call ``machine()``."""
    lacking = []
    for script in sorted(BENCH.glob("*.py")):
        if script.name in ("common.py", *EXEMPT):
            continue
        text = script.read_text()
        writes = WRITES_JSON.search(text) or WRITE_CALL.search(text)
        records = WRITE_CALL.search(text) or "save_experiment(" in text or "machine()" in text
        if writes and not records:
            lacking.append(script.name)
    assert not lacking, f"bench scripts writing JSON without machine(): {lacking}"
    assert "machine()" in (BENCH / "common.py").read_text().split("def save_experiment")[1]
    assert all((BENCH / name).exists() for name in EXEMPT)
