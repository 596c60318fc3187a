"""Markers of the driver's tests, and a real Ray head node for the tests that join one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

RAY = str(Path(sys.executable).with_name("ray"))

# When the first driver joins, Ray's raylet prestarts idle Python workers (up to one per CPU) for
# tasks without a runtime_env. Every actor of these tests has one (its thread variables), so none
# of them is ever used: each session would start them for nothing (measured here: 2 idle workers,
# about 3 CPU-s a session). Every session the tests start inherits this: the shared one, a
# runtime's own, `ray start` heads and nodes, and the `marl train` commands' (idle workers are a
# start-up latency of Ray's, nothing the platform's behaviour depends on).
os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
HEAD_PORTS = (
    "ray-client-server-port", "dashboard-port", "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port",
)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    """``ray``: the test starts a real Ray head node (``-m "not ray"`` leaves it out)."""
    config.addinivalue_line("markers", "ray: starts a real Ray head node (ray start --head)")


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def ray_head(
    log: Path, env: dict[str, str], num_cpus: int = 2
) -> Iterator[tuple[str, subprocess.Popen]]:
    """``ray start --head`` (``num_cpus`` CPUs, every port free-picked) in its own process
    group, with ``env``; yields ``(address, process)`` once it says it started, and kills
    exactly that group afterwards (never ``ray stop``, which would stop other heads too). It
    never skips on the state of the machine: an experiment that needs the cores to itself runs
    outside the suite, not by making the suite skip (no file in /tmp decides what is tested)."""
    port = free_port()
    ports = [f"--{name}={free_port()}" for name in HEAD_PORTS]
    with log.open("w") as out:
        head = subprocess.Popen(
            [
                RAY, "start", "--head", "--block", f"--port={port}", *ports,
                f"--num-cpus={num_cpus}", "--num-gpus=0", "--include-dashboard=false",
                "--disable-usage-stats",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: the teardown kills only it
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start --head did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}", head
    finally:
        # SIGTERM would drain for 30 s; the head's GCS, raylet and workers share its group
        os.killpg(head.pid, signal.SIGKILL)
        head.wait()


NODE_PORTS = (
    "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port",
)  # fmt: skip


@contextmanager
def ray_node(address: str, log: Path, env: dict[str, str], num_cpus: int = 1) -> Iterator[None]:
    """``ray start --address=<address>``: a second node of ``num_cpus`` CPUs on this machine, in
    its own process group (every port free-picked), killed afterwards like :func:`ray_head`."""
    ports = [f"--{name}={free_port()}" for name in NODE_PORTS]
    with log.open("w") as out:
        node = subprocess.Popen(
            [
                RAY, "start", f"--address={address}", "--block", *ports, f"--num-cpus={num_cpus}",
                "--num-gpus=0", "--disable-usage-stats",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text():
            if node.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start --address did not start: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        yield
    finally:
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()


@pytest.fixture(scope="session")
def start_ray_node() -> Callable[..., object]:
    """:func:`ray_node`, for module-scoped fixtures."""
    return ray_node


def scalar_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar curve of a run but the timings (``perf/``), as (step, value) pairs, read
    back by TensorBoard's own reader: what two runs must share to be the same run."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
        if not tag.startswith("perf/")
    }


@pytest.fixture(scope="session")
def curves() -> Callable[[Path], dict[str, list[tuple[int, float]]]]:
    """:func:`scalar_curves`, for test modules."""
    return scalar_curves


@pytest.fixture(scope="session")
def start_ray_head() -> Callable[..., object]:
    """:func:`ray_head`, for module-scoped fixtures (conftest modules are not importable
    under ``--import-mode=importlib``)."""
    return ray_head


# --- one Ray session per xdist worker ------------------------------------------------------------

# Logical CPUs of the shared session: what Ray hands out, not cores. The most any test that
# joins it reserves at once is 5 (test_ray_threads: a learner of 2 and a worker of 3).
SHARED_RAY_CPUS = 8
_shared_session = {"up": False}  # whether the session running in this process is the shared one


@pytest.fixture(scope="session")
def _shared_ray_teardown() -> Iterator[None]:
    """Stops the shared session, if it is still up, when this worker's tests are done."""
    yield
    if _shared_session["up"]:
        import ray

        ray.shutdown()
        _shared_session["up"] = False


@pytest.fixture(scope="module")
def shared_ray(_shared_ray_teardown: None) -> Iterator[None]:
    """This process's one local Ray session (8 logical CPUs, no GPU), started by the first
    module that needs it and joined by every later one: starting Ray costs seconds of several
    processes, and a test that only needs *a* session gets the same actors in a shared one.
    A runtime that finds Ray running joins it and leaves it running (``connect``). Tests that
    need a session of their own use :func:`fresh_ray` instead and say why."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=SHARED_RAY_CPUS,
            num_gpus=0,
            include_dashboard=False,
            log_to_driver=False,
        )
        _shared_session["up"] = True
    elif not _shared_session["up"]:
        pytest.fail("a Ray session other than the shared one is running: a test leaked it")
    yield


@pytest.fixture(scope="module")
def fresh_ray() -> Iterator[None]:
    """No Ray session in this process when the module starts: the shared one is stopped (the
    next module that wants it starts it again), so the module's runtime starts, joins or
    refuses a session of its own, as a user's driver would."""
    import ray

    if ray.is_initialized():
        if not _shared_session["up"]:
            pytest.fail("a Ray session other than the shared one is running: a test leaked it")
        ray.shutdown()
        _shared_session["up"] = False
    yield
