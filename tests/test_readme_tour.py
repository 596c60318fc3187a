"""The README's commands work as printed: each command of the five-minute tour, and the
``marl validate`` / ``marl play scenario=./my_game.yaml`` of "Write your own scenario" (in
docs/scenarios.md), run as a new user would run them, each ``marl`` command a process of its own
(the suite's ``marl_cli``: the console script's argv, path and environment) in a fresh working
directory.

The commands are read from README.md and docs/scenarios.md, not copied here, so an edit of
either is tested as it stands. Only what a test cannot afford is changed, each change listed in
:data:`SUBSTITUTIONS` (a substitution that no longer matches the README fails the test, so the
list stays true):

- ``model=smollm2`` becomes ``model=tiny``: tests never run the 135M model;
- training runs take 1 to 3 steps instead of 20 to 40 (the resume still goes past the first
  run's last step), a warm-up 2 steps instead of 5, and the sweeps 2 seeds / 2 values instead
  of 3 seeds / 5 values;
- the sweep's ``launcher=ray`` is left out: the Ray launcher runs the same tiny jobs in
  tests/marl/test_sweep_ray.py, which checks that its folders, curves and report equal the basic
  launcher's, so the tour's run of it would test that twice (a Ray session and 4 job processes);
- ``tensorboard --logdir runs/`` is started on a free port and stopped once it says it serves.

The working directory is a temporary one (``runs/`` goes there, never into the repository) with
a link to the repository's ``scenarios/`` so ``marl validate scenarios/builtin/relay.yaml`` finds
its file; ``source .venv/bin/activate`` is the venv's ``bin`` put first on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCENARIOS_PAGE = ROOT / "docs" / "scenarios.md"  # holds "## Write your own scenario"
BIN = Path(sys.executable).parent

# (README text, what the test runs instead (None: left out), why)
SUBSTITUTIONS: list[tuple[str, str | None, str]] = [
    ("model=smollm2", "model=tiny", "tests never run the 135M model"),
    ("train.steps=30", "train.steps=2", "two steps are enough to checkpoint"),
    ("train.steps=40", "train.steps=3", "the resume goes one step past the first run"),
    ("train.steps=20", "train.steps=1", "one step per run of a sweep"),
    ("warmup.steps=5", "warmup.steps=2", "a short warm-up"),
    ("seed=0,1,2", "seed=0,1", "two seeds are enough for the report's intervals"),
    # the same tiny unison jobs on the Ray launcher: files, curves and report equal to the
    # basic launcher's, in tests/marl/test_sweep_ray.py; here the sweep's folders and report
    ("launcher=ray", None, "the Ray launcher's sweeps are tested in test_sweep_ray.py"),
]
# runs whose README command leaves train.steps at the default (20): one step each
ONE_STEP = "train.steps=1"
# the ready sweep (15 runs): one seed and two cooperation values, as the sweep file allows
SWEEP_EXTRA = ["seed=0", "scenario.overrides.reward.cooperation=0.0,1.0"]


def tour_block() -> str:
    """The bash block of the README's "A five-minute tour"."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## A five-minute tour", 1)[1]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match, "the tour has a bash block"
    return match.group(1)


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(" ".join(line.split()))
    return out


