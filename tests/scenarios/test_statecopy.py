"""The fast state copy (``marl.scenarios.statecopy``) against ``copy.deepcopy``, and what the
environment shares between its states: the transactional working copy of a step and snapshots.

Snapshot/replay determinism is the contract the counterfactual engine relies on, so these tests
check the structure of copies, not only their values: which objects are shared, which are new,
and that aliasing inside the original survives in the copy.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marl
from marl.protocols.graphs import TOPOLOGIES, GraphSpec, build_graph
from marl.protocols.messages import Message, Violation
from marl.scenarios.base import TextScenarioEnv, TurnLog, _working_copy
from marl.scenarios.bots import get_bot
from marl.scenarios.statecopy import copy_random, deep_copy

SCENARIO_NAMES = marl.list_scenarios()
ATOMS = (type(None), bool, int, float, complex, str, bytes)


@dataclass
class Box:
    items: list
    tag: str = "box"


@dataclass(frozen=True)
class Frozen:
    values: tuple
    payload: dict = field(default_factory=dict)


class Plain:
    def __init__(self, inner: Any) -> None:
        self.inner = inner


class Hooked:
    """A class with its own ``__deepcopy__``: the fast copy must hand it to ``deepcopy``."""

    calls = 0

    def __init__(self, value: list) -> None:
        self.value = value

    def __deepcopy__(self, memo: dict) -> Hooked:
        Hooked.calls += 1
        return Hooked([*copy.deepcopy(self.value, memo), "hooked"])


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


class Stateful:
    def __init__(self, data: list) -> None:
        self.data = data

    def __getstate__(self) -> dict:
        return {"data": self.data, "extra": 1}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


class Tally(Counter):
    """A Counter subclass: not the exact Counter the fast path knows."""


def signature(obj: Any) -> Any:
    """The structure of ``obj``: values, types, and which mutable objects are the same object
    (numbered in visiting order), so two copies compare equal only when their aliasing
    matches."""
    seen: dict[int, int] = {}

    def walk(x: Any) -> Any:
        if isinstance(x, ATOMS):
            return (type(x).__name__, x)
        if isinstance(x, random.Random):
            return ("Random", x.getstate())
        key = id(x)
        if key in seen and not isinstance(x, (tuple, frozenset)):
            return ("ref", seen[key])
        seen.setdefault(key, len(seen))
        if isinstance(x, dict):
            body: Any = [(walk(k), walk(v)) for k, v in x.items()]
        elif isinstance(x, (list, tuple)):
            body = [walk(v) for v in x]
        elif isinstance(x, (set, frozenset)):
            body = sorted(repr(walk(v)) for v in x)
        elif hasattr(x, "__slots__"):
            body = [(s, walk(getattr(x, s))) for s in x.__slots__]
        else:
            body = walk(vars(x))
        return (type(x).__name__, body)

    return walk(obj)


def frozen_numbers(x: Any) -> bool:
    """A frozen dataclass of atoms only (a message budget, a channel noise): it cannot change."""
    return (
        dataclasses.is_dataclass(x)
        and x.__dataclass_params__.frozen  # type: ignore[union-attr]
        and all(isinstance(getattr(x, f.name), ATOMS) for f in dataclasses.fields(x))
    )


def mutable_ids(obj: Any, skip: tuple[type, ...] = ()) -> dict[int, Any]:
    """Every mutable object reachable from ``obj`` (containers, objects, generators), by id."""
    found: dict[int, Any] = {}

    def walk(x: Any) -> None:
        if isinstance(x, ATOMS) or isinstance(x, skip) or id(x) in found or frozen_numbers(x):
            return
        if isinstance(x, (enum.Enum, type)):
            return  # enum members and classes are singletons: deepcopy shares them too
        if not isinstance(x, (tuple, frozenset)):
            found[id(x)] = x
        if isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, (list, tuple, set, frozenset)):
            for v in x:
                walk(v)
        elif isinstance(x, (random.Random, nx.Graph)) or callable(x):
            return  # a graph counts as one object: it is shared or copied whole
        elif hasattr(x, "__dict__"):
            walk(vars(x))

    walk(obj)
    return found


# --- deep_copy against copy.deepcopy -------------------------------------------------------------

atoms = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5)
hashables = st.recursive(atoms, lambda inner: st.tuples(inner, inner), max_leaves=4)


def containers(children: st.SearchStrategy) -> st.SearchStrategy:
    return (
        st.lists(children, max_size=4)
        | st.dictionaries(hashables, children, max_size=4)
        | st.tuples(children, children)
        | st.builds(Box, st.lists(children, max_size=3), st.text(max_size=3))
        | st.builds(Frozen, st.tuples(children), st.dictionaries(st.text(max_size=3), children))
        | st.builds(Plain, children)
        | st.frozensets(hashables, max_size=3)
        | st.sets(hashables, max_size=3)
        | st.builds(lambda d: Counter(d), st.dictionaries(hashables, st.integers(), max_size=3))
        | st.builds(random.Random, st.integers())
    )


plain_data = st.recursive(atoms, containers, max_leaves=25)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_data, st.data())
def test_deep_copy_matches_deepcopy_on_plain_data(value: Any, data: st.DataObject) -> None:
    # the same sub-object twice, so aliasing is exercised too
    root = [value, value, {"again": value}]
    fast, slow = deep_copy(root), copy.deepcopy(root)
    assert signature(fast) == signature(slow) == signature(root)
    shared = set(mutable_ids(fast)) & set(mutable_ids(root))
    assert not shared, f"the copy shares mutable objects with the original: {shared}"
    assert fast[0] is fast[1] and fast[2]["again"] is fast[0] or isinstance(value, ATOMS)


def test_cycles_are_kept() -> None:
    loop: list = [1]
    loop.append(loop)
    table: dict = {"k": None}
    table["self"] = table
    box = Box([])
    box.items.append(box)
    pair = ([], 1)
    pair[0].append(pair)  # a tuple on a cycle through a list
    fast = deep_copy([loop, table, box, pair])
    assert fast[0][1] is fast[0] and fast[0] is not loop
    assert fast[1]["self"] is fast[1] and fast[1] is not table
    assert fast[2].items[0] is fast[2] and fast[2] is not box
    assert fast[3][0][0] is fast[3] and fast[3] is not pair
    assert signature(fast) == signature(copy.deepcopy([loop, table, box, pair]))


def test_classes_with_copy_hooks_go_through_deepcopy() -> None:
    Hooked.calls = 0
    items = [Hooked([1]), Slotted([2], {"x": [3]}), Stateful([4]), Tally(a=2)]
    fast = deep_copy(items)
    slow = copy.deepcopy(items)
    assert Hooked.calls == 2 and fast[0].value == [1, "hooked"]
    assert (fast[1].a, fast[1].b) == ([2], {"x": [3]}) and fast[1].a is not items[1].a
    assert fast[2].__dict__ == slow[2].__dict__ == {"data": [4], "extra": 1}
    assert type(fast[3]) is Tally and fast[3] == Tally(a=2) and fast[3] is not items[3]


def test_a_prefilled_memo_shares_an_object() -> None:
    shared = [1, 2]
    out = deep_copy({"a": shared, "b": [shared]}, {id(shared): shared})
    assert out["a"] is shared and out["b"][0] is shared


def test_copy_random_is_independent_and_in_the_same_state() -> None:
    rng = random.Random("seed")
    rng.random()
    rng.gauss(0, 1)  # leaves a cached gauss value in the state
    clone = copy_random(rng)
    assert clone is not rng and clone.getstate() == rng.getstate()
    assert [clone.random() for _ in range(5)] == [rng.random() for _ in range(5)]
    clone.random()
    assert clone.getstate() != rng.getstate()


# --- what the environment shares ------------------------------------------------------------------


def _played(name: str, rounds: int, seed: int = 3) -> TextScenarioEnv:
    env = marl.make(name)
    policy = get_bot(env.spec.rules, "random")
    rng = random.Random(seed)
    observations, infos = env.reset(seed=seed)
    for _ in range(rounds):
        if not env.agents:
            break
        env.step({a: policy(a, observations[a], infos[a], rng) for a in env.agents})
    return env


# objects created once and never changed after: messages, violations, turn logs
IMMUTABLE_RECORDS = (Message, Violation, TurnLog)


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_a_snapshot_shares_nothing_mutable_with_the_live_state_but_the_frozen_graph(
    name: str,
) -> None:
    env = _played(name, rounds=1)
    snap = env.snapshot()
    live = mutable_ids(env._state)
    held = mutable_ids(snap["state"])
    shared = {id(env.graph)} if nx.is_frozen(env.graph) else set()
    assert set(live) & set(held) == shared
    env.restore(snap)
    assert set(mutable_ids(env._state)) & set(held) == shared


@pytest.mark.parametrize("name", SCENARIO_NAMES)
def test_the_working_copy_of_a_step_shares_only_what_a_step_never_changes(name: str) -> None:
    env = _played(name, rounds=1)
    before = env._state
    work = _working_copy(before)
    shared = set(mutable_ids(work, IMMUTABLE_RECORDS)) & set(mutable_ids(before, IMMUTABLE_RECORDS))
    allowed = {id(before.graph), id(before.agents)}
    if not env.spec.noise.active:
        allowed.add(id(before.channel_rng))  # a quiet channel never draws from it
    assert shared <= allowed, [type(mutable_ids(before)[i]).__name__ for i in shared - allowed]
    assert signature(work) == signature(before)


def test_a_noisy_channel_gets_its_own_generator_in_the_working_copy() -> None:
    env = marl.make("relay", messages={"noise": {"corrupt": 0.5}})
    env.reset(seed=0)
    work = _working_copy(env._state)
    assert work.channel_rng is not env._state.channel_rng
    assert work.channel_rng.getstate() == env._state.channel_rng.getstate()


def test_the_graph_is_frozen_and_a_fixed_topology_is_built_once() -> None:
    env = marl.make("relay")  # a line: the same graph in every episode
    env.reset(seed=0)
    first = env.graph
    assert nx.is_frozen(first)
    with pytest.raises(nx.NetworkXError, match="Frozen"):
        first.add_edge("alice", "dave")
    env.step({a: "ACTION: 0" for a in env.agents})
    env.reset(seed=1)
    assert env.graph is first
    assert set(first.edges) == set(build_graph(env.possible_agents, env.spec.graph, 1).edges)


def test_a_seeded_topology_gets_a_graph_per_episode() -> None:
    env = marl.make("relay", graph={"topology": "random", "p": 0.5})
    graphs = []
    for seed in range(6):
        env.reset(seed=seed)
        graphs.append(env.graph)
        assert set(env.graph.edges) == set(
            build_graph(env.possible_agents, env.spec.graph, seed).edges
        )
    assert len({frozenset(g.edges) for g in graphs}) > 1


@pytest.mark.parametrize("name", sorted(n for n, t in TOPOLOGIES.items() if not t.seeded))
def test_a_topology_declared_unseeded_ignores_its_generator(name: str) -> None:
    agents = ["a", "b", "c", "d", "e"]
    spec = GraphSpec(topology=name, edges=(("a", "b"), ("c", "e")))
    graphs = {
        frozenset(build_graph(agents, spec, seed, rnd).edges)
        for seed in range(5)
        for rnd in range(3)
    }
    assert len(graphs) == 1


def test_reset_without_a_seed_follows_the_previous_seed_as_before() -> None:
    env = marl.make("signal")
    env.reset(seed=12)
    expected = random.Random("12:next").randrange(2**31)
    env.reset()
    assert env.episode_seed == expected
    snap = env.snapshot()
    env.reset()
    following = env.episode_seed
    env.restore(snap)
    env.reset()
    assert env.episode_seed == following
