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
def ray_head(log: Path, env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen]]:
    """``ray start --head`` (2 CPUs, every port free-picked) in its own process group, with
    ``env``; yields ``(address, process)`` once it says it started, and kills exactly that
    group afterwards (never ``ray stop``, which would stop other heads too). It never skips on
    the state of the machine: an experiment that needs the cores to itself runs outside the
    suite, not by making the suite skip (no file in /tmp decides what is tested)."""
    port = free_port()
    ports = [f"--{name}={free_port()}" for name in HEAD_PORTS]
    with log.open("w") as out:
        head = subprocess.Popen(
            [
                RAY, "start", "--head", "--block", f"--port={port}", *ports, "--num-cpus=2",
                "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
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


@pytest.fixture(scope="session")
def start_ray_head() -> Callable[..., object]:
    """:func:`ray_head`, for module-scoped fixtures (conftest modules are not importable
    under ``--import-mode=importlib``)."""
    return ray_head
