"""The credit phase of an iteration: returns -> (counterfactual) credit -> GRPO advantages.

``credit=team`` is plain GRPO, computed from the rollout's episode records alone. The
counterfactual methods re-simulate episodes, so they run where the environments are: each
rollout worker forks the episodes it played (:meth:`marl.runtime.workers.RolloutWorker.credit`,
through :mod:`marl.runtime.resimulation`). What comes back is a
:class:`~marl.credit.CreditResult` (plain data); the runtime joins the workers' parts
(:func:`~marl.runtime.resimulation.merge_credit`), and :func:`credit_phase` turns credit into
advantages and metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from marl.credit import (
    CreditConfig,
    CreditResult,
    Resimulator,
    compute_credit,
)
from marl.credit.advantages import RoleBaselines
from marl.credit.apply import apply_credit
from marl.runtime.resimulation import counterfactual_credit
from marl.runtime.rollout import RolloutResult


def credit_phase(
    credit: CreditConfig,
    rollout: RolloutResult,
    engine: Resimulator | None,
    advantage: str,
    bonuses: Sequence[dict[str, float]] | None = None,
    *,
    computed: CreditResult | None = None,
    baselines: RoleBaselines | None = None,
    game: str = "",
    trainable: Sequence[str] | None = None,
) -> tuple[CreditResult, dict[str, float]]:
    """Assign credit and advantages to the rollout's turn records; returns metrics.

    The credit is ``computed`` when given (the workers' counterfactual credit, for the
    rollout's episodes in order); otherwise it is computed here from the episode records, with
    ``engine`` for a counterfactual method. ``bonuses`` (one per episode, in episode order) are
    the scenario's reward shaping (:mod:`marl.competition.outcomes`): each agent's bonus is added to
    its credit (to each of its per-turn credits with ``credit.per_turn``) before the group
    normalisation. ``baselines`` and ``game`` serve the role estimator ``rae`` (the trainer owns
    the baselines; roles are ``(game, agent)``); its baselines are logged as
    ``credit/baseline/<agent>``. ``trainable``: only these policies' turns get advantages (the
    others, a league's frozen opponent, keep 0 and never reach a baseline or a group's
    statistics)."""
    if computed is None:
        episodes = [record.recorded for record in rollout.episodes]
        if engine is not None:
            computed = counterfactual_credit(credit, episodes, engine)
        else:
            computed = compute_credit(credit, episodes)
    elif computed.episode_ids != [record.episode_id for record in rollout.episodes]:
        raise ValueError(
            f"credit was computed for episodes {computed.episode_ids}, but the rollout has "
            f"{[record.episode_id for record in rollout.episodes]}"
        )
    result = computed
    if bonuses is not None:
        _add_bonuses(result, bonuses)
    turns = rollout.turns
    if trainable is not None:
        learning = set(trainable)
        turns = [t for t in rollout.turns if t.policy_id in learning]
    apply_credit(turns, result, advantage, baselines=baselines, game=game)
    metrics: dict[str, float] = {}
    if baselines is not None:
        prefix = f"{game}:"
        for key, value in sorted(baselines.baselines.items()):
            if key.startswith(prefix):
                metrics[f"credit/baseline/{key[len(prefix) :]}"] = value
    agents = sorted({a for c in result.credit for a in c})
    for agent in agents:
        metrics[f"credit/{agent}/mean"] = fmean(c[agent] for c in result.credit)
    advantages = [t.advantage for t in rollout.turns]
    if advantages:
        mean = fmean(advantages)
        metrics["credit/advantage_variance"] = fmean((a - mean) ** 2 for a in advantages)
    for key, value in result.stats.items():
        metrics[f"credit/sim/{key}"] = float(value)
    return result, metrics


def _add_bonuses(result: CreditResult, bonuses: Sequence[dict[str, float]]) -> None:
    for e, bonus in enumerate(bonuses):
        for agent, value in bonus.items():
            if agent in result.credit[e]:
                result.credit[e][agent] += value
            if result.per_turn is not None:
                for key in result.per_turn[e]:
                    if key[1] == agent:
                        result.per_turn[e][key] += value


def mean_influence(result: CreditResult) -> tuple[list[str], list[list[float]]] | None:
    """The influence matrix averaged over episodes: ``[i][j]`` = i's effect on j's return."""
    if not result.influence:
        return None
    agents = sorted(result.influence[0])
    matrix = [[fmean(m[i][j] for m in result.influence) for j in agents] for i in agents]
    return agents, matrix
