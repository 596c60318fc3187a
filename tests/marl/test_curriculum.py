"""``train.curriculum``: training steps play each stage's version of the scenario in order, the
held-out evaluation always plays the scenario as configured, and a bad stage is refused before
anything starts, naming its key."""

from __future__ import annotations

from typing import Any

import pytest

from marl.config import ConfigError, load_config
from marl.loop.train import check_config, train
from marl.runtime.curriculum import overrides_at, stage_at
from marl.runtime.workers import RolloutWorker

TWO = {"params": {"n_candidates": 2}}
THREE = {"params": {"n_candidates": 3, "partial_credit": False}}


def _config(curriculum: list[dict[str, Any]], steps: int = 6, **extra: Any) -> Any:
    return load_config(
        {
            "agents": "scripted",
            "bot": "rule",
            "scenario": {"name": "signal-code-v0", "overrides": {"params": {"n_colours": 3}}},
            "train": {
                "steps": steps,
                "seeds_per_step": 2,
                "group_size": 2,
                "curriculum": curriculum,
                "eval_episodes": 3,
            },
            "seed": 5,
            **extra,
        }
    )


def test_each_step_has_one_stage_and_its_overrides_merge_over_the_scenarios() -> None:
    config = _config([{"steps": 2, "overrides": TWO}, {"steps": 1, "overrides": THREE}])
    assert [stage_at(config, s) for s in range(6)] == [0, 0, 1, 2, 2, 2]
    assert overrides_at(config, 0) == {"params": {"n_colours": 3, "n_candidates": 2}}
    assert overrides_at(config, 1) == {
        "params": {"n_colours": 3, "n_candidates": 3, "partial_credit": False}
    }
    assert overrides_at(config, 2) == {"params": {"n_colours": 3}}  # the scenario as configured
    plain = _config([])
    assert stage_at(plain, 0) == 0 and overrides_at(plain, 0) == {"params": {"n_colours": 3}}


def test_training_follows_the_stages_and_the_evaluation_plays_the_task() -> None:
    config = _config([{"steps": 2, "overrides": TWO}, {"steps": 1, "overrides": THREE}])
    worker = RolloutWorker(config, None)
    played = []
    for step in range(5):
        slots = worker.slots(step, [0, 1])
        worker.rollout(step, [0, 1])
        played.append({len(slot.env.rules.candidates) for slot in slots})
    assert played == [{2}, {2}, {3}, {4}, {4}]
    evaluation = worker.evaluate(3, step=0)
    assert len(evaluation.episodes) == 3
    assert {len(env.rules.candidates) for env in worker.eval_envs.values()} == {4}


@pytest.mark.parametrize(
    ("curriculum", "steps", "message"),
    [
        ([{"steps": 0}], 6, r"train\.curriculum\[0\]\.steps: must be > 0"),
        ([{"steps": 4}, {"steps": 2}], 6, r"stages take 6 of train\.steps=6"),
        (
            [{"steps": 1}, {"steps": 1, "overrides": {"params": {"n_candidates": 99}}}],
            6,
            r"train\.curriculum\[1\]\.overrides: params\.n_candidates: must be between 2",
        ),
        (
            [{"steps": 1, "overrides": {"params": {"n_candidate": 2}}}],
            6,
            r"train\.curriculum\[0\]\.overrides: params\.n_candidate: unknown parameter",
        ),
        (
            [{"steps": 1, "overrides": {"agents": ["listener", "speaker"]}}],
            6,
            r"train\.curriculum\[0\]\.overrides: changes the agents",
        ),
    ],
)
def test_a_bad_stage_is_refused_naming_its_key(
    curriculum: list[dict[str, Any]], steps: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_config(_config(curriculum, steps))


def test_a_run_logs_the_stage_it_trained_and_says_where_each_begins(tmp_path, capsys) -> None:
    config = {
        "agents": "scripted",
        "bot": "rule",
        "scenario": {"name": "signal-code-v0"},
        "train": {
            "steps": 3,
            "seeds_per_step": 1,
            "group_size": 2,
            "curriculum": [{"steps": 2, "overrides": TWO}],
        },
        "logging": {"progress": False},
    }
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(config, run_dir=tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    stages = [(e.step, e.value) for e in events.Scalars("curriculum/stage")]
    assert stages == [(1, 0.0), (2, 0.0), (3, 1.0)]
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("curriculum:")]
    assert lines == [
        "curriculum: step 1: stage 1 of 2, overrides {'params': {'n_candidates': 2}}",
        "curriculum: step 3: stage 2 of 2, the scenario as configured",
    ]
