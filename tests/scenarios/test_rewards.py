"""Rewards against hand-computed values: the cooperation coefficient in public_goods, signal's
partial credit, relay's fraction of digits."""

from __future__ import annotations

import random

import pytest

import marl
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import get_bot

COOPERATORS_AND_A_DEFECTOR = {"ann": "cooperator", "ben": "cooperator", "cat": "defector"}
ALL_COOPERATE = dict.fromkeys(["ann", "ben", "cat"], "cooperator")


def play(env: TextScenarioEnv, bots: dict[str, str], seed: int = 0) -> list[dict[str, float]]:
    """One episode with a named scripted bot per agent; the reward dict of every step."""
    policies = {a: get_bot(env.spec.rules, b) for a, b in bots.items()}
    rng = random.Random(seed)
    observations, infos = env.reset(seed=seed)
    steps = []
    while env.agents:
        actions = {a: policies[a](a, observations[a], infos[a], rng) for a in env.agents}
        observations, rewards, *_, infos = env.step(actions)
        steps.append(rewards)
    return steps


def public_goods(cooperation: float) -> TextScenarioEnv:
    return marl.make("public-goods", reward={"cooperation": cooperation})


def test_full_cooperation_gives_everyone_the_same_reward() -> None:
    steps = play(public_goods(1.0), COOPERATORS_AND_A_DEFECTOR)
    assert len(steps) == 4
    for rewards in steps:
        assert len(set(rewards.values())) == 1
    # contribution rounds (2nd and 4th): pot 20 * 1.6 / 3 each; team mean payoff 1.4
    assert [s["cat"] for s in steps] == pytest.approx([0.0, 1.4, 0.0, 1.4])


def test_zero_cooperation_is_zero_sum_every_round() -> None:
    steps = play(public_goods(0.0), COOPERATORS_AND_A_DEFECTOR)
    for rewards in steps:
        assert sum(rewards.values()) == pytest.approx(0.0, abs=1e-12)
    # defector: 2.0667 - 1.0667 = 1.0; cooperators: 1.0667 - (1.0667 + 2.0667) / 2 = -0.5
    assert steps[1] == pytest.approx({"ann": -0.5, "ben": -0.5, "cat": 1.0})


def test_mixed_motive_makes_defection_pay() -> None:
    half = play(public_goods(0.5), COOPERATORS_AND_A_DEFECTOR)[1]
    full = play(public_goods(1.0), COOPERATORS_AND_A_DEFECTOR)[1]
    # at 1 the defector gains nothing over the cooperators; at 0.5 it beats them
    assert full["cat"] == pytest.approx(full["ann"])
    assert half["cat"] > half["ann"] == half["ben"]
    assert half == pytest.approx({"ann": 0.45, "ben": 0.45, "cat": 1.2})
    # the dilemma: defecting alone beats cooperating at 0.5, and loses to it at 1
    coop_half = play(public_goods(0.5), ALL_COOPERATE)[1]["cat"]
    coop_full = play(public_goods(1.0), ALL_COOPERATE)[1]["cat"]
    assert coop_full == pytest.approx(1.6) and coop_half == pytest.approx(0.8)
    assert half["cat"] > coop_half
    assert full["cat"] < coop_full


def test_the_yaml_default_is_the_mixed_game() -> None:
    env = marl.make("public-goods")
    assert env.spec.cooperation == 0.5
    steps = play(env, COOPERATORS_AND_A_DEFECTOR)
    assert sum(s["cat"] for s in steps) == pytest.approx(2.4)
    assert env.returns == pytest.approx({"ann": 0.9, "ben": 0.9, "cat": 2.4})


def test_invalid_contribution_counts_as_zero_and_is_penalised() -> None:
    env = public_goods(1.0)
    env.reset(seed=0)
    env.step(dict.fromkeys(env.agents, "SAY: hi"))  # talk round: no action needed
    assert env.malformed == {"ann": 0, "ben": 0, "cat": 0}
    _, rewards, *_ = env.step({"ann": "ACTION: 10", "ben": "ACTION: 11", "cat": "ACTION: lots"})
    # share 10 * 1.6 / 3 = 5.333: payoffs ann 0.5333, ben and cat 1.5333; team mean 1.2;
    # ben and cat pay the -0.1 penalty
    assert rewards == pytest.approx({"ann": 1.2, "ben": 1.1, "cat": 1.1})
    assert env.malformed == {"ann": 0, "ben": 1, "cat": 1}
    assert "Last contributions: ann=10, ben=0, cat=0." in env.state()


# --- signal ------------------------------------------------------------------------------------


def shared(a: tuple[str, str], b: tuple[str, str]) -> int:
    return sum(x == y for x, y in zip(a, b))


