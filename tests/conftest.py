"""Suite-wide rules: markers (registered in pyproject.toml) and parallel workers.

``make test`` runs the suite on one pytest-xdist worker per core (``--dist loadscope``): a
module's tests run on one worker, so its module-scoped fixtures (a loaded model, a Ray runtime)
are built once, and the modules spread over the workers, the Ray ones included. Each worker's
Ray tests share one Ray session where they can (``shared_ray`` in tests/marl/conftest.py), and
each worker's torch (and the CLI subprocesses and Ray actors it starts, through
``OMP_NUM_THREADS``) takes its share of the cores instead of all of them: two processes of two
threads on two cores run 4 to 6 times slower than one (docs/benchmarks.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker: this worker's share of the cores, for torch and its subprocesses."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers <= 1:
        return
    import torch

    from marl.runtime.threads import available_cores

    threads = max(1, available_cores() // workers)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``ray`` is also ``slow``: starting Ray costs seconds here, so the fast loop
    (``-m "not slow"``) leaves out every Ray test, including ones that only say ``ray``.

    The modules with the most ``slow`` tests come first (the order within a module is kept):
    xdist hands out modules in collection order, so the long ones start while the other worker
    takes the many short ones, instead of one long module finishing alone at the end."""
    for item in items:
        if item.get_closest_marker("ray") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    weight: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        weight[module] = weight.get(module, 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -weight[item.nodeid.split("::", 1)[0]])  # stable


def _hide_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test whose expectation holds only on a machine without a GPU: torch reports no
    CUDA device for its duration, so the platform places everything on the CPU, as on CI."""
    _hide_gpus(monkeypatch)


@pytest.fixture(scope="module")
def no_gpu_module() -> Iterator[None]:
    """:func:`no_gpu` for a module-scoped fixture (a runtime compared with CPU references)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _hide_gpus(monkeypatch)
        yield
