"""The command line's mistakes are one line, like the YAML's: a mistyped key names the key and the
nearest valid one, a group option that does not exist names the group and its options (Hydra's own
blocks were 7 and 12 lines). Real ``marl`` subprocesses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marl.cli import config_keys, override_error

pytestmark = pytest.mark.subprocess


@pytest.fixture
def marl(marl_cli):
    """``marl <args>`` in a process of its own, with Hydra's short errors (its default)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return lambda *args, cwd: marl_cli(*args, cwd=cwd, env=env, timeout=300)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "train.stepz=3"], "error: train.stepz: no such key ("),
        (["play", "sampling.temprature=0.5"], "error: sampling.temprature: no such key ("),
        (["train", "algo=ppo"], "error: algo=ppo: algo has no option ppo; its options: "),
        (["train", "train.steps=abc"], "error: train.steps=abc: Value 'abc' of type 'str' "),
    ],
    ids=["train-key", "play-key", "group-option", "value-type"],
)
def test_an_override_mistake_is_one_line(
    marl, args: list[str], expected: str, tmp_path: Path
) -> None:
    done = marl(*args, "model=tiny", cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith(expected), done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.iterdir())  # nothing started


def test_the_nearest_key_and_option_are_suggested() -> None:
    keys = config_keys()
    assert {"train.steps", "ray.num_cpus", "sampling.temperature", "seed"} <= set(keys)

    class Failed(Exception):
        pass

    typo = Failed("Could not override 'train.stepz'.\nTo append to your config use +train.stepz")
    typo.__cause__ = KeyError("Key 'stepz' not in 'TrainSettings'")
    assert override_error(typo).endswith("; did you mean train.steps?")
    options = (
        "In 'train': Could not find 'algo/grpp'\n\nAvailable options in 'algo':\n\tgrpo\n\tgspo"
    )
    assert override_error(Failed(options)) == (
        "algo=grpp: algo has no option grpp; its options: grpo, gspo; did you mean algo=grpo?"
    )
    assert override_error(Failed("something else\nand more")) == "something else"
    wrong = Failed("Error merging override logging.progress=maybe")
    wrong.__cause__ = ValueError("Value 'maybe' is not a valid bool (type str)\n    full_key: x")
    assert override_error(wrong) == (
        "logging.progress=maybe: Value 'maybe' is not a valid bool (type str)"
    )
