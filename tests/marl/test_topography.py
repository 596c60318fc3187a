"""Topographic similarity and the message table (marl.analysis.topography), and
bench/code_table.py on a real tiny run's checkpoint."""

from __future__ import annotations

import itertools
import random
import sys
from pathlib import Path

import pytest

from marl.analysis.topography import (
    edit_distance,
    message_table,
    spearman,
    topographic_similarity,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

COLOURS, SHAPES = ["red", "blue", "green"], ["circle", "square", "star"]
MEANINGS = list(itertools.product(COLOURS, SHAPES))


def test_edit_distance_and_rank_correlation() -> None:
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance(["red", "circle"], ["red", "star"]) == 1
    assert edit_distance([], ["a", "b"]) == 2
    assert spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 2], [1, 2, 3, 4]) == pytest.approx(0.8944, abs=1e-4)  # ties
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1], [2]) is None
    with pytest.raises(ValueError):
        spearman([1, 2], [1])


def test_a_compositional_code_scores_one_and_a_holistic_one_less() -> None:
    compositional = [f"{c} {s}!" for c, s in MEANINGS]  # punctuation and case normalised away
    assert topographic_similarity(MEANINGS, compositional) == pytest.approx(1.0)
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(5)) for _ in MEANINGS]
    holistic = topographic_similarity(MEANINGS, words)  # one arbitrary word per meaning
    assert holistic is None or holistic < 0.5
    assert topographic_similarity(MEANINGS, ["hello"] * len(MEANINGS)) is None  # one message


def test_the_table_gives_each_meaning_its_most_frequent_message() -> None:
    meanings = ["red circle"] * 3 + ["blue star"] * 2
    messages = ["Red!", "red", "the red one", "BLUE", "star"]
    rows = {r["meaning"]: r for r in message_table(meanings, messages)}
    assert rows["red circle"] == {
        "meaning": "red circle",
        "samples": 3,
        "top": "red",
        "top_share": pytest.approx(2 / 3),
        "distinct": 2,
    }
    assert rows["blue star"]["samples"] == 2 and rows["blue star"]["distinct"] == 2


def test_the_bench_tabulates_a_real_runs_speaker(tmp_path) -> None:
    import code_table  # bench/code_table.py

    from marl.loop.train import train

    run = tmp_path / "code" / "seed0"
    train(
        {
            "model": {"kind": "tiny"},
            "scenario": {"name": "signal-code-v0", "overrides": {"params": {"n_colours": 2}}},
            "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2, "checkpoint_every": 1},
            "sampling": {"max_new_tokens": 4},
            "logging": {"progress": False},
        },
        run_dir=run,
    )
    found = code_table.checkpoints_of(run, None)
    assert sorted(found) == [1]  # no warm-up: no step-0 checkpoint
    config = code_table.saved_config(run)
    targets, messages = code_table.speaker_samples(found[1], config, 3, 2, seed=0)
    assert len(targets) == len(messages) == 3 * 4 * 2  # scenarios x candidates x samples
    # the base model as step 0 (no warm-up trained a speaker): its speaker before RL, on the
    # run's scenario; only when asked for, and never in place of a saved checkpoint
    with_base = code_table.checkpoints_of(run, None, "model:tiny")
    assert with_base == {0: "model:tiny", 1: found[1]}
    assert code_table.checkpoints_of(run, [1], "model:tiny") == {1: found[1]}
    base_targets, base_messages = code_table.speaker_samples("model:tiny", config, 3, 2, seed=0)
    assert base_targets == targets and len(base_messages) == 24  # the same held-out scenarios
    assert all(colour in ("red", "blue") for colour, _ in targets)
    described = code_table.describe(targets, messages)
    assert described["samples"] == 24 and 0.0 <= described["named"] <= 1.0
    assert code_table.sent_text("SAY: the red star\nACTION: wait") == "the red star"
    assert code_table.sent_text("ACTION: wait") == ""  # sends nothing
    assert sum(row["samples"] for row in described["table"]) == 24
    summary = code_table.summarise([{"steps": {"1": described}}], 1)
    assert summary["named"]["low"] is None  # one run: no interval
    result = {"args": {"scenarios": 3, "samples": 2}, "summary": {"code": [summary]}}
    result["runs"] = [{"condition": "code", "seed": 0, "steps": {"1": described}}]
    text = code_table.markdown(result)
    assert "| code | 1 | 1 |" in text and "| target | message | share | distinct |" in text


def test_the_base_is_no_step_0_where_the_warm_up_trained_the_speaker(tmp_path) -> None:
    import code_table  # bench/code_table.py
    import yaml

    run = tmp_path / "run"
    (run / "checkpoints" / "step_000020").mkdir(parents=True)
    for agents, base_is_step_0 in ((["listener"], True), (["speaker", "listener"], False)):
        config = {"warmup": {"steps": 8, "agents": agents}}
        (run / "config.yaml").write_text(yaml.safe_dump(config))
        found = code_table.checkpoints_of(run, None, "model:smollm2")
        assert (0 in found) is base_is_step_0, agents
        assert found[20] == run / "checkpoints" / "step_000020"


def test_the_bench_clips_each_interval_to_its_measure_range() -> None:
    import code_table  # bench/code_table.py

    # five runs whose share naming the target spreads wide: the t-interval passes 0, and the
    # table clips it there (a share), while topographic similarity may go down to -1
    per_run = [
        {"steps": {"40": {"named": named, "topsim": topsim, "table": []}}}
        for named, topsim in [(0.0, -0.9), (0.0, 0.9), (1.0, -0.5), (0.05, 0.8), (1.0, -0.9)]
    ]
    summary = code_table.summarise(per_run, 40)
    assert summary["named"]["low"] < 0.0 and summary["topsim"]["low"] < -1.0  # unclipped data
    result = {"args": {"scenarios": 3, "samples": 2}, "summary": {"code": [summary]}, "runs": []}
    row = next(
        line for line in code_table.markdown(result).splitlines() if line.startswith("| code")
    )
    named, topsim = row.split(" | ")[3:5]
    assert named == f"{summary['named']['mean']:.2f} [0.00, 1.00]"
    assert topsim.startswith(f"{summary['topsim']['mean']:.2f} [-1.00, ")
