"""Counterfactual re-simulation where the environments are: what a rollout worker runs for the
credit phase and for the emergence metrics' listener influence.

Both replay episodes a worker played through a :class:`~marl.credit.Resimulator` that forks its
own environment copies, so they run in the worker (:meth:`marl.runtime.workers.RolloutWorker.credit`
and :meth:`~marl.runtime.workers.RolloutWorker.influence`) and send back plain data: a
:class:`~marl.credit.CreditResult` (:func:`merge_credit` joins the workers' parts; the loop's
:func:`marl.loop.credit_phase.credit_phase` turns it into advantages) and one
:data:`Effects` per episode (:mod:`marl.analysis.emergence` aggregates them into metrics).
Generation is the worker's own policy backends (:func:`backend_generate`), batched one call per
policy per round exactly like the rollout, or a scripted bot (:func:`influence_generate`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import fmean
from typing import Any

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
from marl.credit.counterfactual import Branch, Generate, GenerationRequest, Intervention
from marl.credit.registry import engine_for
from marl.episodes import as_emergence_episodes, normalise
from marl.protocols.markup import parse_completion

__all__ = [
    "Effects",
    "action_of",
    "backend_generate",
    "counterfactual_credit",
    "credit_seed",
    "discrete_energy",
    "influence_effects",
    "influence_generate",
    "make_engine",
    "merge_credit",
]


# --- counterfactual credit --------------------------------------------------------------------
def backend_generate(
    backends: Mapping[str, PolicyBackend],
    policy_of: Callable[[str], str],
    sampling: SamplingConfig,
    seed: int = 0,
    *,
    temperatures: Mapping[str, float] | None = None,
    scored: Collection[str] = frozenset(),
) -> Callable[[Sequence[GenerationRequest]], list[list[str]]]:
    """The re-simulator's batched ``generate``: one backend call per policy per round. With
    ``sampling.response_prefix`` replies start with their turn's head, and each policy samples
    at its own temperature (``temperatures``) and the ``scored`` policies choose by score,
    exactly as in the rollout. The k-th call is
    seeded ``seed * 100_003 + k``."""
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
            temperatures=temperatures,
            scored=scored,
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


# --- listener influence -----------------------------------------------------------------------
def action_of(completion: str | None) -> str:
    """The action a completion takes, normalised: its ACTION line, else its prose (as lenient
    scenarios read it); ``""`` for none."""
    if completion is None:
        return ""
    parsed = parse_completion(completion, require_action=False)
    return normalise(parsed.action or parsed.free_text or "")


def discrete_energy(factual: Sequence[str], null: Sequence[str]) -> float:
    """Half the squared L2 distance between two action distributions, unbiased from samples:
    E d(p, q) - (E d(p, p') + E d(q, q')) / 2 with d = 1 when two actions differ, each
    expectation averaged over the pairs of distinct samples. Needs at least two samples of
    each side; 0 when the two distributions are equal, 1 when both are the same point mass
    apart."""
    if len(factual) < 2 or len(null) < 2:
        raise ValueError("discrete_energy needs at least two samples of each distribution")

    def within(xs: Sequence[str]) -> float:
        return fmean(xs[i] != xs[j] for i in range(len(xs)) for j in range(i + 1, len(xs)))

    across = fmean(a != b for a in factual for b in null)
    return across - (within(factual) + within(null)) / 2


@dataclass
class _Pair:
    """One speaker->listener contact in one episode (the speaker delivered to the listener)."""

    episode: int
    speaker: str
    listener: str
    first_round: int
    action_round: int | None = None
    placebo: str = ""
    branches: list[int] = field(default_factory=list)


def _first_action_round(record: RecordedEpisode, listener: str, after: int) -> int | None:
    """The first round after ``after`` in which ``listener`` had to act (prompted, not idle)."""
    points = record.points or []
    for r in range(after + 1, len(points)):
        point = points[r]
        if listener in point.agents and listener not in point.idle:
            if point.infos.get(listener, {}).get("needs_action", True):
                return r
    return None


Effects = dict[tuple[str, str], tuple[float, float]]
"""One episode's influence: ``(speaker, listener) -> (influence_action, influence_return)`` for
every pair in which the speaker delivered to the listener."""


def influence_effects(
    episodes: Sequence[Any],
    engine: Resimulator,
    generate: Generate,
    samples: int = 2,
) -> list[Effects]:
    """Each episode's :data:`Effects`, from ``samples`` null branches per speaker (re-simulated
    through ``engine``, all episodes batched together) and one placebo sample per listener
    (see :func:`listener_influence`). Runs where environments can be built: a rollout worker
    measures the episodes it played."""
    if samples < 2:
        raise ValueError(f"emergence.influence_samples: must be >= 2, got {samples}")
    data = as_emergence_episodes(episodes)
    # fresh copies: the engine fills in their replay points, the caller's stay plain data
    records = [
        replace(ep.recorded, episode_id=i, group_id=0, points=None) for i, ep in enumerate(data)
    ]
    pairs: dict[tuple[int, str, str], _Pair] = {}
    for i, ep in enumerate(data):
        for sender, v, first_round in ep.contacts:
            key = (i, sender, v)
            if key not in pairs:
                pairs[key] = _Pair(i, sender, v, first_round)
    branches: list[Branch] = []
    branch_of: dict[tuple[int, str], list[int]] = {}
    for i, u in sorted({(p.episode, p.speaker) for p in pairs.values()}):
        start = len(branches)
        branches += [Branch(i, (Intervention(u, "null"),))] * samples
        branch_of[(i, u)] = list(range(start, len(branches)))
    outcomes = engine.run(records, branches) if branches else []
    placebo: list[tuple[_Pair, GenerationRequest]] = []
    for pair in pairs.values():
        pair.branches = branch_of[(pair.episode, pair.speaker)]
        record = records[pair.episode]
        pair.action_round = _first_action_round(record, pair.listener, pair.first_round)
        if pair.action_round is not None:
            point = record.points[pair.action_round]  # type: ignore[index]
            v = pair.listener
            request = GenerationRequest(
                "respond", v, point.system_prompts[v], point.observations[v], point.infos[v], 1
            )
            placebo.append((pair, request))
    if placebo:
        texts = generate([r for _, r in placebo])
        for (pair, _), options in zip(placebo, texts):
            pair.placebo = list(options)[0]
    effects: list[Effects] = [{} for _ in data]
    for (i, u, v), pair in pairs.items():
        record = records[pair.episode]
        v, t = pair.listener, pair.action_round
        nulls = [outcomes[b] for b in pair.branches]
        ret = record.returns.get(v, 0.0) - fmean(o.returns.get(v, 0.0) for o in nulls)
        act = 0.0
        if t is not None:
            factual = [action_of(record.completions[t].get(v)), action_of(pair.placebo)]
            null = [
                action_of(o.completions[t].get(v) if t < len(o.completions) else None)
                for o in nulls
            ]
            act = discrete_energy(factual, null)
        effects[i][(u, v)] = (act, ret)
    return effects


def influence_generate(config: Any, step: int) -> Generate | None:
    """The batched ``generate`` of influence at ``step`` for scripted agents: their bot, seeded
    by the run seed and the step (LLM agents generate with their policies: the worker's)."""
    if config.agents != "scripted":
        return None
    from marl.credit.responders import bot_generate
    from marl.scenarios.bots import get_bot
    from marl.scenarios.registry import make

    rules = make(config.scenario.name, **config.scenario.overrides).spec.rules
    return bot_generate(get_bot(rules, config.bot), seed=config.seed * 1_000_003 + step)
