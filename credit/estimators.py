"""The built-in credit methods: ``team``, ``difference``, ``coma`` and ``shapley``.

Notation. An episode's recorded (factual) play is ``z``; ``R_j(z)`` is agent j's return.
``V_i(z)`` is what the play is worth to agent i: with ``value="team"`` (the default) the team
return ``(1/N) sum_j R_j(z)``, with ``value="own"`` agent i's own return ``R_i(z)``. ``z_{-i}``
is the play re-simulated with agent i's messages removed (``absent="null"``: no SAY lines;
``"default"``: the SAY lines of ``default_text``), ``z_{i<-m}`` the play with agent i's
messages re-drawn from its policy. Only messages are replaced; the ACTION line is kept
(``keep_action``). What the other agents do after the change depends on ``mode`` (see
:mod:`marl.credit.counterfactual`).

- ``team`` (plain GRPO): ``c_i = R_i(z)``, the agent's own return. No re-simulation.
- ``difference`` (difference rewards; Wolpert and Tumer 2002, "Optimal payoff functions for
  members of collectives"; Tumer and Agogino 2007): ``c_i = V_i(z) - V_i(z_{-i})``. One branch
  per agent.
- ``coma`` (a counterfactual baseline in the spirit of COMA; Foerster et al. 2018,
  "Counterfactual Multi-Agent Policy Gradients"): ``c_i = V_i(z) - (1/K) sum_k V_i(z_{i<-m_k})``
  with ``m_k`` K fresh messages from agent i's own policy. COMA marginalises agent i's action
  with a learned critic; here the critic is replaced by K re-simulations. K branches per agent.
- ``shapley`` (Shapley 1953; permutation sampling as in Castro et al. 2009): players are the
  agents, ``v(S)`` is the value of the play in which only the agents in ``S`` send messages
  (the others are absent as above); ``c_i = phi_i(v)`` computed exactly from all ``2^N``
  coalitions when ``N! <= exact_threshold`` (or when that is no dearer than sampling), else
  from ``permutations`` sampled orders (antithetic pairs by default). Efficiency holds:
  ``sum_i c_i = v(all) - v(none)``.

Per-turn credit (``per_turn=True``; counterfactual methods): each recorded turn ``(t, i)`` is
forked alone. ``difference``: ``c_{i,t} = V_i(z) - V_i(z_{-(i,t)})``; ``coma``: ``c_{i,t} =
V_i(z) - (1/K) sum_k V_i(z_{(i,t)<-m_k})``; ``shapley``: the players are the turns that sent a
message (a silent turn is a null player and gets 0), so ``sum_{i,t} c_{i,t} = v(all) -
v(none)``. An agent's episode credit is then the sum of its turns' credits.

Influence matrix ``influence[i][j]`` (every counterfactual method): how much agent i's messages
move agent j's return, measured the same way with ``V = R_j``: ``R_j(z) - R_j(z_{-i})`` for
``difference``, ``R_j(z) - mean_k R_j(z_{i<-m_k})`` for ``coma``, ``phi_i(R_j)`` for ``shapley``.

How credit feeds the update: the credit replaces the return, and the group normalisation of
:mod:`marl.credit.advantages` is applied after it, per agent within each GRPO group:
``A_i = (c_i - mean_G(c_i)) / (std_G(c_i) + eps)`` for ``grpo``. See :mod:`marl.credit.apply`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Sequence

from marl.credit.counterfactual import Branch, Intervention, RecordedEpisode, Resimulator
from marl.credit.registry import CreditConfig, CreditResult, register_credit
from marl.credit.shapley import (
    all_coalitions,
    exact_shapley,
    permutation_coalitions,
    permutation_shapley,
    sample_permutations,
)

__all__ = [
    "coma_credit",
    "difference_credit",
    "shapley_credit",
    "shapley_plan",
    "team_credit",
    "team_value",
]


def team_value(returns: dict[str, float]) -> float:
    """The team return: the mean of the agents' returns."""
    return sum(returns.values()) / len(returns) if returns else 0.0


