"""Rules of ``unison``: the smoke-test scenario, simple enough for a randomly initialised model.

Each agent is told a target character; its reward is the fraction of characters of its
completion that are that character (partial credit, so a group of samples almost always has
reward variance and GRPO has something to learn from). Any text counts as the action, so no
markup is needed. It is the CartPole of this platform: if training cannot raise this reward in a
few dozen steps, something in the pipeline is broken. The team reward (cooperation 1) is the
agents' mean.

``scored_agents`` (default: every agent) restricts the score to some agents: the others are told
the same thing, but their text scores 0, so under cooperation 1 they free-ride on the team mean.
It is the counterfactual-credit testbed (``docs/credit_experiment.md``): the team reward hides
who contributed, and a free rider's text changes nothing.

Version history:
- v0: first version; ``scored_agents`` added later (default unchanged: every agent scores).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.scenarios.bots import register_bot
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules


@register_rules("unison")
class UnisonRules(Rules):
    """Write as much of your target character as you can."""

    info = ScenarioInfo(
        min_agents=1,
        max_agents=16,
        default_topology="complete",
        default_rounds=1,
        free_text_action=True,
    )

    @dataclass(frozen=True)
    class Params:
        """target: the character every agent should write.
        scored_agents: the agents whose text scores; null = every agent. The others score 0
        (free riders: same prompt, no effect on any reward but through the team mean)."""

        target: str = "a"
        scored_agents: tuple[str, ...] | None = None

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """The target is a single character; scored agents are agents of the scenario."""
        problems = []
        target = params.get("target", "a")
        if not isinstance(target, str) or len(target) != 1:
            problems.append(Problem("target", f"must be a single character, got {short(target)}"))
        scored = params.get("scored_agents")
        if scored is not None:
            if isinstance(scored, str) or not isinstance(scored, Sequence):
                problems.append(
                    Problem("scored_agents", f"must be a list of agent names, got {short(scored)}")
                )
            else:
                unknown = [a for a in scored if a not in agents]
                if unknown:
                    problems.append(
                        Problem(
                            "scored_agents",
                            f"{', '.join(map(repr, unknown))} not among the agents "
                            f"({', '.join(agents)})",
                        )
                    )
        return problems

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        scored = self.params.scored_agents
        self.scored = frozenset(self.agents if scored is None else scored)

    def private_info(self, agent: str) -> str:
        """The target character."""
        return f"Write the character {self.params.target!r} as many times as you can."

    def action_help(self, agent: str) -> str:
        """Free text."""
        return "any text; every character that is the target scores."

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Score the share of target characters in each scored agent's text (others: 0)."""
        target = self.params.target
        scores = {}
        for agent in self.agents:
            text = actions.get(agent) or ""
            scored = agent in self.scored and text
            scores[agent] = text.count(target) / len(text) if scored else 0.0
        return RoundResult(individual=scores, done=True)


@register_bot("unison", "rule")
def unison_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Writes the target character only (it is named in the observation)."""
    marker = "Write the character '"
    start = observation.find(marker)
    target = observation[start + len(marker)] if start >= 0 else "a"
    return target * 16
