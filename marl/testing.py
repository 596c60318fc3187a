"""Conformance checks any scenario can run: PettingZoo's own tests plus our protocol checks.

The test suite parametrizes these over every registered scenario, so a new scenario is tested
the moment it is registered. Scenario authors can call them directly::

    from marl.testing import check_scenario
    check_scenario("my-scenario-v0")
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable

from pettingzoo.test import parallel_api_test, parallel_seed_test
from pettingzoo.utils.conversions import parallel_to_aec

from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import bot_names, get_bot, play_bot_episode
from marl.scenarios.registry import make


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


def check_scenario(name: str) -> None:
    """Run every conformance check on the registered scenario ``name``."""
    check_pettingzoo_api(lambda: make(name))
    check_aec_playthrough(lambda: make(name))
    env = make(name)
    check_messages_follow_edges(env)
    for fork in range(env.spec.rounds):
        check_snapshot_replay(env, seed=7, fork_round=fork)