def _value(config: CreditConfig, returns: dict[str, float], agent: str) -> float:
    return returns[agent] if config.value == "own" else team_value(returns)


def _result(method: str, episodes: Sequence[RecordedEpisode], **fields: object) -> CreditResult:
    return CreditResult(
        method=method,
        episode_ids=[ep.episode_id for ep in episodes],
        group_ids=[ep.group_id for ep in episodes],
        returns=[dict(ep.returns) for ep in episodes],
        **fields,  # type: ignore[arg-type]
    )


def _need_engine(engine: Resimulator | None, method: str) -> Resimulator:
    if engine is None:
        raise ValueError(f"credit method {method!r} needs a Resimulator (use compute_credit)")
    return engine


@register_credit("team", counterfactual=False)
def team_credit(
    episodes: Sequence[RecordedEpisode], engine: Resimulator | None, config: CreditConfig
) -> CreditResult:
    """Plain GRPO: every agent's credit is its own recorded return."""
    return _result("team", episodes, credit=[dict(ep.returns) for ep in episodes])


def _baseline_credit(
    method: str,
    episodes: Sequence[RecordedEpisode],
    engine: Resimulator,
    config: CreditConfig,
    replacement: str,
    k: int,
) -> CreditResult:
    """``difference`` (k=1, a removed message) and ``coma`` (k samples): credit = value minus
    the mean value of the k branches in which the agent's (or turn's) message was replaced."""
    branches: list[Branch] = []
    targets: list[list[tuple[int | None, str]]] = []
    for e, ep in enumerate(episodes):
        own: list[tuple[int | None, str]] = (
            list(ep.turns()) if config.per_turn else [(None, a) for a in ep.agents]
        )
        targets.append(own)
        for r, agent in own:
            rounds = None if r is None else frozenset({r})
            branches += [Branch(e, (Intervention(agent, replacement, rounds),))] * k
    outcomes = iter(engine.run(episodes, branches))

    credit, baseline, influence, per_turn = [], [], [], []
    for ep, own in zip(episodes, targets):
        c = dict.fromkeys(ep.agents, 0.0)
        infl = {i: dict.fromkeys(ep.agents, 0.0) for i in ep.agents}
        turns: dict[tuple[int, str], float] = {}
        for r, agent in own:
            rets = [next(outcomes).returns for _ in range(k)]
            base = sum(_value(config, ret, agent) for ret in rets) / k
            delta = _value(config, ep.returns, agent) - base
            c[agent] += delta
            if r is not None:
                turns[(r, agent)] = delta
            for j in ep.agents:
                infl[agent][j] += ep.returns[j] - sum(ret[j] for ret in rets) / k
        credit.append(c)
        baseline.append({a: _value(config, ep.returns, a) - c[a] for a in ep.agents})
        influence.append(infl)
        per_turn.append(turns)
    return _result(
        method,
        episodes,
        credit=credit,
        baseline=baseline,
        influence=influence,
        per_turn=per_turn if config.per_turn else None,
    )


@register_credit("difference")
def difference_credit(
    episodes: Sequence[RecordedEpisode], engine: Resimulator | None, config: CreditConfig
) -> CreditResult:
    """Difference rewards: ``V_i(z) - V_i(z_{-i})``, i's messages removed (``config.absent``)."""
    engine = _need_engine(engine, "difference")
    return _baseline_credit("difference", episodes, engine, config, config.absent, 1)


@register_credit("coma")
def coma_credit(
    episodes: Sequence[RecordedEpisode], engine: Resimulator | None, config: CreditConfig
) -> CreditResult:
    """COMA-style baseline: ``V_i(z) - mean_k V_i(z_{i<-m_k})`` over K resampled messages."""
    engine = _need_engine(engine, "coma")
    return _baseline_credit("coma", episodes, engine, config, "sample", config.samples)


