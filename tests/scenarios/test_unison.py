"""unison's ``scored_agents``: only the named agents' text scores, the others free-ride on the
team mean; the default (every agent scores) is unchanged, and bad values name the key."""

from __future__ import annotations

import pytest

import marl
from marl.scenarios.problems import ScenarioError

AGENTS = ["a0", "a1", "a2"]
TEXTS = {"a0": "aab", "a1": "aaaa", "a2": ""}


def rewards(**params: object) -> dict[str, float]:
    env = marl.make("unison", agents=AGENTS, params=params)
    env.reset(seed=0)
    _, reward, *_ = env.step(TEXTS)
    return reward


def test_every_agent_scores_by_default() -> None:
    # scores 2/3, 1, 0: everybody gets the team mean 5/9
    assert rewards() == pytest.approx(dict.fromkeys(AGENTS, 5 / 9))


def test_only_scored_agents_count() -> None:
    # a1's all-'a' text no longer counts: the team mean is (2/3) / 3
    assert rewards(scored_agents=["a0"]) == pytest.approx(dict.fromkeys(AGENTS, 2 / 9))
    assert rewards(scored_agents=["a1", "a2"]) == pytest.approx(dict.fromkeys(AGENTS, 1 / 3))


def test_free_riders_see_the_same_instruction() -> None:
    env = marl.make("unison", agents=AGENTS, params={"scored_agents": ["a0"]})
    observations, _ = env.reset(seed=0)
    strip = {a: o.replace(f"You are {a}.", "") for a, o in observations.items()}
    assert strip["a1"].replace("a0, a2", "a1, a2") == strip["a0"]


@pytest.mark.parametrize(
    ("value", "message"),
    [(["zz"], "'zz' not among the agents"), ("a0", "must be a list of strings or null, got 'a0'")],
)
def test_bad_scored_agents_name_the_key(value: object, message: str) -> None:
    with pytest.raises(ScenarioError, match="params.scored_agents") as error:
        marl.make("unison", agents=AGENTS, params={"scored_agents": value})
    assert message in str(error.value)
