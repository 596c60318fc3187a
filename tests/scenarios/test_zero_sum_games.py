"""The built-in zero-sum games (kuhn-poker, bargain) and the win/draw/loss contract.

Every registered zero-sum scenario runs ``marl.scenarios.conformance.check_zero_sum`` (every
pairing of its bots in each seat: returns sum to zero, one winner or a draw). Kuhn Poker's
payoffs are checked against the hand-computed table for every deal and betting line; its rule
bot (an equilibrium strategy) must beat the random bot in both seats. The bargaining parser is
fuzzed.
"""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import marl
from marl.analysis.stats import mean_ci
from marl.scenarios.builtin.bargain import parse_bargain_action
from marl.scenarios.builtin.kuhn_poker import (
    CARDS,
    equilibrium_policy,
    kuhn_rule_bot,
    legal_moves,
)
from marl.scenarios.conformance import check_scenario, check_zero_sum, play_match
from marl.scenarios.registry import make
from marl.scenarios.zero_sum import is_zero_sum, outcomes, pick_word

ZERO_SUM = [n for n in marl.list_scenarios() if is_zero_sum(marl.make(n).spec)]


def test_the_built_in_zero_sum_games_are_registered_as_zero_sum() -> None:
    assert {"kuhn-poker-v0", "bargain-v0"} <= set(ZERO_SUM)
    # a mixed-motive game at cooperation 0 is not zero-sum: its payoffs do not sum to zero
    assert not is_zero_sum(marl.make("public-goods", reward={"cooperation": 0.0}).spec)
    # a malformed penalty breaks the contract, so the game no longer counts as zero-sum
    assert not is_zero_sum(marl.make("kuhn-poker", reward={"malformed_penalty": -0.1}).spec)


@pytest.mark.parametrize("name", ZERO_SUM)
def test_every_pairing_of_bots_gives_zero_sum_returns(name: str) -> None:
    tally = check_zero_sum(marl.make(name), seeds=range(30))
    for pairing, counts in tally.items():
        assert sum(counts.values()) == 30, pairing


@pytest.mark.parametrize("name", ["kuhn-poker", "bargain"])
def test_the_full_conformance_suite(name: str) -> None:
    check_scenario(name)


# --- the contract -------------------------------------------------------------------------------


def test_outcomes_read_the_sign_of_the_returns() -> None:
    assert outcomes({"a": 2.0, "b": -2.0}) == {"a": "win", "b": "loss"}
    assert outcomes({"a": 0.0, "b": 0.0}) == {"a": "draw", "b": "draw"}
    assert outcomes({"a": -0.2 + 1e-16, "b": 0.2}) == {"a": "loss", "b": "win"}
    with pytest.raises(ValueError, match="do not sum to zero"):
        outcomes({"a": 1.0, "b": -0.9})
    with pytest.raises(ValueError, match="finite"):
        outcomes({"a": math.nan, "b": 0.0})


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_pick_word_never_raises_and_names_one_legal_word(text: str) -> None:
    move = pick_word(text, ["check", "bet"])
    assert move in (None, "check", "bet")


def test_pick_word_cases() -> None:
    legal = ["call", "fold"]
    assert pick_word("[Call]", legal) == "call"
    assert pick_word("**FOLD**", legal) == "fold"
    assert pick_word("I will call.", legal) == "call"
    assert pick_word("call or fold", legal) is None  # two moves: ambiguous
    assert pick_word("recall", legal) is None  # not a whole word
    assert pick_word("bet", legal) is None  # not legal here
    assert pick_word(None, legal) is None


# --- Kuhn Poker ---------------------------------------------------------------------------------

# first player's net chips for each betting line, when the first player holds the higher card
# (showdown) -- a fold decides regardless of the cards
LINES = {
    ("check", "check"): 1,  # showdown for the antes
    ("bet", "call"): 2,  # showdown for ante + bet
    ("bet", "fold"): 1,  # second folds: first wins its ante
    ("check", "bet", "call"): 2,
    ("check", "bet", "fold"): -1,  # first folds
}


@pytest.mark.parametrize(
    ("line", "deal"), itertools.product(LINES, itertools.permutations(range(3), 2))
)
def test_kuhn_payoffs_match_the_hand_computed_table(
    line: tuple[str, ...], deal: tuple[int, int]
) -> None:
    env = make("kuhn-poker")
    env.reset(seed=0)
    first, second = env.possible_agents
    env.rules.cards = {first: deal[0], second: deal[1]}
    movers = []
    for move in line:
        assert not any(env.is_idle(a) for a in [env.rules.to_move()]), "the mover is not idle"
        mover = env.rules.to_move()
        other = second if mover == first else first
        assert env.is_idle(other), "the player not to move is idle"
        movers.append(mover)
        env.step({mover: f"ACTION: {move}", other: "ACTION: wait"})
    assert not env.agents, "the hand is over"
    assert movers == [first, second, first][: len(line)]
    net = LINES[line]
    if "fold" not in line and deal[0] < deal[1]:
        net = -net
    assert env.returns == {first: 2.0 * net, second: -2.0 * net}
    assert env.malformed == {first: 0, second: 0}


