"""bench/listening.py (issue 26's experiment, corrected by issue 40) on runs given as data: each
run measured on its own held-out scenarios, intervals inside each measure's range, CIC given the
target beside CIC, and a listener mostly off the scored texts flagged in the table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import listening  # noqa: E402  (bench/listening.py: bench/ is not a package)


def run(condition: str, seed: int, success: float, off_set: float) -> dict:
    """A run as bench/listening.py's ``measure`` returns it."""
    _, steps = listening.CONDITIONS[condition]
    after = {m: 0.5 for m in listening.METRICS}
    after.update(success=success, off_set=off_set, cic=1.9 + 0.02 * seed, cic_given_target=0.1)
    before = {m: 0.2 for m in listening.METRICS}
    return {
        "condition": condition,
        "seed": seed,
        "heldout_success": {"before": 0.5, "after": success},
        "speaker_mi": 0.4,
        "listening": {"0": before, str(steps): after},
    }


def test_each_run_is_measured_on_its_own_scenarios() -> None:
    seeds = {listening.eval_seed(0, run_seed) for run_seed in range(5)}
    assert len(seeds) == 5
    assert listening.eval_seed(1, 0) not in {listening.eval_seed(0, s) for s in range(100)}


def test_intervals_stay_in_range_and_an_off_set_listener_is_flagged() -> None:
    runs = [run("warmup_rl", s, 1.0 if s else 0.9, 0.1) for s in range(5)]
    runs += [run("rl", s, 0.97, 0.9) for s in range(5)]
    table = {c: listening.aggregate(runs, c) for c in ("warmup_rl", "rl")}
    success = table["warmup_rl"]["listening_20"]["success"]
    assert success["high"] == 1.0 and success["low"] < success["mean"] < 1.0
    assert table["warmup_rl"]["listening_20"]["cic_given_target"]["mean"] == 0.1
    # a CIC at the 2 bits of 4 candidates in 4 seeds of 5: the interval stops at 2
    full = [run("warmup_rl", s, 1.0, 0.1) for s in range(5)]
    for s, r in enumerate(full):
        r["listening"]["20"]["cic"] = 2.0 if s else 1.5
    cic = listening.aggregate(full, "warmup_rl")["listening_20"]["cic"]
    assert cic["high"] == 2.0 and cic["low"] < cic["mean"] < 2.0
    text = listening.markdown(table, argparse.Namespace(listening_episodes=16, counterfactuals=8))
    rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| ")}
    assert rows["| rl"].count(" !") == 1 and " !" not in rows["| warmup_rl"]
    header = rows["| condition"].split(" | ")
    assert "CIC given target after" in header and "off-set after" in header
    assert all(line.count("|") == rows["| condition"].count("|") for line in rows.values())


def test_the_table_says_how_the_listener_was_read() -> None:
    table = {"rl": listening.aggregate([run("rl", s, 0.97, 0.1) for s in range(5)], "rl")}
    exact = listening.markdown(table, argparse.Namespace(listening_episodes=16, counterfactuals=8))
    parsed = listening.markdown(
        table, argparse.Namespace(listening_episodes=16, counterfactuals=8, replies=16)
    )
    assert "scored exactly over the accepted spellings" in exact and "parser" not in exact
    assert "read by the scenario's parser from 16 replies" in parsed
    assert "fraction it rejects" in parsed
