"""Text scenarios: the ParallelEnv base class, the YAML schema and registry, built-in scenarios.

This package knows protocols (messages, graphs, routing) but nothing of LLMs.
"""

from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.problems import Problem, ScenarioError
from marl.scenarios.registry import list_scenarios, load_scenario_spec, make, register_scenario
from marl.scenarios.rules import RULES, RoundResult, Rules, ScenarioInfo, register_rules
from marl.scenarios.spec import ScenarioSpec
from marl.scenarios.validation import validate_scenario

__all__ = [
    "RULES",
    "Problem",
    "RoundResult",
    "Rules",
    "ScenarioError",
    "ScenarioInfo",
    "ScenarioSpec",
    "TextScenarioEnv",
    "list_scenarios",
    "load_scenario_spec",
    "make",
    "register_rules",
    "register_scenario",
    "validate_scenario",
]
