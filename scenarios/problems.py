"""What is wrong with a scenario: :class:`Problem` (one mistake, located by its key path) and
:class:`ScenarioError` (all of a file's problems at once, so a user fixes it in one pass).

Values quoted in a problem go through :func:`short`, which stays bounded whatever the value
(docs/security.md). This module imports nothing of the package: the rules, the shaping
terms, the YAML reader and the validation all report through it.
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass

MAX_PRINTED = 80  # characters of a value quoted in a problem message
MAX_LISTED_PROBLEMS = 50  # problems spelled out in a ScenarioError's message
MAX_MESSAGE = 400  # characters of one problem's message, whatever a rule quoted in it


@dataclass(frozen=True)
class Problem:
    """One mistake in a scenario file, located by its key path. A message longer than
    :data:`MAX_MESSAGE` (a rule that quoted a whole value instead of :func:`short`) is cut in
    the middle, so one line stays one readable line."""

    path: str
    message: str

    def __post_init__(self) -> None:
        if len(self.message) > MAX_MESSAGE:
            half = (MAX_MESSAGE - 30) // 2  # room for the marker: the result fits the limit
            cut = len(self.message) - 2 * half
            message = f"{self.message[:half]} ...({cut} characters)... {self.message[-half:]}"
            object.__setattr__(self, "message", message)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ScenarioError(ValueError):
    """A scenario could not be loaded; ``problems`` lists every mistake found."""

    def __init__(self, problems: list[Problem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"invalid scenario {source}".strip() if source else "invalid scenario"
        lines = [f"  {p}" for p in problems[:MAX_LISTED_PROBLEMS]]
        if len(problems) > MAX_LISTED_PROBLEMS:
            lines.append(f"  ... and {len(problems) - MAX_LISTED_PROBLEMS} more problems")
        super().__init__(head + ":\n" + "\n".join(lines))


class _ShortRepr(reprlib.Repr):
    """``repr`` that stays short whatever the value: nested, shared, huge or self-containing."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 3
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 6
        self.maxstring = self.maxother = self.maxlong = MAX_PRINTED

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 200:  # repr() of a 5000-digit int raises; say how big it is instead
            return f"<an integer of about {int(x.bit_length() * math.log10(2)) + 1} digits>"
        return super().repr_int(x, level)


_SHORT = _ShortRepr()


def short(value: object, limit: int = MAX_PRINTED) -> str:
    """A bounded ``repr`` of a value from a scenario file, for problem messages."""
    try:
        text = _SHORT.repr(value)
    except Exception:  # noqa: BLE001 - a value whose repr fails still gets a message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
