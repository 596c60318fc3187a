"""The ``question`` rule family: hidden-information questions, declared in YAML alone.

Each episode deals every fact one value from its pool; a fact is seen only by its ``holders``.
After ``talk_rounds`` rounds of talk, the ``reporter`` (or, with no reporter, every agent)
answers a question whose answer is computed from the dealt values by one declared operation:

- ``sum``: the sum of the facts (whole numbers);
- ``max``: the largest of the facts (whole numbers);
- ``concat``: the facts' values in the order listed, joined by ``separator`` (default ``""``);
- ``lookup``: the value of the fact that the ``key`` fact names (the key's pool holds names of
  the facts listed).

``scoring: exact`` pays 1 for the right answer and 0 otherwise. ``scoring: partial`` pays for
closeness: ``1 - |answer - right| / span`` for numbers (``span``: the range of possible answers),
the share of parts in the right place for ``concat``, and exact for a lookup of words.

```yaml
rules: question
params:
  facts:
    - {name: a, pool: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], holders: [ann]}
    - {name: b, pool: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], holders: [ben]}
  question: {op: sum, facts: [a, b]}
  reporter: ben
  talk_rounds: 1
  private: {ann: "Your number is {a}.", ben: "Your number is {b}."}
```

Version history:
- v0: first version.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.protocols.values import is_int
from marl.scenarios.families.common import (
    match_choice,
    normalise,
    parse_int,
    render_private,
)
from marl.scenarios.families.question_schema import check_question
from marl.scenarios.families.templates import render
from marl.scenarios.problems import Problem, short
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules

MAX_LISTED_ANSWERS = 100  # answers listed for scripted bots when there are this few


def answer(
    op: str, values: Mapping[str, Any], asked: Sequence[str], key: str | None, separator: str
) -> int | str:
    """The right answer: ``op`` over the values of the facts ``asked`` (``key`` for lookup)."""
    if op == "sum":
        return sum(int(values[name]) for name in asked)
    if op == "max":
        return max(int(values[name]) for name in asked)
    if op == "lookup":
        return values[str(values[key])]
    return separator.join(str(values[name]) for name in asked)


@register_rules("question")
class QuestionRules(Rules):
    """Facts dealt from YAML pools with per-agent visibility; a question computed from them."""

    info = ScenarioInfo(min_agents=2, max_agents=16, default_topology="complete", default_rounds=2)

    @dataclass(frozen=True)
    class Params:
        """facts:       the facts, each ``{name, pool, holders}``: a value is dealt from
                     ``pool`` (whole numbers or strings) each episode and shown only to the
                     agents in ``holders`` (required).
        question:    ``{op, facts, key, separator, text}``: ``op`` is sum, max, concat or
                     lookup over the listed ``facts``; ``key`` the fact a lookup reads;
                     ``separator`` joins concat's parts; ``text`` the public question, a template
                     with {reporter} (required).
        reporter:    the agent who answers; null: every agent answers and the team is paid
                     the mean score.
        scoring:     exact or partial.
        talk_rounds: rounds of talk before the answer round (0 to 50).
        private:     a template of each agent's private information (one string, or a mapping
                     agent -> string); placeholders {agent}, {reporter} and the names of the
                     facts the agent holds."""

        facts: Any = None
        question: Any = None
        reporter: str | None = None
        scoring: str = "exact"
        talk_rounds: int = 1
        private: Any = None

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """See :func:`marl.scenarios.families.question_schema.check_question`."""
        return check_question(params, agents)

    @classmethod
    def episode_rounds(cls, params: dict[str, Any]) -> int | None:
        """talk_rounds + 1 (the answer round)."""
        return cls.Params(**params).talk_rounds + 1

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        p = self.params
        self.facts = {f["name"]: f for f in p.facts}
        self.op: str = p.question["op"]
        self.asked: list[str] = list(p.question["facts"])
        self.key: str | None = p.question.get("key")
        self.separator: str = p.question.get("separator", "")
        self.answerers = [p.reporter] if p.reporter else list(self.agents)
        self.values: dict[str, Any] = {}
        self.scores: dict[str, float] | None = None

    # --- what is dealt and known ---------------------------------------------------------------
    def reset(self) -> None:
        """Deal one value per fact, in declaration order."""
        self.values = {name: self.rng.choice(f["pool"]) for name, f in self.facts.items()}
        self.scores = None

    def held(self, agent: str) -> dict[str, Any]:
        """The facts ``agent`` holds, with their values."""
        return {n: self.values[n] for n, f in self.facts.items() if agent in f.get("holders", [])}

    def right_answer(self) -> int | str:
        """The answer to this episode's question."""
        return answer(self.op, self.values, self.asked, self.key, self.separator)

    def _candidates(self) -> list[Any] | None:
        """Every possible answer when there are few (for lookups of words and for bots)."""
        pools = [self.facts[n]["pool"] for n in self.asked]
        if self.op == "lookup":
            return list(dict.fromkeys(v for pool in pools for v in pool))
        if self.op in ("sum", "max"):
            low, high = self._span()
            if high - low < MAX_LISTED_ANSWERS:
                return list(range(low, high + 1))
        return None

    def _span(self) -> tuple[int, int]:
        """The smallest and largest possible numeric answer."""
        pools = [[v for v in self.facts[n]["pool"] if is_int(v)] or [0] for n in self.asked]
        if self.op == "sum":
            return sum(min(p) for p in pools), sum(max(p) for p in pools)
        if self.op == "max":
            return max(min(p) for p in pools), max(max(p) for p in pools)
        numbers = [v for p in pools for v in p]
        return min(numbers), max(numbers)

    # --- text ----------------------------------------------------------------------------------
    def _reporter_name(self) -> str:
        return self.params.reporter or "everyone"

    def _question_text(self) -> str:
        text = self.params.question.get("text")
        if isinstance(text, str):
            return render(text, {"reporter": self._reporter_name()})
        names = ", ".join(self.asked)
        if self.op == "sum":
            what = f"the sum of {names}"
        elif self.op == "max":
            what = f"the largest of {names}"
        elif self.op == "lookup":
            what = f"the value of the fact that {self.key} names (one of {names})"
        else:
            joined = f"joined by {self.separator!r}" if self.separator else "with nothing between"
            what = f"the values of {names} in that order, {joined}"
        return f"Question: what is {what}? {self._reporter_name()} answers."

    def needs_action(self, agent: str, round: int) -> bool:
        """The answerers write an action in the answer round (the last one)."""
        return round == self.params.talk_rounds and agent in self.answerers

    def private_info(self, agent: str) -> str:
        """The ``private`` template, or the facts the agent holds."""
        held = self.held(agent)
        values = {"agent": agent, "reporter": self._reporter_name(), **held}
        text = render_private(self.params.private, agent, values)
        if text is None:
            known = ", ".join(f"{n} = {v}" for n, v in held.items())
            text = f"You know: {known}." if known else "You hold no facts."
        if self.params.reporter == agent:
            text += " You answer the question."
        elif self.params.reporter:
            text += f" Help {self.params.reporter} answer the question."
        return text

    def private_label(self, agent: str) -> str | None:
        """The values the agent holds, in declaration order."""
        held = self.held(agent)
        return ",".join(str(v) for v in held.values()) if held else None

    def public_state(self) -> str:
        """The question."""
        return self._question_text()

    def action_help(self, agent: str) -> str:
        """What form the answer takes (never an example value)."""
        if self.op in ("sum", "max"):
            return "the answer, a whole number."
        if self.op == "lookup":
            return "the value of the fact the question asks for."
        if self.separator:
            return f"the values in the order asked, separated by {self.separator!r}."
        return "the values in the order asked, with nothing between them."

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots: what the agent holds and what is asked."""
        info: dict[str, Any] = {
            "known": self.held(agent),
            "fact_names": list(self.facts),
            "answering": agent in self.answerers,
            "question": {
                "op": self.op,
                "facts": list(self.asked),
                "key": self.key,
                "separator": self.separator,
            },
            "defaults": {n: f["pool"][0] for n, f in self.facts.items()},
        }
        candidates = self._candidates()
        if (
            candidates is not None
            and len(candidates) <= MAX_LISTED_ANSWERS
            and agent in self.answerers
        ):
            info["valid_actions"] = [str(c) for c in candidates]
        return info

    # --- scoring -------------------------------------------------------------------------------
    def score(self, text: str | None) -> float | None:
        """The score of an answer in [0, 1], or None when it holds no answer at all."""
        right = self.right_answer()
        if isinstance(right, int):
            given = parse_int(text)
            if given is None:
                return None
            if given == right:
                return 1.0
            low, high = self._span()
            if self.params.scoring == "partial" and high > low:
                return max(0.0, 1.0 - abs(given - right) / (high - low))
            return 0.0
        if self.op == "lookup":
            candidates = [str(c) for c in self._candidates() or []]
            choice = match_choice(text, candidates)
            return None if choice is None else float(normalise(choice) == normalise(str(right)))
        given = normalise(text or "")
        if not given:
            return None
        wanted = normalise(right)
        if given == wanted:
            return 1.0
        if self.params.scoring != "partial":
            return 0.0
        parts, right_parts = self._parts(given), self._parts(wanted)
        hits = sum(1 for a, b in zip(parts, right_parts) if a == b)
        return hits / max(len(right_parts), 1)

    def _parts(self, text: str) -> list[str]:
        """The parts of a normalised concat answer: split on the separator, on whitespace for a
        blank separator, or into characters when there is none."""
        sep = self.separator.strip().casefold()
        if sep:
            return [part.strip() for part in text.split(sep)]
        return text.split() if self.separator else list(text)

    def success(self) -> float | None:
        """1.0 when every answer was right, 0.0 otherwise (None before the answer round)."""
        if self.scores is None:
            return None
        return float(all(s == 1.0 for s in self.scores.values()))

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Score the answers in the answer round; the episode ends there."""
        if round < self.params.talk_rounds:
            return RoundResult()
        result = RoundResult(done=True)
        scores = {}
        for agent in self.answerers:
            raw = actions.get(agent)
            score = self.score(raw)
            if score is None:
                help_text = self.action_help(agent).rstrip(".")
                result.invalid[agent] = f"expected {help_text}; got {short(raw)}"
                score = 0.0
            scores[agent] = score
        self.scores = scores
        team = sum(scores.values()) / len(scores)
        result.team = team
        result.individual = {a: scores.get(a, team) for a in self.agents}
        answers = ", ".join(f"{a}: {short(actions.get(a))}" for a in self.answerers)
        result.public_events.append(
            f"answers {answers}; the right answer was {self.right_answer()}."
        )
        return result