def adapt(command: str, used: set[str]) -> list[str]:
    """The command as the test runs it (argv), with :data:`SUBSTITUTIONS` applied."""
    argv = shlex.split(command)
    for old, new, _ in SUBSTITUTIONS:
        if old in argv:
            at = argv.index(old)
            argv[at : at + 1] = [] if new is None else [new]
            used.add(old)
    if argv[:2] == ["marl", "train"]:
        if any(a.startswith("+sweep=") for a in argv):
            argv += SWEEP_EXTRA
        if not any(a.startswith("train.steps=") for a in argv):
            argv.append(ONE_STEP)
        argv.append("logging.progress=false")
    return argv


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve_tensorboard(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    """Start ``tensorboard`` as printed (on a free port), wait until it serves, stop it."""
    proc = subprocess.Popen(
        [*argv, "--port", str(_free_port())],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        seen = ""
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            seen += line
            if re.search(r"TensorBoard .* at http://", line):
                return
        pytest.fail(f"tensorboard did not start serving: {seen[-2000:]}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _env() -> dict[str, str]:
    """``source .venv/bin/activate``: the venv's bin first on PATH; one thread per process."""
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(BIN.parent),
        "OMP_NUM_THREADS": "1",
        "HYDRA_FULL_ERROR": "0",
    }


def test_every_command_of_the_five_minute_tour_runs(marl_cli, tmp_path: Path) -> None:
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios", target_is_directory=True)
    env = _env()
    cmds = commands(tour_block())
    assert cmds[0] == "source .venv/bin/activate"
    used: set[str] = set()
    ran = []
    for command in cmds[1:]:
        argv = adapt(command, used)
        if argv[0] == "tensorboard":
            _serve_tensorboard(argv, tmp_path, env)
            ran.append(command)
            continue
        assert argv[0] == "marl", f"a tour command this test does not know: {command}"
        start = time.monotonic()
        done = marl_cli(*argv[1:], cwd=tmp_path, env=env, timeout=900)
        took = time.monotonic() - start
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"{' '.join(argv)} failed ({took:.0f}s):\n{out[-3000:]}"
        assert "Traceback" not in out, f"{' '.join(argv)}:\n{out[-3000:]}"
        ran.append(command)
    assert len(ran) == len(cmds) - 1
    unused = {old for old, _, _ in SUBSTITUTIONS} - used
    assert not unused, f"substitutions that no longer match the README: {sorted(unused)}"
    # what the commands left behind, where the README says
    assert (tmp_path / "runs/unison/checkpoints/latest").is_file()
    assert len(list((tmp_path / "runs/algos").glob("*/config.yaml"))) == 4  # 2 algos x 2 seeds
    assert list((tmp_path / "runs/algos").rglob("*.png")), "marl report wrote its plot"
    assert list((tmp_path / "runs/sweep/public_goods_cooperation").rglob("*.png"))


def test_write_your_own_scenario_checks_and_plays_as_printed(marl_cli, tmp_path: Path) -> None:
    """Step 1's YAML saved as my_game.yaml; step 3's ``marl validate my_game.yaml`` and
    ``marl play scenario=./my_game.yaml agents=scripted bot=rule`` (once refused by Hydra as
    ``In 'train': Could not find 'scenario/./my_game.yaml'``)."""
    text = SCENARIOS_PAGE.read_text(encoding="utf-8").split("## Write your own scenario", 1)[1]
    game = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert game, "step 1 has a YAML block"
    (tmp_path / "my_game.yaml").write_text(re.sub(r"(?m)^ {3}", "", game.group(1)))
    validate = re.search(r"`(marl validate my_game\.yaml)`", text)
    play = re.search(r"Then\s+`(marl play scenario=\./my_game\.yaml[^`]*)`", text)
    assert validate and play, "step 3 names both commands"
    env = _env()
    validate_argv, play_argv = shlex.split(validate.group(1)), shlex.split(play.group(1))
    assert validate_argv[0] == play_argv[0] == "marl"
    checked = marl_cli(*validate_argv[1:], cwd=tmp_path, env=env)
    assert checked.returncode == 0 and checked.stdout.strip() == "my_game.yaml: ok", (
        checked.stdout + checked.stderr
    )
    played = marl_cli(*play_argv[1:], cwd=tmp_path, env=env)
    assert played.returncode == 0, played.stderr[-2000:]
    assert played.stdout.startswith("=== stag-hunt-v0 | seed 0"), played.stdout[:500]
    assert "--- result ---" in played.stdout and "Traceback" not in played.stderr
