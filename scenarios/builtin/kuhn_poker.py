"""Rules of ``kuhn_poker``: Kuhn Poker, the smallest poker with hidden cards and bluffing.

Two players, a deck of three cards (J < Q < K), one card each, the third unseen. Each antes
``ante`` chip(s) (default 1); there is one betting round with a bet of ``bet`` chip(s):

    first player:  check or bet
    second player: after a check, check (showdown) or bet; after a bet, call (showdown) or fold
    first player:  after check-bet only, call (showdown) or fold

At a showdown the higher card takes the pot; a fold gives the pot to the other player. The
agent's payoff is its net chips (+ante or +ante+bet for the winner, the opposite for the loser),
zero-sum. The betting maps onto rounds: in each round only the player to move has
``needs_action``; the other is idle (it neither talks nor acts, so nothing is generated for it).
With ``table_talk: true`` the player to move may also send a message (bluffing in words).

With ante 1, bet 1 and no table talk the game is solved exactly in
:mod:`marl.scenarios.builtin.kuhn_tree` (best responses, exploitability), which the rules
declare as their tree (``info.tree``; :func:`marl.scenarios.rules.game_tree`).

An action is one of the legal moves, as a word (``check``, ``bet``, ``call``, ``fold``;
brackets, quotes and case do not matter: :func:`marl.scenarios.zero_sum.pick_word`). A reply
with no legal move is invalid and is played as ``check`` where that is legal, else ``fold``.

Version history:
- v0: first version (2026-11-25).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.scenarios.bots import register_bot
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules
from marl.scenarios.zero_sum import pick_word

CARDS = ["J", "Q", "K"]  # index = rank
MOVES = ("check", "bet", "call", "fold")
PAST = {"check": "checked", "bet": "bet", "call": "called", "fold": "folded"}
RULE_BOT_BLUFF = 1 / 6  # the rule bot's alpha in the equilibrium family (equilibrium_policy)


def legal_moves(history: Sequence[str]) -> list[str]:
    """The moves open to the player to act after ``history`` (empty when the hand is over)."""
    h = tuple(history)
    if h in ((), ("check",)):
        return ["check", "bet"]
    if h in (("bet",), ("check", "bet")):
        return ["call", "fold"]
    return []


@register_rules("kuhn_poker")
class KuhnPokerRules(Rules):
    """One hand of Kuhn Poker; the first agent listed acts first."""

    info = ScenarioInfo(
        min_agents=2,
        max_agents=2,
        default_topology="complete",
        default_rounds=3,
        zero_sum=True,
        payoff_unit="chips",  # net chips a hand: the stakes differ, so win rate is no score
        tree="marl.scenarios.builtin.kuhn_tree",  # solved exactly (ante 1, bet 1, no talk)
    )

    @dataclass(frozen=True)
    class Params:
        """ante: chips each player puts in before the cards are dealt.
        bet: the size of the one bet (and of a call).
        table_talk: the player to move may also send a message (cheap talk, bluffs included).
        restate_card: the prompt starts the mover's reply with ``My card is J.`` before its
            ``ACTION:`` head (``sampling.response_prefix``; context, never trained or sent):
            the card right before the move (bench/kuhn_gradients.py, docs/competition.md)."""

        ante: int = 1
        bet: int = 1
        table_talk: bool = False
        restate_card: bool = False

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """Ante and bet are whole numbers from 1 to 1000."""
        p = cls.Params(**params)
        problems = []
        for key in ("ante", "bet"):
            value = getattr(p, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
                problems.append(
                    Problem(key, f"must be a whole number from 1 to 1000, got {short(value)}")
                )
        for key in ("table_talk", "restate_card"):
            if not isinstance(getattr(p, key), bool):
                problems.append(Problem(key, "must be true or false"))
        return problems

    @classmethod
    def episode_rounds(cls, params: dict[str, Any]) -> int | None:
        """At most three moves: check, bet, call/fold."""
        return 3

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.cards: dict[str, int] = {}
        self.history: list[str] = []
        self.net: dict[str, int] = {}
        self.result_text = ""

    def reset(self) -> None:
        """Deal one card to each player; the third stays face down."""
        deck = list(range(len(CARDS)))
        self.rng.shuffle(deck)
        self.cards = {a: deck[i] for i, a in enumerate(self.agents)}
        self.history = []
        self.net = {}
        self.result_text = ""

    def to_move(self) -> str | None:
        """The agent whose turn it is, or ``None`` once the hand is over."""
        if self.net or not legal_moves(self.history):
            return None
        return self.agents[len(self.history) % 2]

    def needs_action(self, agent: str, round: int) -> bool:
        """Only the player to move acts; the history length is the round."""
        return round == len(self.history) and agent == self.to_move()

    def can_talk(self, agent: str, round: int) -> bool:
        """With table talk, the player to move may talk; nobody else, ever."""
        return self.params.table_talk and self.needs_action(agent, round)

    def _opponent(self, agent: str) -> str:
        return self.agents[1 - self.agents.index(agent)]

    def _pot(self) -> int:
        p = self.params
        return 2 * p.ante + p.bet * sum(m in ("bet", "call") for m in self.history)

    def private_info(self, agent: str) -> str:
        """The agent's own card."""
        return f"Your card is {CARDS[self.cards[agent]]}."

    def private_label(self, agent: str) -> str | None:
        """The card: what a bluff would hide."""
        return CARDS[self.cards[agent]]

    def public_state(self) -> str:
        """The pot, the betting so far, and at the end the showdown."""
        betting = ", ".join(f"{self.agents[i % 2]} {PAST[m]}" for i, m in enumerate(self.history))
        text = f"Pot: {self._pot()} chips. Betting so far: {betting or 'nothing yet'}."
        if self.result_text:
            text += f" {self.result_text}"
        return text

    def action_help(self, agent: str) -> str:
        """The legal moves, as words."""
        return f"one word, {' or '.join(legal_moves(self.history))}."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """For bots: the card, the betting and the legal moves (when it is the agent's turn)."""
        mine = agent == self.to_move()
        info = {
            "card": CARDS[self.cards[agent]],
            "history": list(self.history),
            "first": agent == self.agents[0],
            "valid_actions": legal_moves(self.history) if mine else [],
        }
        if mine and self.params.restate_card:
            info["response_note"] = f"My card is {CARDS[self.cards[agent]]}."  # agents/heads.py
        return info

    def legal_actions(self, agent: str) -> dict[str, str] | None:
        """The mover's legal moves, each its own text; None for the player not to move."""
        if agent != self.to_move():
            return None
        return {move: move for move in legal_moves(self.history)} or None

    def parse_action(self, agent: str, text: str) -> str | None:
        """The move the mover's reply names, read as :meth:`step` reads it (whole words, any
        case, punctuation around it ignored); ``None`` for the player not to move."""
        if agent != self.to_move():
            return None
        return pick_word(text, legal_moves(self.history))

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Apply the mover's move; at a fold or showdown, pay out and end the hand."""
        result = RoundResult()
        mover = self.to_move()
        if mover is None:  # cannot happen: the environment stops when the hand is over
            result.done = True
            return result
        legal = legal_moves(self.history)
        raw = actions.get(mover)
        move = pick_word(raw, legal)
        if move is None:
            fallback = "check" if "check" in legal else "fold"
            result.invalid[mover] = (
                f"expected one of {', '.join(legal)}, got {(raw or '')[:80]!r}; played {fallback}"
            )
            move = fallback
        self.history.append(move)
        result.public_events.append(f"{mover} {PAST[move]}.")
        if legal_moves(self.history):
            return result
        result.done = True
        opponent = self._opponent(mover)
        pot = self._pot()
        if move == "fold":
            won = opponent
            self.result_text = f"{mover} folded; {opponent} takes the pot of {pot} chips."
        else:
            won = max(self.agents, key=lambda a: self.cards[a])
            shown = ", ".join(f"{a} {CARDS[self.cards[a]]}" for a in self.agents)
            self.result_text = f"Showdown: {shown}; {won} takes the pot of {pot} chips."
        lost = self._opponent(won)
        self.net = {won: pot // 2, lost: -(pot // 2)}  # each put in half the pot
        result.individual = {a: float(v) for a, v in self.net.items()}
        result.public_events.append(self.result_text)
        return result


def equilibrium_policy(
    card: str, history: Sequence[str], first: bool, bluff: float = 1 / 6
) -> dict[str, float]:
    """A Nash equilibrium of Kuhn Poker (Kuhn 1950): the probability of each legal move.

    ``bluff`` is the family's alpha in [0, 1/3]. First player: open with a bet holding K at
    3a, J at a (a bluff), never Q; after check-bet, call with K, with Q at a + 1/3, never J.
    Second player: facing a bet, call with K, with Q at 1/3, never J; after a check, bet K,
    bluff J at 1/3, check Q. Every such profile is worth -1/18 chip a hand to the first player.
    """
    history = tuple(history)
    if first and not history:
        bet = {"K": 3 * bluff, "Q": 0.0, "J": bluff}[card]
        return {"check": 1 - bet, "bet": bet}
    if first:  # check, then the opponent bet
        call = {"K": 1.0, "Q": bluff + 1 / 3, "J": 0.0}[card]
        return {"call": call, "fold": 1 - call}
    if history == ("bet",):
        call = {"K": 1.0, "Q": 1 / 3, "J": 0.0}[card]
        return {"call": call, "fold": 1 - call}
    bet = {"K": 1.0, "Q": 0.0, "J": 1 / 3}[card]
    return {"check": 1 - bet, "bet": bet}


def _kuhn_move(info: dict[str, Any], rng: random.Random, bluff: float) -> str:
    """A move drawn from :func:`equilibrium_policy` for the bot's card and the betting."""
    policy = equilibrium_policy(
        info.get("card", "J"), info.get("history", ()), bool(info.get("first", True)), bluff
    )
    moves = list(policy)
    return moves[0] if rng.random() < policy[moves[0]] else moves[1]


@register_bot("kuhn_poker", "rule")
def kuhn_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Plays a Nash equilibrium of Kuhn Poker (bluff rate 1/6): unexploitable, and it wins
    chips from any player who strays from equilibrium, the random bot among them."""
    if not info.get("valid_actions"):
        return "ACTION: wait"
    move = _kuhn_move(info, rng, bluff=RULE_BOT_BLUFF)
    lines = []
    if info.get("neighbours"):
        lines.append(f"SAY: I {PAST[move]}.")
    lines.append(f"ACTION: {move}")
    return "\n".join(lines)
