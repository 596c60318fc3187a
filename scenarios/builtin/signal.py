"""Rules of ``signal``: a cooperative referential game with a verifiable reward.

The speaker sees a target object; the listener sees a numbered list of candidates and must pick
the target using only the speaker's messages. Round 1: the speaker talks. Round 2: the listener
answers ``ACTION: <number>``. Both get 1 for the right pick, 0 otherwise; with
``partial_credit`` a wrong pick still earns the fraction of the target's attributes it shares.

Version history:
- v0: first version (the speaker talks in round 1 only). The action help no longer shows an
  example value (small models copied it).
- v1 (``signal-v1.yaml``, same rules class): ``answer_by_name: true`` -- the listener may answer
  with the candidate's name as well as its number, so it can copy the message instead of
  looking the name up in the numbered list (SmolLM2-135M cannot do that lookup zero-shot:
  docs/communication.md).
- v0 and v1, 2026-11-25: a number counts only as the answer itself (``3``, ``#3``,
  ``candidate 3``, ``3: red circle``), not as any digit in prose: ``ACTION: round 1`` used to
  pick candidate 1, and a trained listener settled on writing exactly that (a pooling
  equilibrium worth chance plus partial credit; docs/communication.md).
- code-v0 (``signal-code-v0.yaml``, same rules class): ``coded: true`` -- the listener sees the
  candidates as attribute indices ("colour 3, shape 1") under a mapping drawn from
  ``code_seed`` and shown to neither agent, while the speaker still sees the target in words.
  Copying a name cannot succeed: "red" must come to mean "colour 2" by convention (issue 26
  item 6). v0 and v1 are unchanged (``coded`` defaults to false).
- code-v1 (``signal-code-v1.yaml``, same rules class): ``answer_by_code: true`` -- the coded
  listener may answer with the target's code as its list shows it (``colour 3, shape 1``) as
  well as its number, so it can copy from its own list instead of looking a position up (the
  recipe could not learn that lookup even with the names visible: issue 40 item 2a). The pair
  must still agree that "red" means "colour 3". code-v0 is unchanged.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marl.scenarios.bots import register_bot
from marl.scenarios.problems import Problem
from marl.scenarios.rules import RoundResult, Rules, ScenarioInfo, register_rules

COLOURS = ["red", "blue", "green", "yellow", "purple", "orange"]
SHAPES = ["circle", "square", "triangle", "star", "heart", "cross"]
# A number answer: the number itself, optionally after "#", "no." or "candidate"/"number"/
# "option", and before anything that is not a letter or digit ("3", "#3", "candidate 3.",
# "3: red circle"). A digit inside prose ("round 1", "I think 2") is no answer.
_NUMBER_ANSWER = re.compile(r"^[\s\W_]*(?:(?:candidate|number|option|no\.?)\s*)?#?\s*(\d+)(?![\w])")


@register_rules("signal")
class SignalRules(Rules):
    """A speaker describes a target; a listener picks it from candidates."""

    info = ScenarioInfo(
        min_agents=2,
        max_agents=2,
        default_topology="explicit",
        default_rounds=2,
    )

    @dataclass(frozen=True)
    class Params:
        """n_candidates: how many objects the listener chooses among.
        n_colours, n_shapes: size of the attribute vocabulary objects are drawn from.
        partial_credit: reward shared attributes of a wrong pick (for weak models).
        answer_by_name: the listener may answer with the candidate's name ("red circle") as
            well as its number.
        coded: the listener sees each candidate as attribute indices ("colour 3, shape 1")
            instead of words, under a mapping (a permutation of the colour indices and one of
            the shape indices) that neither agent is shown; it answers by number only. The
            speaker still sees the target in words, so the pair must agree on a code.
        code_seed: draws that mapping; the same for every episode of a run (the shipped
            configs set it to the run seed: configs/scenario/signal_code_v0.yaml and
            signal_code.yaml).
        answer_by_code: (with ``coded``) the listener may answer with the candidate's code as
            listed (``colour 3, shape 1``; case, spacing and punctuation free) as well as its
            number."""

        n_candidates: int = 4
        n_colours: int = 4
        n_shapes: int = 4
        partial_credit: bool = False
        answer_by_name: bool = False
        coded: bool = False
        code_seed: int = 0
        answer_by_code: bool = False

    @classmethod
    def check_params(cls, params: dict[str, Any], agents: Sequence[str]) -> list[Problem]:
        """Candidates must fit the attribute vocabulary."""
        p = cls.Params(**params)
        problems = []
        if not 1 <= p.n_colours <= len(COLOURS):
            problems.append(Problem("n_colours", f"must be between 1 and {len(COLOURS)}"))
        if not 1 <= p.n_shapes <= len(SHAPES):
            problems.append(Problem("n_shapes", f"must be between 1 and {len(SHAPES)}"))
        if not 2 <= p.n_candidates <= p.n_colours * p.n_shapes:
            problems.append(
                Problem(
                    "n_candidates",
                    f"must be between 2 and n_colours*n_shapes ({p.n_colours * p.n_shapes})",
                )
            )
        if p.coded and p.answer_by_name:
            problems.append(
                Problem(
                    "answer_by_name",
                    "cannot be true with coded: the coded listener sees no names to answer with",
                )
            )
        if p.answer_by_code and not p.coded:
            problems.append(
                Problem("answer_by_code", "needs coded: true (only a coded listener sees codes)")
            )
        if isinstance(p.code_seed, bool) or not isinstance(p.code_seed, int):
            problems.append(Problem("code_seed", f"must be a whole number, got {p.code_seed!r}"))
        return problems

    def __init__(
        self, agents: Sequence[str], params: Mapping[str, Any], rng: random.Random
    ) -> None:
        super().__init__(agents, params, rng)
        self.speaker, self.listener = self.agents
        self.candidates: list[tuple[str, str]] = []
        self.target = 0
        self.choice: int | None = None
        self._answered = False
        self.code = signal_code(self.params.n_colours, self.params.n_shapes, self.params.code_seed)

    def _coded(self, candidate: tuple[str, str]) -> str:
        """How the coded listener sees a candidate: ``colour 3, shape 1``."""
        colour, shape = candidate
        return f"{self.code[colour]}, {self.code[shape]}"

    def reset(self) -> None:
        """Draw distinct candidates and a target among them."""
        p = self.params
        objects = [(c, s) for c in COLOURS[: p.n_colours] for s in SHAPES[: p.n_shapes]]
        self.candidates = self.rng.sample(objects, p.n_candidates)
        self.target = self.rng.randrange(p.n_candidates)
        self.choice = None
        self._answered = False

    def needs_action(self, agent: str, round: int) -> bool:
        """Only the listener acts, in the last round."""
        return agent == self.listener and round == 1

    def can_talk(self, agent: str, round: int) -> bool:
        """The speaker talks in round 1 only; after that nobody would hear it in time."""
        return agent == self.speaker and round == 0

    def private_info(self, agent: str) -> str:
        """The speaker sees the target; the listener sees the numbered candidates."""
        if agent == self.speaker:
            colour, shape = self.candidates[self.target]
            return f"The target is the {colour} {shape}. Tell {self.listener} which one it is."
        if self.params.coded:
            listing = "; ".join(f"{i + 1}: {self._coded(c)}" for i, c in enumerate(self.candidates))
        else:
            listing = "; ".join(f"{i + 1}: {c} {s}" for i, (c, s) in enumerate(self.candidates))
        return f"Candidates: {listing}. {self.speaker} knows which one is the target."

    def private_label(self, agent: str) -> str | None:
        """The speaker's target (the listener's candidates are no message's content)."""
        return " ".join(self.candidates[self.target]) if agent == self.speaker else None

    def action_help(self, agent: str) -> str:
        """The listener answers with a candidate number (or name)."""
        if self.params.answer_by_name:
            return "the name of the target, one of the candidates."
        if self.params.answer_by_code:
            return "the target as your list shows it (colour and shape), or its number."
        return f"the number of the target, 1 to {len(self.candidates)}."

    def success(self) -> float | None:
        """1 when the listener picked the target, 0 otherwise (before the pick: None)."""
        if self.choice is None and not self._answered:
            return None
        return 1.0 if self.choice == self.target else 0.0

    def agent_info(self, agent: str) -> dict[str, Any]:
        """Structured facts for scripted bots and logs, never rendered into a prompt (an LLM
        agent's prompt is its system prompt and observation; agents.generation reads an info
        only for the response head and tools). The coded listener's info holds the candidates'
        names and the mapping (``code``): the rule bot reads them, so a warm-up must never
        imitate the rule bot on a coded scenario (it would teach the code)."""
        if agent == self.speaker:
            p = self.params
            objects = [f"{c} {s}" for c in COLOURS[: p.n_colours] for s in SHAPES[: p.n_shapes]]
            return {"target": " ".join(self.candidates[self.target]), "objects": objects}
        names = [" ".join(c) for c in self.candidates]
        numbers = [str(i + 1) for i in range(len(self.candidates))]
        codes = [self._coded(c) for c in self.candidates]
        valid = (
            names
            if self.params.answer_by_name
            else codes
            if self.params.answer_by_code
            else numbers
        )
        info: dict[str, Any] = {"candidates": names, "valid_actions": valid}
        if self.params.coded:
            info["coded_candidates"] = codes
            info["code"] = dict(self.code)
        return info

    def legal_actions(self, agent: str) -> dict[str, str] | None:
        """The listener's answers, each meaning a candidate's name: its number (``"2"``) and,
        with ``answer_by_name``, the name itself (``"red circle"``). The speaker has none."""
        if agent != self.listener or not self.candidates:
            return None
        names = [" ".join(c) for c in self.candidates]
        texts = {str(i + 1): name for i, name in enumerate(names)}
        if self.params.answer_by_name:
            texts.update({name: name for name in names})
        if self.params.answer_by_code:
            texts.update({self._coded(c): " ".join(c) for c in self.candidates})
        return texts

    def parse_action(self, agent: str, text: str) -> str | None:
        """The candidate name the listener's answer picks, read as :meth:`step` reads it."""
        if agent != self.listener or not self.candidates:
            return None
        pick = self._pick(text)
        return " ".join(self.candidates[pick]) if 0 <= pick < len(self.candidates) else None

    def alternative_labels(self, agent: str) -> list[str]:
        """The speaker's target could have been any candidate (drawn uniformly among them)."""
        return [" ".join(c) for c in self.candidates] if agent == self.speaker else []

    def set_private_label(self, agent: str, label: str) -> None:
        """Make the candidate named ``label`` the target (a counterfactual episode)."""
        names = [" ".join(c) for c in self.candidates]
        if agent != self.speaker or label not in names:
            raise ValueError(f"signal: {label!r} is no candidate of {agent!r}'s episode")
        self.target = names.index(label)

    def picked(self) -> str | None:
        """The name of the candidate the listener picked (None before a valid pick)."""
        return None if self.choice is None else " ".join(self.candidates[self.choice])

    def _pick(self, raw: str | None) -> int:
        """The candidate index an answer names, or -1: a number, or (answer_by_name) a name."""
        text = (raw or "").lower()
        if self.params.answer_by_name:
            named = [i for i, c in enumerate(self.candidates) if " ".join(c) in text]
            if len(named) == 1:
                return named[0]
            if named:  # several names: ambiguous, not a pick
                return -1
        if self.params.answer_by_code:
            words = _words(text)
            coded = [i for i, c in enumerate(self.candidates) if _words(self._coded(c)) in words]
            if len(coded) == 1:
                return coded[0]
            if coded:  # several codes: ambiguous, not a pick
                return -1
        match = _NUMBER_ANSWER.match(text)
        # a hostile 5,000-digit number would make int() raise; it is out of range anyway
        return int(match.group(1)) - 1 if match and len(match.group(1)) <= 18 else -1

    def step(self, actions: Mapping[str, str | None], round: int, last_round: bool) -> RoundResult:
        """Score the listener's pick at the end of round 2."""
        if round == 0:
            return RoundResult()
        result = RoundResult(done=True)
        raw = actions.get(self.listener)
        pick = self._pick(raw)
        self._answered = True
        if not 0 <= pick < len(self.candidates):
            result.invalid[self.listener] = (
                f"expected a number from 1 to {len(self.candidates)}, got {raw!r}"
            )
            result.team = 0.0
            return result
        self.choice = pick
        chosen, target = self.candidates[pick], self.candidates[self.target]
        if pick == self.target:
            score = 1.0
        elif self.params.partial_credit:
            score = sum(a == b for a, b in zip(chosen, target)) / 2
        else:
            score = 0.0
        result.team = score
        if self.params.coded:  # the listener's vocabulary: the episode is over, but no words
            event = f"{self.listener} picked candidate {pick + 1}; the target was candidate "
            event += f"{self.target + 1}."
        else:
            event = f"{self.listener} picked {' '.join(chosen)}; the target was {' '.join(target)}."
        result.public_events.append(event)
        return result


