"""The text ParallelEnv base class: episodes, observations, snapshots for counterfactual
branches, rendering, and the multi-agent semantics written down as tests."""

from __future__ import annotations

import random

import pytest

import marl
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import get_bot
from marl.scenarios.transcript import render_transcript

SCENARIO_NAMES = marl.list_scenarios()


def run(env: TextScenarioEnv, bot: str, rng: random.Random, observations=None, infos=None):
    """Play ``env`` to the end from where it stands; every step's (observations, rewards)."""
    policy = get_bot(env.spec.rules, bot)
    if observations is None:
        observations, infos = env._observations(), env._infos()
    steps = []
    while env.agents:
        actions = {a: policy(a, observations[a], infos[a], rng) for a in env.agents}
        observations, rewards, *_, infos = env.step(actions)
        steps.append((observations, rewards))
    return steps


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_same_seed_same_episode(name: str) -> None:
    env = marl.make(name)
    first = env.reset(seed=5)
    assert env.reset(seed=5) == first
    assert marl.make(name).reset(seed=5) == first, "a fresh instance deals the same"


@pytest.mark.parametrize("name", ["relay", "signal"])
def test_seeds_deal_different_episodes(name: str) -> None:
    env = marl.make(name)
    assert len({repr(env.reset(seed=s)[0]) for s in range(6)}) == 6


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_a_snapshot_restored_into_a_fresh_env_replays_after_a_different_branch(name: str) -> None:
    env = marl.make(name)
    rng = random.Random(0)
    observations, infos = env.reset(seed=2)
    policy = get_bot(env.spec.rules, "random")
    env.step({a: policy(a, observations[a], infos[a], rng) for a in env.agents})
    if not env.agents:
        pytest.skip("a one-round scenario has nothing to branch from")
    snapshot = env.snapshot()
    rng_state = rng.getstate()
    original = run(env, "random", rng)
    returns = env.returns
    # a counterfactual branch: every agent writes something else
    branches = []
    for branch_seed in range(90, 95):  # a random bot can repeat the original by chance
        env.restore(snapshot)
        branches.append(run(env, "random", random.Random(branch_seed)))
    # the original again, in the same env and in a brand-new one
    env.restore(snapshot)
    rng.setstate(rng_state)
    assert run(env, "random", rng) == original and env.returns == returns
    fresh = marl.make(name)
    fresh.restore(snapshot)
    rng.setstate(rng_state)
    assert run(fresh, "random", rng) == original and fresh.returns == returns
    assert fresh.log[-1].round == env.log[-1].round
    assert any(b != original for b in branches), "the branches really went elsewhere"


def test_restore_keeps_the_snapshot_reusable_and_independent() -> None:
    env = marl.make("relay")
    env.reset(seed=0)
    snapshot = env.snapshot()
    env.step({"alice": "SAY: 1=1\nACTION: wait", "dave": "ACTION: 1"})
    assert snapshot["state"].round == 0 and snapshot["state"].log == []
    env.restore(snapshot)
    env.step({"dave": "ACTION: 2"})
    env.restore(snapshot)
    assert env.round == 0 and env.log == [] and env.agents == env.possible_agents


def test_private_information_reaches_only_its_owner() -> None:
    env = marl.make("relay")
    observations, _ = env.reset(seed=0)
    code = env.rules.code
    for i, agent in enumerate(env.possible_agents):
        own = f"{i + 1}={code[i]}"
        assert own in observations[agent]
        for other in env.possible_agents:
            if other != agent:
                assert own not in observations[other]


def test_inbox_shows_messages_only_to_their_receivers() -> None:
    env = marl.make("signal-v0")
    env.reset(seed=0)
    observations, *_ = env.step(
        {"speaker": "SAY: the red star\nACTION: wait", "listener": "SAY: can I talk?\nACTION: 1"}
    )
    assert "[round 1] speaker: the red star" in observations["listener"]
    assert "Messages you received:" not in observations["speaker"], "the graph is one-way"
    assert "Messages you sent:\n  [round 1] to listener: the red star" in observations["speaker"]


