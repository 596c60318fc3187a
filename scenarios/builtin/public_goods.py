"""Rules of ``public_goods``: a public-goods game with cheap talk; mixed motive.

Every agent starts each contribution round with an endowment and puts some of it into a common
pot; the pot is multiplied by ``multiplier`` (1 < multiplier < N) and shared equally. Payoff of
agent i (in endowments): ``(E - c_i + multiplier * sum_j c_j / N) / E``. Contributing everything
is best for the team, keeping everything is best for the individual. The YAML
``reward.cooperation`` coefficient moves the reward from fully cooperative (1: everyone gets the
team's mean payoff) to zero-sum (0: payoff relative to the others'). Agents talk freely in every
round; only the rounds listed in ``contribute_every`` ask for a contribution.

Version history:
- v0: first version.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.scenarios.bots import register_bot
from marl.scenarios.families.common import parse_int
from marl.scenarios.problems import Problem
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules


@register_rules("public_goods")
class PublicGoodsRules(Rules):
    """Contribute to a multiplied common pot; talk is free and not binding."""

    info = ScenarioInfo(
        min_agents=2,
        max_agents=16,
        default_topology="complete",
        default_rounds=3,
    )

    @dataclass(frozen=True)
    class Params:
        """endowment: coins each agent gets per contribution round.
        multiplier: the pot's multiplier; a social dilemma needs 1 < multiplier < N.
        talk_rounds: rounds of cheap talk before each contribution round."""

        endowment: int = 10
        multiplier: float = 1.6
        talk_rounds: int = 1

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """Endowment 1-1000 (bots list every amount), multiplier in (0, 1000], talk rounds >= 0."""
        p = cls.Params(**params)
        problems = []
        if not isinstance(p.endowment, int) or not 1 <= p.endowment <= 1000:
            problems.append(Problem("endowment", "must be an integer from 1 to 1000"))
        if not isinstance(p.multiplier, (int, float)) or not 0 < p.multiplier <= 1000:
            problems.append(Problem("multiplier", "must be a number > 0 and <= 1000"))
        if not isinstance(p.talk_rounds, int) or p.talk_rounds < 0:
            problems.append(Problem("talk_rounds", "must be an integer >= 0"))
        return problems

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.history: list[dict[str, int]] = []

    def reset(self) -> None:
        """Nothing is dealt: the game is the same every episode (talk makes it differ)."""
        self.history = []

    def _contribution_round(self, round: int) -> bool:
        return round % (self.params.talk_rounds + 1) == self.params.talk_rounds

    def needs_action(self, agent: str, round: int) -> bool:
        """Everyone contributes in contribution rounds; talk rounds need no action."""
        return self._contribution_round(round)

    def private_info(self, agent: str) -> str:
        """Your endowment."""
        return f"You have {self.params.endowment} coins in each contribution round."

    def public_state(self) -> str:
        """The rules and past contributions."""
        p = self.params
        text = (
            f"Contributions are multiplied by {p.multiplier} and shared equally among "
            f"{len(self.agents)} players."
        )
        if self.history:
            last = ", ".join(f"{a}={c}" for a, c in self.history[-1].items())
            text += f" Last contributions: {last}."
        return text

    def action_help(self, agent: str) -> str:
        """A contribution."""
        return f"how many coins you contribute, 0 to {self.params.endowment}."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots."""
        last = self.history[-1] if self.history else {}
        others = [c for a, c in last.items() if a != agent]
        return {
            "endowment": self.params.endowment,
            "others_last_mean": sum(others) / len(others) if others else None,
            "valid_actions": [str(i) for i in range(self.params.endowment + 1)],
        }

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Collect contributions (invalid ones count as 0) and pay out."""
        if not self._contribution_round(round):
            return RoundResult(done=False)
        p = self.params
        result = RoundResult()
        contributions = {}
        for agent in self.agents:
            raw = actions.get(agent)
            value = parse_int(raw)
            if value is None or not 0 <= value <= p.endowment:
                result.invalid[agent] = (
                    f"expected a whole number from 0 to {p.endowment}, got {raw!r}"
                )
                value = 0
            contributions[agent] = value
        share = p.multiplier * sum(contributions.values()) / len(self.agents)
        result.individual = {
            a: (p.endowment - c + share) / p.endowment for a, c in contributions.items()
        }
        self.history.append(contributions)
        result.public_events.append(
            "contributions: "
            + ", ".join(f"{a}={c}" for a, c in contributions.items())
            + f"; each received {share:.2f}"
        )
        return result


@register_bot("public_goods", "cooperator")
def cooperator_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Always contributes everything, and says so."""
    return f"SAY: I will put in all {info['endowment']}.\nACTION: {info['endowment']}"


@register_bot("public_goods", "defector")
def defector_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Promises everything and contributes nothing."""
    return f"SAY: I will put in all {info['endowment']}.\nACTION: 0"


@register_bot("public_goods", "rule")
def tit_for_tat_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Tit-for-tat: starts by contributing everything, then matches the others' last mean."""
    last = info.get("others_last_mean")
    amount = info["endowment"] if last is None else round(last)
    return f"SAY: I match what you gave: {amount}.\nACTION: {amount}"
