"""Reward-shaping schedules declared in a scenario's YAML (``reward.shaping``).

A dense process reward early in training, annealed to the outcome reward, as progressive reward
shaping does (seed 001 of the project; Ng et al. 1999 for shaping in general)::

    reward:
      shaping:
        - {kind: format, weight: 0.2, until_step: 20}                  # 0.2 until step 20, then 0
        - {kind: talk, weight: 0.1, from_step: 0, until_step: 10, decay: linear}

A term scores each agent's turns of an episode in [0, 1] (the mean over the agent's turns that
produced a reply), and ``weight(step) * score`` is added to that agent's credit before the GRPO
normalisation. ``step`` is the 0-based training iteration. ``decay: constant`` (default) keeps
the full weight for ``from_step <= step < until_step``; ``linear`` falls from the full weight at
``from_step`` to 0 at ``until_step``. Outside the window a term adds exactly 0. The outcome
reward is never changed: ``team/reward`` stays comparable across schedules, and the shaped
value is logged apart (``team/shaped_reward``, ``shaping/<kind>/*``).

Kinds register with :func:`register_shaping` (one registry, duplicates refused). Built in:

- ``format``: the reply parsed (markup well-formed, and a valid action when one was due).
- ``talk``:   the agent got a message delivered in a round where it could talk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from marl.protocols.registry import Registry
from marl.scenarios.problems import Problem

TurnScore = Callable[[Any], float]  # a TurnLog -> a score in [0, 1]
SHAPING_KINDS: Registry[str, TurnScore] = Registry("shaping kind")
TERM_KEYS = {"kind", "weight", "from_step", "until_step", "decay"}
MAX_TERMS = 16


def register_shaping(name: str) -> Callable[[TurnScore], TurnScore]:
    """Register a shaping kind: a function of one turn's log entry to a score in [0, 1]."""

    return SHAPING_KINDS.register(name)


@register_shaping("format")
def format_score(turn: Any) -> float:
    """1 when the reply parsed and its action (if one was due) was valid."""
    return 0.0 if (turn.parse_errors or turn.invalid_action) else 1.0


@register_shaping("talk")
def talk_score(turn: Any) -> float:
    """1 when at least one of the agent's messages was delivered this round."""
    return 1.0 if turn.delivered else 0.0


@dataclass(frozen=True)
class ShapingTerm:
    """One scheduled shaping term (fields as in the YAML; see the module docstring)."""

    kind: str
    weight: float
    until_step: int
    from_step: int = 0
    decay: Literal["constant", "linear"] = "constant"

    def weight_at(self, step: int) -> float:
        """The term's weight at training iteration ``step`` (0-based)."""
        if not self.from_step <= step < self.until_step:
            return 0.0
        if self.decay == "linear":
            return self.weight * (self.until_step - step) / (self.until_step - self.from_step)
        return self.weight


def _finite(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and abs(value) < 1e6
    )


def _step_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10**9


def validate_shaping(value: object, prefix: str = "reward.shaping") -> list[Problem]:
    """Every mistake in a ``reward.shaping`` list, each naming its key path."""
    if value is None:
        return []
    if not isinstance(value, list):
        return [Problem(prefix, "must be a list of {kind, weight, until_step} mappings")]
    if len(value) > MAX_TERMS:
        return [Problem(prefix, f"at most {MAX_TERMS} terms, got {len(value)}")]
    problems: list[Problem] = []
    for i, term in enumerate(value):
        key = f"{prefix}[{i}]"
        if not isinstance(term, Mapping):
            problems.append(Problem(key, "must be a mapping with kind, weight and until_step"))
            continue
        for name in term:
            if name not in TERM_KEYS:
                problems.append(
                    Problem(
                        f"{key}.{str(name)[:40]}",
                        f"unknown key (allowed: {', '.join(sorted(TERM_KEYS))})",
                    )
                )
        kind = term.get("kind")
        if not isinstance(kind, str) or kind not in SHAPING_KINDS:
            problems.append(
                Problem(
                    f"{key}.kind",
                    SHAPING_KINDS.unknown_message(kind, shown=repr(str(kind)[:40])),
                )
            )
        if "weight" not in term or not _finite(term["weight"]):
            problems.append(Problem(f"{key}.weight", "required: a finite number"))
        if "until_step" not in term or not _step_int(term["until_step"]):
            problems.append(Problem(f"{key}.until_step", "required: a whole number >= 0"))
        start = term.get("from_step", 0)
        if not _step_int(start):
            problems.append(Problem(f"{key}.from_step", "must be a whole number >= 0"))
        elif _step_int(term.get("until_step")) and start >= term["until_step"]:
            problems.append(
                Problem(
                    f"{key}.until_step",
                    f"must be greater than from_step ({start}), got {term['until_step']}",
                )
            )
        if term.get("decay", "constant") not in ("constant", "linear"):
            problems.append(Problem(f"{key}.decay", "must be 'constant' or 'linear'"))
    return problems


def parse_shaping(value: object) -> tuple[ShapingTerm, ...]:
    """Terms of a validated ``reward.shaping`` list (call :func:`validate_shaping` first)."""
    if not value:
        return ()
    return tuple(
        ShapingTerm(
            kind=term["kind"],
            weight=float(term["weight"]),
            until_step=int(term["until_step"]),
            from_step=int(term.get("from_step", 0)),
            decay=term.get("decay", "constant"),
        )
        for term in value  # type: ignore[union-attr]
    )


def shaping_scores(log: Sequence[Any], kinds: Sequence[str]) -> dict[str, dict[str, float]]:
    """``kind -> agent -> mean score`` over each agent's turns in ``log`` (one episode)."""
    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        score = SHAPING_KINDS[kind]
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for turn in log:
            sums[turn.agent] = sums.get(turn.agent, 0.0) + score(turn)
            counts[turn.agent] = counts.get(turn.agent, 0) + 1
        out[kind] = {a: sums[a] / counts[a] for a in sums}
    return out


def shaping_bonus(
    log: Sequence[Any],
    terms: Sequence[ShapingTerm],
    step: int,
    replied: set[tuple[int, str]] | None = None,
) -> dict[str, float]:
    """Each agent's shaping bonus for one episode at iteration ``step``:
    ``sum_k weight_k(step) * score_k(agent)`` (0 for every agent once every term has ended).

    ``replied`` holds the ``(round, agent)`` turns that really produced a reply; the others
    (idle rounds, where the runner wrote ``ACTION: wait`` for the agent) are not scored, so an
    agent's score is the share of its own replies that qualify."""
    agents = sorted({turn.agent for turn in log})
    if replied is not None:
        log = [turn for turn in log if (turn.round, turn.agent) in replied]
    bonus = dict.fromkeys(agents, 0.0)
    active = [t for t in terms if t.weight_at(step) != 0.0]
    if not active:
        return bonus
    scores = shaping_scores(log, sorted({t.kind for t in active}))
    for term in active:
        w = term.weight_at(step)
        for agent in agents:
            bonus[agent] += w * scores[term.kind].get(agent, 0.0)
    return bonus
