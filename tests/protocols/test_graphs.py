"""Communication graphs: every topology, directed and undirected, exact edges for small N,
seeded random graphs, rewiring between epochs, and the topology registry."""

from __future__ import annotations

import random

import networkx as nx
import pytest

import marl
from marl.protocols.graphs import TOPOLOGIES, GraphSpec, build_graph, edge_list, register_topology

ABCD = ["a", "b", "c", "d"]


def both_ways(*pairs: tuple[str, str]) -> set[tuple[str, str]]:
    return {(u, v) for u, v in pairs} | {(v, u) for u, v in pairs}


def edges(spec: GraphSpec, agents: list[str] = ABCD, seed: int = 0, rnd: int = 0) -> set:
    graph = build_graph(agents, spec, episode_seed=seed, round=rnd)
    assert set(graph.nodes) == set(agents), "every agent is a node, even an isolated one"
    return set(graph.edges)


COMPLETE = {(u, v) for u in ABCD for v in ABCD if u != v}

EXACT = [
    ("complete", False, {}, COMPLETE),
    ("complete", True, {}, COMPLETE),
    ("ring", True, {}, {("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")}),
    ("ring", False, {}, both_ways(("a", "b"), ("b", "c"), ("c", "d"), ("d", "a"))),
    ("line", True, {}, {("a", "b"), ("b", "c"), ("c", "d")}),
    ("line", False, {}, both_ways(("a", "b"), ("b", "c"), ("c", "d"))),
    ("star", True, {}, {("a", "b"), ("a", "c"), ("a", "d")}),
    ("star", False, {}, both_ways(("a", "b"), ("a", "c"), ("a", "d"))),
    ("star", True, {"center": "c"}, {("c", "a"), ("c", "b"), ("c", "d")}),
    ("star", False, {"center": "c"}, both_ways(("c", "a"), ("c", "b"), ("c", "d"))),
    ("explicit", True, {"edges": (("a", "c"), ("d", "b"))}, {("a", "c"), ("d", "b")}),
    ("explicit", False, {"edges": (("a", "c"), ("d", "b"))}, both_ways(("a", "c"), ("d", "b"))),
    ("random", True, {"p": 1.0}, COMPLETE),
    ("random", False, {"p": 1.0}, COMPLETE),
    ("random", True, {"p": 0.0}, set()),
    ("random", False, {"p": 0.0}, set()),
]


@pytest.mark.parametrize(("topology", "directed", "extra", "expected"), EXACT)
def test_exact_edges(topology: str, directed: bool, extra: dict, expected: set) -> None:
    spec = GraphSpec(topology=topology, directed=directed, **extra)
    assert edges(spec) == expected


@pytest.mark.parametrize(
    ("topology", "directed", "n", "count"),
    [
        ("complete", False, 6, 30),
        ("ring", True, 6, 6),
        ("ring", False, 6, 12),
        ("line", True, 6, 5),
        ("line", False, 6, 10),
        ("star", True, 6, 5),
        ("star", False, 6, 10),
        ("ring", True, 2, 2),  # a->b and b->a: a two-agent ring is one edge each way
        ("ring", False, 1, 0),
        ("line", False, 1, 0),
    ],
)
def test_edge_counts(topology: str, directed: bool, n: int, count: int) -> None:
    agents = [f"x{i}" for i in range(n)]
    graph = build_graph(agents, GraphSpec(topology=topology, directed=directed))
    assert graph.number_of_edges() == count
    assert not any(u == v for u, v in graph.edges), "no self-loops"


def test_undirected_graphs_are_symmetric_and_explicit_self_loops_are_dropped() -> None:
    for topology in ("ring", "line", "star", "complete"):
        graph = build_graph(ABCD, GraphSpec(topology=topology, directed=False))
        assert all(graph.has_edge(v, u) for u, v in graph.edges), topology
    spec = GraphSpec(topology="explicit", directed=True, edges=(("a", "a"), ("a", "b")))
    assert edges(spec) == {("a", "b")}


