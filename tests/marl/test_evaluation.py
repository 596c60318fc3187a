"""Held-out evaluation: unseen, fixed scenarios, logged before the first and after the last
update, and read back from the TensorBoard event file."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.analysis.evaluation import due, evaluation_successes, paired_metrics
from marl.analysis.hparams import read_session
from marl.loop.train import train
from marl.runtime.seeding import HELD_OUT_SEEDS
from marl.runtime.workers import eval_seeds, step_seeds


def test_eval_seeds_are_fixed_and_never_trained_on() -> None:
    held_out = eval_seeds(0, 64)
    assert held_out == eval_seeds(0, 64) and len(set(held_out)) == 64
    trained = {s for step in range(200) for s in step_seeds(0, step, 4)}
    assert not trained & set(held_out)
    assert eval_seeds(1, 64) != held_out


@given(seed=st.integers(-(2**63), 2**63), step=st.integers(0, 10**9), count=st.integers(1, 64))
def test_eval_and_training_seeds_cannot_collide(seed: int, step: int, count: int) -> None:
    """Disjoint by construction, not by luck: training draws below HELD_OUT_SEEDS, the
    evaluation at or above it, for any run seed and any step."""
    assert all(0 <= s < HELD_OUT_SEEDS for s in step_seeds(seed, step, count))
    assert all(HELD_OUT_SEEDS <= s < 2 * HELD_OUT_SEEDS for s in eval_seeds(seed, count))


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


def _eval_run(cfg: dict, run_dir: Path) -> tuple[EventAccumulator, dict[int, dict[int, bool]]]:
    """Train ``cfg``; its event file and each evaluation's outcomes by scenario seed."""
    train(cfg, run_dir=run_dir)
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    outcomes = {}
    for event in acc.Tensors("eval/successes/text_summary"):
        text = event.tensor_proto.string_val[0].decode().strip("`\n")
        outcomes[event.step] = {int(seed): bool(ok) for seed, ok in json.loads(text).items()}
    return acc, outcomes


def _check_paired(acc: EventAccumulator, outcomes: dict[int, dict[int, bool]], seed: int) -> None:
    """Every evaluation logs its outcomes on the held-out seeds and the paired comparison with
    the first, which agrees with the outcomes and with ``eval/success``."""
    steps = [e.step for e in acc.Scalars("eval/success")]
    assert sorted(outcomes) == steps
    first = outcomes[steps[0]]
    for name in ("got_worse", "got_better", "mcnemar_p"):
        assert [e.step for e in acc.Scalars(f"eval/paired/{name}")] == steps
    for event in acc.Scalars("eval/success"):
        got = outcomes[event.step]
        assert sorted(got) == sorted(eval_seeds(seed, len(got)))
        assert event.value == pytest.approx(sum(got.values()) / len(got))  # float32 events
        expected = paired_metrics(first, got)
        logged = {k: acc.Scalars(k)[steps.index(event.step)].value for k in expected}
        assert logged == pytest.approx(expected)
        # what got better minus what got worse is the change in successes
        change = sum(got.values()) - sum(first.values())
        assert expected["eval/paired/got_better"] - expected["eval/paired/got_worse"] == change


def test_evaluations_are_paired_by_scenario_seed(tmp_path: Path) -> None:
    """Random listeners: the outcomes change from evaluation to evaluation, so the McNemar
    counts are not all zero."""
    cfg = {
        "agents": "scripted",
        "bot": "random",
        "scenario": {"name": "signal-v1"},
        "train": {"steps": 2, "eval_episodes": 24, "eval_every": 1},
        "logging": {"progress": False},
        "seed": 3,
    }
    acc, outcomes = _eval_run(cfg, tmp_path)
    _check_paired(acc, outcomes, seed=3)
    changed = [acc.Scalars(f"eval/paired/{k}")[-1].value for k in ("got_worse", "got_better")]
    assert sum(changed) > 0
    _, finals, status = read_session(tmp_path / "tensorboard")
    assert status == "success"
    p = acc.Scalars("eval/paired/mcnemar_p")[-1].value
    assert finals["final/eval/paired/mcnemar_p"] == pytest.approx(p)


@pytest.mark.slow
def test_tiny_model_run_logs_the_paired_comparison(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).parent))  # as test_checkpoint_trust does
    try:
        from test_train import tiny_config
    finally:
        sys.path.remove(str(Path(__file__).parent))
    cfg = tiny_config(**{"scenario.name": "signal-v1", "train.eval_episodes": 6, "train.steps": 1})
    acc, outcomes = _eval_run(cfg, tmp_path)
    assert sorted(outcomes) == [0, 1]
    _check_paired(acc, outcomes, seed=0)
    _, finals, _ = read_session(tmp_path / "tensorboard")
    assert {"final/eval/paired/got_worse", "final/eval/paired/mcnemar_p"} <= set(finals)


def test_evaluation_successes_need_binary_outcomes() -> None:
    def rollout(*successes: float | None) -> SimpleNamespace:
        records = [SimpleNamespace(seed=10 + k, success=s) for k, s in enumerate(successes)]
        return SimpleNamespace(episodes=records)

    assert evaluation_successes(rollout(1.0, 0.0)) == {10: True, 11: False}
    assert evaluation_successes(rollout(1.0, 0.5)) is None  # a fractional success
    assert evaluation_successes(rollout(None, None)) is None  # no success defined
    assert evaluation_successes(rollout()) is None
