"""A gymnasium space that holds any text, so LLM completions and observations always fit."""

from __future__ import annotations

import string
from typing import Any

from gymnasium.spaces import Text

PRINTABLE = "".join(c for c in string.printable if c not in "\x0b\x0c\r")


class AnyText(Text):
    """Text of any characters up to ``max_length``.

    ``sample()`` draws printable ASCII (as gymnasium's ``Text`` does from its charset), but
    ``contains`` admits every string, because an LLM may write any Unicode at all.
    """

    def __init__(self, max_length: int, seed: int | None = None) -> None:
        super().__init__(max_length=max_length, min_length=0, charset=PRINTABLE, seed=seed)

    def contains(self, x: Any) -> bool:
        """Any ``str`` no longer than ``max_length``."""
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText(max_length={self.max_length})"
