"""Reward-shaping schedules: exact weights inside the window, nothing after, clear errors."""

from __future__ import annotations

import random

import pytest

from marl.scenarios.bots import play_bot_episode
from marl.scenarios.problems import ScenarioError
from marl.scenarios.registry import make
from marl.scenarios.shaping import ShapingTerm, shaping_bonus, validate_shaping

SCHEDULE = {"shaping": [{"kind": "format", "weight": 0.2, "until_step": 3}]}


def _played(bot: str, seed: int = 0):
    env = make("signal-v1", reward=SCHEDULE)
    play_bot_episode(env, bot, seed, random.Random(seed))
    replied = {(0, "speaker"), (1, "listener")}  # the turns that are not idle in signal
    return env, replied


def test_bonus_is_exactly_the_weight_until_the_last_step_and_zero_after() -> None:
    env, replied = _played("rule")  # the rule bot's replies are all well-formed: score 1
    (term,) = env.spec.shaping
    for step in range(6):
        bonus = shaping_bonus(env.log, env.spec.shaping, step, replied)
        expected = 0.2 if step < 3 else 0.0
        assert bonus == {"speaker": expected, "listener": expected}, step
        assert term.weight_at(step) == expected


def test_malformed_replies_score_zero() -> None:
    env = make("signal-v1", reward=SCHEDULE)
    env.reset(seed=1)
    env.step({"speaker": "SAY: red circle", "listener": "ACTION: wait"})
    env.step({"speaker": "ACTION: wait", "listener": "I think the first one"})  # no ACTION line
    bonus = shaping_bonus(env.log, env.spec.shaping, 0, {(0, "speaker"), (1, "listener")})
    assert bonus == {"speaker": 0.2, "listener": 0.0}


def test_linear_decay_reaches_zero_at_until_step() -> None:
    term = ShapingTerm("format", 1.0, until_step=4, from_step=0, decay="linear")
    assert [term.weight_at(s) for s in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    late = ShapingTerm("talk", 0.5, until_step=5, from_step=2)
    assert [late.weight_at(s) for s in range(6)] == [0.0, 0.0, 0.5, 0.5, 0.5, 0.0]


@pytest.mark.parametrize(
    ("schedule", "key"),
    [
        ([{"kind": "nope", "weight": 0.1, "until_step": 2}], "reward.shaping[0].kind"),
        ([{"kind": "format", "weight": float("nan"), "until_step": 2}], "reward.shaping[0].weight"),
        ([{"kind": "format", "weight": 0.1}], "reward.shaping[0].until_step"),
        ([{"kind": "format", "weight": 0.1, "until_step": 2, "from_step": 5}], "until_step"),
        ([{"kind": "format", "weight": 0.1, "until_step": 2, "decay": "cubic"}], "decay"),
        ([{"kind": "format", "weight": 0.1, "until_step": 2, "wieght": 1}], "wieght"),
        ("format", "reward.shaping"),
        ([["format"]], "reward.shaping[0]"),
    ],
)
def test_bad_schedules_name_the_key(schedule: object, key: str) -> None:
    problems = validate_shaping(schedule)
    assert problems and any(key in str(p) for p in problems), problems
    with pytest.raises(ScenarioError, match=key.replace("[", r"\[").replace("]", r"\]")):
        make("signal-v1", reward={"shaping": schedule})


def test_shaping_moves_credit_by_the_bonus_and_leaves_the_outcome_alone() -> None:
    """Through the trainer's credit phase: credit = return + bonus, team/reward unchanged."""
    from marl.competition.outcomes import episode_bonuses, outcome_metrics
    from marl.credit import CreditConfig
    from marl.loop.credit_phase import credit_phase
    from marl.protocols.turn import TurnRecord
    from marl.runtime.rollout import EpisodeSlot, RolloutResult

    slots, turns = [], []
    for e in range(2):
        env, _ = _played("rule" if e == 0 else "random", seed=e)
        slots.append(EpisodeSlot(env=env, seed=e, group_id=0, episode_id=e))
        for rnd, agent in ((0, "speaker"), (1, "listener")):
            turns.append(
                TurnRecord(
                    agent=agent, policy_id="p", group_id=0, episode_id=e,
                    round=rnd, prompt_ids=[1], response_ids=[2], logprobs=[0.0], mask=[1],
                    reward=env.returns[agent],
                )
            )  # fmt: skip
    rollout = RolloutResult(turns=turns)
    for slot in slots:
        rollout.add_episode(slot)  # the env stays here; the rollout holds its record
    for step, weight in ((0, 0.2), (3, 0.0)):
        bonuses = episode_bonuses(rollout, step)
        result, _ = credit_phase(CreditConfig(), rollout, None, "grpo", bonuses)
        for e, slot in enumerate(slots):
            for agent, value in slot.env.returns.items():
                score = 0.0 if any(
                    t.agent == agent and (t.parse_errors or t.invalid_action)
                    for t in slot.env.log if (t.round, t.agent) in {(0, "speaker"), (1, "listener")}
                ) else 1.0  # fmt: skip
                assert result.credit[e][agent] == pytest.approx(value + weight * score)
        metrics = outcome_metrics(rollout, step, bonuses)
        assert metrics["shaping/format/weight"] == weight
        assert "team/success" in metrics
