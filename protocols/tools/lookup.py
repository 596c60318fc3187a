"""The ``lookup`` tool: a key-value table the scenario hands each agent (its private records).

The table comes from two places, merged (the rules' entries win): the YAML's
``tools.lookup.tables.<agent>`` (a fixed table per agent) and the rules' ``tool_data(agent)``
(a table dealt per episode, e.g. records only one agent holds). Keys match without regard to
case and surrounding spaces or quotes; an unknown key gets an error that lists a few keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marl.protocols.tools.base import ToolError, register_tool

MAX_LISTED_KEYS = 8


@dataclass(frozen=True)
class LookupParams:
    """tables: ``{agent: {key: value}}``, fixed tables per agent (values are shown as text)."""

    tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def _check(options: Mapping[str, Any], agents: Sequence[str]) -> list[tuple[str, str]]:
    tables = options.get("tables", {})
    if not isinstance(tables, Mapping):
        return [("tables", "must be a mapping of agent -> {key: value}")]
    problems = []
    for agent, table in tables.items():
        name = agent[:80] if isinstance(agent, str) else f"<{type(agent).__name__}>"
        if not isinstance(agent, str) or agent not in agents:
            problems.append((f"tables.{name}", f"unknown agent {name!r}"))
        elif not isinstance(table, Mapping):
            problems.append((f"tables.{name}", "must be a mapping of key -> value"))
    return problems


def _norm(key: str) -> str:
    return key.strip().strip("'\"`").strip().casefold()


@register_tool(
    "lookup",
    "your own private table: write `CALL lookup:` and then a key to read its value",
    params=LookupParams,
    check=_check,
)
def lookup_tool(query: str, settings: Mapping[str, Any], data: Any) -> str:
    """The value stored under ``query`` in the agent's table (``data``)."""
    table = data if isinstance(data, Mapping) else {}
    if not table:
        raise ToolError("your table is empty")
    wanted = _norm(query)
    for key, value in table.items():
        if _norm(str(key)) == wanted:
            return str(value)
    keys = sorted(str(k) for k in table)
    shown = ", ".join(keys[:MAX_LISTED_KEYS]) + (", ..." if len(keys) > MAX_LISTED_KEYS else "")
    raise ToolError(f"no entry {query.strip()[:40]!r}; keys: {shown}")
