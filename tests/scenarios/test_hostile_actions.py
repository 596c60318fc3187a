"""A completion never crashes an environment, and a step that fails leaves it unchanged.

Every built-in scenario's action parsing is fuzzed with action values a model may write (huge,
negative and non-ASCII numbers, option words, prose), both through ``env.step`` (markup, then the
rules) and through ``Rules.step`` directly. A scenario whose rules raise shows that a failed
step is transactional: a retry delivers that round's messages once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import marl
from marl.scenarios.builtin.spotlight import WORDS
from marl.scenarios.rules import RULES, RoundResult, Rules, register_rules

BUILTIN = marl.list_scenarios()

digits = st.sampled_from(["0", "1", "7", "9", "٣", "𝟕", "߀"])  # ASCII, Arabic-Indic, NKo...
number = st.builds(
    lambda sign, d, n, tail: sign + d * n + tail,
    st.sampled_from(["", "-", "+", "0x", "1e"]),
    digits,
    st.sampled_from([1, 2, 18, 19, 4301, 5000]) | st.integers(1, 6000),
    st.sampled_from(["", ".5", " coins", "\n", "7" * 30]),
)
word = st.sampled_from([*WORDS, "wait", "", " ", "APPLE", "apple river"])
action_value = (
    number
    | word
    | st.text(max_size=60)
    | st.lists(number | word | st.text(max_size=8), max_size=6).map(" ".join)
)


def completion(value: str, say: str) -> str:
    """A completion with a message and an ACTION line holding ``value``."""
    return f"SAY: {say}\nACTION: {value}"


@pytest.mark.parametrize("name", ["spotlight", "signal", "public-goods", "relay"])
def test_an_action_of_5000_sevens_is_invalid_not_a_crash(name: str) -> None:
    env = marl.make(name)
    env.reset(seed=0)
    while env.agents:
        env.step({a: "ACTION: " + "7" * 5000 for a in env.agents})
    assert all(math.isfinite(r) for r in env.returns.values())
    acted = [t for t in env.log if t.action is not None and t.action.startswith("777")]
    assert acted, "the long number reached the rules"


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(BUILTIN),
    seed=st.integers(0, 50),
    values=st.lists(action_value, min_size=1, max_size=8),
    say=st.text(max_size=30),
)
@example(name="spotlight-v0", seed=0, values=["7" * 5000], say="")
def test_env_step_is_total_over_action_values(name: str, seed: int, values, say: str) -> None:
    env = marl.make(name)
    env.reset(seed=seed)
    i = 0
    while env.agents:
        actions = {}
        for agent in env.agents:
            actions[agent] = completion(values[i % len(values)], say)
            i += 1
        observations, rewards, *_ = env.step(actions)
        assert all(isinstance(o, str) for o in observations.values())
        assert all(math.isfinite(r) for r in rewards.values())


@settings(max_examples=150, deadline=None)
@given(
    name=st.sampled_from(BUILTIN),
    seed=st.integers(0, 50),
    values=st.lists(action_value | st.none(), min_size=1, max_size=8),
)
@example(name="spotlight-v0", seed=0, values=["7" * 5000])
def test_rules_step_is_total_over_action_values(name: str, seed: int, values) -> None:
    """The rules alone, fed values the markup parser would never produce (None, newlines...)."""
    env = marl.make(name)
    env.reset(seed=seed)
    rules = env.rules
    rounds = env.spec.rounds
    for rnd in range(rounds):
        actions = {a: values[(rnd + k) % len(values)] for k, a in enumerate(rules.agents)}
        result = rules.step(actions, rnd, rnd + 1 >= rounds)
        assert isinstance(result, RoundResult)
        numbers = [*result.individual.values(), *([result.team] if result.team is not None else [])]
        assert all(math.isfinite(x) for x in numbers)
        assert set(result.invalid) <= set(rules.agents)
        if result.done:
            break


# --- transactional steps -------------------------------------------------------------------


class _Brittle(Rules):
    """Rules that change their own state, then raise on the action ``boom`` (a buggy scenario)."""

    @dataclass(frozen=True)
    class Params:
        """No parameters."""

    def __init__(self, agents, params, rng: random.Random) -> None:
        super().__init__(agents, params, rng)
        self.history: list[dict] = []

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Record the round and draw from the RNG before failing, so a rollback must undo it."""
        self.history.append(dict(actions))
        self.rng.random()
        if "boom" in actions.values():
            raise ValueError("a bug in the rules")
        return RoundResult(individual=dict.fromkeys(self.agents, 1.0), done=last_round)


if "test-brittle" not in RULES:
    register_rules("test-brittle")(_Brittle)

BRITTLE_YAML = """
name: brittle-v0
description: Rules that raise on one action.
rules: test-brittle
agents: [alice, bob]
graph:
  topology: complete
messages:
  max_chars: 40
  max_per_round: 1
episode:
  rounds: 2
system_prompt: Test.
"""


def _fingerprint(env) -> tuple:
    """Everything observable about an environment, for before/after comparisons."""
    return (
        env.round,
        list(env.agents),
        env._observations(),
        env.returns,
        env.malformed,
        len(env.log),
        dict(env.router.counts),
        dict(env.router.edge_counts),
        list(env.rules.history),
        env.rules.rng.getstate(),
        env._state.channel_rng.getstate(),
    )


def test_a_failed_step_leaves_the_environment_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "brittle.yaml"
    path.write_text(BRITTLE_YAML)
    env = marl.make(path)
    env.reset(seed=0)
    before = _fingerprint(env)
    with pytest.raises(ValueError, match="a bug in the rules"):
        env.step({"alice": "SAY: hello bob\nACTION: go", "bob": "ACTION: boom"})
    assert _fingerprint(env) == before
    # the retry delivers alice's message once, and the episode goes on as if nothing happened
    observations, rewards, *_ = env.step(
        {"alice": "SAY: hello bob\nACTION: go", "bob": "ACTION: ok"}
    )
    assert observations["bob"].count("hello bob") == 1
    assert env.router.counts["delivered"] == 1
    assert rewards == {"alice": 1.0, "bob": 1.0}
    assert len(env.rules.history) == 1 and len(env.log) == 2


def test_a_failed_last_step_does_not_end_the_episode(tmp_path: Path) -> None:
    path = tmp_path / "brittle.yaml"
    path.write_text(BRITTLE_YAML)
    env = marl.make(path)
    env.reset(seed=0)
    env.step({"alice": "ACTION: go", "bob": "ACTION: go"})
    before = _fingerprint(env)
    with pytest.raises(ValueError):
        env.step({"alice": "SAY: last words\nACTION: boom", "bob": "ACTION: go"})
    assert _fingerprint(env) == before and "last words" not in env._observations()["bob"]
    *_, terminations, _, _ = env.step({"alice": "ACTION: go", "bob": "ACTION: go"})
    assert all(terminations.values()) and env.returns == {"alice": 2.0, "bob": 2.0}
