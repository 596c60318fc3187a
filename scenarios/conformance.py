"""Conformance checks any scenario can run: PettingZoo's own tests plus our protocol checks.

The test suite parametrizes these over every registered scenario, so a new scenario is tested
the moment it is registered. Scenario authors can call them directly::

    from marl.scenarios.conformance import check_scenario
    check_scenario("my-scenario-v0")

Zero-sum games (``ScenarioInfo.zero_sum``) also run :func:`check_zero_sum`: every pairing of
their bots, each seat, returns that sum to zero and read as win/draw/loss. Every TextArena game
the adapter supports runs the same checks: ``check_scenario("textarena", {"params": {"env_id":
env_id}})``.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from pettingzoo.test import parallel_api_test, parallel_seed_test
from pettingzoo.utils.conversions import parallel_to_aec

from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import bot_names, get_bot, play_bot_episode
from marl.scenarios.registry import make
from marl.scenarios.zero_sum import Outcome, is_zero_sum, outcomes


def play_episode(
    env: TextScenarioEnv, bot: str = "random", seed: int = 0, bot_seed: int = 0
) -> dict[str, float]:
    """Play one episode with a scripted bot for every agent; returns the episode returns."""
    return play_bot_episode(env, bot, seed, random.Random(bot_seed))


def check_pettingzoo_api(factory: Callable[[], TextScenarioEnv]) -> None:
    """PettingZoo's ``parallel_api_test`` and ``parallel_seed_test``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(factory(), num_cycles=100)
        parallel_seed_test(factory, num_cycles=100)


def check_aec_playthrough(factory: Callable[[], TextScenarioEnv], seed: int = 0) -> int:
    """Wrap with ``parallel_to_aec`` and play to the end; returns the number of AEC steps.

    PettingZoo's AEC ``api_test`` reads ``.dtype`` off observations, which text does not have,
    so it cannot be run on text scenarios; this plays the AEC wrapper through instead.
    """
    aec = parallel_to_aec(factory())
    aec.reset(seed=seed)
    rng = random.Random(seed)
    steps = 0
    for _agent in aec.agent_iter(max_iter=10_000):
        _, _, terminated, truncated, _ = aec.last()
        if terminated or truncated:
            aec.step(None)
        else:
            aec.step(f"SAY: hi\nACTION: {rng.randint(0, 9)}")
        steps += 1
    assert not aec.agents, "the AEC wrapper did not finish the episode"
    return steps


def check_messages_follow_edges(env: TextScenarioEnv, seeds: range = range(3)) -> None:
    """Every delivered message travelled along an edge of the graph of its round."""
    from marl.protocols.graphs import build_graph

    for seed in seeds:
        for bot in bot_names(env.spec.rules):
            play_episode(env, bot, seed=seed)
            for turn in env.log:
                graph = build_graph(env.possible_agents, env.spec.graph, seed, turn.round)
                for message in turn.delivered:
                    for receiver in message.receivers:
                        assert graph.has_edge(message.sender, receiver), (
                            f"{env.spec.name}: {message.sender}->{receiver} in round "
                            f"{turn.round} is not an edge"
                        )


def check_snapshot_replay(env: TextScenarioEnv, seed: int = 0, fork_round: int = 0) -> None:
    """A restored snapshot replays the same episode (random generators included)."""
    policy = get_bot(env.spec.rules, "random")
    observations, infos = env.reset(seed=seed)
    rng = random.Random(seed)
    for _ in range(fork_round):
        if not env.agents:
            break
        observations, *_, infos = env.step(
            {a: policy(a, observations[a], infos[a], rng) for a in env.agents}
        )
    snap = env.snapshot()
    rng_state = rng.getstate()

    def finish() -> tuple[list[str], dict[str, float]]:
        obs, inf = env._observations(), env._infos()
        seen = []
        while env.agents:
            obs, _, _, _, inf = env.step({a: policy(a, obs[a], inf[a], rng) for a in env.agents})
            seen.append(repr(sorted(obs.items())))
        return seen, env.returns

    first = finish()
    env.restore(snap)
    rng.setstate(rng_state)
    second = finish()
    assert first == second, f"{env.spec.name}: a restored snapshot did not replay the episode"


def play_match(
    env: TextScenarioEnv, bots: Mapping[str, str], seed: int = 0, bot_seed: int = 0
) -> dict[str, float]:
    """Play one episode with a (possibly different) scripted bot per agent; the returns."""
    policies = {a: get_bot(env.spec.rules, bots[a]) for a in env.possible_agents}
    rng = random.Random(bot_seed)
    observations, infos = env.reset(seed=seed)
    while env.agents:
        actions = {a: policies[a](a, observations[a], infos[a], rng) for a in env.agents}
        observations, _, _, _, infos = env.step(actions)
    return env.returns


def check_zero_sum(
    env: TextScenarioEnv, seeds: range = range(20)
) -> dict[tuple[str, ...], dict[Outcome, int]]:
    """Every pairing of the scenario's bots, in every seat, at each seed: the episode ends
    within its rounds, its returns sum to zero, and they read as one winner and one loser or
    a draw. Returns, per pairing (one bot name per agent, in agent order), how often the
    first agent won, drew and lost."""
    assert is_zero_sum(env.spec), (
        f"{env.spec.name}: not zero-sum as configured (rules zero_sum, malformed_penalty 0 "
        "and cooperation < 1 are all needed)"
    )
    names = bot_names(env.spec.rules)
    agents = env.possible_agents
    tally: dict[tuple[str, ...], dict[Outcome, int]] = {}
    pairings = (
        [(a, b) for a in names for b in names]
        if len(agents) == 2
        else [(n,) * len(agents) for n in names]
    )
    for pairing in pairings:
        counts: dict[Outcome, int] = {"win": 0, "draw": 0, "loss": 0}
        for seed in seeds:
            returns = play_match(env, dict(zip(agents, pairing)), seed=seed, bot_seed=seed)
            assert not env.agents, f"{env.spec.name}: the episode did not end"
            result = outcomes(returns)  # raises when they do not sum to zero
            winners = [a for a, o in result.items() if o == "win"]
            draws = [a for a, o in result.items() if o == "draw"]
            assert len(winners) <= 1 or len(agents) > 2, (env.spec.name, returns)
            if len(agents) == 2:
                assert len(draws) in (0, 2), f"{env.spec.name}: half a draw {returns}"
            counts[result[agents[0]]] += 1
        tally[pairing] = counts
    return tally


def check_scenario(name: str, overrides: Mapping[str, Any] | None = None) -> None:
    """Run every conformance check on the registered scenario ``name`` (with ``overrides``
    deep-merged into its YAML, as ``marl.make`` takes them)."""
    extra = dict(overrides or {})
    check_pettingzoo_api(lambda: make(name, **extra))
    check_aec_playthrough(lambda: make(name, **extra))
    env = make(name, **extra)
    check_messages_follow_edges(env)
    for fork in range(env.spec.rounds):
        check_snapshot_replay(env, seed=7, fork_round=fork)
    if is_zero_sum(env.spec):
        check_zero_sum(env, seeds=range(5))
