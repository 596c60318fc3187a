"""Rules of ``bargain``: split a pool of items with private valuations, after cheap talk.

Two players divide a pool of items (by default books, hats and balls, 1 to ``max_count`` of
each, dealt per episode). Each player values the item kinds privately; a player's values are
whole numbers that make the whole pool worth ``total`` to it. The players take turns, the first
agent listed first. On its turn a player may send a message over the graph (cheap talk: nothing
binds it) and acts with one of:

    accept              take the standing offer (only when the opponent made one)
    <n1> <n2> <n3>      a new offer: how many of each kind (in the pool's order) *you* keep;
                        the opponent would get the rest

An accepted offer ends the episode: each player scores the value of its share, by its own
values. No deal by the last turn scores 0 for both. The game is strictly competitive: each
agent's payoff is its points divided by ``total``, and the shipped YAML's cooperation 0 makes
its return its points minus the opponent's (over ``total``), so the returns sum to zero and a
deal that pays both the same is a draw. A deal only helps a player who gets more than its
opponent by their own values, and valuations differ, so what to claim to want is the game.

Actions are parsed defensively (:func:`parse_bargain_action`): ``accept`` alone (any case,
brackets or punctuation around it) accepts; otherwise exactly as many whole numbers as there are
item kinds make an offer, in range; anything else is invalid and wastes the turn (the standing
offer stays on the table).

Version history:
- v0: first version (2026-11-25).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marl.scenarios.bots import register_bot
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules

# a whole number standing alone: not part of a word or a decimal ("x2", "1.5"), but it may end a
# sentence ("... 1.")
_INT = re.compile(r"(?<![\w.])-?\d+(?!\w|\.\d)")
_ACCEPT = re.compile(r"\baccept(?:ed|s)?\b", re.IGNORECASE)
# a refusal is not an acceptance: "I do not accept", "reject", "no deal"
_REFUSE = re.compile(r"\b(?:not|no|never|reject\w*|refuse\w*|decline\w*|don'?t|won'?t)\b", re.I)
_MAX_ACTION_CHARS = 500  # longer replies are cut before parsing (hostile input)


def parse_bargain_action(
    text: str | None, counts: Sequence[int]
) -> tuple[str, tuple[int, ...] | None] | None:
    """``("accept", None)``, ``("offer", kept)`` or ``None`` (invalid) for an action text.

    ``accept`` counts only when the text holds no number (``accept 2 1 0`` is ambiguous) and no
    refusal (``do not accept``). An
    offer is exactly ``len(counts)`` whole numbers, each from 0 to its kind's count; words
    around them are ignored (``keep 2 books, 0 hats, 1 ball``). Never raises.
    """
    if not isinstance(text, str):
        return None
    text = text[:_MAX_ACTION_CHARS]
    numbers = _INT.findall(text)
    if not numbers:
        accepted = _ACCEPT.search(text) and not _REFUSE.search(text)
        return ("accept", None) if accepted else None
    if _ACCEPT.search(text) or len(numbers) != len(counts):
        return None
    if any(len(n.lstrip("-")) > 6 for n in numbers):  # a hostile huge number is out of range
        return None
    kept = tuple(int(n) for n in numbers)
    if not all(0 <= k <= c for k, c in zip(kept, counts)):
        return None
    return ("offer", kept)


@dataclass
class Offer:
    """A standing offer: who made it and how many of each kind the proposer keeps."""

    proposer: str
    kept: tuple[int, ...] = field(default_factory=tuple)


@register_rules("bargain")
class BargainRules(Rules):
    """Alternating offers over a pool of items valued privately; the better share wins."""

    info = ScenarioInfo(
        min_agents=2,
        max_agents=2,
        default_topology="complete",
        default_rounds=6,
        zero_sum=True,
    )

    @dataclass(frozen=True)
    class Params:
        """items: the item kinds, in the order offers list them.
        max_count: each kind comes in 1 to max_count items, dealt per episode.
        total: what the whole pool is worth to each player (values are whole numbers).
        turns: turns in all, alternating, the first agent first; an offer made on the last
            turn cannot be accepted."""

        items: list[str] = field(default_factory=lambda: ["books", "hats", "balls"])
        max_count: int = 3
        total: int = 10
        turns: int = 6

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """Two to five distinct item names; counts 1-5; a total the counts can make; 2-20 turns."""
        p = cls.Params(**params)
        problems = []
        items = p.items
        if (
            not isinstance(items, list)
            or not 2 <= len(items) <= 5
            or not all(isinstance(i, str) and i.isidentifier() for i in items)
            or len(set(items)) != len(items)
        ):
            problems.append(Problem("items", "must be 2 to 5 distinct single-word names"))
        for key, low, high in (("max_count", 1, 5), ("total", 2, 100), ("turns", 2, 20)):
            value = getattr(p, key)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                problems.append(
                    Problem(key, f"must be a whole number from {low} to {high}, got {short(value)}")
                )
        return problems

    @classmethod
    def episode_rounds(cls, params: dict[str, Any]) -> int | None:
        """One round per turn."""
        return cls.Params(**params).turns

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.counts: tuple[int, ...] = ()
        self.values: dict[str, tuple[int, ...]] = {}
        self.offer: Offer | None = None
        self.deal: dict[str, tuple[int, ...]] | None = None
        self.turn = 0
        self.over = False

    # --- dealing ---------------------------------------------------------------------------------
    def _draw_values(self) -> tuple[int, ...]:
        """Whole values, one per kind, with sum(count * value) == total (rejection sampling;
        a fallback puts the whole total on a kind whose count divides it)."""
        total = self.params.total
        for _ in range(2000):
            values = [self.rng.randint(0, total) for _ in self.counts[:-1]]
            rest = total - sum(v * c for v, c in zip(values, self.counts))
            if rest >= 0 and rest % self.counts[-1] == 0:
                return (*values, rest // self.counts[-1])
        for kind, count in enumerate(self.counts):
            if total % count == 0:
                return tuple(total // count if k == kind else 0 for k in range(len(self.counts)))
        raise AssertionError("unreachable: a kind with count 1 always divides the total")

    def reset(self) -> None:
        """Deal the pool and each player's values (both differ from episode to episode)."""
        p = self.params
        while True:
            self.counts = tuple(self.rng.randint(1, p.max_count) for _ in p.items)
            if 1 in self.counts or any(p.total % c == 0 for c in self.counts):
                break
        self.values = {a: self._draw_values() for a in self.agents}
        self.offer = None
        self.deal = None
        self.turn = 0
        self.over = False

    # --- who acts --------------------------------------------------------------------------------
    def to_move(self) -> str | None:
        """The agent whose turn it is, or ``None`` when the game is over."""
        return None if self.over else self.agents[self.turn % 2]

    def needs_action(self, agent: str, round: int) -> bool:
        """Only the player whose turn it is acts."""
        return round == self.turn and agent == self.to_move()

    def can_talk(self, agent: str, round: int) -> bool:
        """The player whose turn it is may talk (cheap talk along the graph)."""
        return self.needs_action(agent, round)

    # --- what agents see -------------------------------------------------------------------------
    def _describe(self, amounts: Sequence[int]) -> str:
        return ", ".join(f"{item}: {n}" for n, item in zip(amounts, self.params.items))

    def _worth(self, agent: str, amounts: Sequence[int]) -> int:
        return sum(v * n for v, n in zip(self.values[agent], amounts))

    def _opponent(self, agent: str) -> str:
        return self.agents[1 - self.agents.index(agent)]

    def _share(self, agent: str, offer: Offer) -> tuple[int, ...]:
        """What ``agent`` gets under ``offer``."""
        if agent == offer.proposer:
            return offer.kept
        return tuple(c - k for c, k in zip(self.counts, offer.kept))

    def private_info(self, agent: str) -> str:
        """The agent's values per item."""
        values = ", ".join(
            f"each of the {item} is worth {v}"
            for item, v in zip(self.params.items, self.values[agent])
        )
        return (
            f"Your values: {values}. The whole pool is worth {self.params.total} to you. "
            "Your opponent values the items differently and you do not know how."
        )

    def private_label(self, agent: str) -> str | None:
        """The kind the agent values most (what its talk may reveal or hide)."""
        values = self.values[agent]
        return self.params.items[max(range(len(values)), key=values.__getitem__)]

    def public_state(self) -> str:
        """The pool, the turn, and the standing offer."""
        p = self.params
        turn = min(self.turn + 1, p.turns)
        text = f"The pool: {self._describe(self.counts)}. Turn {turn} of {p.turns}."
        if self.deal is not None:
            shares = "; ".join(f"{a} gets {self._describe(s)}" for a, s in self.deal.items())
            return f"{text} Deal: {shares}."
        if self.offer is not None:
            other = self._opponent(self.offer.proposer)
            text += (
                f" Standing offer from {self.offer.proposer}: {self.offer.proposer} keeps "
                f"{self._describe(self.offer.kept)}; {other} gets "
                f"{self._describe(self._share(other, self.offer))}."
            )
        return text

    def action_help(self, agent: str) -> str:
        """Accept, or an offer as numbers."""
        kinds = ", ".join(self.params.items)
        offer = (
            f"{len(self.params.items)} whole numbers separated by spaces: how many {kinds} you "
            "keep, in that order; your opponent gets the rest"
        )
        if self.offer is not None and self.offer.proposer != agent:
            return f"either the word accept, to take the standing offer, or a new offer: {offer}."
        return f"an offer: {offer}."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """For bots: the pool, the agent's values, the standing offer and the legal actions."""
        mine = agent == self.to_move()
        valid: list[str] = []
        if mine:
            if self.offer is not None and self.offer.proposer != agent:
                valid.append("accept")
            valid += [
                " ".join(map(str, kept))
                for kept in itertools.product(*(range(c + 1) for c in self.counts))
            ]
        standing = None
        if self.offer is not None and self.offer.proposer != agent:
            standing = list(self._share(agent, self.offer))
        return {
            "items": list(self.params.items),
            "counts": list(self.counts),
            "values": list(self.values[agent]),
            "total": self.params.total,
            "offered_to_me": standing,
            "turns_left": self.params.turns - self.turn,
            "valid_actions": valid,
        }

    # --- the game --------------------------------------------------------------------------------
    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Apply the mover's accept or offer; pay out on a deal or when the turns run out."""
        result = RoundResult()
        mover = self.to_move()
        if mover is None:  # cannot happen: the environment stops when the game is over
            result.done = True
            return result
        raw = actions.get(mover)
        parsed = parse_bargain_action(raw, self.counts)
        can_accept = self.offer is not None and self.offer.proposer != mover
        if parsed is not None and parsed[0] == "accept" and not can_accept:
            parsed = None
        if parsed is None:
            result.invalid[mover] = (
                f"expected {'accept or ' if can_accept else ''}{len(self.counts)} whole numbers "
                f"(how many {', '.join(self.params.items)} you keep, at most "
                f"{', '.join(map(str, self.counts))}), got {(raw or '')[:80]!r}; turn wasted"
            )
            result.public_events.append(f"{mover} made no valid move.")
        elif parsed[0] == "accept":
            assert self.offer is not None
            self.deal = {a: self._share(a, self.offer) for a in self.agents}
            result.public_events.append(f"{mover} accepted the offer of {self.offer.proposer}.")
        else:
            assert parsed[1] is not None
            self.offer = Offer(mover, parsed[1])
            other = self._opponent(mover)
            result.public_events.append(
                f"{mover} offers: {mover} keeps {self._describe(parsed[1])}; "
                f"{other} gets {self._describe(self._share(other, self.offer))}."
            )
        self.turn += 1
        if self.deal is None and self.turn < self.params.turns and not last_round:
            return result
        self.over = True
        result.done = True
        if self.deal is None:
            result.individual = dict.fromkeys(self.agents, 0.0)
            result.public_events.append("No deal: both score 0.")
            return result
        points = {a: self._worth(a, self.deal[a]) for a in self.agents}
        result.individual = {a: points[a] / self.params.total for a in self.agents}
        result.public_events.append(
            "Deal: " + "; ".join(f"{a} scores {points[a]}" for a in self.agents) + "."
        )
        return result


