"""Training runs on the zero-sum games: ``marl train`` takes them like any scenario.

Two steps of GRPO with the tiny model on ``kuhn-poker`` and on a TextArena game: the loss is
finite, turns were trained, and the per-agent mean rewards of a step sum to zero (the
zero-sum contract holds in the rollout the trainer itself plays).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from marl.train import train


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
    assert metrics["policies/shared/trained_turns"] > 0
    rewards = [metrics[f"agents/{a}/reward"] for a in ("player_0", "player_1")]
    assert sum(rewards) == pytest.approx(0.0, abs=1e-9), rewards
