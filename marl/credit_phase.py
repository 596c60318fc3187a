"""The credit phase of an iteration: returns -> (counterfactual) credit -> GRPO advantages.

``credit=team`` is plain GRPO. The counterfactual methods re-simulate each episode through a
:class:`~marl.credit.Resimulator` whose ``generate`` is the policy backend itself, so the
counterfactual episodes are batched one call per round exactly like ordinary rollouts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from statistics import fmean

from marl.agents.backends import PolicyBackend, SamplingConfig
from marl.agents.heads import head_ids, response_head
from marl.agents.prompts import prompt_ids
from marl.credit import (
    CreditConfig,
    CreditResult,
    RecordedEpisode,
    Resimulator,
    apply_credit,
    compute_credit,
    is_counterfactual,
)
from marl.credit.counterfactual import GenerationRequest
from marl.credit.registry import engine_for
from marl.rollout import RolloutResult


def backend_generate(
    backends: Mapping[str, PolicyBackend],
    policy_of: Callable[[str], str],
    sampling: SamplingConfig,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    response_prefix: bool = False,
) -> Callable[[Sequence[GenerationRequest]], list[list[str]]]:
    """The re-simulator's batched ``generate``: one backend call per policy per round. With
    ``response_prefix`` replies start with their turn's head, exactly as in the rollout."""
    calls = itertools.count()

    def generate(requests: Sequence[GenerationRequest]) -> list[list[str]]:
        out: list[list[str]] = [[] for _ in requests]
        by_policy: dict[str, list[int]] = {}
        for k, request in enumerate(requests):
            by_policy.setdefault(policy_of(request.agent), []).append(k)
        call = next(calls)
        for policy, indices in sorted(by_policy.items()):
            tokenizer = backends[policy].tokenizer
            prompts, owners = [], []
            heads: dict[int, str] = {}
            for k in indices:
                ids = prompt_ids(
                    tokenizer, requests[k].system_prompt, requests[k].observation, max_prompt_tokens
                )
                if response_prefix:
                    heads[k] = response_head(requests[k].info)
                    ids = ids + head_ids(tokenizer, heads[k])
                prompts += [ids] * requests[k].n
                owners += [k] * requests[k].n
            generations = backends[policy].generate(
                prompts, replace(sampling, n=1), seed=seed * 100_003 + call
            )
            for k, options in zip(owners, generations):
                out[k].append(heads.get(k, "") + options[0].text)
        return out

    return generate


def make_engine(
    credit: CreditConfig,
    env_factory: Callable[[], object],
    generate: Callable[[Sequence[GenerationRequest]], list[list[str]]],
) -> Resimulator | None:
    """One re-simulation engine for the whole run (its pool of env copies is reused)."""
    if not is_counterfactual(credit.name):
        return None
    return engine_for(credit, env_factory(), generate, env_factory=env_factory)


def credit_phase(
    credit: CreditConfig,
    rollout: RolloutResult,
    engine: Resimulator | None,
    advantage: str,
    bonuses: Sequence[dict[str, float]] | None = None,
) -> tuple[CreditResult, dict[str, float]]:
    """Assign credit and advantages to the rollout's turn records; returns metrics.

    ``bonuses`` (one per episode, in slot order) are the scenario's reward shaping
    (:mod:`marl.outcomes`): each agent's bonus is added to its credit (to each of its per-turn
    credits with ``credit.per_turn``) before the group normalisation."""
    episodes = [
        RecordedEpisode.from_env(s.env, episode_id=s.episode_id, group_id=s.group_id)
        for s in rollout.slots
    ]
    result = compute_credit(credit, episodes, engine=engine)
    if bonuses is not None:
        _add_bonuses(result, bonuses)
    apply_credit(rollout.turns, result, advantage)
    metrics: dict[str, float] = {}
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