def test_kuhn_legal_moves() -> None:
    assert legal_moves([]) == ["check", "bet"]
    assert legal_moves(["check"]) == ["check", "bet"]
    assert legal_moves(["bet"]) == ["call", "fold"]
    assert legal_moves(["check", "bet"]) == ["call", "fold"]
    assert legal_moves(["check", "check"]) == legal_moves(["bet", "fold"]) == []


def test_kuhn_an_invalid_move_is_played_as_check_then_fold_and_counted() -> None:
    env = make("kuhn-poker")
    env.reset(seed=1)
    first, second = env.possible_agents
    env.step({first: "ACTION: raise to 5", second: "ACTION: wait"})
    assert env.rules.history == ["check"]
    env.step({second: "ACTION: bet", first: "ACTION: wait"})
    observations, *_ = env.step({first: "I think so", second: "ACTION: wait"})
    assert env.rules.history == ["check", "bet", "fold"]
    assert env.malformed == {first: 2, second: 0}
    assert env.returns == {first: -2.0, second: 2.0}  # lost its ante; no penalty on top
    assert "not valid" in observations[first]


def test_kuhn_deals_differ_by_seed_and_hide_the_other_card() -> None:
    env = make("kuhn-poker")
    deals = set()
    for seed in range(30):
        observations, infos = env.reset(seed=seed)
        first, second = env.possible_agents
        deals.add((infos[first]["card"], infos[second]["card"]))
        mine, theirs = infos[first]["card"], infos[second]["card"]
        assert f"Your card is {mine}." in observations[first]
        assert f"Your card is {theirs}" not in observations[first]
    assert len(deals) == 6, "every deal of two of the three cards occurs"
    assert all(a != b and a in CARDS and b in CARDS for a, b in deals)


def _mean_return(name: str, bots: dict[str, str], episodes: int) -> tuple[float, float]:
    env = make(name)
    agents = env.possible_agents
    values = [play_match(env, bots, seed=s, bot_seed=s)[agents[0]] for s in range(episodes)]
    return mean_ci(values)  # the mean and its 95% t-interval's half-width


def _kuhn_value(policies: list[str]) -> float:
    """The first player's exact expected net chips a hand: every deal, every move weighted by
    its probability (``rule``: the bot's equilibrium policy; ``random``: uniform over the
    legal moves, as the random bot plays)."""
    total = 0.0
    for deal in itertools.permutations(range(3), 2):

        def value(history: list[str], deal: tuple[int, ...] = deal) -> float:
            legal = legal_moves(history)
            if not legal:
                pot = 2 + sum(m in ("bet", "call") for m in history)
                if history[-1] == "fold":
                    folder = (len(history) - 1) % 2
                    return pot // 2 * (1 if folder == 1 else -1)
                return pot // 2 * (1 if deal[0] > deal[1] else -1)
            seat = len(history) % 2
            if policies[seat] == "random":
                policy = dict.fromkeys(legal, 1 / len(legal))
            else:
                policy = equilibrium_policy(CARDS[deal[seat]], history, seat == 0)
            assert set(policy) == set(legal) and sum(policy.values()) == pytest.approx(1)
            return sum(p * value([*history, m], deal) for m, p in policy.items() if p)

        total += value([]) / 6
    return total


def test_kuhn_rule_bot_is_an_equilibrium_and_beats_the_random_bot_in_either_seat() -> None:
    assert _kuhn_value(["rule", "rule"]) == pytest.approx(-1 / 18)  # the game's value
    assert _kuhn_value(["rule", "random"]) > 0.1
    assert _kuhn_value(["random", "rule"]) < -0.15


def test_kuhn_rule_bot_plays_its_policy() -> None:
    """The bot's sampled moves follow :func:`equilibrium_policy` (which the exact values use)."""
    rng = random.Random(0)
    info = {"card": "J", "history": [], "first": True, "valid_actions": ["check", "bet"]}
    bets = sum("ACTION: bet" in kuhn_rule_bot("p", "", info, rng) for _ in range(6000))
    assert abs(bets / 6000 - 1 / 6) < 0.02
    env = make("kuhn-poker")
    agents = env.possible_agents
    mean, half = _mean_return("kuhn-poker", {agents[0]: "random", agents[1]: "rule"}, 600)
    assert mean + half < 0, f"the rule bot in seat 1 wins: first player's {mean:+.3f} ± {half:.3f}"


# --- bargaining ---------------------------------------------------------------------------------


def test_bargain_parser_cases() -> None:
    counts = (3, 1, 2)
    assert parse_bargain_action("2 0 1", counts) == ("offer", (2, 0, 1))
    assert parse_bargain_action("keep 2 books, 0 hats, 1 ball.", counts) == ("offer", (2, 0, 1))
    assert parse_bargain_action("[Accept]", counts) == ("accept", None)
    assert parse_bargain_action("I accept.", counts) == ("accept", None)
    assert parse_bargain_action("I do not accept", counts) is None
    assert parse_bargain_action("accept 2 0 1", counts) is None  # ambiguous
    assert parse_bargain_action("2 0", counts) is None  # too few numbers
    assert parse_bargain_action("4 0 1", counts) is None  # more books than the pool
    assert parse_bargain_action("-1 0 1", counts) is None
    assert parse_bargain_action("1.5 0 1", counts) is None
    assert parse_bargain_action("9" * 5000 + " 0 0", counts) is None
    assert parse_bargain_action(None, counts) is None


