"""Rule bots for the declarative families: one per family, so every YAML-only game has one.

They read the structured facts the rules put in ``info`` (never hidden values they should not
know) and, for the question family, the facts their neighbours sent as ``name=value``.

- ``matrix``: plays its part of the team's best joint action and says so; after a stage in which
  someone else strayed from it, best-responds to the others' last actions (reciprocity).
- ``question``: passes on every fact it knows as ``name=value``; an answerer computes the answer
  from what it knows (an unknown fact counts as its pool's first value).
- ``vote``: proposes its favourite and votes for the ballot option it likes most; after a ballot
  that adopted nothing it proposes and votes for that ballot's leader (first listed on a tie).
"""

from __future__ import annotations

import random
import re
from typing import Any

from marl.scenarios.bots import register_bot
from marl.scenarios.families.question import answer

_PAIR = re.compile(r"([A-Za-z][A-Za-z0-9_\-]{0,39})=(\S{1,80})")


@register_bot("matrix", "rule")
def matrix_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Team-best action first; best response to the others after someone strays."""
    team = info["team_best"]
    last = info.get("last_actions")
    strayed = last is not None and any(last[a] != team[a] for a in last if a != agent)
    action = info["best_response"] if strayed else team[agent]
    lines = [f"SAY: I will play {action}."] if info.get("neighbours") else []
    if info.get("needs_action"):
        lines.append(f"ACTION: {action}")
    return "\n".join(lines) or "ACTION: wait"


def _heard(observation: str, names: list[str]) -> dict[str, str]:
    """``name=value`` pairs for known fact names in the messages the agent received."""
    if "Messages you received:" not in observation:
        return {}
    inbox = observation.split("Messages you received:", 1)[1].split("Messages you sent:", 1)[0]
    return {n: v.rstrip(".,;") for n, v in _PAIR.findall(inbox) if n in names}


@register_bot("question", "rule")
def question_rule_bot(
    agent: str, observation: str, info: dict[str, Any], rng: random.Random
) -> str:
    """Relay every known fact; answer from what is known."""
    names = info["fact_names"]
    known = {n: str(v) for n, v in info["known"].items()}
    known = {**_heard(observation, names), **known}
    lines = []
    if info.get("neighbours") and known:
        lines.append("SAY: " + " ".join(f"{n}={v}" for n, v in known.items()))
    if info.get("needs_action"):
        q = info["question"]
        values: dict[str, Any] = {n: str(v) for n, v in info["defaults"].items()}
        values.update(known)
        if q["op"] in ("sum", "max"):
            values = {n: int(v) if _is_int_text(v) else 0 for n, v in values.items()}
        try:
            result = answer(q["op"], values, q["facts"], q["key"], q["separator"])
        except KeyError:  # a lookup key heard as a value that names no fact
            result = values[q["facts"][0]]
        lines.append(f"ACTION: {result}")
    return "\n".join(lines) or "ACTION: wait"


def _is_int_text(text: str) -> bool:
    return bool(re.fullmatch(r"-?[0-9]{1,18}", text))


@register_bot("vote", "rule")
def vote_rule_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Sincere first; after a failed ballot, rally behind its leader."""
    choices, worth, last = info["valid_actions"], info["worth"], info.get("last_tally")
    if last:
        leader = max(last, key=lambda o: (last[o], -info["options"].index(o)))
        pick = leader if leader in choices else max(choices, key=lambda o: worth.get(o, 0.0))
    else:
        pick = max(choices, key=lambda o: (worth.get(o, 0.0), -choices.index(o)))
    verb = "vote for" if info["phase"] == "vote" else "propose"
    lines = [f"SAY: I {verb} {pick}."] if info.get("neighbours") else []
    lines.append(f"ACTION: {pick}")
    return "\n".join(lines)
