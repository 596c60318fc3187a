"""Kuhn Poker's game tree, solved exactly: tabular policies, best responses and exploitability.

``kuhn-poker-v0`` (:mod:`marl.scenarios.builtin.kuhn_poker`, ante 1, bet 1, no table talk) is
small enough to evaluate a policy exactly instead of by sampling. Each player decides at 6
information sets, a card and the betting so far, written as OpenSpiel writes the betting:
``p`` for a pass (check or fold), ``b`` for a bet or a call.

=========  ========  =====================================  ===================
key        seat      situation                              moves (pass, bet)
=========  ========  =====================================  ===================
``"K"``    player 0  holding K, nothing bet yet             check, bet
``"Kp"``   player 1  holding K, player 0 checked            check, bet
``"Kb"``   player 1  holding K, player 0 bet                fold, call
``"Kpb"``  player 0  holding K, checked, player 1 bet       fold, call
=========  ========  =====================================  ===================

and the same for J and Q: 12 keys in all (:data:`INFO_SETS`). A :class:`TabularPolicy` gives,
at each key, the probability of the aggressive move (bet or call); one table covers both seats,
so one table is a self-play profile, and a pair of tables (seat 0's, seat 1's) is any profile.

- :func:`expected_value`: player 0's expected chips a hand, by enumerating the 6 deals and the
  betting tree (:func:`deal_value` for one deal).
- :func:`best_response`: the other seat's best response to a policy, and what it wins.
- :func:`nash_conv` and :func:`exploitability`: as OpenSpiel's ``exploitability.nash_conv`` and
  ``exploitability.exploitability``: NashConv sums, over the seats, what a best response gains
  over the profile's own value; exploitability is NashConv / 2 (two players, zero-sum). In
  chips a hand: 0 at a Nash equilibrium, 11/24 for the uniform random policy.
- :func:`average_policy`: the mixture of several policies (one drawn at random each hand) as
  one table, each policy weighted by its own chance of reaching the information set:
  fictitious play's average strategy.
- Constructors: :func:`uniform_policy`, :func:`aggressive_policy` (always bet, always call),
  :func:`passive_policy` (always check, always fold), :func:`nash_policy` (Kuhn's equilibrium
  family, the rule bot's at ``alpha`` 1/6), and :func:`policy_from`, which tabulates any
  ``prob_aggressive(key)`` callable (an LLM's normalised move probabilities, say).
- The scenario's side: :func:`info_set_of` reads the key of the seat to move from the
  environment's info for that seat; :func:`reach_info_set` plays a real environment to a key
  and returns the observation that seat is given there (what an LLM policy would be shown).

The arithmetic is generic: probabilities given as :class:`fractions.Fraction` give exact
fractions back (the tests compare them with ``==``); floats give floats.

The rules declare this module as their tree (``KuhnPokerRules.info.tree``); read it with
:func:`marl.scenarios.rules.game_tree`, which also checks :func:`supports` for the params.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from marl.scenarios.builtin.kuhn_poker import (
    CARDS,
    RULE_BOT_BLUFF,
    KuhnPokerRules,
    equilibrium_policy,
)

if TYPE_CHECKING:
    from marl.scenarios.base import TextScenarioEnv

__all__ = [
    "DEALS",
    "HISTORIES",
    "INFO_SETS",
    "MOVES",
    "RULE_BOT_ALPHA",
    "TabularPolicy",
    "aggressive_policy",
    "average_policy",
    "best_response",
    "chips_by_seat",
    "deal_value",
    "expected_value",
    "exploitability",
    "info_set_key",
    "info_set_of",
    "nash_conv",
    "nash_policy",
    "passive_policy",
    "policy_from",
    "reach_info_set",
    "seat_of",
    "supports",
    "uniform_policy",
]

# The betting at each decision point, in OpenSpiel's letters (p: check/fold, b: bet/call).
HISTORIES = ("", "p", "b", "pb")
# Every information set: card + betting, e.g. "Qpb" (player 0 holds Q, checked, faces a bet).
INFO_SETS = tuple(card + history for history in HISTORIES for card in CARDS)
# The scenario's words for (pass, aggressive) at each decision point.
MOVES = {"": ("check", "bet"), "p": ("check", "bet"), "b": ("fold", "call"), "pb": ("fold", "call")}
# The deals: (player 0's card, player 1's card), each with chance 1/6.
DEALS = tuple(itertools.permutations(CARDS, 2))
# The bluff rate alpha of the scenario's rule bot (kuhn_poker.kuhn_rule_bot).
RULE_BOT_ALPHA = RULE_BOT_BLUFF
# A bet must beat a pass by more than this to be the best response (ties go to the pass, the
# first action, as OpenSpiel's best response takes the first maximum).
TIE = 1e-12

_LETTER = {"check": "p", "fold": "p", "bet": "b", "call": "b"}
_RANK = {card: rank for rank, card in enumerate(CARDS)}


def _split(key: str) -> tuple[str, str]:
    """(card, betting) of an information-set key; a key not in :data:`INFO_SETS` is refused."""
    if key not in INFO_SETS:
        raise KeyError(f"unknown Kuhn information set {key!r}; known: {', '.join(INFO_SETS)}")
    return key[0], key[1:]


def seat_of(key: str) -> int:
    """The seat that decides at ``key``: 0 (acts first) or 1."""
    return len(_split(key)[1]) % 2


@dataclass(frozen=True)
class TabularPolicy:
    """A Kuhn Poker policy for both seats: at each information set, the probability of the
    aggressive move (bet, or call when facing a bet); the pass (check or fold) gets the rest.

    ``table`` must hold every key of :data:`INFO_SETS` and nothing else, each a real number in
    [0, 1]; otherwise :class:`ValueError` names the bad keys. It is stored read-only.
    """

    table: Mapping[str, float]

    def __post_init__(self) -> None:
        problems = [f"{key!r}: missing" for key in INFO_SETS if key not in self.table]
        problems += [
            f"{key!r}: not an information set" for key in self.table if key not in INFO_SETS
        ]
        for key in INFO_SETS:
            value = self.table.get(key, 0.0)
            real = isinstance(value, numbers.Real) and not isinstance(value, bool)
            if not (real and math.isfinite(value) and 0 <= value <= 1):
                problems.append(f"{key!r}: the probability must be in [0, 1], got {value!r}")
        if problems:
            known = ", ".join(INFO_SETS)
            raise ValueError(f"not a Kuhn tabular policy: {'; '.join(problems)} (keys: {known})")
        ordered = {key: self.table[key] for key in INFO_SETS}
        object.__setattr__(self, "table", MappingProxyType(ordered))

    def __getitem__(self, key: str) -> float:
        """The probability of the aggressive move at ``key``."""
        _split(key)
        return self.table[key]

    def moves(self, key: str) -> dict[str, float]:
        """The move distribution at ``key`` in the scenario's words, e.g.
        ``{"check": 0.75, "bet": 0.25}`` (the form of ``kuhn_poker.equilibrium_policy``)."""
        passive, aggressive = MOVES[_split(key)[1]]
        p = self.table[key]
        return {passive: 1 - p, aggressive: p}


# --------------------------------------------------------------------------- constructors


def policy_from(prob_aggressive: Callable[[str], float]) -> TabularPolicy:
    """Tabulate ``prob_aggressive(key)``, the probability of betting or calling at each key of
    :data:`INFO_SETS` (for an LLM: the mass on the aggressive move's reply, normalised over the
    two legal moves). A value outside [0, 1] is refused, naming its key."""
    return TabularPolicy({key: prob_aggressive(key) for key in INFO_SETS})


def uniform_policy() -> TabularPolicy:
    """Each legal move with probability 1/2 everywhere (the scenario's ``random`` bot)."""
    return policy_from(lambda key: 0.5)


def aggressive_policy() -> TabularPolicy:
    """Always bet, always call."""
    return policy_from(lambda key: 1.0)


def passive_policy() -> TabularPolicy:
    """Always check, always fold."""
    return policy_from(lambda key: 0.0)


def nash_policy(alpha: float = RULE_BOT_ALPHA) -> TabularPolicy:
    """Kuhn's equilibrium with bluff rate ``alpha`` in [0, 1/3], read from the rule bot's own
    :func:`~marl.scenarios.builtin.kuhn_poker.equilibrium_policy` (the default, 1/6, is the
    rule bot). Every member is worth -1/18 chip a hand to player 0."""
    if not 0 <= alpha <= 1 / 3:
        raise ValueError(f"alpha must be in [0, 1/3] (the equilibrium family), got {alpha!r}")

    def bet(key: str) -> float:
        card, history = _split(key)
        words = [("check", "bet")[h == "b"] for h in history]
        return equilibrium_policy(card, words, seat_of(key) == 0, alpha)[MOVES[history][1]]

    return policy_from(bet)


# --------------------------------------------------------------------------- the tree


def _payoff(history: str, deal: tuple[str, str]) -> int | None:
    """Player 0's net chips once the betting ``history`` is over, else ``None`` (ante 1, bet 1:
    a showdown is worth the ante, or ante + bet after a call; a fold loses the ante)."""
    showdown = 1 if _RANK[deal[0]] > _RANK[deal[1]] else -1
    return {"pp": showdown, "bb": 2 * showdown, "pbb": 2 * showdown, "bp": 1, "pbp": -1}.get(
        history
    )


def _value(history: str, deal: tuple[str, str], seats: Sequence[Callable[[str], float]]) -> float:
    """Player 0's expected chips from the node ``history`` of ``deal``, seat ``i`` betting with
    probability ``seats[i](key)``."""
    payoff = _payoff(history, deal)
    if payoff is not None:
        return payoff
    seat = len(history) % 2
    p = seats[seat](deal[seat] + history)
    return (1 - p) * _value(history + "p", deal, seats) + p * _value(history + "b", deal, seats)


def deal_value(policy0: TabularPolicy, policy1: TabularPolicy, deal: tuple[str, str]) -> float:
    """Player 0's expected chips in one ``deal`` (player 0's card, player 1's card), player 0
    playing ``policy0`` and player 1 ``policy1``."""
    if deal not in DEALS:
        raise ValueError(f"not a deal of two different cards of {CARDS}: {deal!r}")
    return _value("", deal, (policy0.__getitem__, policy1.__getitem__))


def expected_value(policy0: TabularPolicy, policy1: TabularPolicy | None = None) -> float:
    """Player 0's expected chips a hand (exact: the mean over the 6 equally likely deals),
    player 0 playing ``policy0`` and player 1 ``policy1`` (default: ``policy0``, self-play).
    Player 1's is the negative (zero-sum)."""
    policy1 = policy0 if policy1 is None else policy1
    return sum(deal_value(policy0, policy1, deal) for deal in DEALS) / len(DEALS)


def chips_by_seat(policy: TabularPolicy, opponent: TabularPolicy) -> tuple[float, float]:
    """``policy``'s expected chips a hand against ``opponent``: as player 0, and as player 1."""
    return expected_value(policy, opponent), -expected_value(opponent, policy)


def _reach(policy: TabularPolicy, seat: int, card: str, history: str) -> float:
    """The probability that ``seat``, holding ``card`` and playing ``policy``, makes its own
    moves of ``history`` (the other seat's moves and chance are not counted)."""
    reach: float = 1
    for i in range(seat, len(history), 2):
        p = policy[card + history[:i]]
        reach *= p if history[i] == "b" else 1 - p
    return reach


def average_policy(policies: Sequence[TabularPolicy]) -> TabularPolicy:
    """The policy that plays as a uniform draw of one of ``policies`` for the whole hand: at
    each information set, the policies' probabilities weighted by each one's own chance of
    making its seat's moves to that set (Kuhn's theorem: a mixture of behaviour strategies is a
    behaviour strategy of these weights; fictitious play's average strategy, Heinrich, Lanctot
    and Silver 2015). Against any opponent it wins the mean of what the policies win. Where no
    policy reaches a set, the plain mean. An empty sequence is refused."""
    if not policies:
        raise ValueError("average_policy needs at least one policy")

    def mean(key: str) -> float:
        card, history = _split(key)
        seat = seat_of(key)
        weights = [_reach(p, seat, card, history) for p in policies]
        total = sum(weights)
        if total == 0:
            return sum(p[key] for p in policies) / len(policies)
        average = sum(w * p[key] for w, p in zip(weights, policies)) / total
        return min(max(average, 0), 1)  # a float sum may round just past [0, 1]

    return policy_from(mean)


def best_response(policy: TabularPolicy, seat: int) -> tuple[TabularPolicy, float]:
    """The best response of seat ``1 - seat`` to ``policy`` played in ``seat``, and its value:
    the responder's expected chips a hand.

    The tree is walked from the deepest decisions up (player 0's ``pb`` before its opening).
    At each of the responder's information sets, each move's value sums, over the deals
    consistent with it (the responder's card, either other card for the opponent), the chance
    of the deal times the opponent's probability of reaching that betting times the value of
    the move's subtree (with the responder's deeper choices already made). The better move is
    played with probability 1 (a tie goes to the pass). The returned table holds the response
    at the responder's 6 information sets and ``policy``'s own entries at the other 6, so it is
    the whole profile: ``expected_value(policy, br)`` for ``seat`` 0.
    """
    if seat not in (0, 1):
        raise ValueError(f"seat must be 0 or 1, got {seat!r}")
    responder = 1 - seat
    sign = 1 if responder == 0 else -1  # _value is player 0's chips
    choice: dict[str, float] = {}
    seats: list[Callable[[str], float]] = [policy.__getitem__, policy.__getitem__]
    seats[responder] = choice.__getitem__
    own = [h for h in HISTORIES if len(h) % 2 == responder]
    for history in sorted(own, key=len, reverse=True):
        for card in CARDS:
            passed: float = 0
            bet: float = 0
            for deal in DEALS:
                if deal[responder] != card:
                    continue
                reach = _reach(policy, seat, deal[seat], history) / len(DEALS)
                passed += reach * sign * _value(history + "p", deal, seats)
                bet += reach * sign * _value(history + "b", deal, seats)
            choice[card + history] = 1 if bet > passed + TIE else 0
    br = policy_from(lambda key: choice[key] if seat_of(key) == responder else policy[key])
    value = expected_value(br, policy) if responder == 0 else -expected_value(policy, br)
    return br, value


def nash_conv(policy: TabularPolicy, policy1: TabularPolicy | None = None) -> float:
    """NashConv of the profile (``policy`` in seat 0, ``policy1`` in seat 1; default: ``policy``
    in both, self-play): over the two seats, the best response's value minus the seat's value
    under the profile. 0 exactly at a Nash equilibrium, positive elsewhere."""
    policy1 = policy if policy1 is None else policy1
    value0 = expected_value(policy, policy1)
    _, best0 = best_response(policy1, seat=1)  # player 0 responds to seat 1's policy
    _, best1 = best_response(policy, seat=0)  # player 1 responds to seat 0's policy
    return (best0 - value0) + (best1 + value0)


def exploitability(policy: TabularPolicy, policy1: TabularPolicy | None = None) -> float:
    """Chips a hand a best response wins over the profile, averaged over the two seats:
    :func:`nash_conv` / 2 (OpenSpiel's convention for two-player zero-sum games)."""
    return nash_conv(policy, policy1) / 2


# --------------------------------------------------------------------------- the scenario


def supports(params: Mapping[str, Any]) -> bool:
    """Whether this tree is the game ``kuhn_poker`` plays with ``params``: ante 1, bet 1 and
    no table talk (talk is information the 12 keys do not hold)."""
    p = KuhnPokerRules.Params(**params)
    return p.ante == 1 and p.bet == 1 and p.table_talk is False


def info_set_key(card: str, history: Sequence[str]) -> str:
    """The key of a decision: the mover's card (``"J"``, ``"Q"``, ``"K"``) and the betting so
    far in the scenario's words (``[]``, ``["check"]``, ``["bet"]``, ``["check", "bet"]``).
    A finished betting line or an unknown word is refused."""
    letters = []
    for move in history:
        if move not in _LETTER:
            raise ValueError(f"unknown Kuhn move {move!r} in {list(history)!r}")
        letters.append(_LETTER[move])
    key = card + "".join(letters)
    if key not in INFO_SETS:
        raise ValueError(
            f"card {card!r} with betting {list(history)!r} is no decision point of Kuhn Poker"
        )
    return key


def info_set_of(info: Mapping[str, Any]) -> str:
    """The key at which the agent whose environment info is ``info`` (``infos[agent]`` of
    ``kuhn-poker``) must move. Refused when it is not that agent's turn, or when the info
    contradicts itself (the seat by ``first`` against the betting, the legal moves)."""
    legal = list(info.get("valid_actions") or [])
    if not legal:
        raise ValueError("not this agent's turn: no legal moves in its info")
    key = info_set_key(info["card"], info["history"])
    seat = 0 if info["first"] else 1
    if seat_of(key) != seat or sorted(legal) != sorted(MOVES[key[1:]]):
        raise ValueError(
            f"inconsistent Kuhn info: seat {seat}, betting {info['history']!r}, legal {legal!r}"
        )
    return key


def reach_info_set(
    env: TextScenarioEnv, key: str, seed: int = 0, max_tries: int = 1000
) -> tuple[str, dict[str, Any]]:
    """Play the ``kuhn-poker`` environment ``env`` to the information set ``key``; returns the
    observation and info of the seat to move there, exactly as the environment renders them.

    The episode seed is the first from ``seed`` on whose deal gives the mover the key's card
    (the opponent's card is hidden from the mover, so any deal with that card renders the
    same), and the betting is played as ``ACTION:`` replies."""
    if env.spec.rules != "kuhn_poker":
        raise ValueError(f"reach_info_set needs a kuhn_poker environment, got {env.spec.rules!r}")
    card, history = _split(key)
    mover = env.possible_agents[seat_of(key)]
    for episode_seed in range(seed, seed + max_tries):
        observations, infos = env.reset(seed=episode_seed)
        if infos[mover]["card"] == card:
            break
    else:
        raise RuntimeError(f"no seed in [{seed}, {seed + max_tries}) deals {card} to {mover}")
    for i, letter in enumerate(history):
        acting = env.possible_agents[i % 2]
        move = MOVES[history[:i]][letter == "b"]
        actions = {a: f"ACTION: {move}" if a == acting else "ACTION: wait" for a in env.agents}
        observations, _, _, _, infos = env.step(actions)
    return observations[mover], infos[mover]