def find_episode(env: TextScenarioEnv, overlap: int) -> tuple[int, int]:
    """A seed and a wrong candidate sharing exactly ``overlap`` attributes with the target."""
    for seed in range(100):
        env.reset(seed=seed)
        rules = env.rules
        target = rules.candidates[rules.target]
        for i, candidate in enumerate(rules.candidates):
            if i != rules.target and shared(candidate, target) == overlap:
                return seed, i
    raise AssertionError(f"no episode with a candidate sharing {overlap} attributes")


def pick(env: TextScenarioEnv, seed: int, index: int | str) -> dict[str, float]:
    env.reset(seed=seed)
    _, first, *_ = env.step({"speaker": "SAY: hello\nACTION: wait", "listener": "ACTION: wait"})
    assert first == {"speaker": 0.0, "listener": 0.0}
    answer = f"ACTION: {index + 1}" if isinstance(index, int) else index
    _, rewards, terminations, *_ = env.step({"speaker": "ACTION: wait", "listener": answer})
    assert all(terminations.values())
    return rewards


@pytest.mark.parametrize(
    ("partial", "overlap", "expected"),
    [
        (True, 1, 0.5),
        (True, 0, 0.0),
        (False, 1, 0.0),
        (False, 0, 0.0),
    ],
)
def test_signal_partial_credit(partial: bool, overlap: int, expected: float) -> None:
    env = marl.make("signal-v0", params={"partial_credit": partial})
    seed, wrong = find_episode(env, overlap)
    assert pick(env, seed, wrong) == {"speaker": expected, "listener": expected}
    assert pick(env, seed, env.rules.target) == {"speaker": 1.0, "listener": 1.0}


def test_signal_invalid_pick_scores_zero_and_penalises_the_listener() -> None:
    env = marl.make("signal-v0")
    rewards = pick(env, 0, "ACTION: 9")
    assert rewards == pytest.approx({"speaker": 0.0, "listener": -0.1})
    assert env.malformed == {"speaker": 0, "listener": 1}
    assert pick(env, 0, "no action at all") == pytest.approx({"speaker": 0.0, "listener": -0.1})


# --- relay -------------------------------------------------------------------------------------


@pytest.mark.parametrize("right", [0, 1, 2, 3, 4])
def test_relay_pays_the_fraction_of_digits_right(right: int) -> None:
    env = marl.make("relay")
    env.reset(seed=3)
    code = env.rules.code
    answer = "".join(str(d if i < right else (d + 1) % 10) for i, d in enumerate(code))
    for _ in range(env.spec.rounds - 1):
        _, rewards, *_ = env.step({"dave": "ACTION: 0000"})
        assert set(rewards.values()) == {0.0}, "only the last round's answer is scored"
    _, rewards, *_ = env.step({"dave": f"ACTION: {answer[:2]} {answer[2:]}"})
    assert rewards == pytest.approx(dict.fromkeys(env.possible_agents, right / 4))


def test_relay_short_and_missing_answers() -> None:
    env = marl.make("relay", episode={"rounds": 1})
    env.reset(seed=3)
    code = "".join(map(str, env.rules.code))
    _, rewards, *_ = env.step({"dave": f"ACTION: {code[:2]}"})
    assert rewards["alice"] == pytest.approx(0.5)
    env.reset(seed=3)
    _, rewards, *_ = env.step({"dave": "ACTION: I do not know"})
    assert rewards == pytest.approx({"alice": 0.0, "bob": 0.0, "carol": 0.0, "dave": -0.05})
    assert env.malformed["dave"] == 1


def test_relay_format_bot_teaches_the_markup_and_carries_no_digit() -> None:
    """The warm-up bot of bench/relay_credit.py: well-formed pieces and codes, at chance."""
    bot = get_bot("relay", "format")
    env = marl.make("relay", graph={"topology": "line", "directed": True})
    right = []
    for seed in range(200):
        observations, infos = env.reset(seed=seed)
        rng = random.Random(seed)
        while env.agents:
            replies = {a: bot(a, observations[a], infos[a], rng) for a in env.agents}
            for agent in replies:
                other = {**infos[agent], "digit": (infos[agent]["digit"] + 1) % 10}
                assert bot(agent, observations[agent], other, random.Random(seed)) == bot(
                    agent, observations[agent], infos[agent], random.Random(seed)
                ), "the reply must not depend on the agent's own digit"
            observations, rewards, *_ = env.step(replies)
        assert sum(env.malformed.values()) == 0
        right.append(round(env.returns["dave"] * 4))
    # four random digits: 0.4 right on average (binomial, sd 0.6 / sqrt(200) = 0.04)
    assert 0.25 < sum(right) / len(right) < 0.55
