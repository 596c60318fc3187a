"""Rules of ``spotlight``: a team task whose shared reward hides who contributed.

Several advisers and one decider. Each episode a random adviser (the *scout*; ``n_scouts`` of
them, or the fixed list ``scouts``) privately sees the answer, one of ``n_options`` words; the
other advisers see nothing (they are *free riders*: whatever they say cannot help). Advisers talk
for ``talk_rounds`` rounds; then the decider, who sees the numbered options and is told who the
scout is (``reveal_scout``), answers ``ACTION: <number or word>``. Everybody gets the same team
reward: 1 for the right answer, 0 otherwise.

Under the team reward every adviser gets the same return, so plain GRPO pushes the free riders'
messages up and down with the scout's success: pure noise. Counterfactual credit separates them:
nulling the scout's message changes the outcome, nulling a free rider's changes nothing, so
difference rewards and Shapley values give the scout the whole effect and the free riders zero.
With two scouts (``n_scouts: 2``) each is redundant: difference rewards give both zero, Shapley
values split the effect between them.

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
from marl.scenarios.families.common import parse_int
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules

WORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "piano",
    "lemon",
    "rocket",
    "candle",
    "forest",
    "mirror",
    "violin",
]


@register_rules("spotlight")
class SpotlightRules(Rules):
    """Only the scout's message can help the decider; the reward is shared by everyone."""

    info = ScenarioInfo(
        min_agents=2,
        max_agents=12,
        default_topology="complete",
        default_rounds=2,
    )

    @dataclass(frozen=True)
    class Params:
        """decider: the agent that answers (default: the last agent); the others are advisers.
        n_options: how many words the decider chooses among.
        n_scouts: how many advisers see the answer, drawn at random each episode.
        scouts: a fixed list of scouts instead of a random draw (overrides n_scouts).
        reveal_scout: tell the decider who the scouts are.
        talk_rounds: rounds of talk before the decider answers (set episode.rounds to this + 1).
        """

        decider: str | None = None
        n_options: int = 4
        n_scouts: int = 1
        scouts: list[str] | None = None
        reveal_scout: bool = True
        talk_rounds: int = 1

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """The decider and scouts must be agents; counts must fit."""
        p = cls.Params(**params)
        problems = []
        decider = p.decider if p.decider is not None else (agents[-1] if agents else None)
        if p.decider is not None and p.decider not in agents:
            problems.append(Problem("decider", f"unknown agent {short(p.decider)}"))
        advisers = [a for a in agents if a != decider]
        if not isinstance(p.n_options, int) or not 2 <= p.n_options <= len(WORDS):
            problems.append(Problem("n_options", f"must be an integer from 2 to {len(WORDS)}"))
        if not isinstance(p.talk_rounds, int) or p.talk_rounds < 1:
            problems.append(Problem("talk_rounds", "must be an integer >= 1"))
        if p.scouts is not None:
            if not isinstance(p.scouts, list) or not p.scouts:
                problems.append(Problem("scouts", "must be a non-empty list of advisers or null"))
            else:
                for i, scout in enumerate(p.scouts):
                    if scout not in advisers:
                        problems.append(
                            Problem(f"scouts[{i}]", f"{short(scout)} is not an adviser: {advisers}")
                        )
                if len(set(p.scouts)) != len(p.scouts):
                    problems.append(Problem("scouts", "duplicate scout"))
        elif not isinstance(p.n_scouts, int) or not 1 <= p.n_scouts <= len(advisers):
            problems.append(
                Problem("n_scouts", f"must be an integer from 1 to {len(advisers)} (the advisers)")
            )
        return problems

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.decider = self.params.decider or self.agents[-1]
        self.advisers = [a for a in self.agents if a != self.decider]
        self.options: list[str] = []
        self.answer = 0
        self.scouts: list[str] = []
        self.choice: int | None = None

    def reset(self) -> None:
        """Draw the options, the answer and the scouts."""
        p = self.params
        self.options = self.rng.sample(WORDS, p.n_options)
        self.answer = self.rng.randrange(p.n_options)
        if p.scouts is not None:
            self.scouts = list(p.scouts)
        else:
            self.scouts = sorted(self.rng.sample(self.advisers, p.n_scouts), key=self.agents.index)
        self.choice = None

    def needs_action(self, agent: str, round: int) -> bool:
        """Only the decider acts, once the talk rounds are over."""
        return agent == self.decider and round == self.params.talk_rounds

    def private_info(self, agent: str) -> str:
        """The scouts see the answer; free riders see nothing; the decider sees the options."""
        if agent == self.decider:
            listing = "; ".join(f"{i + 1}: {w}" for i, w in enumerate(self.options))
            text = f"Options: {listing}."
            if self.params.reveal_scout:
                text += f" {' and '.join(self.scouts)} saw the answer."
            return text
        if agent in self.scouts:
            return f"You saw the answer: {self.options[self.answer]}. Tell {self.decider}."
        return f"You did not see the answer. {self.decider} must choose among the options."

    def private_label(self, agent: str) -> str | None:
        """A scout's answer word; free riders and the decider have none."""
        return self.options[self.answer] if agent in self.scouts else None

    def action_help(self, agent: str) -> str:
        """The decider answers with an option's number or word."""
        return f"the number (1 to {len(self.options)}) or the word of the answer."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots."""
        if agent == self.decider:
            return {
                "role": "decider",
                "options": list(self.options),
                "scouts": list(self.scouts) if self.params.reveal_scout else [],
                "valid_actions": [str(i + 1) for i in range(len(self.options))],
            }
        if agent in self.scouts:
            return {"role": "scout", "answer": self.options[self.answer], "decider": self.decider}
        return {"role": "free_rider", "decider": self.decider}

    def _parse(self, raw: str | None) -> int | None:
        text = (raw or "").strip().lower()
        number = parse_int(text, signed=False)
        if number is not None:
            pick = number - 1
            return pick if 0 <= pick < len(self.options) else None
        named = [i for i, w in enumerate(self.options) if re.search(rf"\b{w}\b", text)]
        return named[0] if len(named) == 1 else None

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Score the decider's answer after the talk rounds."""
        if round < self.params.talk_rounds:
            return RoundResult()
        result = RoundResult(done=True)
        raw = actions.get(self.decider)
        pick = self._parse(raw)
        answer = self.options[self.answer]
        if pick is None:
            result.invalid[self.decider] = (
                f"expected a number from 1 to {len(self.options)} or one option word, "
                f"got {short(raw)}"
            )
            result.team = 0.0
            result.public_events.append(f"{self.decider} gave no valid answer; it was {answer}.")
            return result
        self.choice = pick
        result.team = 1.0 if pick == self.answer else 0.0
        result.public_events.append(
            f"{self.decider} chose {self.options[pick]}; the answer was {answer}."
        )
        return result


