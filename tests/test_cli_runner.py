"""The suite's ``marl_cli`` runner (tests/conftest.py) gives what the console script gives."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

SCRIPT = str(Path(sys.executable).with_name("marl"))


def script(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


def same_load(stderr: str) -> str:
    """``stderr`` without the busy-machine warning, which follows the load average: one of the
    two runs may see the machine busier than the other."""
    return re.sub(r"(?m)^marl: warning: load average .*\n", "", stderr)


@pytest.mark.parametrize(
    "args",
    [
        ("list",),
        ("validate", "missing.yaml"),
        ("validate", "bad.yaml"),
        ("play", "scenario=unison", "agents=scripted", "bot=random", "seed=3"),
        ("train", "train.stepz=3"),
        ("bogus",),
    ],
)
def test_a_forked_command_prints_and_exits_as_the_script_does(
    marl_cli, tmp_path: Path, args: tuple[str, ...]
) -> None:
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    forked, real = marl_cli(*args, cwd=tmp_path), script(*args, cwd=tmp_path)
    assert marl_cli.forks(dict(os.environ))
    assert (forked.returncode, forked.stdout, same_load(forked.stderr)) == (
        real.returncode,
        real.stdout,
        same_load(real.stderr),
    )


def test_a_forked_command_runs_in_a_process_and_folder_of_its_own(marl_cli, tmp_path: Path) -> None:
    before = os.getcwd()
    done = marl_cli(
        "play", "scenario=unison", "agents=scripted", "hydra.run.dir=here", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "here").is_dir()  # hydra.run.dir is relative to the command's folder
    assert os.getcwd() == before


def test_an_environment_read_at_import_gets_a_fresh_interpreter(marl_cli, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    (tmp_path / "sitecustomize.py").write_text("print('fresh interpreter')\n")
    assert not marl_cli.forks(env)
    assert marl_cli.forks(
        {**os.environ, "OMP_NUM_THREADS": "1", "MARL_X": "y", "PYTHONBREAKPOINT": "0"}
    )
    assert not marl_cli.forks({**os.environ, "ATEN_CPU_CAPABILITY": "avx2"})
    assert not marl_cli.forks({**os.environ, "HOME": str(tmp_path)})
    done = marl_cli("list", cwd=tmp_path, env=env)
    assert done.returncode == 0 and done.stdout.startswith("fresh interpreter")


def test_a_command_past_its_timeout_is_killed(marl_cli, tmp_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        marl_cli("play", "scenario=unison", "agents=llm", "model=tiny", cwd=tmp_path, timeout=0.01)
