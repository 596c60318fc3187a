"""Wall time of one training step's phases, for the ``perf/*`` metrics.

``train`` opens a :class:`StepTimer` per step and wraps each phase in ``with
timer.phase(name):``; :meth:`StepTimer.metrics` then gives ``perf/<name>_time`` for every phase
and ``perf/step_time`` since the timer started, so the loop reads as its phases and the
bookkeeping lives here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["StepTimer"]


class StepTimer:
    """Seconds spent in each named phase of one step, and since the step began."""

    def __init__(self) -> None:
        self.began = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the ``with`` block as phase ``name`` (a phase entered twice adds up)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def elapsed(self) -> float:
        """Seconds since the step began."""
        return time.perf_counter() - self.began

    def metrics(self) -> dict[str, float]:
        """``perf/step_time`` (since the step began) and ``perf/<phase>_time`` for each phase."""
        return {
            "perf/step_time": self.elapsed(),
            **{f"perf/{name}_time": seconds for name, seconds in self.seconds.items()},
        }
