"""The step timer behind ``train``'s ``perf/*`` metrics: each phase's wall time, and the step's."""

from __future__ import annotations

import time

import pytest

from marl.loop.timing import StepTimer


def test_each_phase_is_timed_and_the_step_time_covers_them_all() -> None:
    timer = StepTimer()
    with timer.phase("rollout"):
        time.sleep(0.03)
    time.sleep(0.01)  # between phases: only the step time sees it
    with timer.phase("update"):
        time.sleep(0.02)
    metrics = timer.metrics()
    assert set(metrics) == {"perf/step_time", "perf/rollout_time", "perf/update_time"}
    assert 0.03 <= metrics["perf/rollout_time"] < 0.5
    assert 0.02 <= metrics["perf/update_time"] < 0.5
    assert metrics["perf/step_time"] >= 0.06
    assert metrics["perf/step_time"] >= metrics["perf/rollout_time"] + metrics["perf/update_time"]


def test_a_phase_that_raises_is_still_timed_and_a_phase_entered_twice_adds_up() -> None:
    timer = StepTimer()
    with pytest.raises(RuntimeError), timer.phase("credit"):
        time.sleep(0.01)
        raise RuntimeError("a failing phase")
    with timer.phase("credit"):
        time.sleep(0.01)
    assert timer.seconds["credit"] >= 0.02
