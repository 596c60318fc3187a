"""Credit -> GRPO advantages on turn records: the credit replaces the return, then the group
normalisation of :mod:`marl.credit.advantages` runs on it.

Episode-level credit ``c_i`` (every turn of agent i in an episode shares it) is normalised per
``(group, agent)``, exactly as plain returns are: with ``grpo``,
``A_i = (c_i - mean_G c_i) / (std_G c_i + eps)`` over the G episodes of the group. With
``method="team"`` credit this reproduces plain GRPO.

Per-turn credit ``c_{i,t}`` is normalised per ``(group, agent, round)``: turn t of agent i is
compared with turn t of agent i in the other episodes of its group. (Pooling all of an agent's
turns would teach it that a turn made redundant by an earlier one was bad.)

Turn-level estimators (``marshal``, scope ``"turn"``) value each turn instead of each episode:
with episode credit, turn t of agent i is worth its reward-to-go ``G_{i,t}`` (the rewards of
agent i from round t to the end, ``turn.extras["reward_to_go"]``, filled by the rollout) plus
the agent's credit minus its return (the shaping bonus, or a counterfactual method's
correction; 0 under ``credit=team`` without shaping); with per-turn credit, the per-turn
credit itself. Each turn is its own entry of the ``(group, agent)`` column.

The role estimator ``rae`` (scope ``"role"``) subtracts a per-role baseline kept across
iterations by a :class:`~marl.credit.advantages.RoleBaselines` that the caller owns; a role is
``(game, agent)``.

The result goes to ``turn.advantage``; the credit itself is kept in ``turn.extras["credit"]``
for logging, and ``turn.reward`` (the episode return) is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from marl.credit.advantages import RoleBaselines, advantage_scope, group_advantages
from marl.credit.registry import CreditResult
from marl.protocols.turn import TurnRecord

__all__ = ["REWARD_TO_GO", "apply_credit", "turn_credits", "turn_values"]

REWARD_TO_GO = "reward_to_go"  # turn.extras key: the agent's rewards from this round to the end


def turn_credits(turns: Sequence[TurnRecord], result: CreditResult) -> list[float]:
    """The credit of each turn record: its turn's per-turn credit if ``result`` has them, else
    its agent's episode credit. Turns are matched to episodes by ``episode_id``."""
    index = {eid: e for e, eid in enumerate(result.episode_ids)}
    if len(index) != len(result.episode_ids):
        raise ValueError(f"credit result has duplicate episode ids: {result.episode_ids}")
    out = []
    for turn in turns:
        e = index.get(turn.episode_id)
        if e is None:
            raise ValueError(
                f"turn of agent {turn.agent!r} belongs to episode {turn.episode_id}, which has "
                f"no credit (episodes with credit: {sorted(index)})"
            )
        if result.per_turn is not None:
            value = result.per_turn[e].get((turn.round, turn.agent))
            if value is None:
                raise ValueError(
                    f"no per-turn credit for agent {turn.agent!r}, round {turn.round}, "
                    f"episode {turn.episode_id}"
                )
        else:
            value = result.credit[e].get(turn.agent)
            if value is None:
                raise ValueError(f"no credit for agent {turn.agent!r} in episode {turn.episode_id}")
        out.append(float(value))
    return out


def turn_values(
    turns: Sequence[TurnRecord], credits: Sequence[float], per_turn: bool
) -> list[float]:
    """The value of each turn for a turn-level estimator: its per-turn credit when ``per_turn``,
    else ``reward_to_go + credit - reward`` (see the module docstring)."""
    if per_turn:
        return [float(c) for c in credits]
    out = []
    for turn, credit in zip(turns, credits):
        togo = turn.extras.get(REWARD_TO_GO)
        if togo is None:
            raise ValueError(
                f"turn of agent {turn.agent!r} (round {turn.round}, episode {turn.episode_id}) "
                f"has no extras[{REWARD_TO_GO!r}]: turn-level advantages need the per-round "
                "rewards the rollout records"
            )
        out.append(float(togo) + float(credit) - float(turn.reward))
    return out


def apply_credit(
    turns: Sequence[TurnRecord],
    result: CreditResult,
    method: str = "grpo",
    *,
    baselines: RoleBaselines | None = None,
    game: str = "",
    **kwargs: Any,
) -> list[float]:
    """Set ``turn.advantage`` from the credit with the advantage estimator ``method`` (``grpo``,
    ``dr_grpo``, ``rloo``: normalised within each GRPO group; ``marshal``: per turn; ``rae``:
    against the role baselines ``baselines``, roles ``(game, agent)``); returns the advantages.

    ``kwargs`` go to the estimator (for example ``eps``).
    """
    credits = turn_credits(turns, result)
    scope = advantage_scope(method)
    if scope == "role":
        if baselines is None:
            raise ValueError(
                f"advantage estimator {method!r} keeps a baseline per role: pass "
                "baselines=RoleBaselines(...) (the trainer owns one)"
            )
        if result.per_turn is not None:
            episodes: list[Any] = [(t.episode_id, t.round) for t in turns]
        else:
            episodes = [t.episode_id for t in turns]
        advantages = baselines.advantages(
            credits, [(game, t.agent) for t in turns], episode_ids=episodes
        )
        return _store(turns, credits, advantages)
    if scope == "turn":
        values = turn_values(turns, credits, result.per_turn is not None)
        advantages = group_advantages(
            values, [t.group_id for t in turns], [t.agent for t in turns], method, **kwargs
        )
        return _store(turns, credits, advantages)
    if result.per_turn is not None:
        columns = [f"{t.agent}@{t.round}" for t in turns]  # '@' never occurs in agent names
    else:
        columns = [t.agent for t in turns]
    advantages = group_advantages(
        credits,
        [t.group_id for t in turns],
        columns,
        method,
        episode_ids=[t.episode_id for t in turns],
        **kwargs,
    )
    return _store(turns, credits, advantages)


def _store(
    turns: Sequence[TurnRecord], credits: Sequence[float], advantages: list[float]
) -> list[float]:
    for turn, credit, advantage in zip(turns, credits, advantages):
        turn.extras["credit"] = credit
        turn.advantage = advantage
    return advantages
