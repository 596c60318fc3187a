"""bench/tools.py's summary.json: beside the tabulating call's own arguments it records each
tabulated run's ``marl train`` command, read back from the run's directory, so a ``--table-only``
call (whose ``--steps`` need not be the runs') no longer stands in for the runs."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tools(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(ROOT / "bench" / "tools.py"), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.subprocess
def test_summary_records_the_runs_commands_beside_the_tabulating_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = str(tmp_path / "tools")
    common = ["--model", "tiny", "--conditions", "rl", "--seeds", "0", "--threads", "1"]
    _tools(*common, "--steps", "1", "--eval-episodes", "2", "--max-new-tokens", "8", "--out", out)
    # the tabulating call (the defaults: --steps 20, 64 episodes) trains nothing: the script's
    # own main, run here (a fresh interpreter would only import again)
    script = ROOT / "bench" / "tools.py"
    spec = importlib.util.spec_from_file_location("bench_tools", script)
    assert spec is not None and spec.loader is not None
    tools = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tools)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [str(script), *common, "--table-only", "--out", out])
    tools.main()
    summary = json.loads((tmp_path / "tools" / "summary.json").read_text())
    assert summary["args"]["table_only"] and summary["args"]["steps"] == 20
    ((name, command),) = summary["runs"].items()
    assert name == "rl/seed0"
    words = shlex.split(command)
    assert words[:4] == ["marl", "train", "--config-name", "demo_full"]
    assert {"train.steps=1", "train.eval_episodes=2", "sampling.max_new_tokens=8"} <= set(words)
    assert {"seed=0", "model=tiny", "warmup.steps=0"} <= set(words)
    assert f"hydra.run.dir={tmp_path / 'tools' / 'rl' / 'seed0'}" in words
    assert not any(w.startswith("hydra.mode=") for w in words)
    assert summary["table"]["rl"]["seeds"] == 1