def test_observation_and_info_describe_what_the_agent_must_do() -> None:
    env = marl.make("signal-v0")
    observations, infos = env.reset(seed=0)
    assert infos["speaker"]["needs_action"] is False and infos["listener"]["needs_action"] is False
    assert infos["speaker"]["neighbours"] == ["listener"] and infos["listener"]["neighbours"] == []
    assert "You can message: listener." in observations["speaker"]
    assert "You can message: nobody." in observations["listener"]
    action_help = env.rules.action_help("listener")
    assert "the number of the target, 1 to 4" in action_help
    assert action_help not in observations["listener"], "no action is asked for in round 1"
    observations, _, _, _, infos = env.step({})
    assert infos["listener"]["needs_action"] is True
    assert action_help in observations["listener"]
    assert "Round 2 of 2." in observations["speaker"]
    prompt = env.system_prompt("speaker")
    assert "Your role (speaker):" in prompt and "whom you can message" in prompt
    assert "Nobody can receive messages from you." in env.system_prompt("listener")


def test_a_rounds_prompts_share_everything_before_the_agents_own_part() -> None:
    """The system prompt names no contact and the shared state comes before ``You are``: the
    prompts of a round share that prefix, which the backends prefill once."""
    names = [f"p{i}" for i in range(6)]
    env = marl.make("majority-vote-v0", agents=names)
    observations, _ = env.reset(seed=0)
    assert len({env.system_prompt(a) for a in names}) == 1
    shared = {o.split("You are ")[0] for o in observations.values()}
    assert len(shared) == 1 and "Public state:" in shared.pop()
    for agent, observation in observations.items():
        own = observation.split(f"You are {agent}.")[1]
        assert "Private information:" in own and "You can message:" in own


def test_every_agent_ends_together_and_a_finished_episode_refuses_steps() -> None:
    env = marl.make("relay")
    env.reset(seed=0)
    for _ in range(3):
        _, _, terminations, truncations, _ = env.step({})
        assert not any(terminations.values()) and not any(truncations.values())
        assert env.agents == env.possible_agents
    observations, rewards, terminations, truncations, infos = env.step({})
    assert set(terminations) == set(env.possible_agents) and all(terminations.values())
    assert not any(truncations.values()) and env.agents == []
    assert "The episode is over. Your total reward:" in observations["alice"]
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step({})
    env.reset(seed=1)
    assert env.agents == env.possible_agents and env.round == 0


def test_missing_actions_count_as_empty_replies() -> None:
    env = marl.make("relay", episode={"rounds": 1})
    env.reset(seed=0)
    _, rewards, *_ = env.step({"alice": "SAY: 1=1\nACTION: wait"})
    assert env.malformed == {"alice": 0, "bob": 0, "carol": 0, "dave": 1}
    assert rewards["dave"] == pytest.approx(-0.05)


def test_reset_without_a_seed_follows_from_the_previous_one() -> None:
    a, b = marl.make("relay"), marl.make("relay")
    a.reset(seed=4)
    b.reset(seed=4)
    assert a.reset()[0] == b.reset()[0]
    assert a.episode_seed == b.episode_seed != 4


def test_render_returns_the_transcript_in_ansi_mode_only() -> None:
    env = marl.make("relay", render_mode="ansi")
    env.reset(seed=0)
    env.step({"alice": "SAY: 1=3\nACTION: wait", "dave": "ACTION: 1"})
    text = env.render()
    assert text == render_transcript(env)
    assert "--- round 1 ---" in text and "    -> bob: 1=3" in text
    assert marl.make("relay").render() is None
    with pytest.raises(ValueError, match="render_mode"):
        marl.make("relay", render_mode="human")


def test_spaces_admit_any_text_up_to_their_length() -> None:
    env = marl.make("relay")
    space = env.action_space("alice")
    assert space is env.action_space("alice"), "PettingZoo wants the same object back"
    assert space.contains("ünï\x00cödé 🚀\n") and space.contains("")
    assert not space.contains(b"bytes") and not space.contains("x" * (space.max_length + 1))
    assert env.observation_space("bob").contains(env.reset(seed=0)[0]["bob"])


def test_notices_count_rounds_like_the_header_and_a_missing_action_is_noticed_once() -> None:
    env = marl.make("majority-vote")
    env.reset(seed=0)
    ann, ben, cat, *rest = env.possible_agents
    replies = {ann: "SAY: let us agree", ben: "ACTION: zoo"}  # no ACTION line; not an option
    replies |= {a: "ACTION: park" for a in [cat, *rest]}
    observations, *_ = env.step(replies)
    assert "Round 2 of" in observations[ann]
    notices = observations[ann].split("Notices:\n")[1].split("\n")  # the observation's end
    # the missing action is noticed once
    assert notices == ["  [round 1] Your reply was malformed: no ACTION line."]
    assert "  [round 1] Your action was not valid: " in observations[ben]
    assert "Notices:" not in observations[cat]
    assert env.malformed[ann] == env.malformed[ben] == 1 and env.malformed[cat] == 0
