"""Routing: deliver messages only along graph edges, within budget, through a noisy channel; an
edge marked cut (:data:`~marl.protocols.graphs.DELIVER` false) delivers nothing."""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, get_args

import networkx as nx

from marl.protocols.graphs import delivers
from marl.protocols.markup import OutgoingMessage
from marl.protocols.messages import Message, Violation, ViolationKind

TRUNCATION_MARK = "..."
# Every counter a router keeps (``Router.counts``), so a metric of each can be logged at every
# step, 0 included: what was written and delivered, each violation, a message an agent could
# not send this round (``muted``, counted by the environment), and what the channel took away.
COUNTER_KINDS: tuple[str, ...] = (
    "sent",
    "delivered",
    *get_args(ViolationKind),
    "muted",
    "cut_dropped",
    "noise_dropped",
    "noise_corrupted",
)


@dataclass(frozen=True)
class MessageBudget:
    """Per-message and per-round limits. A message over ``max_chars`` is truncated; messages
    beyond ``max_per_round`` in one round are dropped."""

    max_chars: int = 200
    max_per_round: int = 2


@dataclass(frozen=True)
class ChannelNoise:
    """Channel noise: each delivery is dropped with probability ``drop``, and each character of a
    delivered message is replaced by a random letter with probability ``corrupt``."""

    drop: float = 0.0
    corrupt: float = 0.0

    @property
    def active(self) -> bool:
        """True when the channel alters anything."""
        return self.drop > 0 or self.corrupt > 0


class Router:
    """Turns what an agent wrote into delivered messages and violations.

    The router is stateless apart from its running counters (``counts``), which the environment
    snapshots together with everything else.
    """

    def __init__(self, budget: MessageBudget, noise: ChannelNoise | None = None) -> None:
        self.budget = budget
        self.noise = noise or ChannelNoise()
        # COUNTER_KINDS: "sent", "delivered", violation kinds, "noise_*", "cut_dropped" (one per
        # receiver); the environment adds "muted"
        self.counts: Counter[str] = Counter()
        self.edge_counts: Counter[tuple[str, str]] = Counter()

    def __deepcopy__(self, memo: dict[int, Any]) -> Router:
        """A copy with its own counters (what ``copy.deepcopy`` gives, without its generic
        machinery: the budget and the noise are frozen numbers, and the counters map strings and
        name pairs to ints, so they are copied shallowly)."""
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            if key in ("budget", "noise"):
                clone.__dict__[key] = value
            elif key in ("counts", "edge_counts"):
                clone.__dict__[key] = Counter(value)
            else:  # an attribute a subclass added: copied the general way
                clone.__dict__[key] = copy.deepcopy(value, memo)
        return clone

    def route(
        self,
        graph: nx.DiGraph,
        sender: str,
        outgoing: list[OutgoingMessage],
        round: int,
        rng: random.Random,
    ) -> tuple[list[Message], list[Violation]]:
        """Deliver ``sender``'s messages for ``round`` along ``graph``.

        A cut edge is a neighbour like any other (no violation, no notice: the sender is not
        told), and its delivery is dropped last, after the channel noise has drawn for it, so
        that the channel's random stream is the one it would be with the edge."""
        delivered: list[Message] = []
        violations: list[Violation] = []
        neighbours = sorted(graph.successors(sender)) if sender in graph else []
        for index, out in enumerate(outgoing):
            self.counts["sent"] += 1
            if index >= self.budget.max_per_round:
                violations.append(
                    Violation(
                        sender,
                        round,
                        "too_many",
                        f"Only {self.budget.max_per_round} messages per round are allowed; "
                        f"your message {out.text[:30]!r} was dropped.",
                    )
                )
                continue
            text = out.text
            if len(text) > self.budget.max_chars:
                keep = self.budget.max_chars - len(TRUNCATION_MARK)
                # a budget shorter than the mark gets a plain cut: never more than max_chars
                text = text[:keep] + TRUNCATION_MARK if keep > 0 else text[: self.budget.max_chars]
                violations.append(
                    Violation(
                        sender,
                        round,
                        "over_budget",
                        f"Your message was {len(out.text)} characters; the limit is "
                        f"{self.budget.max_chars}, so it was truncated.",
                    )
                )
            if out.to is None:
                receivers = neighbours
            else:
                receivers = []
                for name in out.to:
                    if name in neighbours:
                        receivers.append(name)
                    elif name in graph:
                        violations.append(
                            Violation(
                                sender,
                                round,
                                "not_neighbour",
                                f"{name} is not one of your neighbours "
                                f"({', '.join(neighbours) or 'none'}); the message to {name} "
                                "was dropped.",
                            )
                        )
                    else:
                        like = [n for n in neighbours if n.casefold() == name.casefold()]
                        hint = f" (names are exact: did you mean {like[0]}?)" if like else ""
                        violations.append(
                            Violation(
                                sender,
                                round,
                                "unknown_agent",
                                f"There is no agent called {name[:40]!r}{hint}; the message to "
                                "it was dropped.",
                            )
                        )
            receivers = [r for r in receivers if self._survives(rng)]
            if not receivers:
                continue
            text = self._corrupt(text, rng)
            cut = [r for r in receivers if not delivers(graph, sender, r)]
            if cut:
                self.counts["cut_dropped"] += len(cut)
                receivers = [r for r in receivers if r not in cut]
                if not receivers:
                    continue
            delivered.append(Message(sender, tuple(receivers), round, text))
            for receiver in receivers:
                self.counts["delivered"] += 1
                self.edge_counts[(sender, receiver)] += 1
        for violation in violations:
            self.counts[violation.kind] += 1
        return delivered, violations

    def _survives(self, rng: random.Random) -> bool:
        if self.noise.drop <= 0:
            return True
        if rng.random() < self.noise.drop:
            self.counts["noise_dropped"] += 1
            return False
        return True

    def _corrupt(self, text: str, rng: random.Random) -> str:
        if self.noise.corrupt <= 0:
            return text
        letters = "abcdefghijklmnopqrstuvwxyz"
        chars = [rng.choice(letters) if rng.random() < self.noise.corrupt else c for c in text]
        out = "".join(chars)
        if out != text:
            self.counts["noise_corrupted"] += 1
        return out
