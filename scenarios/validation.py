"""Validating a scenario document: :func:`validate_scenario` returns one
:class:`~marl.scenarios.problems.Problem` per mistake, each naming its key path
(``graph.edges[3]: unknown agent 'carol'``), from one checker per section of the file.

Agent names may be neither invisible nor look-alikes of each other (docs/security.md), and
no text of the file (a value or a key, at any depth) may be longer than :data:`MAX_TEXT_CHARS`.
The rules, topologies and shaping kinds a document names are looked up in their registries;
a ``rules_module`` is imported first, since it may register them.
"""

from __future__ import annotations

import dataclasses
import types
import typing
import unicodedata
from collections.abc import Mapping
from typing import Any

from marl.protocols.graphs import TOPOLOGIES
from marl.protocols.tools import tool_problems
from marl.protocols.values import is_finite_number, is_int, is_number
from marl.scenarios.problems import MAX_PRINTED, Problem, short
from marl.scenarios.rules import RULES, Rules, import_rules_module
from marl.scenarios.shaping import validate_shaping

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

MAX_AGENT_NAME = 64  # characters of one agent name
# Agents of one scenario file. No registered rules take more than 16; a graph over n agents
# holds up to n^2 edges, so a list of 100,000 names is refused before anything is built.
MAX_AGENTS = 1024
# The most characters one text of a scenario file may hold: a system prompt, a role, a
# description, a string in params or anywhere else. Texts become prompts, and a prompt must fit
# its model's context: the longest of a preset is 8,192 tokens (SmolLM2's), and at about 4
# characters a token a longer text cannot fit in any preset's prompt. (The 1 MB file bound of
# marl.scenarios.reader let a 900 KB system prompt through, and one episode then took minutes
# and gigabytes.) The exact check, with the run's tokenizer and model, is made when a run starts
# (marl.runtime.context_check) and at every generate call (marl.agents.context).
MAX_TEXT_CHARS = 32_768


def _key(key: object) -> str:
    """A mapping key as it appears in a problem's path (a string as is, else its short repr)."""
    if isinstance(key, str):
        return key if len(key) <= MAX_PRINTED else key[: MAX_PRINTED - 3] + "..."
    return short(key)


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


def validate_scenario(data: object, rules_params: set[str] | None = None) -> list[Problem]:
    """Every problem with a scenario document; an empty list means it is valid.

    ``rules_params``: when the rules are known, the parameter names they accept (default: the
    fields of their ``Params``). The rules' own ``check_params`` and the rounds their params
    imply are checked only once everything else is valid.
    """
    if not isinstance(data, Mapping):
        return [Problem("", f"a scenario must be a YAML mapping, got {type(data).__name__}")]
    problems = _unknown_keys(data, TOP_LEVEL_KEYS, "")
    if data.get("rules_module") is not None:  # imported first: it may register the rules
        problems += import_rules_module(data["rules_module"])
    problems += _name_problems(data)
    rules_problems, rules = _rules_of(data)
    problems += rules_problems
    agent_problems, agents = _agents_of(data)
    problems += agent_problems
    if rules is not None and agents:
        problems += _agent_count_problems(data["rules"], rules, agents)
        if rules_params is None:
            rules_params = {f.name for f in dataclasses.fields(rules.Params)}
    problems += _roles_problems(data, agents)
    problems += _graph_problems(data, rules, agents)
    problems += _messages_problems(data)
    problems += _episode_problems(data)
    problems += _reward_problems(data)
    problems += [Problem(path, text) for path, text in tool_problems(data.get("tools"), agents)]
    problems += _text_problems(data)
    problems += _long_text_problems(data)
    problems += _params_problems(data, rules, rules_params)
    if not problems and rules is not None:
        params = dict(data.get("params") or {})
        problems += _rules_params_problems(data["rules"], rules, params, agents)
        if not problems:
            problems += _implied_rounds_problems(rules, params, data.get("episode") or {})
    return problems


def _name_problems(data: Mapping) -> list[Problem]:
    """``name``: required, a non-empty string."""
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        return [Problem("name", "required, a non-empty string such as 'signal-v0'")]
    return []


