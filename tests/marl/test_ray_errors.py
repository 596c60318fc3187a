"""A user error raised inside a Ray actor reaches the user as the same one line as without Ray.

``ray.get`` re-raises an actor's exception as ``RayTaskError(<its class>)``, whose text is the
remote traceback; the CLI and the Ray runtime unwrap it to the original exception.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray.exceptions import RayTaskError  # noqa: E402

from marl.cli import _guarded  # noqa: E402
from marl.errors import remote_cause  # noqa: E402
from marl.runtime.learner import NonFiniteUpdateError  # noqa: E402

MESSAGE = "policy 'shared': 3 optimizer steps in a row met a non-finite value"


def wrapped() -> BaseException:
    """What ``ray.get`` raises when a learner actor raised NonFiniteUpdateError."""
    try:
        raise NonFiniteUpdateError(MESSAGE)
    except NonFiniteUpdateError as exc:
        err = RayTaskError(
            "Learner.update", traceback.format_exc(), exc, proctitle="ray::Learner.update()"
        )
        return err.as_instanceof_cause()


def test_the_wrapper_is_unwrapped_to_the_original_error() -> None:
    err = wrapped()
    assert isinstance(err, NonFiniteUpdateError) and "\n" in str(err)  # the remote traceback
    cause = remote_cause(err)
    assert type(cause) is NonFiniteUpdateError and str(cause) == MESSAGE
    plain = ValueError("x")
    assert remote_cause(plain) is plain


def test_the_cli_prints_the_cause_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def fail() -> None:
        raise wrapped()

    with pytest.raises(SystemExit) as done:
        _guarded(fail)
    assert done.value.code == 2
    assert capsys.readouterr().err == f"error: {MESSAGE}\n"


def _train(marl_cli, tmp_path: Path, *extra: str) -> list[str]:
    """``marl train`` with an lr that overflows the weights; the lines it printed as errors."""
    completed = marl_cli(
        "train",
        "model=tiny",
        "algo.lr=1e39",
        "algo.beta=0.01",
        "algo.max_nonfinite_updates=1",
        "train.steps=2",
        "train.seeds_per_step=1",
        "train.group_size=2",
        "sampling.max_new_tokens=4",
        "logging.progress=false",
        f"hydra.run.dir={tmp_path}",
        *extra,
        timeout=600,
    )
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr
    return [line for line in completed.stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.subprocess
def test_a_nonfinite_stop_under_ray_prints_the_same_line_as_without(
    marl_cli, tmp_path: Path
) -> None:
    local = _train(marl_cli, tmp_path / "local")
    # a Ray session of its own, in the command's process: `marl train ray=local` as a user runs
    # it starts Ray and stops it again (the shared session lives in the pytest process, which a
    # separate `marl train` process cannot join as `ray=local`)
    on_ray = _train(
        marl_cli,
        tmp_path / "ray",
        "ray=local",
        "ray.num_cpus=2",
        "ray.num_rollout_workers=1",
        "ray.worker_num_cpus=0.5",
        "ray.learner_num_cpus=0.5",
    )
    assert len(local) == 1 and "non-finite" in local[0], local
    assert on_ray == local
