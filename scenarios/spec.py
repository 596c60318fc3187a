"""The scenario spec: a validated scenario document as frozen data.

:func:`spec_from_dict` validates a document (:func:`marl.scenarios.validation.validate_scenario`)
and builds the :class:`ScenarioSpec`, or raises :class:`~marl.scenarios.problems.ScenarioError`
carrying all the problems at once, so a user fixes a file in one pass. Reading the file is
:mod:`marl.scenarios.reader`'s job.

The scenario package layers one way: ``problems`` (what is wrong) <- ``rules``, ``shaping`` <-
``validation`` <- ``spec``, and ``reader`` beside them, on ``problems`` alone.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marl.protocols.graphs import TOPOLOGIES, GraphSpec
from marl.protocols.router import ChannelNoise, MessageBudget
from marl.protocols.tools import normalise_tools
from marl.scenarios.problems import ScenarioError
from marl.scenarios.rules import RULES
from marl.scenarios.shaping import parse_shaping
from marl.scenarios.validation import validate_scenario


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


def topology_params(topology: str, raw: Mapping | None) -> dict[str, Any]:
    """A valid ``graph.params`` with the topology's defaults filled in (empty if it has none)."""
    params_cls = TOPOLOGIES[topology].params
    if params_cls is None:
        return {}
    return dataclasses.asdict(params_cls(**dict(raw or {})))


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
        shaping=parse_shaping(reward.get("shaping")),
        system_prompt=data.get("system_prompt", ""),
        params=params,
        source=source,
        tools=normalise_tools(data.get("tools")),
    )