def _sort_key(coalition: frozenset) -> tuple[int, list[str]]:
    return len(coalition), sorted(map(repr, coalition))


def _absent_interventions(
    players: Sequence[Hashable], coalition: frozenset, per_turn: bool, replacement: str
) -> tuple[Intervention, ...]:
    absent = [p for p in players if p not in coalition]
    if not per_turn:
        return tuple(Intervention(str(a), replacement) for a in absent)
    rounds: dict[str, set[int]] = {}
    for r, agent in absent:  # type: ignore[misc]
        rounds.setdefault(agent, set()).add(r)
    return tuple(Intervention(a, replacement, frozenset(rs)) for a, rs in rounds.items())


def shapley_plan(
    episode: RecordedEpisode, config: CreditConfig
) -> tuple[list[Hashable], list[tuple[Hashable, ...]] | None, list[frozenset]]:
    """The players of ``episode`` (agents, or ``(round, agent)`` message turns with
    ``per_turn``), the sampled orders (``None`` when exact) and the coalitions to simulate.

    The orders are drawn from a generator seeded by ``config.seed`` and the episode's ids, so a
    result is reproducible. Exact when ``n! <= exact_threshold`` or when the ``2^n`` coalitions
    are no more than the sampled orders would need anyway.
    """
    players: list[Hashable] = (
        list(episode.message_turns()) if config.per_turn else list(episode.agents)
    )
    n = len(players)
    rng = random.Random(f"{config.seed}:{episode.group_id}:{episode.episode_id}:{episode.seed}")
    orders = sample_permutations(players, config.permutations, rng, config.antithetic)
    sampled = permutation_coalitions(orders)
    if math.factorial(n) <= config.exact_threshold or 2**n <= len(sampled):
        return players, None, all_coalitions(players)
    return players, orders, sorted(sampled, key=_sort_key)


@register_credit("shapley")
def shapley_credit(
    episodes: Sequence[RecordedEpisode], engine: Resimulator | None, config: CreditConfig
) -> CreditResult:
    """Shapley values over agents (or message turns), absent players' messages removed."""
    engine = _need_engine(engine, "shapley")
    branches: list[Branch] = []
    plans = []
    for e, ep in enumerate(episodes):
        players, orders, coalitions = shapley_plan(ep, config)
        plans.append((players, orders, coalitions))
        for s in coalitions:
            branches.append(
                Branch(e, _absent_interventions(players, s, config.per_turn, config.absent))
            )
    outcomes = iter(engine.run(episodes, branches))

    credit, influence, per_turn = [], [], []
    for ep, (players, orders, coalitions) in zip(episodes, plans):
        returns = {s: next(outcomes).returns for s in coalitions}

        def phi(value_of: object, players: list = players, orders: object = orders) -> dict:
            if orders is None:
                return exact_shapley(players, value_of)  # type: ignore[arg-type]
            return permutation_shapley(players, orders, value_of)  # type: ignore[arg-type]

        by_agent = {j: phi({s: ret[j] for s, ret in returns.items()}) for j in ep.agents}
        by_team = phi({s: team_value(ret) for s, ret in returns.items()})

        def owner(player: Hashable) -> str:
            return player[1] if config.per_turn else player  # type: ignore[index,return-value]

        c = dict.fromkeys(ep.agents, 0.0)
        infl = {i: dict.fromkeys(ep.agents, 0.0) for i in ep.agents}
        turns: dict[tuple[int, str], float] = {}
        for p in players:
            i = owner(p)
            value = by_agent[i][p] if config.value == "own" else by_team[p]
            c[i] += value
            if config.per_turn:
                turns[p] = value  # type: ignore[index]
            for j in ep.agents:
                infl[i][j] += by_agent[j][p]
        credit.append(c)
        influence.append(infl)
        per_turn.append(turns)
    return _result(
        "shapley",
        episodes,
        credit=credit,
        influence=influence,
        per_turn=per_turn if config.per_turn else None,
    )
