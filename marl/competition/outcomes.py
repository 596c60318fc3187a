"""The outcome of a rollout kept apart from what training adds to it: success and shaping.

``team/reward`` is always the scenario's outcome reward. The shaping schedule of the scenario's
YAML (:mod:`marl.scenarios.shaping`) adds a bonus to each agent's credit before the advantage
normalisation; it is logged under ``team/shaped_reward`` and ``shaping/<kind>/*``, so curves of
runs with different schedules stay comparable. ``team/success`` is the scenario's own notion of
success (``Rules.success``), e.g. an exact pick in signal, when it has one. Everything here is
a function of the rollout's episode records (:mod:`marl.episodes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean
from typing import Any

from marl.scenarios.shaping import shaping_bonus, shaping_scores


def episode_bonuses(rollout: Any, step: int) -> list[dict[str, float]] | None:
    """Each episode's shaping bonus per agent at iteration ``step``, in ``rollout.episodes``
    order; ``None`` when the scenario declares no shaping."""
    if not rollout.episodes:
        return None
    terms = rollout.episodes[0].shaping
    if not terms:
        return None
    replied = _replied(rollout)
    return [
        shaping_bonus(record.log, terms, step, replied.get(record.episode_id, set()))
        for record in rollout.episodes
    ]


def _replied(rollout: Any) -> dict[int, set[tuple[int, str]]]:
    """``episode id -> {(round, agent)}`` of the turns a policy generated."""
    out: dict[int, set[tuple[int, str]]] = {}
    for turn in rollout.turns:
        out.setdefault(turn.episode_id, set()).add((turn.round, turn.agent))
    return out


def outcome_metrics(
    rollout: Any, step: int, bonuses: Sequence[dict[str, float]] | None
) -> dict[str, float]:
    """``team/success``, ``team/shaped_reward`` and ``shaping/<kind>/{weight,score}``.

    Every tag the scenario can have is logged at every step, zeros included (a shaping term
    that has ended logs weight 0, not nothing)."""
    out: dict[str, float] = {}
    records = rollout.episodes
    successes = [record.success for record in records]
    if successes and all(v is not None for v in successes):
        out["team/success"] = fmean(successes)  # type: ignore[arg-type]
    if not records:
        return out
    terms = records[0].shaping
    if not terms:
        return out
    shaped = []
    for record, bonus in zip(records, bonuses or [{} for _ in records]):
        returns = record.returns
        shaped.append(fmean(returns[a] + bonus.get(a, 0.0) for a in returns))
    out["team/shaped_reward"] = fmean(shaped)
    replied = _replied(rollout)
    kinds = sorted({t.kind for t in terms})
    for kind in kinds:
        out[f"shaping/{kind}/weight"] = sum(t.weight_at(step) for t in terms if t.kind == kind)
        per_episode = []
        for record in records:
            mine = replied.get(record.episode_id, set())
            log = [t for t in record.log if (t.round, t.agent) in mine]
            scores = shaping_scores(log, [kind])[kind]
            if scores:
                per_episode.append(fmean(scores.values()))
        out[f"shaping/{kind}/score"] = fmean(per_episode) if per_episode else 0.0
    return out
