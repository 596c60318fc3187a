"""The message an agent sends, and the record of a rule it broke while sending it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ViolationKind = Literal["not_neighbour", "unknown_agent", "over_budget", "too_many", "empty"]


@dataclass(frozen=True)
class Message:
    """A message as delivered: who sent it, who received it, in which round, and its text."""

    sender: str
    receivers: tuple[str, ...]
    round: int
    text: str


@dataclass(frozen=True)
class Violation:
    """A protocol rule the sender broke; counted, and shown to the sender next round."""

    sender: str
    round: int
    kind: ViolationKind
    detail: str

    def notice(self) -> str:
        """The sentence the sender reads in its next observation; rounds count from 1 there, as
        in the observation's header (``round`` itself counts from 0)."""
        return f"[round {self.round + 1}] {self.detail}"
