"""bench/kuhn_supervised.py (issue 40's supervised control): the goal check on fits given as
data, and one tiny seed end to end: the warm-up trained through the sweep, the fp32 start equal
to the run's own logged step-0 score, and the exact cross-entropy to the Nash table falling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import kuhn_supervised as supervised  # noqa: E402  (bench/kuhn_supervised.py: bench/ is not a package)


def fitted(seed: int, start: float, end: float, spread: float) -> dict:
    curve = {"loss": [0.8, 0.4]}

    def scores(exploitability: float, card_spread: float) -> dict:
        return {"exploitability": exploitability, "chips_vs_nash": -0.1, "card_spread": card_spread}

    return {"seed": seed, "start": scores(start, 0.0), "end": scores(end, spread), "curve": curve}


def test_the_goal_needs_half_the_start_a_falling_change_and_an_end_below_a_third() -> None:
    met = [fitted(s, 0.45, e, 0.6) for s, e in enumerate((0.10, 0.12, 0.11))]
    summary = supervised.summarise(met)
    assert summary["goal"]["met"] and summary["reads_card"] == 3
    floor = [fitted(s, 0.70, e, 0.1) for s, e in enumerate((0.33, 0.34, 0.35))]
    goal = supervised.summarise(floor)["goal"]  # halved and falling, but at the card-blind floor
    assert goal["end_at_most_half_of_start"] and goal["change_interval_excludes_0"]
    assert not goal["end_interval_below_card_blind_floor"] and not goal["met"]
    assert supervised.summarise(floor)["reads_card"] == 0


def test_the_loss_floor_is_the_nash_tables_own_entropy() -> None:
    """J 1/6, K 1/2, Jp and Qb 1/3, Qpb 1/2 are the mixed sets; the other seven are pure."""
    import math

    def h(q: float) -> float:
        return -(q * math.log(q) + (1 - q) * math.log(1 - q))

    expected = (h(1 / 6) + 2 * h(1 / 2) + 2 * h(1 / 3)) / 12
    assert supervised.loss_floor() == pytest.approx(expected, abs=1e-9)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_tiny_seed_end_to_end(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "out"
    args = [
        sys.executable, str(ROOT / "bench" / "kuhn_supervised.py"), "--model", "tiny",
        "--seeds", "0", "--steps", "3", "--every", "3", "--fit-threads", "1", "--runs", str(runs),
        "--out", str(out),
        "warmup.steps=1", "warmup.episodes=1", "algo.lr=1e-3",
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (fit,) = json.loads((out / "summary.json").read_text())["fits"]
    assert "train.steps=0" in fit["warm_up_command"] and "seed=0" in fit["warm_up_command"]
    # the warmed-up checkpoint scored here in fp32 is the table the warm-up run logged
    assert fit["start"]["exploitability"] == pytest.approx(fit["warm_up_logged_start"], abs=2e-3)
    assert fit["curve"]["steps"] == [0, 3] and len(fit["curve"]["loss"]) == 3
    assert fit["curve"]["loss"][-1] < fit["curve"]["loss"][0]  # the exact signal is followed
    assert fit["end"]["aggressive"] != fit["start"]["aggressive"]
    assert "| 0 |" in (out / "table.md").read_text()
    cache = json.loads((runs / "supervised" / "seed0" / "fit.json").read_text())
    assert (cache["steps"], cache["every"]) == (3, 3) and cache["fit"]["curve"] == fit["curve"]
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["against_selfplay"] is None  # no self-play run of seed 0 under these runs