@given(st.text(max_size=400), st.lists(st.integers(1, 5), min_size=2, max_size=5))
@settings(max_examples=400, deadline=None)
def test_bargain_parser_never_raises_and_stays_in_range(text: str, counts: list[int]) -> None:
    parsed = parse_bargain_action(text, counts)
    if parsed is None:
        return
    kind, kept = parsed
    assert kind in ("accept", "offer")
    if kind == "offer":
        assert kept is not None and len(kept) == len(counts)
        assert all(0 <= k <= c for k, c in zip(kept, counts))


@given(st.lists(st.text(max_size=60) | st.none(), min_size=6, max_size=6), st.integers(0, 50))
@settings(max_examples=100, deadline=None)
def test_bargain_any_replies_end_in_zero_sum_returns(replies: list[str | None], seed: int) -> None:
    env = make("bargain")
    env.reset(seed=seed)
    for reply in replies:
        if not env.agents:
            break
        env.step({a: reply for a in env.agents})
    assert not env.agents, "six turns end the game"
    outcomes(env.returns)  # raises unless they sum to zero


def test_bargain_a_deal_pays_each_its_own_values() -> None:
    env = make("bargain")
    env.reset(seed=4)
    first, second = env.possible_agents
    rules = env.rules
    kept = tuple(c // 2 for c in rules.counts)
    env.step({first: "SAY: a fair split\nACTION: " + " ".join(map(str, kept)), second: ""})
    observations, *_ = env.step({second: "ACTION: accept", first: ""})
    assert "a fair split" in observations[second]
    theirs = tuple(c - k for c, k in zip(rules.counts, kept))
    mine = sum(v * n for v, n in zip(rules.values[first], kept))
    other = sum(v * n for v, n in zip(rules.values[second], theirs))
    total = rules.params.total
    assert env.returns[first] == pytest.approx((mine - other) / total)
    assert env.returns[second] == pytest.approx((other - mine) / total)


def test_bargain_no_deal_is_a_draw_and_accept_needs_an_offer() -> None:
    env = make("bargain")
    env.reset(seed=2)
    first, second = env.possible_agents
    env.step({first: "ACTION: accept", second: ""})  # nothing to accept: invalid, turn wasted
    assert env.malformed[first] == 1 and env.rules.offer is None
    while env.agents:
        env.step({a: "ACTION: 0 0 0" for a in env.agents})  # offers nobody accepts
    assert env.returns == {first: 0.0, second: 0.0}
    assert outcomes(env.returns) == {first: "draw", second: "draw"}


def test_bargain_values_are_private_and_add_up_to_the_total() -> None:
    env = make("bargain")
    for seed in range(20):
        observations, infos = env.reset(seed=seed)
        rules = env.rules
        for agent in env.possible_agents:
            worth = sum(v * c for v, c in zip(rules.values[agent], rules.counts))
            assert worth == rules.params.total
        first, second = env.possible_agents
        assert observations[first] != observations[second]
        assert "Your values" in observations[first]


@pytest.mark.parametrize("seat", [0, 1])
def test_bargain_rule_bot_beats_the_random_bot_in_either_seat(seat: int) -> None:
    agents = make("bargain").possible_agents
    bots = {agents[seat]: "rule", agents[1 - seat]: "random"}
    mean, half = _mean_return("bargain", bots, episodes=300)
    rule_mean = mean if seat == 0 else -mean
    assert rule_mean - half > 0, f"rule bot's mean return {rule_mean:+.3f} ± {half:.3f}"


def test_rule_bots_in_self_play_are_deterministic_per_seed() -> None:
    for name in ("kuhn-poker", "bargain"):
        env = make(name)
        bots = dict.fromkeys(env.possible_agents, "rule")
        assert play_match(env, bots, seed=5, bot_seed=5) == play_match(
            env, bots, seed=5, bot_seed=5
        )
        rng = random.Random(0)
        assert (
            len({tuple(play_match(env, bots, seed=rng.randrange(99)).values()) for _ in range(20)})
            > 1
        )


UNAVAILABLE_PROBE = """
import sys
sys.modules["textarena"] = None  # as if the extra were not installed
import marl
from marl.scenarios.problems import ScenarioError
assert "textarena-v0" not in marl.list_scenarios()
try:
    marl.make("textarena")
except ScenarioError as exc:
    print(exc)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_without_the_extra_textarena_is_unlisted_and_named_when_asked_for() -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNAVAILABLE_PROBE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'textarena-v0' is unavailable: TextArena is not installed" in done.stdout
    assert "pip install 'marl-llm[textarena]'" in done.stdout
