"""The YAML scenario schema: parse, validate with key paths, and turn into a frozen spec.

``validate_scenario(data)`` returns one :class:`Problem` per mistake, each naming the key path
(``graph.edges[3]: unknown agent 'carol'``). ``load_spec(path_or_dict)`` raises
:class:`ScenarioError` carrying all the problems at once, so a user fixes a file in one pass.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marl.protocols.graphs import TOPOLOGIES, GraphSpec
from marl.protocols.router import ChannelNoise, MessageBudget

TOP_LEVEL_KEYS = {
    "name",
    "description",
    "rules",
    "agents",
    "roles",
    "graph",
    "messages",
    "episode",
    "reward",
    "system_prompt",
    "params",
}
GRAPH_KEYS = {"topology", "directed", "edges", "center", "p", "seed", "rewire_every"}
MESSAGE_KEYS = {"max_chars", "max_per_round", "noise"}
NOISE_KEYS = {"drop", "corrupt"}
EPISODE_KEYS = {"rounds", "lenient_actions"}
REWARD_KEYS = {"cooperation", "malformed_penalty"}


@dataclass(frozen=True)
class Problem:
    """One mistake in a scenario file, located by its key path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ScenarioError(ValueError):
    """A scenario could not be loaded; ``problems`` lists every mistake found."""

    def __init__(self, problems: list[Problem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"invalid scenario {source}".strip() if source else "invalid scenario"
        super().__init__(head + ":\n" + "\n".join(f"  {p}" for p in problems))


@dataclass(frozen=True)
class ScenarioSpec:
    """A validated scenario: everything the environment needs, as plain frozen data."""

    name: str
    rules: str
    agents: tuple[str, ...]
    description: str = ""
    roles: Mapping[str, str] = field(default_factory=dict)
    graph: GraphSpec = GraphSpec()
    budget: MessageBudget = MessageBudget()
    noise: ChannelNoise = ChannelNoise()
    rounds: int = 1
    lenient_actions: bool = False
    cooperation: float = 1.0
    malformed_penalty: float = -0.1
    system_prompt: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""


def _unknown_keys(data: Mapping, allowed: set[str], prefix: str) -> list[Problem]:
    return [
        Problem(f"{prefix}{key}", f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for key in data
        if key not in allowed
    ]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_section(data: Mapping, key: str, problems: list[Problem]) -> Mapping:
    value = data.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(Problem(key, f"must be a mapping, got {type(value).__name__}"))
        return {}
    return value


def _type_ok(value: object, hint: object) -> bool:
    """Whether ``value`` fits a simple annotation: int, float, bool, str, None and unions."""
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return _is_int(value)
    if hint is float:
        return _is_number(value) and math.isfinite(value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this simple check does not know: the rules check it


def _describe(hint: object) -> str:
    """An annotation in words: ``int | None`` -> 'an integer or null'."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    words = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
    if hint is type(None) or hint is None:
        return "null"
    return words.get(hint, getattr(hint, "__name__", str(hint)))  # type: ignore[call-overload]


def _param_type_problems(params_cls: type, params: Mapping) -> list[Problem]:
    """``params.<key>`` values whose type does not match the rules' ``Params`` annotation."""
    try:
        hints = typing.get_type_hints(params_cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: leave it to check_params
        return []
    problems = []
    for key, value in params.items():
        hint = hints.get(key) if isinstance(key, str) else None
        if hint is not None and not _type_ok(value, hint):
            problems.append(
                Problem(f"params.{key}", f"must be {_describe(hint)}, got {value!r:.40}")
            )
    return problems


def validate_scenario(data: object, rules_params: set[str] | None = None) -> list[Problem]:
    """Every problem with a scenario document; an empty list means it is valid.

    ``rules_params``: when the rules are known, the parameter names they accept.
    """
    from marl.scenarios.rules import RULES  # late import: rules modules import this one

    problems: list[Problem] = []
    if not isinstance(data, Mapping):
        return [Problem("", f"a scenario must be a YAML mapping, got {type(data).__name__}")]
    problems += _unknown_keys(data, TOP_LEVEL_KEYS, "")

    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(Problem("name", "required, a non-empty string such as 'signal-v0'"))

    rules = data.get("rules")
    if not isinstance(rules, str):
        problems.append(Problem("rules", "required, the name of registered Python rules"))
    elif rules not in RULES:  # a str, so hashable
        known = ", ".join(sorted(RULES)) or "none"
        problems.append(Problem("rules", f"unknown rules {rules!r}; known: {known}"))

    agents_raw = data.get("agents")
    agents: list[str] = []
    if isinstance(agents_raw, list) and agents_raw:
        for i, agent in enumerate(agents_raw):
            if not isinstance(agent, str) or not agent.strip():
                problems.append(Problem(f"agents[{i}]", "an agent name must be a non-empty string"))
            elif any(c.isspace() or c in "@:," for c in agent):
                problems.append(
                    Problem(
                        f"agents[{i}]", f"agent name {agent!r} may not hold spaces, '@', ':' or ','"
                    )
                )
            elif agent in agents:
                problems.append(Problem(f"agents[{i}]", f"duplicate agent {agent!r}"))
            else:
                agents.append(agent)
    else:
        problems.append(Problem("agents", "required, a non-empty list of agent names"))
    known_agents = set(agents)

    rules_known = isinstance(rules, str) and rules in RULES
    if rules_known and agents:
        info = RULES[rules].info
        if not info.min_agents <= len(agents) <= info.max_agents:
            problems.append(
                Problem(
                    "agents",
                    f"rules {rules!r} take {info.min_agents} to {info.max_agents} agents, "
                    f"got {len(agents)}",
                )
            )
        if rules_params is None:
            rules_params = {f.name for f in dataclasses.fields(RULES[rules].Params)}

    roles = _check_section(data, "roles", problems)
    for agent, text in roles.items():
        if agent not in known_agents:
            problems.append(Problem(f"roles.{agent}", f"unknown agent {agent!r}"))
        elif not isinstance(text, str):
            problems.append(Problem(f"roles.{agent}", "must be a string"))

    graph = _check_section(data, "graph", problems)
    problems += _unknown_keys(graph, GRAPH_KEYS, "graph.")
    default_topology = RULES[rules].info.default_topology if rules_known else "complete"
    topology = graph.get("topology", default_topology)
    if not isinstance(topology, str) or topology not in TOPOLOGIES:
        problems.append(
            Problem(
                "graph.topology",
                f"unknown topology {topology!r}; known: {', '.join(sorted(TOPOLOGIES))}",
            )
        )
    if "directed" in graph and not isinstance(graph["directed"], bool):
        problems.append(Problem("graph.directed", "must be true or false"))
    if "center" in graph and not (
        isinstance(graph["center"], str) and graph["center"] in known_agents
    ):
        problems.append(Problem("graph.center", f"unknown agent {graph['center']!r}"))
    if "p" in graph and not (_is_number(graph["p"]) and 0 <= graph["p"] <= 1):
        problems.append(Problem("graph.p", "must be a probability between 0 and 1"))
    if "seed" in graph and graph["seed"] is not None and not _is_int(graph["seed"]):
        problems.append(Problem("graph.seed", "must be an integer or null"))
    if "rewire_every" in graph and not (
        _is_int(graph["rewire_every"]) and graph["rewire_every"] >= 0
    ):
        problems.append(Problem("graph.rewire_every", "must be an integer >= 0"))
    edges = graph.get("edges", [])
    if topology == "explicit" and not edges:
        problems.append(Problem("graph.edges", "topology 'explicit' needs a non-empty edge list"))
    if not isinstance(edges, list):
        problems.append(Problem("graph.edges", "must be a list of [from, to] pairs"))
        edges = []
    for i, edge in enumerate(edges):
        if not (isinstance(edge, (list, tuple)) and len(edge) == 2):
            problems.append(Problem(f"graph.edges[{i}]", "must be a [from, to] pair"))
            continue
        for end in edge:
            if not isinstance(end, str) or end not in known_agents:
                problems.append(Problem(f"graph.edges[{i}]", f"unknown agent {end!r}"))
        if edge[0] == edge[1]:
            problems.append(Problem(f"graph.edges[{i}]", "an edge may not loop to itself"))

    messages = _check_section(data, "messages", problems)
    problems += _unknown_keys(messages, MESSAGE_KEYS, "messages.")
    for key in ("max_chars", "max_per_round"):
        if key in messages and not (_is_int(messages[key]) and messages[key] >= 1):
            problems.append(Problem(f"messages.{key}", "must be an integer >= 1"))
    noise = messages.get("noise", {}) or {}
    if not isinstance(noise, Mapping):
        problems.append(Problem("messages.noise", "must be a mapping with drop and corrupt"))
    else:
        problems += _unknown_keys(noise, NOISE_KEYS, "messages.noise.")
        for key in NOISE_KEYS & set(noise):
            if not (_is_number(noise[key]) and 0 <= noise[key] <= 1):
                problems.append(
                    Problem(f"messages.noise.{key}", "must be a probability between 0 and 1")
                )

    episode = _check_section(data, "episode", problems)
    problems += _unknown_keys(episode, EPISODE_KEYS, "episode.")
    if "rounds" in episode and not (_is_int(episode["rounds"]) and 1 <= episode["rounds"] <= 1000):
        problems.append(Problem("episode.rounds", "must be an integer between 1 and 1000"))
    if "lenient_actions" in episode and not isinstance(episode["lenient_actions"], bool):
        problems.append(Problem("episode.lenient_actions", "must be true or false"))

    reward = _check_section(data, "reward", problems)
    problems += _unknown_keys(reward, REWARD_KEYS, "reward.")
    if "cooperation" in reward and not (
        _is_number(reward["cooperation"]) and 0 <= reward["cooperation"] <= 1
    ):
        problems.append(
            Problem("reward.cooperation", "must be between 0 (zero-sum) and 1 (fully cooperative)")
        )
    if "malformed_penalty" in reward and not (
        _is_number(reward["malformed_penalty"]) and math.isfinite(reward["malformed_penalty"])
    ):
        problems.append(Problem("reward.malformed_penalty", "must be a finite number"))

    for key in ("description", "system_prompt"):
        if key in data and not isinstance(data[key], str):
            problems.append(Problem(key, "must be a string"))

    params = _check_section(data, "params", problems)
    if rules_params is not None:
        for key in params:
            if key not in rules_params:
                allowed = ", ".join(sorted(rules_params)) or "none"
                problems.append(
                    Problem(
                        f"params.{key}",
                        f"unknown parameter for rules {rules!r} (allowed: {allowed})",
                    )
                )
    if rules_known:
        problems += _param_type_problems(RULES[rules].Params, params)
    if not problems and rules_known:
        problems += [
            Problem(f"params.{p.path}" if p.path else "params", p.message)
            for p in RULES[rules].check_params(dict(params), agents)
        ]
    return problems


def read_yaml(path: str | Path) -> object:
    """Read a YAML file; missing files and YAML syntax errors become a ScenarioError."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError([Problem("", f"file not found: {path}")], str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError([Problem("", f"cannot read {path}: {exc}")], str(path)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError(
            [Problem("", f"YAML syntax error at {where}{reason}")], str(path)
        ) from None
    except RecursionError:
        raise ScenarioError([Problem("", "YAML nested too deeply")], str(path)) from None


def deep_merge(base: Mapping, overrides: Mapping) -> dict:
    """``base`` with ``overrides`` merged in, recursively for nested mappings."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def spec_from_dict(data: Mapping, source: str = "") -> ScenarioSpec:
    """Validate ``data`` and build the frozen spec; raises ScenarioError listing all problems."""
    from marl.scenarios.rules import RULES

    problems = validate_scenario(data)
    if problems:
        raise ScenarioError(problems, source)
    graph = dict(data.get("graph") or {})
    messages = dict(data.get("messages") or {})
    noise = dict(messages.pop("noise", None) or {})
    reward = dict(data.get("reward") or {})
    rules_cls = RULES[data["rules"]]
    params = dataclasses.asdict(rules_cls.Params(**(data.get("params") or {})))
    return ScenarioSpec(
        name=data["name"],
        rules=data["rules"],
        agents=tuple(data["agents"]),
        description=data.get("description", ""),
        roles=dict(data.get("roles") or {}),
        graph=GraphSpec(
            topology=graph.get("topology", rules_cls.info.default_topology),
            directed=graph.get("directed", False),
            edges=tuple(tuple(e) for e in graph.get("edges", [])),
            center=graph.get("center"),
            p=float(graph.get("p", 0.5)),
            seed=graph.get("seed"),
            rewire_every=graph.get("rewire_every", 0),
        ),
        budget=MessageBudget(**messages),
        noise=ChannelNoise(**{k: float(v) for k, v in noise.items()}),
        rounds=int((data.get("episode") or {}).get("rounds", rules_cls.info.default_rounds)),
        lenient_actions=bool((data.get("episode") or {}).get("lenient_actions", False)),
        cooperation=float(reward.get("cooperation", 1.0)),
        malformed_penalty=float(reward.get("malformed_penalty", -0.1)),
        system_prompt=data.get("system_prompt", ""),
        params=params,
        source=source,
    )
