"""The message an agent sends, and the record of a rule it broke while sending it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ViolationKind = Literal["not_neighbour", "unknown_agent", "over_budget", "too_many", "empty"]


def round_tag(round_index: int) -> str:
    """How an observation dates a line (a message, a notice): ``[round N]``, counting from 1 like
    the observation's ``Round N of M.`` header, while rounds count from 0 in the code."""
    return f"[round {round_index + 1}]"


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
        """The sentence the sender reads in its next observation."""
        return f"{round_tag(self.round)} {self.detail}"
