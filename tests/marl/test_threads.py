"""runtime.threads (issue 10): torch's thread count at process start, its default, the
oversubscription warning, and the config check that names the key."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from marl.config import ConfigError, load_config
from marl.runtime.threads import (
    actor_threads,
    available_cores,
    configure_threads,
    default_threads,
    oversubscription_warning,
    thread_env,
)


@pytest.fixture(autouse=True)
def keep_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_explicit_threads_are_set() -> None:
    other = 2 if torch.get_num_threads() == 1 else 1
    assert configure_threads(other, stream=None) == other
    assert torch.get_num_threads() == other


def test_default_is_the_affinity_cores_or_omp_num_threads(monkeypatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert available_cores() == len(os.sched_getaffinity(0))
    assert default_threads() == available_cores()
    assert configure_threads(None, stream=None) == available_cores()
    assert torch.get_num_threads() == available_cores()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")  # not a number: ignored
    assert default_threads() == available_cores()


def test_oversubscription_warns_in_one_line_only_above_the_core_count() -> None:
    assert oversubscription_warning(2.0, cores=2, threads=2) is None
    assert oversubscription_warning(0.3, cores=2, threads=2) is None
    message = oversubscription_warning(3.5, cores=2, threads=2)
    assert message is not None and "\n" not in message
    assert "3.5" in message and "2 core" in message and "runtime.threads" in message


def test_configure_writes_the_warning_when_the_load_is_above_the_cores() -> None:
    stream = io.StringIO()
    configure_threads(1, stream=stream)
    lines = stream.getvalue().splitlines()
    assert len(lines) <= 1
    # the load average moves; only a clear case on either side is checked
    load = os.getloadavg()[0]
    if load > available_cores() + 1:
        assert len(lines) == 1 and "oversubscribed" in lines[0]
    elif load < available_cores() - 0.5:
        assert lines == []


@pytest.mark.parametrize("value", [0, -1, "two", 1.5])
def test_a_bad_value_names_the_key(value: object) -> None:
    with pytest.raises(ConfigError, match=r"runtime\.threads"):
        load_config({"runtime": {"threads": value}})


def test_default_and_valid_values_load() -> None:
    assert load_config({}).runtime.threads is None
    assert load_config({"runtime": {"threads": 2}}).runtime.threads == 2


def _marl(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """``marl <args>`` in a fresh interpreter (Hydra's app state stays out of this one); the
    last line of stdout is torch's thread count after the command."""
    code = (
        "import sys, torch\n"
        "from marl.cli import main\n"
        f"main({args!r})\n"
        "print('threads', torch.get_num_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.subprocess
def test_marl_play_applies_runtime_threads_at_start(tmp_path: Path) -> None:
    args = ["play", "runtime.threads=1", "agents=scripted", "scenario=unison", "bot=random"]
    done = _marl(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "threads 1"
    assert "solo_a" in done.stdout  # the transcript


@pytest.mark.slow
@pytest.mark.subprocess
def test_marl_train_refuses_a_bad_thread_count(tmp_path: Path) -> None:
    done = _marl(["train", "runtime.threads=0", "train.steps=0"], tmp_path)
    assert done.returncode == 2
    assert "runtime.threads" in done.stderr


@pytest.mark.parametrize(
    ("threads", "num_cpus", "expected"),
    [
        (None, 1, 1),
        (None, 2, 2),
        (None, 2.5, 2),  # whole CPUs only
        (None, 0.25, 1),  # a fraction of a CPU (the tests' Ray presets) runs one thread
        (None, 0, 1),  # ray.worker_num_cpus may be 0
        (1, 4, 1),  # runtime.threads caps the reservation
        (3, 2, 2),  # ... and never raises it
        (2, 0.5, 1),
        (4, 4, 4),
    ],
)
def test_an_actor_runs_its_reserved_cpus_capped_by_runtime_threads(
    threads: int | None, num_cpus: float, expected: int
) -> None:
    assert actor_threads(threads, num_cpus) == expected
    assert thread_env(expected) == {
        "OMP_NUM_THREADS": str(expected),
        "MKL_NUM_THREADS": str(expected),
    }
