"""The YAML scenario schema: parse, validate with key paths, and turn into a frozen spec.

``validate_scenario(data)`` returns one :class:`Problem` per mistake, each naming the key path
(``graph.edges[3]: unknown agent 'carol'``). ``load_spec(path_or_dict)`` raises
:class:`ScenarioError` carrying all the problems at once, so a user fixes a file in one pass.

A scenario file is untrusted data: :func:`read_yaml` reads only regular files up to
MAX_YAML_BYTES, :class:`ScenarioLoader` refuses anchors, aliases, duplicate keys, deep nesting
and huge numbers, values quoted in problems go through :func:`short`, and agent names may be
neither invisible nor look-alikes of each other (README, "Trust model").
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import reprlib
import stat
import types
import typing
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marl.protocols.graphs import TOPOLOGIES, GraphSpec
from marl.protocols.router import ChannelNoise, MessageBudget
from marl.protocols.tools import normalise_tools, tool_problems
from marl.protocols.values import is_finite_number, is_int, is_number

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
    "rules_module",
    "tools",
}
GRAPH_KEYS = {
    "topology",
    "directed",
    "edges",
    "center",
    "p",
    "seed",
    "rewire_every",
    "params",
    "cut",
}
MESSAGE_KEYS = {"max_chars", "max_per_round", "noise"}
NOISE_KEYS = {"drop", "corrupt"}
EPISODE_KEYS = {"rounds", "lenient_actions"}
REWARD_KEYS = {"cooperation", "malformed_penalty", "shaping"}

# Bounds on what a scenario file may make the loader do (README, "Trust model").
MAX_YAML_BYTES = 1_000_000  # a scenario file larger than this is refused unread
MAX_YAML_DEPTH = 50  # nesting of mappings and sequences
MAX_NUMBER_CHARS = 100  # characters of one YAML number (Python refuses ints over 4300 digits)
MAX_AGENT_NAME = 64  # characters of one agent name
MAX_PRINTED = 80  # characters of a value quoted in a problem message
MAX_LISTED_PROBLEMS = 50  # problems spelled out in a ScenarioError's message


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


def _key(key: object) -> str:
    """A mapping key as it appears in a problem's path (a string as is, else its short repr)."""
    if isinstance(key, str):
        return key if len(key) <= MAX_PRINTED else key[: MAX_PRINTED - 3] + "..."
    return short(key)


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
    shaping: tuple[Any, ...] = ()  # ShapingTerm (marl.scenarios.shaping), applied by the trainer
    system_prompt: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    # the tools agents may call within a turn: {name: limits and options} (docs/tools.md)
    tools: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def _unknown_keys(data: Mapping, allowed: set[str], prefix: str) -> list[Problem]:
    return [
        Problem(f"{prefix}{_key(key)}", f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for key in data
        if key not in allowed
    ]


def _check_section(data: Mapping, key: str, problems: list[Problem]) -> Mapping:
    value = data.get(key, {})
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(Problem(key, f"must be a mapping, got {type(value).__name__}"))
        return {}
    return value


def _type_ok(value: object, hint: object) -> bool:
    """Whether ``value`` fits a simple annotation: int, float, bool, str, None, unions, and
    lists or tuples of those (``list[str]``, ``tuple[str, ...]``: YAML gives both as a list)."""
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    item = _item_hint(hint)
    if item is not None:
        return isinstance(value, (list, tuple)) and all(_type_ok(v, item) for v in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return is_int(value)
    if hint is float:
        return is_finite_number(value)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this simple check does not know: the rules check it


def _item_hint(hint: object) -> object:
    """The item annotation of ``list[X]`` or ``tuple[X, ...]``; None for any other hint."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list and len(args) == 1:
        return args[0]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    return None


def _describe(hint: object) -> str:
    """An annotation in words: ``int | None`` -> 'an integer or null'; ``list[str]`` -> 'a
    list of strings'."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    item = _item_hint(hint)
    if item is not None:
        plural = {bool: "true or false values", int: "integers", float: "finite numbers"}
        words = plural.get(item) or (  # type: ignore[call-overload]
            "strings" if item is str else f"items of type {_describe(item)}"
        )
        return f"a list of {words}"
    words = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
    if hint is type(None) or hint is None:
        return "null"
    return words.get(hint, getattr(hint, "__name__", str(hint)))  # type: ignore[call-overload]


def _param_type_problems(
    params_cls: type, params: Mapping, prefix: str = "params"
) -> list[Problem]:
    """``<prefix>.<key>`` values whose type does not match the ``Params`` annotation (of the
    rules, or of a topology with ``prefix="graph.params"``).

    An annotation that cannot be resolved (a name that exists only under ``TYPE_CHECKING``, or
    a typo) is a problem of the rules, reported here rather than skipped: the values given
    could not be checked.
    """
    try:
        hints = typing.get_type_hints(params_cls)
    except Exception as exc:  # noqa: BLE001 - any failure to evaluate an annotation
        if not params:
            return []  # nothing to check
        owner = getattr(params_cls, "__qualname__", repr(params_cls))
        return [
            Problem(
                prefix,
                f"cannot check the values: the annotations of {owner} do not resolve "
                f"({type(exc).__name__}: {exc}); annotate with names the rules module "
                "defines or imports at its top level",
            )
        ]
    problems = []
    for key, value in params.items():
        hint = hints.get(key) if isinstance(key, str) else None
        if hint is not None and not _type_ok(value, hint):
            problems.append(
                Problem(f"{prefix}.{_key(key)}", f"must be {_describe(hint)}, got {short(value)}")
            )
    return problems


# Code points that render as nothing in most fonts but are letters or marks by category
# (Unicode's Default_Ignorable_Code_Point, less the Cf ones the category test already catches).
_INVISIBLE = {0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0}
_INVISIBLE_RANGES = ((0x180B, 0x180F), (0xFE00, 0xFE0F), (0xE0100, 0xE01EF))
# Control, format (zero-width, bidi), surrogate, private-use, unassigned, separators.
_REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"}
# Cyrillic and Greek letters that look like Latin ones (lower case: compared after casefold).
_LOOKALIKE = str.maketrans(
    "аеорсухѕіјһԁӏԛԝкмтнвьαβεικνορτυχηωζ",
    "aeopcyxsijhdlqwkmthbbabeikvoptuxnwz",
)
_MIXABLE_SCRIPTS = {"LATIN", "CYRILLIC", "GREEK"}


def _invisible(char: str) -> bool:
    code = ord(char)
    if unicodedata.category(char) in _REFUSED_CATEGORIES or code in _INVISIBLE:
        return True
    return any(low <= code <= high for low, high in _INVISIBLE_RANGES)


def _name_problem(name: str) -> str | None:
    """Why an agent name could be mistaken for another or hide text, or None when it is fine:
    invisible, control, format (zero-width, bidi) or separator characters, or letters of the
    Latin, Greek and Cyrillic scripts mixed in one name."""
    for char in name:
        if _invisible(char):
            return (
                f"agent name {short(name)} holds the invisible or control character "
                f"U+{ord(char):04X}"
            )
    scripts = {
        unicodedata.name(c, "?").split()[0] for c in name if unicodedata.category(c)[0] == "L"
    }
    mixed = sorted(scripts & _MIXABLE_SCRIPTS)
    if len(mixed) > 1:
        return (
            f"agent name {short(name)} mixes {' and '.join(s.title() for s in mixed)} letters, "
            "so it can look like another name"
        )
    return None


def _skeleton(name: str) -> str:
    """What a name looks like: two names with the same skeleton are refused as look-alikes."""
    return unicodedata.normalize("NFKC", name).casefold().translate(_LOOKALIKE)


def _topology_param_problems(topology: object, graph: Mapping) -> list[Problem]:
    """Problems of ``graph.params``: the parameters of a topology registered with a ``params``
    dataclass (names, simple types, required fields)."""
    raw = graph.get("params")
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        return [Problem("graph.params", f"must be a mapping, got {type(raw).__name__}")]
    if not (isinstance(topology, str) and topology in TOPOLOGIES):
        return []  # the unknown topology is reported on its own
    params_cls = TOPOLOGIES[topology].params
    if params_cls is None:
        if not raw:
            return []
        return [Problem("graph.params", f"topology {topology!r} takes no parameters")]
    fields = dataclasses.fields(params_cls)
    allowed = {f.name for f in fields}
    problems = [
        Problem(
            f"graph.params.{_key(key)}",
            f"unknown parameter for topology {topology!r} (allowed: "
            f"{', '.join(sorted(allowed)) or 'none'})",
        )
        for key in raw
        if key not in allowed
    ]
    problems += _param_type_problems(params_cls, raw, prefix="graph.params")
    for f in fields:
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default and f.name not in raw:
            problems.append(Problem(f"graph.params.{f.name}", f"required by topology {topology!r}"))
    return problems


def topology_params(topology: str, raw: Mapping | None) -> dict[str, Any]:
    """A valid ``graph.params`` with the topology's defaults filled in (empty if it has none)."""
    params_cls = TOPOLOGIES[topology].params
    if params_cls is None:
        return {}
    return dataclasses.asdict(params_cls(**dict(raw or {})))


def validate_scenario(data: object, rules_params: set[str] | None = None) -> list[Problem]:
    """Every problem with a scenario document; an empty list means it is valid.

    ``rules_params``: when the rules are known, the parameter names they accept.
    """
    # late import: rules modules import this one
    from marl.scenarios.rules import RULES, import_rules_module

    problems: list[Problem] = []
    if not isinstance(data, Mapping):
        return [Problem("", f"a scenario must be a YAML mapping, got {type(data).__name__}")]
    problems += _unknown_keys(data, TOP_LEVEL_KEYS, "")
    if data.get("rules_module") is not None:  # imported first: it may register the rules
        problems += import_rules_module(data["rules_module"])

    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append(Problem("name", "required, a non-empty string such as 'signal-v0'"))

    rules = data.get("rules")
    if not isinstance(rules, str):
        problems.append(Problem("rules", "required, the name of registered Python rules"))
    elif rules not in RULES:
        problems.append(Problem("rules", RULES.unknown_message(rules, shown=short(rules))))

    agents_raw = data.get("agents")
    agents: list[str] = []
    if isinstance(agents_raw, list) and agents_raw:
        skeletons: dict[str, str] = {}
        for i, agent in enumerate(agents_raw):
            if not isinstance(agent, str) or not agent.strip():
                problems.append(Problem(f"agents[{i}]", "an agent name must be a non-empty string"))
            elif len(agent) > MAX_AGENT_NAME:
                problems.append(
                    Problem(
                        f"agents[{i}]",
                        f"agent name {short(agent)} is {len(agent)} characters long "
                        f"(at most {MAX_AGENT_NAME})",
                    )
                )
            elif any(c.isspace() or c in "@:," for c in agent):
                problems.append(
                    Problem(
                        f"agents[{i}]",
                        f"agent name {short(agent)} may not hold spaces, '@', ':' or ','",
                    )
                )
            elif (bad := _name_problem(agent)) is not None:
                problems.append(Problem(f"agents[{i}]", bad))
            elif agent in agents:
                problems.append(Problem(f"agents[{i}]", f"duplicate agent {short(agent)}"))
            elif (twin := skeletons.get(_skeleton(agent))) is not None:
                problems.append(
                    Problem(
                        f"agents[{i}]",
                        f"agent name {short(agent)} looks like agent {short(twin)}; names must "
                        "differ by more than case, character width or look-alike letters",
                    )
                )
            else:
                agents.append(agent)
                skeletons[_skeleton(agent)] = agent
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
            problems.append(Problem(f"roles.{_key(agent)}", f"unknown agent {short(agent)}"))
        elif not isinstance(text, str):
            problems.append(Problem(f"roles.{_key(agent)}", "must be a string"))

    graph = _check_section(data, "graph", problems)
    problems += _unknown_keys(graph, GRAPH_KEYS, "graph.")
    default_topology = RULES[rules].info.default_topology if rules_known else "complete"
    topology = graph.get("topology", default_topology)
    if not isinstance(topology, str) or topology not in TOPOLOGIES:
        problems.append(
            Problem(
                "graph.topology",
                TOPOLOGIES.unknown_message(topology, shown=short(topology)),
            )
        )
    problems += _topology_param_problems(topology, graph)
    if "directed" in graph and not isinstance(graph["directed"], bool):
        problems.append(Problem("graph.directed", "must be true or false"))
    if "center" in graph and not (
        isinstance(graph["center"], str) and graph["center"] in known_agents
    ):
        problems.append(Problem("graph.center", f"unknown agent {short(graph['center'])}"))
    if "p" in graph and not (is_number(graph["p"]) and 0 <= graph["p"] <= 1):
        problems.append(Problem("graph.p", "must be a probability between 0 and 1"))
    if "seed" in graph and graph["seed"] is not None and not is_int(graph["seed"]):
        problems.append(Problem("graph.seed", "must be an integer or null"))
    if "rewire_every" in graph and not (
        is_int(graph["rewire_every"]) and graph["rewire_every"] >= 0
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
                problems.append(Problem(f"graph.edges[{i}]", f"unknown agent {short(end)}"))
        if edge[0] == edge[1]:
            problems.append(Problem(f"graph.edges[{i}]", "an edge may not loop to itself"))
    cut = graph.get("cut", [])
    if not isinstance(cut, list):
        problems.append(Problem("graph.cut", "must be a list of [sender, receiver] pairs"))
        cut = []
    for i, edge in enumerate(cut):
        if not (isinstance(edge, (list, tuple)) and len(edge) == 2):
            problems.append(Problem(f"graph.cut[{i}]", "must be a [sender, receiver] pair"))
            continue
        for end in edge:
            if not isinstance(end, str) or end not in known_agents:
                problems.append(Problem(f"graph.cut[{i}]", f"unknown agent {short(end)}"))
        if edge[0] == edge[1]:
            problems.append(Problem(f"graph.cut[{i}]", "an edge may not loop to itself"))

    messages = _check_section(data, "messages", problems)
    problems += _unknown_keys(messages, MESSAGE_KEYS, "messages.")
    for key in ("max_chars", "max_per_round"):
        if key in messages and not (is_int(messages[key]) and messages[key] >= 1):
            problems.append(Problem(f"messages.{key}", "must be an integer >= 1"))
    noise = messages.get("noise", {}) or {}
    if not isinstance(noise, Mapping):
        problems.append(Problem("messages.noise", "must be a mapping with drop and corrupt"))
    else:
        problems += _unknown_keys(noise, NOISE_KEYS, "messages.noise.")
        for key in NOISE_KEYS & set(noise):
            if not (is_number(noise[key]) and 0 <= noise[key] <= 1):
                problems.append(
                    Problem(f"messages.noise.{key}", "must be a probability between 0 and 1")
                )

    episode = _check_section(data, "episode", problems)
    problems += _unknown_keys(episode, EPISODE_KEYS, "episode.")
    if "rounds" in episode and not (is_int(episode["rounds"]) and 1 <= episode["rounds"] <= 1000):
        problems.append(Problem("episode.rounds", "must be an integer between 1 and 1000"))
    if "lenient_actions" in episode and not isinstance(episode["lenient_actions"], bool):
        problems.append(Problem("episode.lenient_actions", "must be true or false"))

    reward = _check_section(data, "reward", problems)
    problems += _unknown_keys(reward, REWARD_KEYS, "reward.")
    if "cooperation" in reward and not (
        is_number(reward["cooperation"]) and 0 <= reward["cooperation"] <= 1
    ):
        problems.append(
            Problem("reward.cooperation", "must be between 0 (zero-sum) and 1 (fully cooperative)")
        )
    if "malformed_penalty" in reward and not is_finite_number(reward["malformed_penalty"]):
        problems.append(Problem("reward.malformed_penalty", "must be a finite number"))
    if "shaping" in reward:
        from marl.scenarios.shaping import validate_shaping

        problems += validate_shaping(reward["shaping"])

    problems += [Problem(path, text) for path, text in tool_problems(data.get("tools"), agents)]

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
                        f"params.{_key(key)}",
                        f"unknown parameter for rules {short(rules)} (allowed: {allowed})",
                    )
                )
    if rules_known:
        problems += _param_type_problems(RULES[rules].Params, params)
    if not problems and rules_known:
        problems += _rules_params_problems(rules, dict(params), agents)
    if not problems and rules_known:
        problems += _implied_rounds_problems(RULES[rules], dict(params), episode)
    return problems


def _rules_params_problems(rules: str, params: dict, agents: list[str]) -> list[Problem]:
    """The rules' own ``check_params``, its problems under ``params``. A check that raises (a
    value of a shape it did not expect) is one problem naming ``params``, not a traceback."""
    from marl.scenarios.rules import RULES

    try:
        found = RULES[rules].check_params(params, agents)
    except Exception as exc:  # noqa: BLE001 - a rules module's check is code we do not own
        lines = str(exc).splitlines()
        reason = f"{type(exc).__name__}: {lines[0][:160]}" if lines else type(exc).__name__
        return [Problem("params", f"rules {short(rules)} could not check these params ({reason})")]
    return [Problem(f"params.{p.path}" if p.path else "params", p.message) for p in found]


def _implied_rounds_problems(rules_cls: type, params: dict, episode: Mapping) -> list[Problem]:
    """``episode.rounds`` against the number of rounds the rules' params imply, if any."""
    implied = rules_cls.episode_rounds(params)
    if implied is None:
        return []
    if not 1 <= implied <= 1000:
        return [Problem("params", f"these params make {implied} rounds; at most 1000")]
    given = episode.get("rounds", implied)
    if given != implied:
        return [
            Problem(
                "episode.rounds",
                f"the params of these rules make {implied} rounds, got {short(given)}; "
                "leave episode.rounds out (it follows the params) or change the params",
            )
        ]
    return []


class _Refused(yaml.YAMLError):
    """A YAML construct a scenario file may not use, at a place in the file."""

    def __init__(self, problem: str, mark: object | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class ScenarioLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` with bounds for files nobody vouches for.

    Refused: anchors and aliases (``&x``, ``*x``: the alias bomb and self-containing values),
    duplicate keys, nesting deeper than MAX_YAML_DEPTH, and numbers longer than
    MAX_NUMBER_CHARS characters. Like SafeLoader, it builds plain data only: no tag runs code.
    """

    def __init__(self, stream: object) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: object, index: object) -> yaml.Node:  # noqa: D102
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(
                "YAML aliases (*name) are not allowed in a scenario file", event.start_mark
            )
        if getattr(event, "anchor", None) is not None:
            raise _Refused(
                "YAML anchors (&name) are not allowed in a scenario file", event.start_mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _Refused(
                    f"YAML nested too deeply (more than {MAX_YAML_DEPTH} levels)",
                    event.start_mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict:  # noqa: D102
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: SafeLoader refuses it with its mark
                    continue
                if duplicate:
                    raise _Refused(f"duplicate key {short(key)}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def _bounded_number(self, node: yaml.Node, construct: Any) -> object:
        text = self.construct_scalar(node)
        if len(text) > MAX_NUMBER_CHARS:
            raise _Refused(
                f"a number of {len(text)} characters (at most {MAX_NUMBER_CHARS})",
                node.start_mark,
            )
        return construct(self, node)

    def construct_yaml_int(self, node: yaml.Node) -> object:  # noqa: D102
        return self._bounded_number(node, yaml.SafeLoader.construct_yaml_int)

    def construct_yaml_float(self, node: yaml.Node) -> object:  # noqa: D102
        return self._bounded_number(node, yaml.SafeLoader.construct_yaml_float)


ScenarioLoader.add_constructor("tag:yaml.org,2002:int", ScenarioLoader.construct_yaml_int)
ScenarioLoader.add_constructor("tag:yaml.org,2002:float", ScenarioLoader.construct_yaml_float)

_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableFile(OSError):
    """A path that is not a regular file, or a file over the size limit of what it should be."""


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, refusing anything else without blocking.

    Raises FileNotFoundError, :class:`UnreadableFile` for a directory, FIFO, device or socket,
    or for a file over ``limit`` bytes (``/dev/zero`` and a FIFO are refused, not read), and
    OSError for the rest.
    """
    # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((k for test, k in _FILE_KINDS if test(info.st_mode)), "not a file")
            raise UnreadableFile(f"not a regular file ({kind})")
        if info.st_size > limit:
            raise UnreadableFile(f"{info.st_size} bytes, over the limit of {limit}")
        chunks, size = [], 0
        while size <= limit:  # st_size can understate (/proc): read at most limit + 1 bytes
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnreadableFile(f"over the limit of {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse_yaml(text: str) -> object:
    """Parse a scenario document with :class:`ScenarioLoader` (raises yaml.YAMLError)."""
    loader = ScenarioLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> object:
    """Read a scenario YAML file within the bounds of :class:`ScenarioLoader` and
    MAX_YAML_BYTES; an unreadable file or a YAML error becomes a ScenarioError."""
    path = Path(path)
    try:
        text = read_bounded(path, MAX_YAML_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError([Problem("", f"file not found: {path}")], str(path)) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError([Problem("", f"cannot read {path}: {exc}")], str(path)) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ScenarioError([Problem("", f"cannot read {path}: {reason}")], str(path)) from None
    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        reason = str(getattr(exc, "problem", None) or exc)[:200]
        if isinstance(exc, _Refused):  # well-formed YAML that a scenario file may not use
            message = f"{where}{reason}"
        else:
            message = f"YAML syntax error at {where}{reason}"
        raise ScenarioError([Problem("", message)], str(path)) from None
    except RecursionError:
        raise ScenarioError([Problem("", "YAML nested too deeply")], str(path)) from None
    except Exception as exc:  # noqa: BLE001 - a tagged scalar SafeLoader fails to build
        # (`!!int` with no digits, `!!timestamp 2001-13-45`): a problem, not a traceback
        reason = f"{type(exc).__name__}: {exc}"[:200]
        raise ScenarioError(
            [Problem("", f"YAML value cannot be built: {reason}")], str(path)
        ) from None


def deep_merge(base: Mapping, overrides: Mapping) -> dict:
    """``base`` with ``overrides`` merged in, recursively for nested mappings."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _shaping_terms(value: object) -> tuple[Any, ...]:
    from marl.scenarios.shaping import parse_shaping

    return parse_shaping(value)


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
    topology = graph.get("topology", rules_cls.info.default_topology)
    return ScenarioSpec(
        name=data["name"],
        rules=data["rules"],
        agents=tuple(data["agents"]),
        description=data.get("description", ""),
        roles=dict(data.get("roles") or {}),
        graph=GraphSpec(
            topology=topology,
            directed=graph.get("directed", False),
            edges=tuple(tuple(e) for e in graph.get("edges", [])),
            center=graph.get("center"),
            p=float(graph.get("p", 0.5)),
            seed=graph.get("seed"),
            rewire_every=graph.get("rewire_every", 0),
            params=topology_params(topology, graph.get("params")),
            cut=tuple((str(u), str(v)) for u, v in graph.get("cut") or []),
        ),
        budget=MessageBudget(**messages),
        noise=ChannelNoise(**{k: float(v) for k, v in noise.items()}),
        rounds=int(
            (data.get("episode") or {}).get(
                "rounds", rules_cls.episode_rounds(params) or rules_cls.info.default_rounds
            )
        ),
        lenient_actions=bool((data.get("episode") or {}).get("lenient_actions", False)),
        cooperation=float(reward.get("cooperation", 1.0)),
        malformed_penalty=float(reward.get("malformed_penalty", -0.1)),
        shaping=_shaping_terms(reward.get("shaping")),
        system_prompt=data.get("system_prompt", ""),
        params=params,
        source=source,
        tools=normalise_tools(data.get("tools")),
    )
