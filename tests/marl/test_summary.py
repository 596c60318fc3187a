"""The end-of-run summary: Wilson intervals, start/end values, and the PNG."""

from __future__ import annotations

from pathlib import Path

import pytest

from marl.analysis.stats import wilson
from marl.analysis.summary import RunSummary


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
                "emergence/speaker/speaker_mi_content": value * 2,
                "emergence/edges/speaker->listener/influence_action": value / 2,
                "perf/step_time": 3.0,  # not a headline metric
            },
        )
    lines = "\n".join(summary.lines())
    assert "success: start 0.25" in lines and "end 0.92" in lines and "48 episodes" in lines
    assert "speaker MI (speaker, content words): start 0.50 -> end 1.83 bits" in lines
    assert "listener influence (speaker->listener, sampled null message)" in lines
    assert "perf/step_time" not in summary.history
    png = summary.plot(tmp_path / "curves.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_held_out_line_has_mcnemar_on_the_paired_scenarios() -> None:
    """64 scenarios (seeds 100-163): 37 succeed before; after, 3 of those fail and 26 of the 27
    failures succeed (37 -> 60). McNemar's exact p: 2 P(Binomial(29, 1/2) <= 3)
    = 2 (1 + 29 + 406 + 3654) / 2^29 = 8180 / 2^29 = 1.52e-05."""
    summary = RunSummary(episodes_per_step=16)
    seeds = range(100, 164)
    before = {s: s < 137 for s in seeds}
    after = {s: (103 <= s < 137) or (137 <= s < 163) for s in seeds}
    assert sum(before.values()) == 37 and sum(after.values()) == 60
    for step, outcomes in ((0, before), (20, after)):
        paired = summary.add_evaluation(step, outcomes)
        rate = sum(outcomes.values()) / 64
        summary.add(step, {"eval/success": rate, "eval/episodes": 64.0, **paired})
    assert paired == {
        "eval/paired/got_worse": 3.0,
        "eval/paired/got_better": 26.0,
        "eval/paired/mcnemar_p": pytest.approx(8180 / 2**29, rel=1e-12),
    }
    (line,) = summary.lines()
    assert line == (
        "held-out success (64 unseen scenarios): after 0 updates 0.58 [0.46, 0.69] -> after 20 "
        "updates 0.94 [0.85, 0.98] (95% Wilson intervals); McNemar exact p = 1.52e-05, "
        "3 got worse, 26 got better"
    )
    finals = summary.finals()
    assert finals["final/eval/paired/mcnemar_p"] == pytest.approx(8180 / 2**29, rel=1e-12)
    assert finals["final/eval/paired/got_worse"] == 3.0
    assert finals["final/eval/paired/got_better"] == 26.0


def test_paired_comparison_uses_the_first_evaluation_and_only_binary_outcomes() -> None:
    summary = RunSummary(episodes_per_step=4)
    first = summary.add_evaluation(0, {1: True, 2: False, 3: False})
    assert first == {
        "eval/paired/got_worse": 0.0,
        "eval/paired/got_better": 0.0,
        "eval/paired/mcnemar_p": 1.0,
    }
    summary.add_evaluation(5, {1: False, 2: False, 3: True})
    # against step 0, not step 5: 1 got worse, 2 and 3 got better; p = 2 P(X <= 1 | n=3) = 1
    last = summary.add_evaluation(10, {1: False, 2: True, 3: True})
    assert last["eval/paired/got_worse"] == 1.0 and last["eval/paired/got_better"] == 2.0
    assert last["eval/paired/mcnemar_p"] == 1.0
    assert summary.add_evaluation(15, None) == {}  # no success defined: nothing to pair
    assert sorted(summary.evaluations) == [0, 5, 10]


def test_the_exact_listening_measures_get_their_lines_with_intervals() -> None:
    summary = RunSummary(episodes_per_step=16)
    for step, (cic, follow) in ((0, (0.8, 0.5)), (20, (1.9, 0.95))):
        summary.add(
            step,
            {
                "eval/listening/cic": cic,
                "eval/listening/cic_low": cic - 0.1,
                "eval/listening/cic_high": cic + 0.1,
                "eval/listening/swap_follow": follow,
                "eval/listening/null_success": 0.25,
                "eval/listening/success": 1.0,
                "emergence/edges/speaker->listener/influence_action": 0.5,
            },
        )
    lines = summary.lines()
    assert (
        "listening (held-out, exact; 95% t-intervals over scenarios): CIC after 0 updates "
        "0.80 [0.70, 0.90] -> after 20 updates 1.90 [1.80, 2.00] bits"
    ) in lines
    assert (
        "interventions after 20 updates: message swap followed 0.95, success with no message "
        "0.25, with the sent message 1.00"
    ) in lines
    assert not any("sampled null message" in line for line in lines)  # the exact one replaces it
    assert summary.finals()["final/eval/listening/cic"] == 1.9
    assert not any("FLAGGED" in line for line in lines)


def test_a_listener_mostly_off_the_scored_texts_is_flagged_and_cic_given_target_shown() -> None:
    summary = RunSummary(episodes_per_step=16)
    for step, off in ((0, 0.2), (20, 0.8)):
        summary.add(
            step,
            {
                "eval/listening/cic": 1.0,
                "eval/listening/cic_given_target": 0.3,
                "eval/listening/off_set": off,
                "eval/listening/off_set_flag": float(off > 0.5),
            },
        )
    lines = summary.lines()
    assert any(line.endswith("bits (given the target: 0.30)") for line in lines), lines
    flagged = [line for line in lines if "FLAGGED" in line]
    assert len(flagged) == 1 and "after 20 updates" in flagged[0] and "off-set 0.80" in flagged[0]


def test_exploitability_gets_a_line_and_finals() -> None:
    summary = RunSummary(episodes_per_step=16)
    for step, value in ((0, 0.458), (1, 0.458), (2, 0.2)):
        summary.add(
            step,
            {
                "league/exploitability": value,
                "league/nash_conv": 2 * value,
                "eval/chips_vs_nash": -0.1,
                "eval/chips_vs_random": 0.05,
            },
        )
    assert (
        "exploitability (exact, chips a hand; uniform random 0.458, Nash 0): after 0 updates "
        "0.458 -> after 2 updates 0.200; chips vs nash -0.100; chips vs random +0.050"
    ) in summary.lines()
    assert summary.finals()["final/league/exploitability"] == 0.2