def test_random_graph_is_reproducible_per_seed_and_differs_across_seeds() -> None:
    agents = [f"x{i}" for i in range(8)]
    spec = GraphSpec(topology="random", p=0.5)
    first = [edges(spec, agents, seed=s) for s in range(5)]
    again = [edges(spec, agents, seed=s) for s in range(5)]
    assert first == again
    assert len({frozenset(e) for e in first}) == 5, "five seeds, five different graphs"
    assert all(0 < len(e) < 56 for e in first)
    # undirected random graphs are symmetric; directed ones (p=0.5, 56 ordered pairs) are not
    assert all((v, u) in e for e in first for u, v in e)
    directed = edges(GraphSpec(topology="random", p=0.5, directed=True), agents, seed=0)
    assert any((v, u) not in directed for u, v in directed)


def test_fixed_graph_seed_ignores_the_episode_seed() -> None:
    agents = [f"x{i}" for i in range(8)]
    fixed = GraphSpec(topology="random", p=0.5, seed=123)
    assert edges(fixed, agents, seed=0) == edges(fixed, agents, seed=99)
    free = GraphSpec(topology="random", p=0.5)
    assert edges(free, agents, seed=0) != edges(free, agents, seed=99)


def test_rewire_every_changes_the_graph_between_epochs_but_not_within() -> None:
    agents = [f"x{i}" for i in range(8)]
    spec = GraphSpec(topology="random", p=0.5, rewire_every=3)
    by_round = [edges(spec, agents, seed=4, rnd=r) for r in range(9)]
    for epoch in range(3):
        within = by_round[3 * epoch : 3 * epoch + 3]
        assert within[0] == within[1] == within[2], f"graph changed inside epoch {epoch}"
    assert by_round[0] != by_round[3] != by_round[6]
    static = GraphSpec(topology="random", p=0.5, rewire_every=0)
    assert len({frozenset(edges(static, agents, seed=4, rnd=r)) for r in range(9)}) == 1
    ring = GraphSpec(topology="ring", rewire_every=1)  # only random graphs rewire
    assert len({frozenset(edges(ring, agents, seed=4, rnd=r)) for r in range(4)}) == 1


def test_environment_graph_rewires_between_epochs_only() -> None:
    env = marl.make(
        "relay",
        agents=["a", "b", "c", "d", "e", "f"],
        params={"reporter": "f"},
        graph={"topology": "random", "p": 0.5, "rewire_every": 2},
        episode={"rounds": 6},
    )
    env.reset(seed=1)
    seen = []
    while env.agents:
        seen.append(frozenset(env.graph.edges))
        assert seen[-1] == frozenset(
            build_graph(env.possible_agents, env.spec.graph, 1, env.round).edges
        )
        env.step({a: "ACTION: 000000" for a in env.agents})
    assert len(seen) == 6
    assert seen[0] == seen[1] and seen[2] == seen[3] and seen[4] == seen[5]
    assert seen[0] != seen[2] or seen[2] != seen[4]


def test_edge_list_is_sorted() -> None:
    graph = build_graph(["c", "a", "b"], GraphSpec(topology="ring", directed=True))
    assert edge_list(graph) == [("a", "b"), ("b", "c"), ("c", "a")]


def test_unknown_topology_names_the_key_and_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match=r"graph.topology: unknown topology 'torus'; known: .*ring"):
        build_graph(ABCD, GraphSpec(topology="torus"))


def test_register_topology_refuses_duplicates_and_new_topologies_work_in_yaml() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_topology("ring")(lambda agents, spec, rng: nx.DiGraph())

    @register_topology("test-pairs")
    def pairs(agents: list[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
        graph = nx.DiGraph()
        graph.add_nodes_from(agents)
        graph.add_edges_from(zip(agents[::2], agents[1::2]))
        return graph

    try:
        env = marl.make("relay", graph={"topology": "test-pairs"})
        env.reset(seed=0)
        assert set(env.graph.edges) == {("alice", "bob"), ("carol", "dave")}
    finally:
        del TOPOLOGIES["test-pairs"]
