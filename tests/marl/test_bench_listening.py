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


def cells(matrix: dict[tuple[str, str], float], condition: str = "rl") -> list[dict]:
    """Cross-play cells as bench/listening.py records them."""
    return [
        {"condition": condition, "speaker": s, "listener": x, "episodes": 24, "success": v,
         "success_lo": 0.0, "success_hi": 1.0}
        for (s, x), v in matrix.items()
    ]  # fmt: skip


def test_the_self_play_gap_tells_a_shared_language_from_private_conventions() -> None:
    from marl.competition.role_eval import self_play_gap

    runs = ["seed0", "seed1", "seed2"]
    names = [*runs, "base"]
    shared = {(s, x): 0.25 if "base" in (s, x) else 1.0 for s in names for x in names}
    private = {k: (1.0 if k[0] == k[1] else 0.25) for k in shared}
    # one language: any trained speaker works with any trained listener, the base left out
    gap = listening.crossplay_gap(cells(shared))
    assert gap["runs"] == runs and gap["per_run"] == [0.0, 0.0, 0.0] and gap["mean"] == 0.0
    # each pair its own convention: 1.0 with itself, chance with the others' partners
    gap = self_play_gap(cells(private), runs)
    assert gap["per_run"] == [0.75, 0.75, 0.75] and gap["mean"] == 0.75
    # the speaker's and the listener's side both count: a listener that follows only its own
    # speaker, whose speaker every listener understands, is half private
    half = dict(shared)
    half.update({("seed1", "seed0"): 0.25, ("seed2", "seed0"): 0.25})
    per_run = self_play_gap(cells(half), runs)["per_run"]
    assert per_run[0] == 1.0 - (1.0 + 1.0 + 0.25 + 0.25) / 4
    text = listening.crossplay_text(cells(private), self_play_gap(cells(private), runs), "T\n")
    assert text.startswith("\n\nCross-play (rl pairs and the base model):\n\nT\n")
    assert "Self-play gap" in text and "+0.75 [+0.75, +0.75]; per run +0.75, +0.75, +0.75" in text
    assert listening.crossplay_gap(cells({("seed0", "seed0"): 1.0})) is None  # one run: none
    try:
        self_play_gap(cells({("seed0", "seed0"): 1.0, ("seed1", "seed1"): 1.0}), ["seed0", "seed1"])
    except ValueError as exc:
        assert "no cross-play cell" in str(exc)
    else:
        raise AssertionError("a missing cell must be refused")


def test_a_cached_cross_play_is_reused_only_for_its_own_condition(tmp_path: Path) -> None:
    from marl.competition.role_eval import write_tables

    names = ["seed0", "seed1", "base"]
    matrix = {(s, x): 0.5 for s in names for x in names}
    write_tables(tmp_path, cells(matrix, "rl"), {})
    path = tmp_path / "crossplay_roles.csv"
    reused = listening._cached_cells(path, names, 24, "rl")
    assert len(reused) == 9 and all(c["condition"] == "rl" and c["success"] == 0.5 for c in reused)
    assert listening._cached_cells(path, names, 24, "warmup_rl") == []  # another condition's
    assert listening._cached_cells(path, names, 12, "rl") == []  # other episodes
    legacy = [{k: v for k, v in c.items() if k != "condition"} for c in cells(matrix)]
    write_tables(tmp_path, legacy, {})  # written before cells named their condition
    assert len(listening._cached_cells(path, names, 24, "warmup_rl")) == 9
    assert listening._cached_cells(path, names, 24, "rl") == []


def test_the_scored_conditions_compose_a_choosing_listener_and_its_cut_control() -> None:
    """code_v1_scored (registered in docs/communication.md) is code_v1 with a listener that
    chooses by score and an entropy bonus of 0.1, and nothing else; its cut control cuts the
    speaker -> listener edge and changes nothing else."""
    from hydra import compose, initialize_config_module

    from marl.cli import register_scenario_options
    from marl.config import load_config
    from marl.runtime.policy_map import plan_for

    def load(condition: str):  # noqa: ANN202
        overrides, _ = listening.CONDITIONS[condition]
        register_scenario_options()
        with initialize_config_module(config_module="marl.configs", version_base=None):
            return load_config(compose(config_name=overrides[1], overrides=overrides[2:]))

    base, scored, cut = load("code_v1"), load("code_v1_scored"), load("code_v1_scored_cut")
    plan = plan_for(scored)
    assert plan.scored == {"listener"}
    assert plan.policies["listener"].entropy == 0.1 and plan.policies["speaker"].entropy == 0.0
    assert plan_for(base).scored == frozenset()
    assert scored.scenario.name == base.scenario.name and scored.train == base.train
    assert scored.algo == base.algo and scored.sampling == base.sampling
    assert cut.scenario.overrides == {
        **scored.scenario.overrides,
        "graph": {"cut": [["speaker", "listener"]]},
    }
    assert plan_for(cut).scored == {"listener"} and cut.train == scored.train