def _est_worth(info: dict[str, Any], amounts: Sequence[int]) -> float:
    """What ``amounts`` may be worth to the opponent, its values unknown: the pool's total
    spread evenly over the items."""
    per_item = info["total"] / max(sum(info["counts"]), 1)
    return per_item * sum(amounts)


@register_bot("bargain", "rule")
def bargain_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Accepts an offer that gives it at least what the opponent probably gets (its values
    unknown, so spread evenly); otherwise offers to keep the items it values most while giving
    away at least half of them by count, and says which kind it wants (honestly)."""
    if not info.get("valid_actions"):
        return "ACTION: wait"
    counts, values = info["counts"], info["values"]
    offered = info.get("offered_to_me")
    if offered is not None:
        theirs = [c - o for c, o in zip(counts, offered)]
        mine = sum(v * n for v, n in zip(values, offered))
        if mine >= _est_worth(info, theirs):
            return "ACTION: accept"
    best: tuple[float, int, tuple[int, ...]] | None = None
    for kept in itertools.product(*(range(c + 1) for c in counts)):
        if 2 * sum(kept) > sum(counts):
            continue  # give away at least half the items
        score = sum(v * n for v, n in zip(values, kept))
        key = (score, -sum(kept), tuple(kept))
        if best is None or key > best:
            best = key
    assert best is not None  # keeping nothing always qualifies
    kept = best[2]
    favourite = info["items"][max(range(len(values)), key=values.__getitem__)]
    lines = []
    if info.get("neighbours"):
        lines.append(f"SAY: I care most about the {favourite}.")
    lines.append(f"ACTION: {' '.join(map(str, kept))}")
    return "\n".join(lines)
