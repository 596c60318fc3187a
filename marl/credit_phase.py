"""The credit phase of an iteration: returns -> (counterfactual) credit -> GRPO advantages.

``credit=team`` is plain GRPO, computed from the rollout's episode records alone. The
counterfactual methods re-simulate episodes, so they run where the environments are: each
rollout worker forks the episodes it played (:meth:`marl.workers.RolloutWorker.credit`), with a
:class:`~marl.credit.Resimulator` whose ``generate`` is the worker's own policy backends
(:func:`backend_generate`), batched one call per policy per round exactly like the rollout.
What comes back is a :class:`~marl.credit.CreditResult` (plain data); :func:`merge_credit`
joins the workers' parts, and :func:`credit_phase` turns credit into advantages and metrics.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from statistics import fmean

from marl.agents.backends import PolicyBackend, SamplingConfig
from marl.agents.generation import PromptRequest, generate_by_policy
from marl.credit import (
    CreditConfig,
    CreditResult,
    RecordedEpisode,
    Resimulator,
    compute_credit,
    is_counterfactual,
)
from marl.credit.advantages import RoleBaselines
from marl.credit.apply import apply_credit
from marl.credit.counterfactual import GenerationRequest
from marl.credit.registry import engine_for
from marl.rollout import RolloutResult


def backend_generate(
    backends: Mapping[str, PolicyBackend],
    policy_of: Callable[[str], str],
    sampling: SamplingConfig,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
) -> Callable[[Sequence[GenerationRequest]], list[list[str]]]:
    """The re-simulator's batched ``generate``: one backend call per policy per round. With
    ``sampling.response_prefix`` replies start with their turn's head, exactly as in the
    rollout. The k-th call is seeded ``seed * 100_003 + k``."""
    calls = itertools.count()

    def generate(requests: Sequence[GenerationRequest]) -> list[list[str]]:
        prompts = [
            PromptRequest(r.agent, r.system_prompt, r.observation, r.info, r.n) for r in requests
        ]
        replies, _ = generate_by_policy(
            backends,
            policy_of,
            prompts,
            sampling,
            seed * 100_003 + next(calls),
            max_prompt_tokens=max_prompt_tokens,
        )
        return [[reply.text for reply in options] for options in replies]

    return generate


def credit_seed(run_seed: int, step: int) -> int:
    """The seed of iteration ``step``'s counterfactual generation: a pure function of the run
    seed and the step, so a worker asked again (or a resumed run) draws the same samples."""
    return (run_seed + 7) * 1_000_003 + step


def make_engine(
    credit: CreditConfig,
    env_factory: Callable[[], object],
    generate: Callable[[Sequence[GenerationRequest]], list[list[str]]] | None,
) -> Resimulator | None:
    """One re-simulation engine (its pool of env copies is reused across calls); None for a
    method that does not re-simulate."""
    if not is_counterfactual(credit.name):
        return None
    return engine_for(credit, None, generate, env_factory=env_factory)  # type: ignore[arg-type]


def counterfactual_credit(
    credit: CreditConfig, episodes: Sequence[RecordedEpisode], engine: Resimulator
) -> CreditResult:
    """Credit of ``episodes`` by re-simulation through ``engine``, in the process that owns its
    environments. The episodes are copied first, so the replay points the engine adds to them
    (environment snapshots) never travel with the caller's records."""
    copies = [replace(episode, points=None) for episode in episodes]
    return compute_credit(credit, copies, engine=engine)


def merge_credit(parts: Sequence[CreditResult]) -> CreditResult:
    """One credit result from the workers' parts, episodes in the parts' order; the
    re-simulation counters are summed."""
    if not parts:
        raise ValueError("merge_credit needs at least one part")

    def joined(name: str) -> list | None:
        values = [getattr(p, name) for p in parts]
        if all(v is None for v in values):
            return None
        if any(v is None for v in values):
            raise ValueError(f"credit parts disagree on whether they have {name!r}")
        return [x for v in values for x in v]

    stats: dict[str, int] = {}
    for part in parts:
        for key, value in part.stats.items():
            stats[key] = stats.get(key, 0) + value
    return CreditResult(
        method=parts[0].method,
        episode_ids=[e for p in parts for e in p.episode_ids],
        group_ids=[g for p in parts for g in p.group_ids],
        returns=[r for p in parts for r in p.returns],
        credit=[c for p in parts for c in p.credit],
        per_turn=joined("per_turn"),
        baseline=joined("baseline"),
        influence=joined("influence"),
        stats=stats,
    )


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
    the scenario's reward shaping (:mod:`marl.outcomes`): each agent's bonus is added to its
    credit (to each of its per-turn credits with ``credit.per_turn``) before the group
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
