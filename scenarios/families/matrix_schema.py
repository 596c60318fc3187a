"""Validation of the ``matrix`` family's params: every mistake named by its key.

The action names (shared or per player), the payoff table's shape against them (one mapping
level per player, then one payoff per player; an undeclared or missing action is named by its
path), the fallback action, the round counts and the ``private`` template. Total over any value
a YAML file can hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marl.protocols.values import is_finite_number
from marl.scenarios.families.common import (
    int_problem,
    name_list_problems,
    private_problems,
)
from marl.scenarios.problems import Problem, short

MAX_CELLS = 4096  # joint actions in a payoff table
PLACEHOLDERS = ("agent", "actions", "payoffs")


def player_actions(actions: object, agents: Sequence[str]) -> dict[str, list[str]] | None:
    """Each player's action names, from a shared list or a per-player mapping (None if neither)."""
    if isinstance(actions, list):
        return {a: list(actions) for a in agents}
    if isinstance(actions, Mapping) and all(isinstance(actions.get(a), list) for a in agents):
        return {a: list(actions[a]) for a in agents}
    return None


def _bool_hint(value: object) -> str:
    return " (quote it: YAML reads yes/no/on/off as true/false)" if isinstance(value, bool) else ""


def _actions_problems(actions: object, agents: Sequence[str]) -> list[Problem]:
    if actions is None:
        return [Problem("actions", "required: the action names, shared or per player")]
    if isinstance(actions, list):
        problems = name_list_problems(actions, "actions", "action")
        return [Problem(p.path, p.message + _bool_hint(_at(actions, p.path))) for p in problems]
    if not isinstance(actions, Mapping):
        return [Problem("actions", "must be a list of names or a mapping agent -> list of names")]
    problems = [
        Problem(f"actions.{short(a) if not isinstance(a, str) else a[:80]}", "unknown agent")
        for a in actions
        if a not in agents
    ]
    for agent in agents:
        if agent not in actions:
            problems.append(Problem(f"actions.{agent}", "missing: every player needs actions"))
        else:
            problems += name_list_problems(actions[agent], f"actions.{agent}", "action")
    return problems


def _at(actions: list, path: str) -> object:
    """The list item a path like ``actions[2]`` names (for the yes/no hint)."""
    try:
        return actions[int(path.rsplit("[", 1)[1].rstrip("]"))]
    except (IndexError, ValueError):
        return None


def _table_problems(
    node: object, depth: int, path: str, agents: Sequence[str], actions: dict[str, list[str]]
) -> list[Problem]:
    """The payoff table below ``path``: one mapping level per player, then a payoff list."""
    n = len(agents)
    if depth == n:
        if not (
            isinstance(node, list) and len(node) == n and all(is_finite_number(x) for x in node)
        ):
            return [
                Problem(
                    path,
                    f"must be a list of {n} payoffs, one per agent ({', '.join(agents)}), "
                    f"got {short(node)}",
                )
            ]
        return []
    agent = agents[depth]
    declared = actions[agent]
    level = "the first player" if depth == 0 else f"player {depth + 1}"
    if not isinstance(node, Mapping):
        return [
            Problem(
                path,
                f"must map each action of {agent} ({level}: {', '.join(declared)}) to the next "
                f"level of the table, got {short(node)}",
            )
        ]
    problems = []
    for key in node:
        if key not in declared:
            problems.append(
                Problem(
                    f"{path}.{short(key) if not isinstance(key, str) else key[:80]}",
                    f"undeclared action {short(key)} of {agent} (declared: "
                    f"{', '.join(declared)}){_bool_hint(key)}",
                )
            )
    for action in declared:
        if action not in node:
            problems.append(Problem(path, f"missing action {action!r} of {agent} ({level})"))
        else:
            problems += _table_problems(
                node[action], depth + 1, f"{path}.{action}", agents, actions
            )
        if len(problems) >= 20:  # a table of the wrong shape says so in a few lines, not 4096
            break
    return problems


def check_matrix(params: Mapping[str, Any], agents: Sequence[str]) -> list[Problem]:
    """The actions, the table's shape against them, the fallback, the round counts and the
    template (paths relative to ``params``)."""
    problems = _actions_problems(params.get("actions"), agents)
    problems += int_problem(params, "talk_rounds", 0, 20)
    problems += int_problem(params, "repeats", 1, 100)
    if problems:
        return problems
    actions = player_actions(params["actions"], agents)
    assert actions is not None  # checked above
    cells = 1
    for agent in agents:
        cells *= len(actions[agent])
    if cells > MAX_CELLS:
        return [Problem("payoffs", f"{cells} joint actions; at most {MAX_CELLS}")]
    if params.get("payoffs") is None:
        return [Problem("payoffs", "required: the payoff table")]
    problems += _table_problems(params["payoffs"], 0, "payoffs", agents, actions)
    fallback = params.get("fallback")
    lacking = [a for a in agents if fallback is not None and fallback not in actions[a]]
    if lacking:
        problems.append(
            Problem(
                "fallback",
                f"undeclared action {short(fallback)} of {', '.join(lacking)} (declared: "
                + "; ".join(f"{a}: {', '.join(actions[a])}" for a in lacking)
                + ")",
            )
        )
    problems += private_problems(params.get("private"), agents, lambda a: PLACEHOLDERS)
    return problems
