"""The light ``marl`` commands start without torch, Ray or transformers, and without the
machine-load warning (issue 29: every CLI call used to cost 4-5 s at start-up).

``marl --help``, ``marl list``, ``marl validate <file>``, ``marl report --help`` and
``marl eval --help`` run in a fresh interpreter through the same ``marl.cli.main`` the console
script calls; afterwards ``sys.modules`` must hold none of the heavy packages. The load average
is made to read 99 for the run, so a warning printed by any of them would show.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = ROOT / "scenarios" / "builtin"
HEAVY = ("torch", "ray", "transformers", "vllm", "peft")
PROBE = f"""
import json, os, sys
os.getloadavg = lambda: (99.0, 99.0, 99.0)  # a machine as busy as can be
import marl.cli
args = json.loads(sys.argv[1])
code = 0
if args is not None:
    try:
        code = marl.cli.main(args)
    except SystemExit as exc:  # argparse's --help
        code = exc.code or 0
heavy = [m for m in {HEAVY!r} if m in sys.modules]
print("PROBE " + json.dumps({{"code": code, "heavy": heavy}}))
"""

COMMANDS = {
    "import marl.cli": None,
    "marl --help": ["--help"],
    "marl list": ["list"],
    "marl validate": ["validate", str(BUILTIN / "relay.yaml")],
    "marl validate (spotlight)": ["validate", str(BUILTIN / "spotlight.yaml")],
    "marl report --help": ["report", "--help"],
    "marl eval --help": ["eval", "--help"],
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_light_command_imports_no_heavy_package_and_prints_no_load_warning(name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(COMMANDS[name])],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    probe = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert probe, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(probe[-1][len("PROBE ") :])
    assert result["code"] == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert result["heavy"] == [], f"{name} imported {result['heavy']}"
    assert "load average" not in done.stdout + done.stderr


@pytest.mark.parametrize("module", ["marl.config", "marl.agents.backends", "marl.agents.models"])
def test_the_config_schema_imports_no_torch(module: str) -> None:
    """``marl play`` / ``marl train`` read their config through ``marl.config``: the schema and
    the lower dataclasses it reuses (SamplingConfig, LoraSettings, ModelSpec, CreditConfig) load
    no torch, ray, transformers, vLLM or peft when imported."""
    probe = (
        f"import importlib, json, sys; importlib.import_module({module!r}); "
        f"print('PROBE ' + json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(lines[-1][len("PROBE ") :]) == [], f"import {module} loads them"
