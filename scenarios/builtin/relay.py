"""Rules of ``relay``: a hidden-information team task over a sparse graph.

Each agent privately holds one digit of a secret code; the reporter (the last agent) must
submit the whole code in the last round. On a line or ring, pieces have to be relayed hop by hop,
so the episode has as many rounds as it takes information to cross the graph. Team reward: the
fraction of digits the reporter got right (partial credit, verifiable).

Version history:
- v0: first version.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.scenarios.bots import register_bot
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules

_PIECE = re.compile(r"(\d+)\s*=\s*(\d)")


@register_rules("relay")
class RelayRules(Rules):
    """Combine one digit per agent into the code; only the reporter answers."""

    info = ScenarioInfo(
        min_agents=2,
        max_agents=12,
        default_topology="line",
        default_rounds=4,
    )

    @dataclass(frozen=True)
    class Params:
        """reporter: the agent that submits the code (default: the last agent)."""

        reporter: str | None = None

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """The reporter must be one of the agents."""
        reporter = params.get("reporter")
        if reporter is not None and reporter not in agents:
            return [Problem("reporter", f"unknown agent {short(reporter)}")]
        return []

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.reporter = self.params.reporter or self.agents[-1]
        self.code: list[int] = []
        self.answer: str | None = None
        self.last_round = 0

    def reset(self) -> None:
        """Deal one digit per agent."""
        self.code = [self.rng.randrange(10) for _ in self.agents]
        self.answer = None

    def _position(self, agent: str) -> int:
        return self.agents.index(agent) + 1

    def needs_action(self, agent: str, round: int) -> bool:
        """The reporter answers every round; only its last answer is scored."""
        return agent == self.reporter

    def private_info(self, agent: str) -> str:
        """Each agent's own digit and position."""
        pos = self._position(agent)
        digit = self.code[pos - 1]
        text = (
            f"Digit {pos} of the {len(self.agents)}-digit code is {digit} "
            f"(write it as {pos}={digit})."
        )
        if agent == self.reporter:
            text += " You are the reporter: collect every digit and submit the full code."
        else:
            text += f" Pass every digit you know towards {self.reporter}, the reporter."
        return text

    def private_label(self, agent: str) -> str | None:
        """The agent's own digit."""
        return str(self.code[self._position(agent) - 1])

    def action_help(self, agent: str) -> str:
        """The reporter writes the digits in order."""
        n = len(self.agents)
        return (
            f"the full code as {n} digits in order, with no spaces; the last round's answer counts."
        )

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots."""
        pos = self._position(agent)
        return {
            "position": pos,
            "digit": self.code[pos - 1],
            "code_length": len(self.agents),
            "reporter": self.reporter,
        }

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Score the reporter's code in the last round."""
        if not last_round:
            return RoundResult()
        raw = actions.get(self.reporter)
        digits = re.sub(r"\D", "", raw or "")
        result = RoundResult(done=True)
        if not digits:
            result.invalid[self.reporter] = f"expected {len(self.agents)} digits, got {short(raw)}"
            result.team = 0.0
            return result
        self.answer = digits
        right = sum(1 for a, b in zip(digits, self.code) if int(a) == b)
        result.team = right / len(self.code)
        result.public_events.append(
            f"{self.reporter} submitted {digits}; the code was {''.join(map(str, self.code))}."
        )
        return result


@register_bot("relay", "rule")
def relay_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Forward every digit known so far; the reporter submits what it has (0 for unknowns)."""
    known = {info["position"]: info["digit"]}
    inbox = observation.split("Messages you received:")[-1].split("Messages you sent:")[0]
    if "Messages you received:" in observation:
        for pos, digit in _PIECE.findall(inbox):
            if len(pos) <= 6:  # a hostile 5,000-digit position would make int() raise
                known[int(pos)] = int(digit)
    pieces = " ".join(f"{p}={d}" for p, d in sorted(known.items()))
    lines = [f"SAY: {pieces}"] if info.get("neighbours") else []
    if agent == info["reporter"]:
        code = "".join(str(known.get(p, 0)) for p in range(1, info["code_length"] + 1))
        lines.append(f"ACTION: {code}")
    else:
        lines.append("ACTION: wait")
    return "\n".join(lines)


@register_bot("relay", "format")
def relay_format_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """The rule bot's markup with content drawn at random: relays send ``position=digit``
    pieces with random positions and digits, the reporter submits a random code. A warm-up on
    it teaches the protocol (the piece syntax, a code of the right length), never the relay:
    its messages carry nothing about the real code, and its answer ignores what it heard."""
    length = info["code_length"]
    lines = []
    if info.get("neighbours"):
        positions = sorted(rng.sample(range(1, length + 1), rng.randint(1, length)))
        lines.append("SAY: " + " ".join(f"{p}={rng.randrange(10)}" for p in positions))
    if agent == info["reporter"]:
        lines.append("ACTION: " + "".join(str(rng.randrange(10)) for _ in range(length)))
    elif not lines:
        lines.append("ACTION: wait")
    return "\n".join(lines)
