"""Conformance of every registered scenario, through the library checks in
``marl.scenarios.conformance``.

The parametrization is ``marl.list_scenarios()``, so a new built-in scenario is tested the moment
it is registered; ``test_a_scenario_registered_from_a_file_is_tested_too`` proves the same for a
YAML file of a user's own. The last tests prove that the checks have teeth: an environment
that breaks a contract makes them fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import marl
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.conformance import (
    check_aec_playthrough,
    check_messages_follow_edges,
    check_pettingzoo_api,
    check_scenario,
    check_snapshot_replay,
    play_episode,
)
from marl.scenarios.registry import SCENARIOS, register_scenario

SCENARIO_NAMES = marl.list_scenarios()


def test_at_least_the_three_builtin_scenarios_are_registered() -> None:
    assert {"signal-v0", "relay-v0", "public-goods-v0"} <= set(SCENARIO_NAMES)


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_pettingzoo_parallel_api_and_seed_tests(name: str) -> None:
    check_pettingzoo_api(lambda: marl.make(name))


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_aec_wrapper_plays_to_the_end(name: str) -> None:
    env = marl.make(name)
    steps = check_aec_playthrough(lambda: marl.make(name), seed=3)
    assert steps >= len(env.possible_agents), "every agent acted at least once"


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_messages_travel_only_along_edges(name: str) -> None:
    env = marl.make(name)
    check_messages_follow_edges(env, seeds=range(3))


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_snapshot_replays_from_every_fork_round(name: str) -> None:
    env = marl.make(name)
    for fork in range(env.spec.rounds):
        check_snapshot_replay(env, seed=11, fork_round=fork)


# --- a scenario of the user's own, registered from a file ---------------------------------------

USER_SCENARIOS = {
    # relay over a directed random graph that rewires every round, through a noisy channel
    "test-noisy-relay-v0": {
        "rules": "relay",
        "agents": ["p1", "p2", "p3", "p4", "p5"],
        "graph": {"topology": "random", "directed": True, "p": 0.6, "rewire_every": 1},
        "messages": {"max_chars": 20, "max_per_round": 2, "noise": {"drop": 0.2, "corrupt": 0.1}},
        "episode": {"rounds": 5},
        "params": {"reporter": "p3"},
    },
    # public goods on a star, zero-sum, with no talk rounds
    "test-star-goods-v0": {
        "rules": "public_goods",
        "agents": ["hub", "s1", "s2", "s3"],
        "graph": {"topology": "star", "center": "hub", "directed": True},
        "episode": {"rounds": 3},
        "reward": {"cooperation": 0.0},
        "params": {"endowment": 4, "multiplier": 2.0, "talk_rounds": 0},
    },
}


@pytest.fixture(params=sorted(USER_SCENARIOS))
def user_scenario(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    name = request.param
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **USER_SCENARIOS[name]}))
    assert register_scenario(path) == name
    try:
        yield name
    finally:
        SCENARIOS.pop(name, None)


def test_a_scenario_registered_from_a_file_is_tested_too(user_scenario: str) -> None:
    assert user_scenario in marl.list_scenarios()
    check_scenario(user_scenario)  # the same checks the parametrized tests above run
    env = marl.make(user_scenario)
    if env.spec.noise.active:
        play_episode(env, "rule", seed=0)
        assert env.router.counts["noise_dropped"] > 0


# --- the checks have teeth ----------------------------------------------------------------------


class ForgetfulEnv(TextScenarioEnv):
    """Restores everything except the channel's random generator."""

    def restore(self, snapshot: dict[str, Any]) -> None:
        channel = self._state.channel_rng
        super().restore(snapshot)
        self._state.channel_rng = channel


class LeakyEnv(TextScenarioEnv):
    """Delivers every message over a complete graph, whatever the scenario's graph says."""

    def step(self, actions: dict[str, Any]) -> tuple:
        import networkx as nx

        real = self._state.graph
        self._state.graph = nx.complete_graph(self.possible_agents, create_using=nx.DiGraph)
        try:
            return super().step(actions)
        finally:
            if self.agents:
                self._state.graph = real


def noisy_relay_spec() -> Any:
    return marl.make("relay", messages={"noise": {"corrupt": 0.5}}).spec


def test_snapshot_check_catches_an_environment_that_forgets_its_channel_rng() -> None:
    check_snapshot_replay(TextScenarioEnv(noisy_relay_spec()), seed=0, fork_round=1)
    with pytest.raises(AssertionError, match="did not replay"):
        check_snapshot_replay(ForgetfulEnv(noisy_relay_spec()), seed=0, fork_round=1)


def test_edge_check_catches_an_environment_that_ignores_the_graph() -> None:
    with pytest.raises(AssertionError, match="is not an edge"):
        check_messages_follow_edges(LeakyEnv(marl.make("relay").spec), seeds=range(1))
