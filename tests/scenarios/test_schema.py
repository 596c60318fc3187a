"""The YAML scenario schema: key-path problems for broken documents, unreadable files, fuzzing,
and ``marl.make`` overrides and version resolution."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import marl
from marl.scenarios import ScenarioError, validate_scenario
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import random_bot
from marl.scenarios.reader import read_yaml
from marl.scenarios.registry import BUILTIN_DIR, load_scenario_spec, resolve_name
from marl.scenarios.rules import RULES
from marl.scenarios.spec import deep_merge, spec_from_dict
from marl.scenarios.validation import TOP_LEVEL_KEYS

marl.list_scenarios()  # registers the built-in rules

VALID = {
    "name": "test-relay-v0",
    "rules": "relay",
    "agents": ["alice", "bob", "carol", "dave"],
    "graph": {"topology": "line", "directed": False},
    "messages": {"max_chars": 60, "max_per_round": 1, "noise": {"drop": 0.0, "corrupt": 0.0}},
    "episode": {"rounds": 4},
    "reward": {"cooperation": 1.0, "malformed_penalty": -0.05},
    "params": {"reporter": "dave"},
}


def broken(**changes: object) -> dict:
    """VALID with top-level keys replaced (``None`` deletes) and ``a__b`` for nested keys."""
    doc = copy.deepcopy(VALID)
    for key, value in changes.items():
        *parents, last = key.split("__")
        target = doc
        for parent in parents:
            target = target.setdefault(parent, {})
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return doc


def problems(doc: object) -> list[str]:
    return [str(p) for p in validate_scenario(doc)]


def test_the_reference_document_and_every_builtin_file_are_valid() -> None:
    assert problems(VALID) == []
    for path in sorted(BUILTIN_DIR.glob("*.yaml")):
        assert problems(read_yaml(path)) == [], path.name


EXPLICIT_EDGES = [["alice", "bob"], ["bob", "dave"], ["dave", "alice"], ["alice", "carol"]]

# (document, the exact problem lines expected)
BROKEN = [
    (
        broken(
            agents=["alice", "bob", "dave"], graph={"topology": "explicit", "edges": EXPLICIT_EDGES}
        ),
        ["graph.edges[3]: unknown agent 'carol'"],
    ),
    (
        broken(colour="red"),
        [
            "colour: unknown key (allowed: agents, description, episode, graph, messages, name, "
            "params, reward, roles, rules, rules_module, system_prompt, tools)"
        ],
    ),
    (
        broken(graph__colour="red"),
        [
            "graph.colour: unknown key (allowed: center, cut, directed, edges, p, params, "
            "rewire_every, seed, topology)"
        ],
    ),
    (broken(name=None), ["name: required, a non-empty string such as 'signal-v0'"]),
    (broken(name="  "), ["name: required, a non-empty string such as 'signal-v0'"]),
    (broken(rules=None), ["rules: required, the name of registered Python rules"]),
    (broken(rules=["relay"]), ["rules: required, the name of registered Python rules"]),
    (broken(agents="alice"), ["agents: required, a non-empty list of agent names"]),
    (broken(agents=[]), ["agents: required, a non-empty list of agent names"]),
    (broken(agents=["alice", "bob", "alice", "dave"]), ["agents[2]: duplicate agent 'alice'"]),
    (
        broken(agents=["alice", 7, "carol", "dave"]),
        ["agents[1]: an agent name must be a non-empty string"],
    ),
    (
        broken(agents=["alice", "b ob", "carol", "dave"]),
        ["agents[1]: agent name 'b ob' may not hold spaces, '@', ':' or ','"],
    ),
    (broken(graph=["line"]), ["graph: must be a mapping, got list"]),
    (
        broken(graph__topology="torus"),
        [
            "graph.topology: unknown topology 'torus'; known: complete, empty, explicit, line, "
            "random, ring, star"
        ],
    ),
    (broken(graph__directed="yes"), ["graph.directed: must be true or false"]),
    (broken(graph__topology="star", graph__center="zed"), ["graph.center: unknown agent 'zed'"]),
    (broken(graph__center=["alice"]), ["graph.center: unknown agent ['alice']"]),
    (broken(graph__p=1.5), ["graph.p: must be a probability between 0 and 1"]),
    (broken(graph__seed="x"), ["graph.seed: must be an integer or null"]),
    (broken(graph__rewire_every=-1), ["graph.rewire_every: must be an integer >= 0"]),
    (
        broken(graph__topology="explicit"),
        ["graph.edges: topology 'explicit' needs a non-empty edge list"],
    ),
    (
        broken(graph__topology="explicit", graph__edges=[["alice", "alice"], ["bob"], "ab"]),
        [
            "graph.edges[0]: an edge may not loop to itself",
            "graph.edges[1]: must be a [from, to] pair",
            "graph.edges[2]: must be a [from, to] pair",
        ],
    ),
    (broken(graph__edges={"alice": "bob"}), ["graph.edges: must be a list of [from, to] pairs"]),
    (
        broken(graph__cut=[["alice", "zed"], ["bob", "bob"], ["carol"]]),
        [
            "graph.cut[0]: unknown agent 'zed'",
            "graph.cut[1]: an edge may not loop to itself",
            "graph.cut[2]: must be a [sender, receiver] pair",
        ],
    ),
    (
        broken(graph__cut={"alice": "bob"}),
        ["graph.cut: must be a list of [sender, receiver] pairs"],
    ),
    (broken(messages__max_chars=0), ["messages.max_chars: must be an integer >= 1"]),
    (broken(messages__max_per_round=1.5), ["messages.max_per_round: must be an integer >= 1"]),
    (
        broken(messages__noise__drop=2),
        ["messages.noise.drop: must be a probability between 0 and 1"],
    ),
    (broken(messages__noise=[0.1]), ["messages.noise: must be a mapping with drop and corrupt"]),
    (broken(episode__rounds="four"), ["episode.rounds: must be an integer between 1 and 1000"]),
    (broken(episode__rounds=True), ["episode.rounds: must be an integer between 1 and 1000"]),
    (broken(episode__rounds=0), ["episode.rounds: must be an integer between 1 and 1000"]),
    (
        broken(reward__cooperation=1.5),
        ["reward.cooperation: must be between 0 (zero-sum) and 1 (fully cooperative)"],
    ),
    (
        broken(reward__cooperation=-0.1),
        ["reward.cooperation: must be between 0 (zero-sum) and 1 (fully cooperative)"],
    ),
    (
        broken(reward__cooperation=math.nan),
        ["reward.cooperation: must be between 0 (zero-sum) and 1 (fully cooperative)"],
    ),
    (
        broken(reward__malformed_penalty="big"),
        ["reward.malformed_penalty: must be a finite number"],
    ),
    (
        broken(reward__malformed_penalty=-math.inf),
        ["reward.malformed_penalty: must be a finite number"],
    ),
    (broken(roles={"zed": "a role"}), ["roles.zed: unknown agent 'zed'"]),
    (broken(roles={"alice": 3}), ["roles.alice: must be a string"]),
    (broken(description=3), ["description: must be a string"]),
    (
        broken(params__colour="red"),
        ["params.colour: unknown parameter for rules 'relay' (allowed: reporter)"],
    ),
    (broken(params__reporter="zed"), ["params.reporter: unknown agent 'zed'"]),
    (broken(params__reporter=4), ["params.reporter: must be a string or null, got 4"]),
    (broken(rules="chess"), ["rules: unknown rules 'chess'; known: " + ", ".join(sorted(RULES))]),
    (
        broken(rules="signal", params=None, graph=None),
        [
            "agents: rules 'signal' take 2 to 2 agents, got 4",
            "graph.edges: topology 'explicit' needs a non-empty edge list",
        ],
    ),
    (
        broken(agents=["a" + str(i) for i in range(13)], params=None, graph=None),
        ["agents: rules 'relay' take 2 to 12 agents, got 13"],
    ),
    (
        broken(rules="signal", agents=["s", "l"], params={"n_colours": "x"}, graph=None),
        [
            "graph.edges: topology 'explicit' needs a non-empty edge list",
            "params.n_colours: must be an integer, got 'x'",
        ],
    ),
    (
        broken(
            rules="signal",
            agents=["s", "l"],
            params={"n_candidates": 99},
            graph={"topology": "complete"},
        ),
        ["params.n_candidates: must be between 2 and n_colours*n_shapes (16)"],
    ),
    (
        broken(rules="public_goods", params={"multiplier": math.nan}),
        ["params.multiplier: must be a finite number, got nan"],
    ),
    (
        broken(rules="public_goods", params={"endowment": 10**9}),
        ["params.endowment: must be an integer from 1 to 1000"],
    ),
    (
        broken(rules="public_goods", params={"endowment": True}),
        ["params.endowment: must be an integer, got True"],
    ),
    ([1, 2], ["a scenario must be a YAML mapping, got list"]),
    (None, ["a scenario must be a YAML mapping, got NoneType"]),
]


@pytest.mark.parametrize(("doc", "expected"), BROKEN, ids=[str(i) for i in range(len(BROKEN))])
def test_broken_documents_name_the_key_path(doc: object, expected: list[str]) -> None:
    assert problems(doc) == expected


def test_every_problem_is_reported_in_one_pass() -> None:
    doc = broken(colour="red", episode__rounds=0, reward__cooperation=2, roles={"zed": "x"})
    assert [line.split(":")[0] for line in problems(doc)] == [
        "colour",
        "roles.zed",
        "episode.rounds",
        "reward.cooperation",
    ]


def test_load_raises_scenario_error_listing_every_problem() -> None:
    with pytest.raises(ScenarioError) as info:
        spec_from_dict(broken(episode__rounds=0, graph__p=3), source="mine.yaml")
    assert [p.path for p in info.value.problems] == ["graph.p", "episode.rounds"]
    assert str(info.value).startswith("invalid scenario mine.yaml:\n  graph.p: ")


# --- files -------------------------------------------------------------------------------------

BAD_FILES = {
    "syntax.yaml": (b"name: x\nagents: [a, b\n", "YAML syntax error at line 3, column 1:"),
    "tabs.yaml": (b"name: x\n\tagents: 1\n", "YAML syntax error at line 2, column 1:"),
    "binary.yaml": (bytes(range(256)) * 4, "cannot read"),
    "deep.yaml": (b"[" * 600, "YAML nested too deeply"),
    "tag.yaml": (b"name: !!python/object/apply:os.system [ls]\n", "YAML syntax error"),
}


@pytest.mark.parametrize("filename", sorted(BAD_FILES))
def test_unreadable_files_give_a_readable_scenario_error(tmp_path: Path, filename: str) -> None:
    content, expected = BAD_FILES[filename]
    path = tmp_path / filename
    path.write_bytes(content)
    with pytest.raises(ScenarioError) as info:
        read_yaml(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)
    with pytest.raises(ScenarioError):
        marl.make(str(path))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="file not found: .*nope.yaml"):
        marl.make(str(tmp_path / "nope.yaml"))
    with pytest.raises(ScenarioError, match="cannot read"):
        read_yaml(tmp_path)


def test_make_loads_a_yaml_file_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(broken(agents=["p", "q", "r"], params__reporter="q")))
    env = marl.make(str(path))
    assert env.possible_agents == ["p", "q", "r"] and env.spec.source == str(path)
    assert env.spec.params == {"reporter": "q"}


# --- make, overrides, versions -----------------------------------------------------------------


def test_make_deep_merges_overrides() -> None:
    env = marl.make("relay", graph={"topology": "ring"}, episode={"rounds": 6})
    assert env.spec.graph.topology == "ring"
    assert env.spec.graph.directed is False, "sibling keys of an override survive"
    assert env.spec.rounds == 6
    assert env.spec.budget.max_chars == 60 and env.spec.params == {"reporter": "dave"}
    env = marl.make("public-goods-v0", reward={"cooperation": 0.0}, messages={"noise": {"drop": 1}})
    assert env.spec.cooperation == 0.0 and env.spec.malformed_penalty == -0.1
    assert env.spec.noise.drop == 1.0 and env.spec.budget.max_per_round == 1
    with pytest.raises(ScenarioError, match="reward.cooperation"):
        marl.make("relay", reward={"cooperation": 3})
    # overrides never leak into the registry's copy
    assert marl.make("relay").spec.rounds == 4


def test_deep_merge_does_not_mutate_its_inputs() -> None:
    base = {"a": {"b": 1, "c": [1]}, "d": 2}
    over = {"a": {"b": 5}, "e": {"f": 1}}
    merged = deep_merge(base, over)
    assert merged == {"a": {"b": 5, "c": [1]}, "d": 2, "e": {"f": 1}}
    merged["a"]["c"].append(2)
    assert base == {"a": {"b": 1, "c": [1]}, "d": 2} and over == {"a": {"b": 5}, "e": {"f": 1}}


def test_names_resolve_to_the_latest_version(tmp_path: Path) -> None:
    assert resolve_name("signal") == "signal-v1" and resolve_name("signal-v0") == "signal-v0"
    assert marl.make("signal").spec.name == "signal-v1"
    from marl.scenarios.registry import SCENARIOS, register_scenario

    for version in (2, 10):
        doc = yaml.safe_load((BUILTIN_DIR / "signal.yaml").read_text())
        doc["name"] = f"signal-v{version}"
        (tmp_path / f"signal{version}.yaml").write_text(yaml.safe_dump(doc))
    try:
        register_scenario(tmp_path / "signal2.yaml")
        register_scenario(tmp_path / "signal10.yaml")
        assert resolve_name("signal") == "signal-v10", "versions compare as numbers"
        assert marl.make("signal-v0").spec.name == "signal-v0"
        with pytest.raises(ValueError, match="already registered"):
            register_scenario(_copy_as(tmp_path))
    finally:
        SCENARIOS.pop("signal-v2", None)
        SCENARIOS.pop("signal-v10", None)
    known = "bargain-v0, kuhn-poker-v0, ledger-v0, majority-vote-v0"
    with pytest.raises(ScenarioError, match=f"unknown scenario 'nope'; known: {known}"):
        marl.make("nope")


def _copy_as(tmp_path: Path) -> Path:
    """A second file declaring an already registered name."""
    path = tmp_path / "dup.yaml"
    path.write_text((BUILTIN_DIR / "relay.yaml").read_text())
    return path


# --- fuzzing -----------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers(-5, 2000) | st.floats() | st.text(max_size=8)
json_like = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=6) | st.integers(), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = sorted(TOP_LEVEL_KEYS) + ["topology", "edges", "rounds", "cooperation", "noise", "junk"]


@settings(max_examples=100, deadline=None)
@given(json_like)
def test_validate_never_raises_on_arbitrary_data(data: object) -> None:
    result = validate_scenario(data)
    assert isinstance(result, list)
    assert all(isinstance(p.path, str) and isinstance(p.message, str) for p in result)
    if not isinstance(data, dict):
        assert result


def near_valid(junk: bool) -> st.SearchStrategy:
    """Scenario documents whose values are mostly plausible; ``junk`` mixes in wrong types."""
    bad = scalars if junk else st.nothing()
    agent = st.sampled_from(["a", "b", "c", "d"])
    probability = st.floats(0, 1) | bad
    optional = {
        "roles": st.dictionaries(
            st.sampled_from(["a", "b", "z"]), st.text(max_size=5) | bad, max_size=2
        ),
        "graph": st.fixed_dictionaries(
            {},
            optional={
                "topology": st.sampled_from(
                    ["complete", "ring", "star", "line", "random", "explicit", "torus"]
                )
                | bad,
                "directed": st.booleans() | bad,
                "edges": st.lists(
                    st.lists(
                        st.sampled_from(["a", "b", "c", "z"]) | bad,
                        min_size=1 if junk else 2,
                        max_size=3 if junk else 2,
                    ),
                    max_size=4,
                )
                | bad,
                "center": st.sampled_from(["a", "b", "z"]) | bad,
                "p": probability,
                "seed": st.integers(0, 9) | st.none() | bad,
                "rewire_every": st.integers(0, 3) | bad,
            },
        )
        | bad,
        "messages": st.fixed_dictionaries(
            {},
            optional={
                "max_chars": st.integers(0, 200) | bad,
                "max_per_round": st.integers(0, 4) | bad,
                "noise": st.fixed_dictionaries(
                    {}, optional={"drop": probability, "corrupt": probability}
                )
                | bad,
            },
        )
        | bad,
        "episode": st.fixed_dictionaries({}, optional={"rounds": st.integers(0, 8) | bad}),
        "reward": st.fixed_dictionaries(
            {},
            optional={
                "cooperation": probability,
                "malformed_penalty": st.floats(-2, 2) | bad,
            },
        ),
        "params": st.dictionaries(
            st.sampled_from(
                [
                    "reporter",
                    "endowment",
                    "multiplier",
                    "talk_rounds",
                    "n_candidates",
                    "n_colours",
                    "n_shapes",
                    "partial_credit",
                    "target",
                    "junk",
                ]
            ),
            st.integers(0, 30) | st.floats(0, 5) | st.booleans() | agent | st.just("z") | bad,
            max_size=3,
        ),
        "system_prompt": st.text(max_size=10) | bad,
        "description": st.text(max_size=10) | bad,
    }
    required = {
        "name": st.just("fuzz-v0") | bad,
        "rules": st.sampled_from(sorted(RULES)) | bad,
        "agents": st.lists(agent, min_size=1, max_size=4, unique=True)
        | (
            st.lists(agent | st.sampled_from(["e f", "@x", ""]) | bad, max_size=5) | bad
            if junk
            else st.nothing()
        ),
    }
    return st.fixed_dictionaries(required, optional=optional)


@settings(max_examples=100, deadline=None)
@given(near_valid(junk=True))
def test_validate_never_raises_on_near_valid_documents(doc: dict) -> None:
    assert all(isinstance(p.path, str) for p in validate_scenario(doc))


@settings(max_examples=100, deadline=None)
@given(near_valid(junk=False))
def test_a_document_that_validates_always_loads_and_plays(doc: dict) -> None:
    found = validate_scenario(doc)
    if found:
        return
    env = TextScenarioEnv(spec_from_dict(doc))
    rng = random.Random(0)
    observations, infos = env.reset(seed=0)
    while env.agents:
        actions = {a: random_bot(a, observations[a], infos[a], rng) for a in env.agents}
        observations, rewards, *_, infos = env.step(actions)
        assert all(math.isfinite(r) for r in rewards.values())


def test_load_scenario_spec_reports_the_source_path() -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario_spec("relay", {"graph": {"topology": "torus"}})
    assert "relay.yaml" in str(info.value) and "graph.topology" in str(info.value)


def test_registering_a_builtin_name_first_is_refused_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from marl.scenarios import registry

    monkeypatch.setattr(registry, "SCENARIOS", {})  # as in a fresh interpreter
    monkeypatch.setattr(registry, "_loaded", False)
    with pytest.raises(ValueError, match=r"'relay-v0' is already registered from .*relay.yaml"):
        registry.register_scenario(_copy_as(tmp_path))
    assert "signal-v0" in registry.list_scenarios()
