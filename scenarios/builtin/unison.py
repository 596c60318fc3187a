"""Rules of ``unison``: the smoke-test scenario, simple enough for a randomly initialised model.

Each agent is told a target character; its reward is the fraction of characters of its
completion that are that character (partial credit, so a group of samples almost always has
reward variance and GRPO has something to learn from). Any text counts as the action, so no
markup is needed. It is the CartPole of this platform: if training cannot raise this reward in a
few dozen steps, something in the pipeline is broken. The team reward (cooperation 1) is the
agents' mean.

Version history:
- v0: first version.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.scenarios.bots import register_bot
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules
from marl.scenarios.spec import Problem


@register_rules("unison")
class UnisonRules(Rules):
    """Write as much of your target character as you can."""

    info = ScenarioInfo(
        turn_structure="simultaneous",
        reward_model="cooperative",
        min_agents=1,
        max_agents=16,
        default_topology="complete",
        default_rounds=1,
        free_text_action=True,
    )

    @dataclass(frozen=True)
    class Params:
        """target: the character every agent should write."""

        target: str = "a"

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """The target is a single character."""
        target = params.get("target", "a")
        if not isinstance(target, str) or len(target) != 1:
            return [Problem("target", f"must be a single character, got {target!r}")]
        return []

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)

    def private_info(self, agent: str) -> str:
        """The target character."""
        return f"Write the character {self.params.target!r} as many times as you can."

    def action_help(self, agent: str) -> str:
        """Free text."""
        return "any text; every character that is the target scores."

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Score the share of target characters in each agent's text."""
        target = self.params.target
        scores = {}
        for agent in self.agents:
            text = actions.get(agent) or ""
            scores[agent] = text.count(target) / len(text) if text else 0.0
        return RoundResult(individual=scores, done=True)


@register_bot("unison", "rule")
def unison_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Writes the target character only (it is named in the observation)."""
    marker = "Write the character '"
    start = observation.find(marker)
    target = observation[start + len(marker)] if start >= 0 else "a"
    return target * 16