def _rules_of(data: Mapping) -> tuple[list[Problem], type[Rules] | None]:
    """``rules``: the problems, and the registered rules class (None when unknown)."""
    rules = data.get("rules")
    if not isinstance(rules, str):
        return [Problem("rules", "required, the name of registered Python rules")], None
    if rules not in RULES:
        return [Problem("rules", RULES.unknown_message(rules, shown=short(rules)))], None
    return [], RULES[rules]


def _agents_of(data: Mapping) -> tuple[list[Problem], list[str]]:
    """``agents``: the problems, and the names that are valid, in order."""
    agents_raw = data.get("agents")
    if not (isinstance(agents_raw, list) and agents_raw):
        return [Problem("agents", "required, a non-empty list of agent names")], []
    if len(agents_raw) > MAX_AGENTS:
        return [
            Problem("agents", f"{len(agents_raw):,} agents, over the limit of {MAX_AGENTS:,}")
        ], []
    problems: list[Problem] = []
    agents: list[str] = []
    seen: set[str] = set()
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
        elif agent in seen:
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
            seen.add(agent)
            skeletons[_skeleton(agent)] = agent
    return problems, agents


def _agent_count_problems(name: str, rules: type[Rules], agents: list[str]) -> list[Problem]:
    """``agents``: as many as the rules take."""
    info = rules.info
    if info.min_agents <= len(agents) <= info.max_agents:
        return []
    return [
        Problem(
            "agents",
            f"rules {name!r} take {info.min_agents} to {info.max_agents} agents, got {len(agents)}",
        )
    ]


def _roles_problems(data: Mapping, agents: list[str]) -> list[Problem]:
    """``roles``: a string per known agent."""
    problems: list[Problem] = []
    roles = _check_section(data, "roles", problems)
    for agent, text in roles.items():
        if agent not in agents:
            problems.append(Problem(f"roles.{_key(agent)}", f"unknown agent {short(agent)}"))
        elif not isinstance(text, str):
            problems.append(Problem(f"roles.{_key(agent)}", "must be a string"))
    return problems


def _graph_problems(data: Mapping, rules: type[Rules] | None, agents: list[str]) -> list[Problem]:
    """``graph``: a registered topology with its params, and edges and cuts between known
    agents."""
    problems: list[Problem] = []
    graph = _check_section(data, "graph", problems)
    problems += _unknown_keys(graph, GRAPH_KEYS, "graph.")
    default_topology = rules.info.default_topology if rules is not None else "complete"
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
    if "center" in graph and not (isinstance(graph["center"], str) and graph["center"] in agents):
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
    problems += _pair_problems(edges, "graph.edges", "[from, to]", agents)
    cut = graph.get("cut", [])
    if not isinstance(cut, list):
        problems.append(Problem("graph.cut", "must be a list of [sender, receiver] pairs"))
        cut = []
    problems += _pair_problems(cut, "graph.cut", "[sender, receiver]", agents)
    return problems


def _pair_problems(pairs: list, path: str, form: str, agents: list[str]) -> list[Problem]:
    """Each item of ``pairs`` (``graph.edges`` or ``graph.cut``): two distinct known agents."""
    problems: list[Problem] = []
    for i, edge in enumerate(pairs):
        if not (isinstance(edge, (list, tuple)) and len(edge) == 2):
            problems.append(Problem(f"{path}[{i}]", f"must be a {form} pair"))
            continue
        for end in edge:
            if not isinstance(end, str) or end not in agents:
                problems.append(Problem(f"{path}[{i}]", f"unknown agent {short(end)}"))
        if edge[0] == edge[1]:
            problems.append(Problem(f"{path}[{i}]", "an edge may not loop to itself"))
    return problems


def _messages_problems(data: Mapping) -> list[Problem]:
    """``messages``: budgets of at least 1, noise probabilities."""
    problems: list[Problem] = []
    messages = _check_section(data, "messages", problems)
    problems += _unknown_keys(messages, MESSAGE_KEYS, "messages.")
    for key in ("max_chars", "max_per_round"):
        if key in messages and not (is_int(messages[key]) and messages[key] >= 1):
            problems.append(Problem(f"messages.{key}", "must be an integer >= 1"))
    noise = messages.get("noise", {}) or {}
    if not isinstance(noise, Mapping):
        problems.append(Problem("messages.noise", "must be a mapping with drop and corrupt"))
        return problems
    problems += _unknown_keys(noise, NOISE_KEYS, "messages.noise.")
    for key in NOISE_KEYS & set(noise):
        if not (is_number(noise[key]) and 0 <= noise[key] <= 1):
            problems.append(
                Problem(f"messages.noise.{key}", "must be a probability between 0 and 1")
            )
    return problems


