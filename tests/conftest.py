"""Suite-wide marker rules; the markers themselves are registered in pyproject.toml."""

from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test marked ``ray`` is also ``slow``: starting Ray costs seconds here, so the fast loop
    (``-m "not slow"``) leaves out every Ray test, including ones that only say ``ray``."""
    for item in items:
        if item.get_closest_marker("ray") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test whose expectation holds only on a machine without a GPU: torch reports no
    CUDA device for its duration, so the platform places everything on the CPU, as on CI."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
