"""The ``matrix`` rule family: normal-form games with cheap talk, declared in YAML alone.

N players, each with named actions, and a payoff table giving every player's payoff for every
joint action. One stage is ``talk_rounds`` rounds of free talk followed by one round in which
every player writes an action at once; the episode plays ``repeats`` stages (repeated play, each
stage's actions announced to all). Payoffs come straight from the table; the YAML's
``reward.cooperation`` mixes them, from the team's mean (1) to zero-sum (0).

```yaml
rules: matrix
params:
  actions: [cooperate, defect]        # or per player: {alice: [a, b], bob: [x, y, z]}
  payoffs:                            # first player's action -> second's -> [payoff per player]
    cooperate: {cooperate: [3, 3], defect: [0, 5]}
    defect:    {cooperate: [5, 0], defect: [1, 1]}
  talk_rounds: 1
  repeats: 1
```

The table nests one mapping level per player, in the order of ``agents``; each leaf lists one
payoff per player in that order. An action that is missing or invalid counts as ``fallback``
(default: the player's first action) and costs the malformed penalty.

Version history:
- v0: first version.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.scenarios.families.common import match_choice, render_private
from marl.scenarios.families.matrix_schema import check_matrix, player_actions
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules


@register_rules("matrix")
class MatrixRules(Rules):
    """A normal-form game declared in YAML: talk rounds, then simultaneous named actions."""

    info = ScenarioInfo(min_agents=2, max_agents=8, default_topology="complete", default_rounds=2)

    @dataclass(frozen=True)
    class Params:
        """actions:     the action names, a list shared by every player or a mapping agent ->
                     list (required).
        payoffs:     the payoff table: one nested mapping level per player (in the order of
                     ``agents``) from action name to the next level; the leaves list one payoff
                     per player (required).
        talk_rounds: rounds of cheap talk before each action round (0 to 20).
        repeats:     stages (talk, then act) per episode; above 1 the game is repeated and every
                     stage's actions are announced (1 to 100).
        fallback:    the action a player who writes no valid action is taken to play (default:
                     its first action); it must be an action of every player.
        private:     a template of each player's private information (one string, or a mapping
                     agent -> string); placeholders {agent}, {actions} and {payoffs}."""

        actions: Any = None
        payoffs: Any = None
        talk_rounds: int = 1
        repeats: int = 1
        fallback: str | None = None
        private: Any = None

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """See :func:`marl.scenarios.families.matrix_schema.check_matrix`."""
        return check_matrix(params, agents)

    @classmethod
    def episode_rounds(cls, params: dict[str, Any]) -> int | None:
        """(talk_rounds + 1) x repeats."""
        p = cls.Params(**params)
        return (p.talk_rounds + 1) * p.repeats

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        actions = player_actions(self.params.actions, self.agents)
        assert actions is not None, "params were not validated"
        self.actions = actions
        self.history: list[dict[str, str]] = []
        self._team_best = self.team_best()
        self._table = self._table_text()  # constant: the table and the players never change

    # --- the table ---------------------------------------------------------------------------
    def payoff(self, joint: Mapping[str, str]) -> list[float]:
        """Every player's payoff for a joint action (agent -> action name)."""
        node: Any = self.params.payoffs
        for agent in self.agents:
            node = node[joint[agent]]
        return [float(x) for x in node]

    def team_best(self) -> dict[str, str]:
        """The joint action with the highest total payoff (the first one in table order)."""
        best, best_total = None, float("-inf")
        for combo in itertools.product(*(self.actions[a] for a in self.agents)):
            joint = dict(zip(self.agents, combo))
            total = sum(self.payoff(joint))
            if total > best_total:
                best, best_total = joint, total
        assert best is not None
        return best

    def best_response(self, agent: str, others: Mapping[str, str]) -> str:
        """``agent``'s action with the highest own payoff against the others' actions."""
        index = self.agents.index(agent)
        return max(
            self.actions[agent],
            key=lambda action: (
                self.payoff({**others, agent: action})[index],
                -self.actions[agent].index(action),
            ),
        )

    def _table_text(self) -> str:
        rows = []
        for combo in itertools.product(*(self.actions[a] for a in self.agents)):
            pays = self.payoff(dict(zip(self.agents, combo)))
            rows.append(f"{'/'.join(combo)} -> {', '.join(f'{x:g}' for x in pays)}")
        return f"Payoffs ({', '.join(self.agents)}): " + "; ".join(rows)

    # --- the game ----------------------------------------------------------------------------
    def reset(self) -> None:
        """Nothing is dealt: the table is public; only the play differs between episodes."""
        self.history = []

    def _stage_length(self) -> int:
        return self.params.talk_rounds + 1

    def needs_action(self, agent: str, round: int) -> bool:
        """Every player acts in the last round of each stage."""
        return round % self._stage_length() == self.params.talk_rounds

    def private_info(self, agent: str) -> str:
        """The ``private`` template, or the player's own actions."""
        values = {
            "agent": agent,
            "actions": ", ".join(self.actions[agent]),
            "payoffs": self._table,
        }
        text = render_private(self.params.private, agent, values)
        return text if text is not None else f"Your actions: {values['actions']}."

    def public_state(self) -> str:
        """The actions, the table, the stage and the last stage's actions."""
        stage = min(len(self.history) + 1, self.params.repeats)
        choices = "; ".join(f"{a}: {', '.join(self.actions[a])}" for a in self.agents)
        text = (
            f"Each player picks one action at the same time ({choices}). {self._table}. "
            f"Stage {stage} of {self.params.repeats}."
        )
        if self.history:
            last = ", ".join(f"{a}={x}" for a, x in self.history[-1].items())
            text += f" Last actions: {last}."
        return text

    def action_help(self, agent: str) -> str:
        """The player's action names (all of them, so no one is singled out as an example)."""
        return f"one of your actions: {', '.join(self.actions[agent])}."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots: the valid actions, the last stage's actions, the
        team's best joint action and the best response to the others' last actions."""
        last = self.history[-1] if self.history else None
        others = {a: x for a, x in last.items() if a != agent} if last else None
        return {
            "valid_actions": list(self.actions[agent]),
            "last_actions": dict(last) if last else None,
            "team_best": dict(self._team_best),
            "best_response": self.best_response(agent, others) if others else None,
        }

    def legal_actions(self, agent: str) -> dict[str, str] | None:
        """The player's actions, each its own text (they are the same in every stage; only the
        stage's last round asks for one: :meth:`needs_action`)."""
        return {action: action for action in self.actions[agent]}

    def parse_action(self, agent: str, text: str) -> str | None:
        """The action the player's reply names, read as :meth:`step` reads it."""
        return match_choice(text, self.actions[agent])

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """In an action round: read each player's action, pay the table's payoffs."""
        if not self.needs_action(self.agents[0], round):
            return RoundResult()
        result = RoundResult()
        joint = {}
        for agent in self.agents:
            raw = actions.get(agent)
            choice = match_choice(raw, self.actions[agent])
            if choice is None:
                fallback = self.params.fallback or self.actions[agent][0]
                result.invalid[agent] = (
                    f"expected one of {', '.join(self.actions[agent])}, got {short(raw)}; "
                    f"counted as {fallback}"
                )
                choice = fallback
            joint[agent] = choice
        pays = self.payoff(joint)
        result.individual = dict(zip(self.agents, pays))
        self.history.append(joint)
        result.public_events.append(
            f"stage {len(self.history)}: "
            + ", ".join(f"{a} played {x}" for a, x in joint.items())
            + "; payoffs "
            + ", ".join(f"{a}={p:g}" for a, p in zip(self.agents, pays))
        )
        result.done = len(self.history) >= self.params.repeats or last_round
        return result
