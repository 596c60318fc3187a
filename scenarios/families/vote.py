"""The ``vote`` rule family: propose and vote until an option is adopted, declared in YAML alone.

Each episode deals every agent private preferences: a random ranking of the ``options``, where
the option ranked k-th is worth ``utilities[k]`` to the agent. The episode is up to ``ballots``
ballots of two rounds each. In the propose round every agent names one option; the options
named make the ballot (all options when nobody named a valid one). In the vote round every
agent votes for one option on the ballot. An option with more than half of the votes
(``threshold: majority``) or all of them (``unanimous``) is adopted and the episode ends; each
agent is then paid ``agreement + utilities`` of the adopted option for it. When no ballot adopts
anything, everyone gets ``no_agreement``. Talk is free in every round.

```yaml
rules: vote
params:
  options: [park, museum, beach]
  utilities: [1.0, 0.5, 0.0]      # the best-ranked option is worth 1.0 to its agent
  ballots: 2
  threshold: majority
  private: "You like {favourite} best; your ranking: {ranking}."
```

Version history:
- v0: first version.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.protocols.values import is_finite_number
from marl.scenarios.families.common import (
    int_problem,
    match_choice,
    name_list_problems,
    number_problem,
    private_problems,
    render_private,
)
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules

THRESHOLDS = ("majority", "unanimous")
PLACEHOLDERS = ("agent", "favourite", "ranking", "values")


@register_rules("vote")
class VoteRules(Rules):
    """Propose, then vote; an option with enough votes is adopted and pays by preference."""

    info = ScenarioInfo(min_agents=2, max_agents=16, default_topology="complete", default_rounds=4)

    @dataclass(frozen=True)
    class Params:
        """options:      the option names (required).
        utilities:    one number per option: each agent gets a random ranking of the options
                      and the k-th ranked option is worth ``utilities[k]`` to it (default: 1
                      for the favourite, 0 for the rest).
        ballots:      propose-then-vote ballots at most (1 to 50).
        threshold:    majority (more than half of the votes) or unanimous.
        agreement:    paid to every agent when an option is adopted, on top of its utility.
        no_agreement: paid to every agent when no ballot adopts an option.
        private:      a template of each agent's private information (one string, or a mapping
                      agent -> string); placeholders {agent}, {favourite}, {ranking} (best
                      first) and {values} (each option with its worth)."""

        options: Any = None
        utilities: Any = None
        ballots: int = 2
        threshold: str = "majority"
        agreement: float = 1.0
        no_agreement: float = 0.0
        private: Any = None

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """Options, utilities (one per option), ballots, threshold, payments and templates."""
        options = params.get("options")
        if options is None:
            return [Problem("options", "required: the option names")]
        problems = name_list_problems(options, "options", "option")
        if len(options if isinstance(options, list) else []) == 1:
            problems.append(Problem("options", "a vote needs at least 2 options"))
        utilities = params.get("utilities")
        if utilities is not None:
            if not isinstance(utilities, list) or not all(is_finite_number(u) for u in utilities):
                problems.append(
                    Problem("utilities", f"must be a list of numbers, got {short(utilities)}")
                )
            elif isinstance(options, list) and len(utilities) != len(options):
                problems.append(
                    Problem(
                        "utilities",
                        f"must hold one value per option ({len(options)} options), "
                        f"got {len(utilities)}",
                    )
                )
        problems += int_problem(params, "ballots", 1, 50)
        if params.get("threshold", "majority") not in THRESHOLDS:
            problems.append(
                Problem(
                    "threshold",
                    f"must be majority or unanimous, got {short(params['threshold'])}",
                )
            )
        problems += number_problem(params, "agreement") + number_problem(params, "no_agreement")
        problems += private_problems(params.get("private"), agents, lambda a: PLACEHOLDERS)
        return problems

    @classmethod
    def episode_rounds(cls, params: dict[str, Any]) -> int | None:
        """Two rounds (propose, vote) per ballot."""
        return 2 * cls.Params(**params).ballots

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.options: list[str] = list(self.params.options)
        utilities = self.params.utilities
        self.utilities: list[float] = (
            [float(u) for u in utilities]
            if utilities is not None
            else [1.0] + [0.0] * (len(self.options) - 1)
        )
        self.rankings: dict[str, list[str]] = {}
        self.ballot: list[str] = []
        self.tallies: list[dict[str, int]] = []
        self.adopted: str | None = None

    def reset(self) -> None:
        """Deal each agent a random ranking of the options."""
        self.rankings = {a: self.rng.sample(self.options, len(self.options)) for a in self.agents}
        self.ballot = []
        self.tallies = []
        self.adopted = None

    def worth(self, agent: str) -> dict[str, float]:
        """What each option is worth to ``agent``."""
        return {o: self.utilities[k] for k, o in enumerate(self.rankings[agent])}

    # --- text ----------------------------------------------------------------------------------
    def needs_action(self, agent: str, round: int) -> bool:
        """Everyone acts in every round: a proposal, then a vote."""
        return True

    def private_info(self, agent: str) -> str:
        """The ``private`` template, or the agent's ranking with each option's worth."""
        worth = self.worth(agent)
        values = {
            "agent": agent,
            "favourite": self.rankings[agent][0],
            "ranking": ", ".join(self.rankings[agent]),
            "values": ", ".join(f"{o}={worth[o]:g}" for o in self.rankings[agent]),
        }
        text = render_private(self.params.private, agent, values)
        if text is not None:
            return text
        return f"What each option is worth to you, best first: {values['values']}."

    def private_label(self, agent: str) -> str | None:
        """The agent's favourite option."""
        return self.rankings[agent][0] if self.rankings else None

    def public_state(self) -> str:
        """The options, the rule, the ballot being voted on and past tallies."""
        rule = (
            "more than half of the votes" if self.params.threshold == "majority" else "every vote"
        )
        text = (
            f"Options: {', '.join(self.options)}. An option is adopted with {rule}. "
            f"Ballot {min(len(self.tallies) + 1, self.params.ballots)} of {self.params.ballots}."
        )
        if self.ballot:
            text += f" On the ballot: {', '.join(self.ballot)}."
        if self.adopted:
            text += f" Adopted: {self.adopted}."
        return text

    def _phase(self) -> str:
        return "vote" if self.ballot else "propose"

    def action_help(self, agent: str) -> str:
        """An option to propose, or one on the ballot to vote for (all are listed)."""
        if self._phase() == "vote":
            return f"the option you vote for, one on the ballot: {', '.join(self.ballot)}."
        return f"the option you propose, one of: {', '.join(self.options)}."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots."""
        return {
            "phase": self._phase(),
            "valid_actions": list(self.ballot or self.options),
            "worth": self.worth(agent) if self.rankings else {},
            "options": list(self.options),
            "last_tally": dict(self.tallies[-1]) if self.tallies else None,
        }

    def success(self) -> float | None:
        """1.0 when an option was adopted; 0.0 when the ballots ran out; None before."""
        if self.adopted is not None:
            return 1.0
        return 0.0 if len(self.tallies) >= self.params.ballots else None

    # --- rounds --------------------------------------------------------------------------------
    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Collect proposals, or count the votes and pay out when the vote ends the episode."""
        result = RoundResult()
        if not self.ballot:
            proposed = set()
            for agent in self.agents:
                raw = actions.get(agent)
                choice = match_choice(raw, self.options)
                if choice is None:
                    result.invalid[agent] = (
                        f"expected one of {', '.join(self.options)}, got {short(raw)}"
                    )
                else:
                    proposed.add(choice)
            self.ballot = [o for o in self.options if o in proposed] or list(self.options)
            result.public_events.append(
                f"ballot {len(self.tallies) + 1}: on the ballot {', '.join(self.ballot)}"
            )
            return result
        tally = dict.fromkeys(self.ballot, 0)
        for agent in self.agents:
            raw = actions.get(agent)
            choice = match_choice(raw, self.ballot)
            if choice is None:
                result.invalid[agent] = (
                    f"expected one of the ballot's {', '.join(self.ballot)}, got {short(raw)}; "
                    "counted as no vote"
                )
            else:
                tally[choice] += 1
        self.tallies.append(tally)
        self.ballot = []
        n = len(self.agents)
        needed = n if self.params.threshold == "unanimous" else n // 2 + 1
        winners = [o for o, votes in tally.items() if votes >= needed]
        counts = ", ".join(f"{o}={v}" for o, v in tally.items())
        if winners:
            self.adopted = winners[0]
            result.individual = {
                a: self.params.agreement + self.worth(a)[self.adopted] for a in self.agents
            }
            result.done = True
            result.public_events.append(f"votes: {counts}; adopted {self.adopted}")
        elif len(self.tallies) >= self.params.ballots or last_round:
            result.individual = dict.fromkeys(self.agents, float(self.params.no_agreement))
            result.done = True
            result.public_events.append(f"votes: {counts}; nothing adopted, no more ballots")
        else:
            result.public_events.append(f"votes: {counts}; nothing adopted")
        return result
