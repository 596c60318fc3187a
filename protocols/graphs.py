"""Communication graphs built with networkx, and the registry of topologies.

A topology is a function ``(agents, spec, rng) -> nx.DiGraph``. Undirected topologies are stored
as a DiGraph with both directions, so that "a message travels only along an edge" is always the
check ``graph.has_edge(sender, receiver)``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import networkx as nx

TopologyFn = Callable[[Sequence[str], "GraphSpec", random.Random], nx.DiGraph]
TOPOLOGIES: dict[str, TopologyFn] = {}


@dataclass(frozen=True)
class GraphSpec:
    """How to build a communication graph.

    topology:      name of a registered topology (complete, ring, star, line, random, explicit).
    directed:      if False every edge works both ways.
    edges:         explicit edge list, for topology ``explicit``.
    center:        hub agent, for ``star`` (default: the first agent).
    p:             edge probability, for ``random``.
    seed:          seed of the ``random`` topology; ``None`` means the episode seed.
    rewire_every:  for ``random``: draw a fresh graph every this many rounds (0 = never).
    """

    topology: str = "complete"
    directed: bool = False
    edges: tuple[tuple[str, str], ...] = ()
    center: str | None = None
    p: float = 0.5
    seed: int | None = None
    rewire_every: int = 0


def register_topology(name: str) -> Callable[[TopologyFn], TopologyFn]:
    """Register a topology builder under ``name``; duplicate names are refused."""

    def decorator(fn: TopologyFn) -> TopologyFn:
        if name in TOPOLOGIES:
            raise ValueError(f"topology {name!r} is already registered")
        TOPOLOGIES[name] = fn
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


@register_topology("complete")
def _complete(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    return _finish(agents, [(u, v) for u in agents for v in agents if u != v], True)


@register_topology("ring")
def _ring(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    n = len(agents)
    edges = [(agents[i], agents[(i + 1) % n]) for i in range(n)] if n > 1 else []
    return _finish(agents, edges, spec.directed)


@register_topology("line")
def _line(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    edges = [(agents[i], agents[i + 1]) for i in range(len(agents) - 1)]
    return _finish(agents, edges, spec.directed)


@register_topology("star")
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


@register_topology("explicit")
def _explicit(agents: Sequence[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
    return _finish(agents, [tuple(e) for e in spec.edges], spec.directed)


def build_graph(
    agents: Sequence[str], spec: GraphSpec, episode_seed: int = 0, round: int = 0
) -> nx.DiGraph:
    """Build the graph in force at ``round`` of an episode seeded ``episode_seed``.

    Only ``random`` graphs with ``rewire_every > 0`` change between rounds; every other graph is
    the same in all rounds.
    """
    if spec.topology not in TOPOLOGIES:
        known = ", ".join(sorted(TOPOLOGIES))
        raise KeyError(f"graph.topology: unknown topology {spec.topology!r}; known: {known}")
    epoch = round // spec.rewire_every if spec.rewire_every > 0 else 0
    base_seed = spec.seed if spec.seed is not None else episode_seed
    rng = random.Random(f"{base_seed}:{epoch}")
    return TOPOLOGIES[spec.topology](list(agents), spec, rng)


def edge_list(graph: nx.DiGraph) -> list[tuple[str, str]]:
    """Edges of ``graph`` in a stable order (for transcripts and logs)."""
    return sorted(graph.edges())
