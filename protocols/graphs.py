"""Communication graphs built with networkx, and the registry of topologies.

A topology is a function ``(agents, spec, rng) -> nx.DiGraph``. Undirected topologies are stored
as a DiGraph with both directions, so that "a message travels only along an edge" is always the
check ``graph.has_edge(sender, receiver)``.

A topology may take parameters of its own from the scenario YAML (``graph: {topology: hubs,
params: {hubs: 2}}``): declare them as a dataclass with defaults, as rules declare ``Params``,
and register with ``@register_topology("hubs", params=HubParams)``. The YAML's values are
checked against the dataclass (names and simple types, each problem naming its key such as
``graph.params.hubs``) and reach the builder, defaults filled in, as the mapping
``spec.params``.

An edge may be **cut** (``graph: {cut: [[speaker, listener]]}``): it stays in the graph, so the
sender is told it can message the receiver and its prompts and talk turns are what they are
with the edge, but the router drops whatever travels along it (counted as ``cut_dropped``,
never delivered). It is the control for "does the listener use the message": the speaker still
talks, and is still measured, into a channel that nobody hears. A cut edge carries the edge
attribute ``deliver=False`` (:data:`DELIVER`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from marl.protocols.registry import Registry

TopologyFn = Callable[[Sequence[str], "GraphSpec", random.Random], nx.DiGraph]


@dataclass(frozen=True)
class Topology:
    """A registered topology: its builder, the dataclass of its own parameters (or None), and
    whether the builder draws from its ``rng`` (``seeded``): a topology that does not gives one
    graph for every episode and round, which an environment builds once."""

    build: TopologyFn
    params: type | None = None
    seeded: bool = True


TOPOLOGIES: Registry[str, Topology] = Registry("topology")
DELIVER = "deliver"  # edge attribute: False on a cut edge (the router drops what it carries)


@dataclass(frozen=True)
class GraphSpec:
    """How to build a communication graph.

    topology:      name of a registered topology (complete, ring, star, line, random, explicit,
                   empty).
    directed:      if False every edge works both ways.
    edges:         explicit edge list, for topology ``explicit``.
    center:        hub agent, for ``star`` (default: the first agent).
    p:             edge probability, for ``random``.
    seed:          seed of the ``random`` topology; ``None`` means the episode seed.
    rewire_every:  for ``random``: draw a fresh graph every this many rounds (0 = never).
    params:        the topology's own parameters (``graph.params`` in the YAML), defaults
                   filled in from the dataclass it was registered with.
    cut:           directed edges ``(sender, receiver)`` that stay in the graph but deliver
                   nothing (see the module docstring); one direction each, also in an undirected
                   graph. A cut edge the topology did not build (a ``random`` draw) is no edge.
    """

    topology: str = "complete"
    directed: bool = False
    edges: tuple[tuple[str, str], ...] = ()
    center: str | None = None
    p: float = 0.5
    seed: int | None = None
    rewire_every: int = 0
    params: Mapping[str, Any] = field(default_factory=dict)
    cut: tuple[tuple[str, str], ...] = ()


def register_topology(
    name: str, params: type | None = None, *, seeded: bool = True
) -> Callable[[TopologyFn], TopologyFn]:
    """Register a topology builder under ``name``; duplicate names are refused.

    ``params``: a dataclass (every field with a default) of the parameters the topology reads
    from ``spec.params``; None = it takes none. ``seeded=False`` declares that the builder never
    draws from its ``rng``, so its graph is the same in every episode (then built once).
    """
    if params is not None and not dataclasses.is_dataclass(params):
        raise TypeError(f"topology {name!r}: params must be a dataclass")

    def decorator(fn: TopologyFn) -> TopologyFn:
        TOPOLOGIES.add(name, Topology(fn, params, seeded))
        return fn

    return decorator


def _finish(agents: Sequence[str], edges: list[tuple[str, str]], directed: bool) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(agents)
    for u, v in edges:
        if u == v:
            continue
        graph.add_edge(u, v)
        if not directed:
            graph.add_edge(v, u)
    return graph


@register_topology("complete", seeded=False)
def _complete(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    return _finish(agents, [(u, v) for u in agents for v in agents if u != v], True)


@register_topology("ring", seeded=False)
def _ring(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    n = len(agents)
    edges = [(agents[i], agents[(i + 1) % n]) for i in range(n)] if n > 1 else []
    return _finish(agents, edges, spec.directed)


@register_topology("line", seeded=False)
def _line(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    edges = [(agents[i], agents[i + 1]) for i in range(len(agents) - 1)]
    return _finish(agents, edges, spec.directed)


@register_topology("star", seeded=False)
def _star(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    hub = spec.center or agents[0]
    return _finish(agents, [(hub, a) for a in agents if a != hub], spec.directed)


@register_topology("random")
def _random(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    if spec.directed:
        edges = [(u, v) for u in agents for v in agents if u != v and rng.random() < spec.p]
    else:
        edges = [
            (agents[i], agents[j])
            for i in range(len(agents))
            for j in range(i + 1, len(agents))
            if rng.random() < spec.p
        ]
    return _finish(agents, edges, spec.directed)


@register_topology("empty", seeded=False)
def _empty(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    """No edges: nobody can message anybody (games whose only channel is the game itself)."""
    return _finish(agents, [], True)


@register_topology("explicit", seeded=False)
def _explicit(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    return _finish(agents, [tuple(e) for e in spec.edges], spec.directed)


def build_graph(
    agents: Sequence[str], spec: GraphSpec, episode_seed: int = 0, round: int = 0
) -> nx.DiGraph:
    """Build the graph in force at ``round`` of an episode seeded ``episode_seed``.

    Only ``random`` graphs with ``rewire_every > 0`` change between rounds; every other graph is
    the same in all rounds. The edges of ``spec.cut`` that the topology built are marked
    ``deliver=False`` (the cut draws nothing from the topology's generator).
    """
    topology = TOPOLOGIES.lookup(spec.topology, key="graph.topology")
    epoch = round // spec.rewire_every if spec.rewire_every > 0 else 0
    base_seed = spec.seed if spec.seed is not None else episode_seed
    rng = random.Random(f"{base_seed}:{epoch}")
    graph = topology.build(list(agents), spec, rng)
    for u, v in spec.cut:
        if graph.has_edge(u, v):  # add_edge updates the attribute; no cached edge view
            graph.add_edge(u, v, **{DELIVER: False})
    return graph


def delivers(graph: nx.DiGraph, sender: str, receiver: str) -> bool:
    """Whether the edge ``sender -> receiver`` of ``graph`` delivers (exists and is not cut)."""
    data = graph.get_edge_data(sender, receiver)
    return data is not None and bool(data.get(DELIVER, True))


def depends_on_seed(spec: GraphSpec) -> bool:
    """Whether :func:`build_graph` may give different graphs for different episode seeds or
    rounds; False when the topology is not ``seeded`` or its seed is fixed and it never
    rewires."""
    topology = TOPOLOGIES.lookup(spec.topology, key="graph.topology")
    return topology.seeded and (spec.seed is None or spec.rewire_every > 0)


def rewires_at(spec: GraphSpec, round: int) -> bool:
    """Whether the graph of ``round`` may differ from the graph of the round before it (a
    ``random`` graph with ``rewire_every > 0`` starting a new epoch); :func:`build_graph` gives
    the same graph for every round of one epoch."""
    return spec.rewire_every > 0 and round > 0 and round % spec.rewire_every == 0


def edge_list(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Edges of ``graph`` in a stable order (for transcripts and logs)."""
    return sorted(graph.edges())
