"""The tool markup and the toolbox that runs an agent's calls within its limits.

An agent calls a tool with one line of its completion::

    CALL calculator: 17*23

and the result is inserted right after that line, as one line the agent then reads::

    RESULT calculator: 391

``CALL`` is case-insensitive and may be decorated like the other markup (``**CALL calculator:**``).
The result is always one line that starts with ``RESULT``: newlines in a tool's output become
`` | `` and control characters are dropped, so no output can ever be read as the agent's own
``SAY:`` or ``ACTION:`` line. A failed call's result reads ``RESULT <tool>: error: <reason>``.

:class:`ToolBox` holds one agent's tools for one turn (settings and data come from the
environment's info dict, ``info["tools"]``) and counts calls against each tool's limit.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marl.protocols.markup import sanitize
from marl.protocols.tools.base import TOOLS, ToolError

CALL_HEAD = "CALL"
RESULT_HEAD = "RESULT"
_DECOR = r"[ \t\-\*\#>`_]*"
_CALL = re.compile(
    rf"^{_DECOR}CALL[ \t]+(?P<name>[A-Za-z_][\w\-]{{0,40}})[ \t\*`_]*:(?P<query>[^\n]*)$",
    re.IGNORECASE | re.MULTILINE,
)
MAX_QUERY_CHARS = 2_000


@dataclass(frozen=True)
class ToolCall:
    """A ``CALL`` line found in a completion.

    end:        index in the text just past the line (past its newline when it has one).
    terminated: the line ends with a newline (else it runs to the end of the text).
    """

    name: str
    query: str
    end: int
    terminated: bool


def find_call(text: str, start: int = 0) -> ToolCall | None:
    """The first ``CALL`` line of ``text`` at or after ``start``, or None. Never raises."""
    match = _CALL.search(text, start)
    if match is None:
        return None
    end = match.end()
    terminated = end < len(text) and text[end] == "\n"
    query = match.group("query").strip().strip("*`_").strip()[:MAX_QUERY_CHARS]
    return ToolCall(match.group("name").lower(), query, end + int(terminated), terminated)


def format_result(name: str, text: str, error: bool = False) -> str:
    """One ``RESULT`` line (with its newline) holding ``text``, made safe to insert."""
    lines = [sanitize(line) for line in str(text).splitlines()]
    body = " | ".join(line for line in lines if line) or "(empty)"
    if error:
        body = f"error: {body}"
    name = re.sub(r"[^\w\-]", "", str(name))[:40] or "tool"
    return f"{RESULT_HEAD} {name}: {body}\n"


@dataclass
class ToolOutcome:
    """One call and what came of it: the text inserted after it, whether it failed, how long
    it took."""

    name: str
    query: str
    text: str
    error: bool
    seconds: float


@dataclass
class ToolBox:
    """One agent's tools for one turn: ``{name: settings}`` from ``info["tools"]``, where
    ``settings`` holds the limits, the tool's options and ``data`` (that agent's data)."""

    tools: Mapping[str, Mapping[str, Any]]
    used: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_info(cls, info: Mapping[str, Any] | None) -> ToolBox | None:
        """The toolbox an info dict declares, or None when the agent has no tools."""
        tools = (info or {}).get("tools")
        if not isinstance(tools, Mapping) or not tools:
            return None
        return cls({str(k): v for k, v in tools.items() if isinstance(v, Mapping)})

    @property
    def max_calls(self) -> int:
        """Calls this turn may make in all (the sum of every tool's ``calls``)."""
        return sum(int(s.get("calls", 0)) for s in self.tools.values())

    def call(self, name: str, query: str) -> ToolOutcome:
        """Run one call within its limits; never raises. The outcome's ``text`` is the
        ``RESULT`` line to insert."""
        start = time.monotonic()
        error = True
        settings = self.tools.get(name)
        if settings is None or name not in TOOLS:
            known = ", ".join(sorted(self.tools)) or "none"
            output = f"unknown tool {name[:40]!r}; your tools: {known}"
        elif self.used.get(name, 0) >= int(settings.get("calls", 0)):
            output = f"call limit reached ({settings.get('calls')} {name} calls per turn)"
        else:
            self.used[name] = self.used.get(name, 0) + 1
            try:
                output = TOOLS[name].run(query, settings, settings.get("data"))
                error = False
            except ToolError as exc:
                output = str(exc)
            except Exception as exc:  # noqa: BLE001 - a tool's bug is the call's error, not a crash
                output = f"the tool failed ({type(exc).__name__}: {str(exc)[:200]})"
            limit = int(settings.get("max_chars", 400))
            if len(output) > limit:
                output = f"{output[:limit]} ... [cut: {len(output)} characters in all]"
        seconds = time.monotonic() - start
        return ToolOutcome(name, query, format_result(name, output, error), error, seconds)


def tool_instructions(tools: Mapping[str, Mapping[str, Any]]) -> str:
    """The paragraph of the system prompt that teaches an agent its tools."""
    if not tools:
        return ""
    lines = [
        "You can use tools before you answer. To call one, write a line that starts with "
        "`CALL` and the tool's name and a colon, then its input. The result comes back on the "
        "next line, which starts with `RESULT`; then continue your reply. Your tools:"
    ]
    for name, settings in tools.items():
        entry = TOOLS.get(name)
        description = entry.description if entry else ""
        lines.append(f"- {name}: {description} (at most {settings.get('calls')} calls per turn)")
    return "\n".join(lines)


def scripted_call(tools: ToolBox, name: str, query: str) -> tuple[str, ToolOutcome]:
    """What a scripted agent writes to call a tool: its ``CALL`` line followed by the result
    line the tool gave (exactly what the generation loop would insert), and the outcome."""
    outcome = tools.call(name, query)
    return f"{CALL_HEAD} {name}: {query}\n{outcome.text}", outcome
