"""Two GRPO steps of the tiny model on the tool scenario, through the real trainer: the
parameters change, the loss is finite, and every step logs the per-agent tool scalars (0
included) that TensorBoard's own reader reads back."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.agents.models import ModelSpec, load_model
from marl.loop.train import train
from marl.runtime.checkpoint import load_checkpoint


def tool_config(steps: int = 2) -> dict:
    return {
        # digits scoring: partial credit, so that the random tiny model's groups differ
        "scenario": {"name": "ledger", "overrides": {"params": {"scoring": "digits"}}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 24, "response_prefix": True},
        "algo": {"lr": 3e-3},
        "train": {"steps": steps, "seeds_per_step": 1, "group_size": 4},
        "logging": {"progress": False, "transcripts_every": 1},
        "seed": 0,
    }


@pytest.mark.slow
def test_two_steps_on_the_tool_scenario_train_and_log_tool_use(tmp_path: Path) -> None:
    metrics = train(tool_config(), run_dir=tmp_path)
    assert math.isfinite(metrics["policies/shared/loss"])
    assert metrics["policies/shared/trained_turns"] > 0
    initial, _ = load_model(ModelSpec(kind="tiny"))
    trained = load_checkpoint(tmp_path / "checkpoints")["policies"]["shared"]["weights"]
    changed = [n for n, p in initial.state_dict().items() if not torch.equal(p, trained[n])]
    assert len(changed) > len(trained) // 2
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for agent in ("clerk", "auditor"):
        for key in ("tool_calls", "tool_errors", "tool_seconds"):
            values = events.Scalars(f"agents/{agent}/{key}")
            assert [v.step for v in values] == [1, 2], (agent, key, tags)
            assert all(math.isfinite(v.value) and v.value >= 0 for v in values)