def _episode_problems(data: Mapping) -> list[Problem]:
    """``episode``: rounds between 1 and 1000, ``lenient_actions`` a bool."""
    problems: list[Problem] = []
    episode = _check_section(data, "episode", problems)
    problems += _unknown_keys(episode, EPISODE_KEYS, "episode.")
    if "rounds" in episode and not (is_int(episode["rounds"]) and 1 <= episode["rounds"] <= 1000):
        problems.append(Problem("episode.rounds", "must be an integer between 1 and 1000"))
    if "lenient_actions" in episode and not isinstance(episode["lenient_actions"], bool):
        problems.append(Problem("episode.lenient_actions", "must be true or false"))
    return problems


def _reward_problems(data: Mapping) -> list[Problem]:
    """``reward``: the cooperation coefficient, the malformed penalty, shaping terms."""
    problems: list[Problem] = []
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
        problems += validate_shaping(reward["shaping"])
    return problems


def _text_problems(data: Mapping) -> list[Problem]:
    """``description`` and ``system_prompt``: strings."""
    return [
        Problem(key, "must be a string")
        for key in ("description", "system_prompt")
        if key in data and not isinstance(data[key], str)
    ]


def _long_text_problems(data: Mapping) -> list[Problem]:
    """Every text of the document longer than :data:`MAX_TEXT_CHARS` (a string value, or a
    mapping key, at any depth), named by its key path (``roles.alice``, ``params.words[3]``), in
    document order. A loop, not recursion, and each container visited once: a document built in
    Python (``overrides``) may nest deeply, share one list many times or contain itself."""
    why = f"over the limit of {MAX_TEXT_CHARS:,} (a prompt must fit the model's context)"
    problems: list[Problem] = []
    seen: set[int] = set()
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if len(value) > MAX_TEXT_CHARS:
                problems.append(Problem(path, f"{len(value):,} characters, {why}"))
            continue
        if not isinstance(value, (Mapping, list, tuple)) or id(value) in seen:
            continue
        seen.add(id(value))
        children: list[tuple[str, object]] = []
        if isinstance(value, Mapping):
            for key, item in value.items():
                child = f"{path}.{_key(key)}" if path else _key(key)
                if isinstance(key, str) and len(key) > MAX_TEXT_CHARS:
                    problems.append(Problem(child, f"a key of {len(key):,} characters, {why}"))
                children.append((child, item))
        else:
            children = [(f"{path}[{i}]", item) for i, item in enumerate(value)]
        stack.extend(reversed(children))
    return problems


def _params_problems(
    data: Mapping, rules: type[Rules] | None, rules_params: set[str] | None
) -> list[Problem]:
    """``params``: names the rules accept, of the types their ``Params`` annotate."""
    problems: list[Problem] = []
    params = _check_section(data, "params", problems)
    if rules_params is not None:
        for key in params:
            if key not in rules_params:
                allowed = ", ".join(sorted(rules_params)) or "none"
                problems.append(
                    Problem(
                        f"params.{_key(key)}",
                        f"unknown parameter for rules {short(data.get('rules'))} "
                        f"(allowed: {allowed})",
                    )
                )
    if rules is not None:
        problems += _param_type_problems(rules.Params, params)
    return problems


def _rules_params_problems(
    name: str, rules: type[Rules], params: dict, agents: list[str]
) -> list[Problem]:
    """The rules' own ``check_params``, its problems under ``params``. A check that raises (a
    value of a shape it did not expect) is one problem naming ``params``, not a traceback."""
    try:
        found = rules.check_params(params, agents)
    except Exception as exc:  # noqa: BLE001 - a rules module's check is code we do not own
        lines = str(exc).splitlines()
        reason = f"{type(exc).__name__}: {lines[0][:160]}" if lines else type(exc).__name__
        return [Problem("params", f"rules {short(name)} could not check these params ({reason})")]
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
