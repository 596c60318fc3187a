"""Held-out evaluation: unseen, fixed scenarios, logged before the first and after the last
update, and read back from the TensorBoard event file."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.evaluation import due
from marl.train import train
from marl.workers import eval_seeds, step_seeds


def test_eval_seeds_are_fixed_and_never_trained_on() -> None:
    held_out = eval_seeds(0, 64)
    assert held_out == eval_seeds(0, 64) and len(set(held_out)) == 64
    trained = {s for step in range(200) for s in step_seeds(0, step, 4)}
    assert not trained & set(held_out)
    assert eval_seeds(1, 64) != held_out


def test_due_at_start_end_and_every() -> None:
    assert [u for u in range(11) if due(u, 10, 0)] == [0, 10]
    assert [u for u in range(11) if due(u, 10, 4)] == [0, 4, 8, 10]


def test_train_logs_eval_before_the_first_and_after_the_last_update(tmp_path: Path) -> None:
    cfg = {
        "agents": "scripted",
        "bot": "rule",
        "scenario": {"name": "signal-v1"},
        "train": {"steps": 3, "eval_episodes": 12, "eval_every": 2},
        "logging": {"progress": False},
    }
    train(cfg, run_dir=tmp_path)
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    success = acc.Scalars("eval/success")
    assert [e.step for e in success] == [0, 2, 3]
    assert all(e.value == 1.0 for e in success)  # the rule bots always find the target
    assert [e.value for e in acc.Scalars("eval/episodes")] == [12.0, 12.0, 12.0]
    assert (tmp_path / "curves.png").exists()