def _words(text: str) -> str:
    """``text`` as its lower-case words and numbers, single-spaced and padded with a space
    each side, so a code is found as a whole (``colour 3, shape 1`` in ``I pick colour 3 shape
    1.``, never ``colour 3, shape 12``)."""
    return " " + " ".join(re.findall(r"[a-z]+|\d+", text.lower())) + " "


def signal_code(n_colours: int, n_shapes: int, code_seed: int) -> dict[str, str]:
    """The coded listener's vocabulary: each colour and shape word -> its attribute index
    (``"red" -> "colour 2"``), a random permutation of the colour indices and one of the shape
    indices, drawn from ``code_seed`` alone (the same for every episode of a run)."""
    rng = random.Random(f"signal-code:{code_seed}")
    colours = rng.sample(range(1, n_colours + 1), n_colours)
    shapes = rng.sample(range(1, n_shapes + 1), n_shapes)
    code = {c: f"colour {k}" for c, k in zip(COLOURS[:n_colours], colours)}
    code.update({s: f"shape {k}" for s, k in zip(SHAPES[:n_shapes], shapes)})
    return code


@register_bot("signal", "rule")
def signal_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """The speaker names the target; the listener picks the candidate the message names.

    On a coded scenario the listener reads the candidates' names (hence the code) from its info,
    which no LLM sees: a reference that always succeeds. Never imitate it in a warm-up on a coded
    scenario (``warmup.bot: rule``): it would teach the code that RL is meant to find."""
    if "target" in info:
        return f"SAY: {info['target']}\nACTION: wait"
    candidates = info.get("candidates", [])
    heard = (
        observation.split("Messages you received:")[-1]
        if "Messages you received:" in observation
        else ""
    )
    answers = info.get("valid_actions") or [str(i + 1) for i in range(len(candidates))]
    for i, name in enumerate(candidates):
        if name in heard:
            return f"ACTION: {answers[i]}"
    return f"ACTION: {rng.choice(answers)}" if answers else "ACTION: 1"


@register_bot("signal", "format")
def signal_format_bot(
    agent: str, observation: str, info: dict[str, Any], rng: random.Random
) -> str:
    """The markup and the message style of the rule bot, with content drawn at random: the
    speaker names a random object (not the target), the listener picks a random candidate.
    A warm-up on it teaches the protocol, never the answer (its messages carry no information
    about the target, and the listener's pick ignores them)."""
    if "target" in info:
        objects = info.get("objects") or [f"{c} {s}" for c in COLOURS for s in SHAPES]
        return f"SAY: {rng.choice(objects)}\nACTION: wait"
    answers = info.get("valid_actions") or ["1"]
    return f"ACTION: {rng.choice(answers)}"
