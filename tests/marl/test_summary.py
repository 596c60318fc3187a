"""The end-of-run summary: Wilson intervals, start/end values, and the PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from marl.stats import wilson
from marl.summary import RunSummary


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.4038, abs=1e-3) and hi == pytest.approx(0.5962, abs=1e-3)
    assert wilson(16, 16)[1] == 1.0 and wilson(16, 16)[0] == pytest.approx(0.806, abs=1e-3)
    assert wilson(0, 8)[0] == 0.0


def test_summary_start_end_and_plot(tmp_path: Path) -> None:
    summary = RunSummary(episodes_per_step=16, last=3)
    successes = [0.25, 0.5, 0.75, 1.0, 1.0, 0.75]
    for step, value in enumerate(successes, 1):
        summary.add(
            step,
            {
                "team/success": value,
                "team/reward": value,
                "emergence/speaker/speaker_mi_words": value * 2,
                "emergence/edges/speaker->listener/influence_action": value / 2,
                "perf/step_time": 3.0,  # not a headline metric
            },
        )
    lines = "\n".join(summary.lines())
    assert "success: start 0.25" in lines and "end 0.92" in lines and "48 episodes" in lines
    assert "speaker MI (speaker, words): start 0.50 -> end 1.83 bits" in lines
    assert "listener influence (speaker->listener)" in lines
    assert "perf/step_time" not in summary.history
    png = summary.plot(tmp_path / "curves.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
