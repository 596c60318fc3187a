"""Extension points configurable without editing a whitelist: a topology's own parameters from
YAML, and a user's rules module named in the scenario YAML or in the config."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest
import yaml

import marl
from marl.protocols.graphs import TOPOLOGIES, GraphSpec, register_topology
from marl.scenarios.problems import ScenarioError
from marl.scenarios.registry import BUILTIN_DIR, load_scenario_spec
from marl.scenarios.rules import RULES
from marl.scenarios.validation import validate_scenario


# --- topology parameters --------------------------------------------------------------------
@dataclass(frozen=True)
class HubParams:
    hubs: int = 1  # the first `hubs` agents talk to everyone; the others only to the hubs
    label: str = "hub"


@pytest.fixture
def hubs() -> Iterator[str]:
    @register_topology("test-hubs", params=HubParams)
    def build(agents: list[str], spec: GraphSpec, rng: random.Random) -> nx.DiGraph:
        graph = nx.DiGraph()
        graph.add_nodes_from(agents)
        for hub in agents[: spec.params["hubs"]]:
            for other in agents:
                if other != hub:
                    graph.add_edge(hub, other)
                    graph.add_edge(other, hub)
        return graph

    try:
        yield "test-hubs"
    finally:
        TOPOLOGIES.pop("test-hubs", None)


def test_a_topology_reads_its_own_parameters_from_yaml(hubs: str) -> None:
    env = marl.make("relay", graph={"topology": hubs, "params": {"hubs": 2}})
    env.reset(seed=0)
    assert env.spec.graph.params == {"hubs": 2, "label": "hub"}  # defaults filled in
    assert env.graph.has_edge("bob", "carol") and not env.graph.has_edge("carol", "dave")
    default = marl.make("relay", graph={"topology": hubs})
    default.reset(seed=0)
    assert default.spec.graph.params == {"hubs": 1, "label": "hub"}
    assert not default.graph.has_edge("bob", "carol")


def test_topology_parameter_mistakes_name_their_key(hubs: str) -> None:
    def problems(graph: dict) -> list[str]:
        with pytest.raises(ScenarioError) as err:
            load_scenario_spec("relay", {"graph": graph})
        return [str(p) for p in err.value.problems]

    assert problems({"topology": hubs, "params": {"hubz": 2}}) == [
        "graph.params.hubz: unknown parameter for topology 'test-hubs' (allowed: hubs, label)"
    ]
    assert problems({"topology": hubs, "params": {"hubs": "two"}}) == [
        "graph.params.hubs: must be an integer, got 'two'"
    ]
    assert problems({"topology": "ring", "params": {"k": 2}}) == [
        "graph.params: topology 'ring' takes no parameters"
    ]
    assert problems({"topology": hubs, "params": [1]}) == [
        "graph.params: must be a mapping, got list"
    ]


def test_a_required_topology_parameter_is_reported() -> None:
    @dataclass(frozen=True)
    class Needs:
        k: int

    register_topology("test-needs", params=Needs)(lambda agents, spec, rng: nx.DiGraph())
    try:
        doc = yaml.safe_load((BUILTIN_DIR / "relay.yaml").read_text())
        doc["graph"] = {"topology": "test-needs"}
        assert [str(p) for p in validate_scenario(doc)] == [
            "graph.params.k: required by topology 'test-needs'"
        ]
    finally:
        TOPOLOGIES.pop("test-needs", None)


# --- a user's rules module ------------------------------------------------------------------
RULES_MODULE = '''
"""A user's rules module, outside the marl package."""
from dataclasses import dataclass

from marl.scenarios import RoundResult, Rules, ScenarioInfo, register_rules


@register_rules("test-guess")
class GuessRules(Rules):
    info = ScenarioInfo(min_agents=2, max_agents=4, default_topology="complete")

    @dataclass(frozen=True)
    class Params:
        high: int = 5

    def reset(self):
        self.secret = self.rng.randint(1, self.params.high)

    def step(self, actions, round, last_round):
        result = RoundResult(done=True)
        for agent, text in actions.items():
            ok = (text or "").strip().isdigit()
            result.individual[agent] = -abs(int(text) - self.secret) if ok else -1.0
        return result
'''


@pytest.fixture
def user_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module ``test_user_rules`` on the import path and a scenario YAML naming it."""
    (tmp_path / "test_user_rules.py").write_text(textwrap.dedent(RULES_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    scenario = tmp_path / "guess.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "test-guess-v0",
                "rules": "test-guess",
                "rules_module": "test_user_rules",
                "agents": ["ann", "ben"],
            }
        )
    )
    try:
        yield scenario
    finally:
        RULES.pop("test-guess", None)
        sys.modules.pop("test_user_rules", None)


def test_a_rules_module_named_in_yaml_is_imported_and_its_rules_play(user_rules: Path) -> None:
    assert "test-guess" not in RULES
    env = marl.make(str(user_rules))
    env.reset(seed=1)
    env.step({"ann": "ACTION: 3", "ben": "no number"})
    assert not env.agents and env.returns["ben"] < 0


def test_a_rules_module_named_in_the_config_is_imported(user_rules: Path) -> None:
    from marl.config import load_config
    from marl.runtime.policy_map import plan_for

    doc = yaml.safe_load(user_rules.read_text())
    del doc["rules_module"]
    user_rules.write_text(yaml.safe_dump(doc))
    with pytest.raises(ScenarioError, match="rules: unknown rules 'test-guess'"):
        marl.make(str(user_rules))
    config = load_config({"scenario": {"name": str(user_rules), "rules_module": "test_user_rules"}})
    assert config.scenario.overrides == {"rules_module": "test_user_rules"}
    assert plan_for(config).agent_policy == {"ann": "shared", "ben": "shared"}


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (
            "../evil",
            "rules_module: must be a dotted Python module name such as my_pkg.my_rules, "
            "got '../evil'",
        ),
        (
            "/tmp/x.py",
            "rules_module: must be a dotted Python module name such as "
            "my_pkg.my_rules, got '/tmp/x.py'",
        ),
        (7, "rules_module: must be a dotted Python module name such as my_pkg.my_rules, got 7"),
        (
            "no_such_module_here",
            "rules_module: cannot import 'no_such_module_here': "
            "ModuleNotFoundError: No module named 'no_such_module_here'",
        ),
    ],
)
def test_a_bad_rules_module_is_one_problem_naming_the_key(module: object, message: str) -> None:
    doc = yaml.safe_load((BUILTIN_DIR / "relay.yaml").read_text())
    doc["rules_module"] = module
    assert [str(p) for p in validate_scenario(doc)] == [message]


@pytest.mark.subprocess
def test_the_cli_plays_a_scenario_whose_rules_come_from_a_user_module(user_rules: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "marl.cli",
            "play",
            f"scenario.name={user_rules}",
            "agents=scripted",
            "bot=random",
            "seed=2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(user_rules.parent)},
    )
    assert done.returncode == 0, done.stderr
    assert "test-guess-v0" in done.stdout and "ann" in done.stdout
