"""Training runs on the zero-sum games: ``marl train`` takes them like any scenario.

Two steps of GRPO with the tiny model on ``kuhn-poker``, ``bargain`` and a TextArena game: the
run ends, the loss is finite, both agents generated replies, and the per-agent mean rewards of a
step sum to zero (the zero-sum contract holds in the rollout the trainer itself plays). Whether
a model learns these games is the league's experiment, not this test's.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from marl.loop.train import train


def config(scenario: dict) -> dict:
    return {
        "scenario": scenario,
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 8},
        "algo": {"lr": 3e-3},
        "train": {"steps": 2, "seeds_per_step": 1, "group_size": 4},
        "logging": {"progress": False, "transcripts_every": 1},
        "seed": 0,
    }


CASES = [
    pytest.param({"name": "kuhn-poker", "overrides": {}}, id="kuhn-poker"),
    pytest.param({"name": "bargain", "overrides": {}}, id="bargain"),
    pytest.param(
        {"name": "textarena", "overrides": {"params": {"env_id": "KuhnPoker-v0"}}},
        id="textarena-KuhnPoker-v0",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("textarena") is None,
            reason="textarena is not installed (pip install 'marl-llm[textarena]')",
        ),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", CASES)
def test_two_training_steps_on_a_zero_sum_game(scenario: dict, tmp_path: Path) -> None:
    metrics = train(config(scenario), run_dir=tmp_path)
    assert math.isfinite(metrics["policies/shared/loss"])
    rewards = [metrics[f"agents/{a}/reward"] for a in ("player_0", "player_1")]
    assert sum(rewards) == pytest.approx(0.0, abs=1e-9), rewards
    # the player to move generated replies (the idle one is never prompted). A random tiny
    # model's replies are all invalid, so a group's episodes end alike and GRPO has nothing to
    # learn from; in TextArena's Kuhn Poker player_1 opens, and two invalid replies end the
    # game before player_0 ever moves, so only "some agent" is checked.
    lengths = [metrics.get(f"agents/{a}/response_length", 0.0) for a in ("player_0", "player_1")]
    assert max(lengths) > 0, lengths
