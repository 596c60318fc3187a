"""Credit -> GRPO advantages on turn records: the credit replaces the return, then the group
normalisation of :mod:`marl.credit.advantages` runs on it.

Episode-level credit ``c_i`` (every turn of agent i in an episode shares it) is normalised per
``(group, agent)``, exactly as plain returns are: with ``grpo``,
``A_i = (c_i - mean_G c_i) / (std_G c_i + eps)`` over the G episodes of the group. With
``method="team"`` credit this reproduces plain GRPO.

Per-turn credit ``c_{i,t}`` is normalised per ``(group, agent, round)``: turn t of agent i is
compared with turn t of agent i in the other episodes of its group. (Pooling all of an agent's
turns would teach it that a turn made redundant by an earlier one was bad.)

The result goes to ``turn.advantage``; the credit itself is kept in ``turn.extras["credit"]``
for logging, and ``turn.reward`` (the episode return) is left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from marl.credit.advantages import group_advantages
from marl.credit.registry import CreditResult

if TYPE_CHECKING:
    from marl.agents.turn import TurnRecord

__all__ = ["apply_credit", "turn_credits"]


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


def apply_credit(
    turns: Sequence[TurnRecord], result: CreditResult, method: str = "grpo", **kwargs: Any
) -> list[float]:
    """Set ``turn.advantage`` from the credit, normalised within each GRPO group by the
    advantage estimator ``method`` (``grpo``, ``dr_grpo``, ``rloo``); returns the advantages.

    ``kwargs`` go to the estimator (for example ``eps``).
    """
    credits = turn_credits(turns, result)
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
    for turn, credit, advantage in zip(turns, credits, advantages):
        turn.extras["credit"] = credit
        turn.advantage = advantage
    return advantages
