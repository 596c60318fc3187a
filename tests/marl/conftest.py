"""Markers of the driver's tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """``ray``: the test starts a real Ray head node (``-m "not ray"`` leaves it out)."""
    config.addinivalue_line("markers", "ray: starts a real Ray head node (ray start --head)")
