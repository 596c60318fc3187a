"""A rules class whose ``Params`` annotations do not resolve: the type check says so, not skip."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from marl.scenarios import RoundResult, Rules, ScenarioInfo, register_rules, validate_scenario
from marl.scenarios.rules import RULES

if TYPE_CHECKING:
    from decimal import Decimal  # exists only for type checkers: unresolvable at run time


class _Rules(Rules):
    info = ScenarioInfo(min_agents=2, max_agents=2)

    def needs_action(self, agent: str, round: int) -> bool:
        return False

    def step(self, actions: dict, round: int, last_round: bool) -> RoundResult:
        return RoundResult(done=True)


class UnresolvedRules(_Rules):
    @dataclass(frozen=True)
    class Params:
        stake: Decimal | None = None


class ResolvedRules(_Rules):
    @dataclass(frozen=True)
    class Params:
        stake: int = 1


@pytest.fixture
def registered() -> Iterator[None]:
    names = {"test-unresolved-params": UnresolvedRules, "test-resolved-params": ResolvedRules}
    for name, cls in names.items():
        register_rules(name)(cls)
    try:
        yield
    finally:
        for name in names:
            RULES.pop(name, None)


def doc(rules: str, params: dict | None) -> dict:
    data = {"name": "t-v0", "rules": rules, "agents": ["a", "b"]}
    if params is not None:
        data["params"] = params
    return data


def test_unresolvable_annotation_is_a_problem_when_values_are_given(registered: None) -> None:
    (problem,) = validate_scenario(doc("test-unresolved-params", {"stake": "lots"}))
    assert problem.path == "params"
    assert "UnresolvedRules.Params" in problem.message
    assert "NameError" in problem.message and "Decimal" in problem.message


def test_unresolvable_annotation_with_no_values_has_nothing_to_check(registered: None) -> None:
    assert validate_scenario(doc("test-unresolved-params", None)) == []


def test_resolvable_annotation_still_checks_the_type(registered: None) -> None:
    (problem,) = validate_scenario(doc("test-resolved-params", {"stake": "lots"}))
    assert str(problem) == "params.stake: must be an integer, got 'lots'"
    assert validate_scenario(doc("test-resolved-params", {"stake": 3})) == []
