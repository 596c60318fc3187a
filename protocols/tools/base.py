"""Tools an agent may call within its turn: the registry, the shared limits, and the YAML check.

A tool is a pure function ``(query, settings, data) -> output text``: ``query`` is what the
agent wrote after ``CALL <tool>:``, ``settings`` its limits and options from the scenario YAML,
``data`` what the scenario hands that agent (a lookup table, say). Being a pure function of its
input and the scenario's state, a call replays exactly (counterfactual re-simulation relies on
it). A tool signals a failure the agent should read by raising :class:`ToolError`; the message
becomes the call's result.

Scenario YAML::

    tools: [calculator, lookup]                     # defaults
    tools:
      calculator: {calls: 2}                         # limits per tool
      python: {calls: 1, timeout: 3, max_chars: 300, memory_mb: 256}

Every tool takes the limits of :class:`ToolLimits`; options of its own are declared by the
``params`` dataclass it registers with (``@register_tool("python", params=PythonParams)``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.protocols.registry import Registry

__all__ = [
    "TOOLS",
    "ToolEntry",
    "ToolError",
    "ToolLimits",
    "normalise_tools",
    "register_tool",
    "tool_problems",
]


class ToolError(Exception):
    """A call that failed in a way the agent should read (its message is the call's result)."""


@dataclass(frozen=True)
class ToolLimits:
    """Limits every tool takes, per agent turn.

    calls:     calls of this tool per turn; a further call gets an error result.
    max_chars: characters of one result; longer output is cut, and the cut is said.
    timeout:   seconds of wall-clock time one call may take (the python tool enforces it by
               killing its process group; the built-in in-process tools are bounded by
               construction and finish far below it).
    """

    calls: int = 3
    max_chars: int = 400
    timeout: float = 2.0


LIMIT_BOUNDS = {"calls": (1, 20), "max_chars": (1, 10_000), "timeout": (0.05, 60.0)}

Run = Callable[[str, Mapping[str, Any], Any], str]


@dataclass(frozen=True)
class ToolEntry:
    """A registered tool: its function, a one-line description for the system prompt, the
    ``params`` dataclass of its own options (or None), and how it reads an agent's data."""

    name: str
    run: Run
    description: str
    params: type | None = None
    check: Callable[[Mapping[str, Any], Sequence[str]], list[tuple[str, str]]] | None = None


TOOLS: Registry[str, ToolEntry] = Registry("tool")


def register_tool(
    name: str,
    description: str,
    params: type | None = None,
    check: Callable[[Mapping[str, Any], Sequence[str]], list[tuple[str, str]]] | None = None,
) -> Callable[[Run], Run]:
    """Register ``run(query, settings, data) -> str`` as the tool ``name``; duplicates are
    refused. ``check(options, agents)`` returns ``(key, message)`` problems of its options."""

    def decorator(run: Run) -> Run:
        TOOLS.add(name, ToolEntry(name, run, description, params, check))
        return run

    return decorator


def _entries(raw: object) -> tuple[list[tuple[str, str, Any]], list[tuple[str, str]]]:
    """``(path, name, options)`` per declared tool, and the problems of the form itself."""
    problems: list[tuple[str, str]] = []
    out: list[tuple[str, str, Any]] = []
    if raw is None:
        return out, problems
    if isinstance(raw, Mapping):
        items = [(f"tools.{_word(k)}", k, v) for k, v in raw.items()]
    elif isinstance(raw, list):
        items = []
        for i, item in enumerate(raw):
            if isinstance(item, str):
                items.append((f"tools[{i}]", item, {}))
            elif isinstance(item, Mapping) and len(item) == 1:
                ((k, v),) = item.items()
                items.append((f"tools[{i}].{_word(k)}", k, v))
            else:
                problems.append(
                    (f"tools[{i}]", "must be a tool name or a mapping {name: {limits}}")
                )
    else:
        return out, [("tools", "must be a list of tool names or a mapping name -> limits")]
    seen: set[str] = set()
    for path, name, options in items:
        if not isinstance(name, str):
            problems.append((path, "a tool name must be a string"))
        elif name in seen:
            problems.append((path, f"tool {name!r} is declared twice"))
        else:
            seen.add(name)
            out.append((path, name, {} if options is None else options))
    return out, problems


def _bad_number(value: object, kind: type, low: float, high: float) -> bool:
    """Whether ``value`` is not a number of ``kind`` within ``[low, high]`` (never converts a
    huge integer to float: that would overflow)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    if kind is int and not isinstance(value, int):
        return True
    if isinstance(value, float) and not math.isfinite(value):
        return True
    return not low <= value <= high


def _word(key: object) -> str:
    """A key as it appears in a problem's path: a string cut to 80 characters, else its type
    (``str()`` of a hostile 5,000-digit integer raises)."""
    return key[:80] if isinstance(key, str) else f"<{type(key).__name__}>"


def tool_problems(raw: object, agents: Sequence[str]) -> list[tuple[str, str]]:
    """Every problem of a scenario's ``tools`` section as ``(key path, message)``; empty when
    it is valid. Unknown tools list the registered ones; options name their key."""
    entries, problems = _entries(raw)
    limit_fields = {f.name: f.type for f in dataclasses.fields(ToolLimits)}
    for path, name, options in entries:
        if name not in TOOLS:
            problems.append((path, TOOLS.unknown_message(name, shown=repr(_word(name)))))
            continue
        if not isinstance(options, Mapping):
            problems.append((path, "must be a mapping of limits and options"))
            continue
        entry = TOOLS[name]
        own = {f.name: f for f in dataclasses.fields(entry.params)} if entry.params else {}
        allowed = sorted(set(limit_fields) | set(own))
        for key, value in options.items():
            where = f"{path}.{_word(key)}"
            if key in limit_fields:
                low, high = LIMIT_BOUNDS[key]
                kind = int if key != "timeout" else float
                if _bad_number(value, kind, low, high):
                    word = "an integer" if kind is int else "a number"
                    problems.append((where, f"must be {word} between {low} and {high}"))
            elif key not in own:
                problems.append(
                    (where, f"unknown option of tool {name!r} (allowed: {', '.join(allowed)})")
                )
        if entry.check is not None:
            own_options = {k: v for k, v in options.items() if k in own}
            problems += [(f"{path}.{k}", m) for k, m in entry.check(own_options, agents)]
    return problems


def normalise_tools(raw: object) -> dict[str, dict[str, Any]]:
    """A valid ``tools`` section as ``{name: settings}`` in declaration order, every limit and
    option filled in with its default (call :func:`tool_problems` first)."""
    entries, _ = _entries(raw)
    out: dict[str, dict[str, Any]] = {}
    for _, name, options in entries:
        entry = TOOLS[name]
        settings = dataclasses.asdict(ToolLimits())
        if entry.params is not None:
            settings.update(dataclasses.asdict(entry.params()))
        settings.update(options)
        settings["timeout"] = float(settings["timeout"])
        out[name] = settings
    return out
