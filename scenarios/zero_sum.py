"""What the zero-sum games share: the win/draw/loss contract and a defensive move parser.

The contract (every built-in zero-sum game and every TextArena game hosted by the adapter keeps
it, with their shipped YAML): an episode's per-agent returns sum to zero; the agent with a
positive return won, an agent with a negative return lost, and all returns zero is a draw.
:func:`outcomes` reads it off ``env.returns``.

The shipped YAML sets ``reward.cooperation: 0`` and ``reward.malformed_penalty: 0``: an invalid
move is played as the game's fallback move instead (Kuhn Poker: check, or fold; bargaining: a
wasted turn), so it costs what the game makes it cost and the returns stay zero-sum. With two
players and cooperation 0 a return is the agent's payoff minus its opponent's
(docs/scenarios.md, "Rewards"), so it is twice the agent's own zero-sum payoff.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

Outcome = Literal["win", "draw", "loss"]
TOLERANCE = 1e-9  # returns are sums of floats; |r| below this is a tie


def outcome(own: float, other: float, tolerance: float = TOLERANCE) -> Outcome:
    """The one rule for who won: ``win`` when ``own`` exceeds ``other`` by more than
    ``tolerance``, ``loss`` when it falls short by more, else ``draw``. The league, ``marl eval``
    and :func:`outcomes` (``other`` = 0: a zero-sum return against the zero of a tie) all use it.
    """
    if own - other > tolerance:
        return "win"
    if other - own > tolerance:
        return "loss"
    return "draw"


def outcomes(returns: Mapping[str, float], tolerance: float = TOLERANCE) -> dict[str, Outcome]:
    """``win``/``draw``/``loss`` for each agent from an episode's returns.

    ``win`` for a positive return, ``loss`` for a negative one, ``draw`` for zero (within
    ``tolerance``). Raises ``ValueError`` when the returns are not finite or do not sum to zero,
    which happens only when a run changed the shipped YAML (a malformed penalty, a
    cooperation coefficient above 0 with non-zero-sum payoffs).
    """
    values = list(returns.values())
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"returns must be finite, got {dict(returns)}")
    if abs(sum(values)) > max(tolerance, 1e-6 * sum(abs(v) for v in values)):
        raise ValueError(f"returns do not sum to zero, so no zero-sum outcome: {dict(returns)}")
    return {agent: outcome(r, 0.0, tolerance) for agent, r in returns.items()}


def is_zero_sum(spec: Any) -> bool:
    """Whether episodes of the scenario ``spec`` keep the contract: its rules declare zero-sum
    payoffs (``ScenarioInfo.zero_sum``), the malformed penalty is 0 and cooperation is below 1
    (at 1 every agent gets the team mean, which is 0)."""
    from marl.scenarios.rules import RULES

    return (
        bool(RULES[spec.rules].info.zero_sum)
        and spec.malformed_penalty == 0
        and spec.cooperation < 1
    )


_WORD = re.compile(r"[a-z]+")


def pick_word(text: str | None, words: Iterable[str]) -> str | None:
    """The one word of ``words`` that ``text`` names, or ``None``.

    Case-insensitive and whole words only (``bet`` is not found in ``better``); brackets,
    quotes and punctuation around it are ignored, so ``[Bet]``, ``**bet**`` and ``I bet.`` all
    name ``bet``. Text naming two different words of the set (``check or bet``) names none.
    Never raises, whatever ``text`` holds.
    """
    if not isinstance(text, str):
        return None
    wanted = {w.lower() for w in words}
    found = {w for w in _WORD.findall(text[:2000].lower()) if w in wanted}
    return found.pop() if len(found) == 1 else None