def heard_lines(observation: str, senders: Sequence[str] = ()) -> list[str]:
    """The received-message lines of an observation (only from ``senders`` when given)."""
    if "Messages you received:" not in observation:
        return []
    block = observation.split("Messages you received:")[-1]
    lines = []
    for line in block.splitlines()[1:]:
        match = re.match(r"^\s+\[round \d+\] ([^:]+): (.*)$", line)
        if not match:
            break
        if not senders or match.group(1) in senders:
            lines.append(match.group(2))
    return lines


@register_bot("spotlight", "rule")
def spotlight_rule_bot(
    agent: str, observation: str, info: dict[str, Any], rng: random.Random
) -> str:
    """Scouts name the answer; free riders chat; the decider takes the last option it heard.

    The decider listens to the scouts when it knows them, else to everybody. When nobody named
    an option it answers 1 (deterministic, so brute-force tests get exact values).
    """
    role = info.get("role")
    if role == "scout":
        return f"SAY: the answer is {info['answer']}\nACTION: wait"
    if role == "free_rider":
        return "SAY: I did not see it, sorry.\nACTION: wait"
    if not info.get("needs_action", True):
        return "ACTION: wait"
    options = info["options"]
    for line in reversed(heard_lines(observation, info.get("scouts") or ())):
        named = [i for i, w in enumerate(options) if re.search(rf"\b{w}\b", line.lower())]
        if named:
            return f"ACTION: {named[-1] + 1}"
    return "ACTION: 1"
