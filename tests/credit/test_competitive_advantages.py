"""The competitive-game estimators: SPIRAL's role-conditioned advantages (``rae``, state in
RoleBaselines) and MARSHAL's turn-level advantages normalised per agent (``marshal``), against
hand-computed values, through the registry and through apply_credit on turn records."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.credit import compute_credit
from marl.credit.advantages import (
    RoleBaselines,
    advantage_scope,
    compute_advantages,
    list_advantages,
)
from marl.credit.apply import apply_credit
from marl.credit.counterfactual import RecordedEpisode
from marl.protocols.turn import TurnRecord


def test_both_are_registered_with_their_scope() -> None:
    assert {"rae", "marshal", "grpo", "dr_grpo", "rloo"} <= set(list_advantages())
    assert advantage_scope("rae") == "role"
    assert advantage_scope("marshal") == "turn"
    assert advantage_scope("grpo") == "group"


def test_rae_needs_its_state_not_a_single_group() -> None:
    with pytest.raises(ValueError, match="baseline per role"):
        compute_advantages(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]), "rae")


def test_rae_ema_by_hand() -> None:
    rae = RoleBaselines(decay=0.5)
    # batch 1: role p0 returns 2, -2, 2 (mean 2/3): first sight -> baseline = the mean
    first = rae.advantages([2.0, -2.0, 2.0, -1.0], ["p0", "p0", "p0", "p1"])
    b0 = 2.0 / 3.0
    assert first == pytest.approx([2 - b0, -2 - b0, 2 - b0, 0.0])
    # batch 2: p0 mean 4 -> b = 0.5 * 2/3 + 0.5 * 4; p1 mean 1 -> 0.5 * -1 + 0.5 * 1 = 0
    second = rae.advantages([4.0, 4.0, 1.0], ["p0", "p0", "p1"])
    b0 = 0.5 * (2.0 / 3.0) + 0.5 * 4.0
    assert second == pytest.approx([4 - b0, 4 - b0, 1.0])
    assert rae.baselines == pytest.approx({"p0": b0, "p1": 0.0})
    assert rae.updates == {"p0": 2, "p1": 2}


def test_rae_roles_are_separate_and_keyed_by_game() -> None:
    rae = RoleBaselines(decay=0.0)  # decay 0: the baseline is the batch mean of the role
    out = rae.advantages([3.0, 1.0, -3.0, -1.0], [("g", "a"), ("g", "a"), ("g", "b"), ("g", "b")])
    assert out == pytest.approx([1.0, -1.0, -1.0, 1.0])
    assert set(rae.baselines) == {"g:a", "g:b"}


def test_rae_counts_an_episode_once_and_refuses_disagreement() -> None:
    rae = RoleBaselines(decay=0.0)
    # episode 0 has three turn records of role a (return 3), episode 1 one (return 1): mean 2
    out = rae.advantages([3.0, 3.0, 3.0, 1.0], ["a"] * 4, episode_ids=[0, 0, 0, 1])
    assert out == pytest.approx([1.0, 1.0, 1.0, -1.0])
    with pytest.raises(ValueError, match="disagree"):
        rae.advantages([3.0, 2.0], ["a", "a"], episode_ids=[0, 0])


def test_rae_state_round_trip_continues_identically() -> None:
    a = RoleBaselines(decay=0.9)
    a.advantages([1.0, -1.0], ["x", "y"])
    b = RoleBaselines(decay=0.1)
    b.load_state_dict(a.state_dict())
    batch = ([5.0, -5.0, 2.0], ["x", "y", "x"])
    assert a.advantages(*batch) == b.advantages(*batch)
    with pytest.raises(ValueError, match="decay"):
        RoleBaselines(decay=1.0)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=12),
    st.floats(0.0, 0.99),
)
def test_rae_with_one_role_matches_the_formula(returns: list[float], decay: float) -> None:
    rae = RoleBaselines(decay=decay)
    rae.baselines["r"] = 7.0
    out = rae.advantages(returns, ["r"] * len(returns))
    b = decay * 7.0 + (1 - decay) * sum(returns) / len(returns)
    assert out == pytest.approx([r - b for r in returns], abs=1e-9)


def _turn(agent: str, episode: int, rnd: int, reward: float, togo: float) -> TurnRecord:
    turn = TurnRecord(
        agent=agent,
        policy_id="shared",
        group_id=0,
        episode_id=episode,
        round=rnd,
        prompt_ids=[1],
        response_ids=[2],
        logprobs=[-0.1],
        mask=[1],
        reward=reward,
    )
    turn.extras["reward_to_go"] = togo
    return turn


def _episodes(returns: list[dict[str, float]]) -> list[RecordedEpisode]:
    return [
        RecordedEpisode(seed=0, completions=[], returns=r, agents=["a", "b"], episode_id=e)
        for e, r in enumerate(returns)
    ]


def test_marshal_values_turns_by_reward_to_go_and_normalises_per_agent() -> None:
    # two episodes, two rounds; agent a: rewards per round ep0 (1, 0), ep1 (0, -1);
    # agent b is on a 10x scale: (10, 0) and (0, -10)
    turns = [
        _turn("a", 0, 0, 1.0, 1.0),
        _turn("a", 0, 1, 1.0, 0.0),
        _turn("a", 1, 0, -1.0, -1.0),
        _turn("a", 1, 1, -1.0, -1.0),
        _turn("b", 0, 0, 10.0, 10.0),
        _turn("b", 0, 1, 10.0, 0.0),
        _turn("b", 1, 0, -10.0, -10.0),
        _turn("b", 1, 1, -10.0, -10.0),
    ]
    result = compute_credit("team", _episodes([{"a": 1.0, "b": 10.0}, {"a": -1.0, "b": -10.0}]))
    result.credit = [dict(r) for r in result.returns]  # own returns as credit (no team mean)
    out = apply_credit(turns, result, "marshal")
    values = [1.0, 0.0, -1.0, -1.0]
    mean = sum(values) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
    expected = [(v - mean) / (std + 1e-6) for v in values]
    assert out[:4] == pytest.approx(expected)
    assert out[4:] == pytest.approx(expected)  # b's 10x scale is normalised away
    # the turn after the decisive reward no longer shares it (episode-level GRPO would)
    assert out[0] != out[1]
    episode_level = apply_credit(turns, result, "grpo")
    assert episode_level[0] == episode_level[1]


def test_marshal_needs_the_rollouts_reward_to_go() -> None:
    turn = _turn("a", 0, 0, 1.0, 1.0)
    del turn.extras["reward_to_go"]
    result = compute_credit("team", _episodes([{"a": 1.0, "b": 0.0}]))
    with pytest.raises(ValueError, match="reward_to_go"):
        apply_credit([turn], result, "marshal")


def test_apply_credit_rae_uses_the_callers_baselines() -> None:
    turns = [_turn("a", 0, 0, 2.0, 2.0), _turn("a", 0, 1, 2.0, 0.0), _turn("b", 0, 0, -2.0, -2.0)]
    result = compute_credit("team", _episodes([{"a": 2.0, "b": -2.0}]))
    result.credit = [dict(r) for r in result.returns]
    with pytest.raises(ValueError, match="baselines"):
        apply_credit(turns, result, "rae")
    baselines = RoleBaselines(decay=0.5)
    baselines.baselines = {"pennies:a": 0.0, "pennies:b": 4.0}
    out = apply_credit(turns, result, "rae", baselines=baselines, game="pennies")
    # a: b <- 0.5 * 0 + 0.5 * 2 = 1 -> A = 1 (both turns: one episode counted once)
    # b: b <- 0.5 * 4 + 0.5 * -2 = 1 -> A = -3
    assert out == pytest.approx([1.0, 1.0, -3.0])
