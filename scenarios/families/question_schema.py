"""Validation of the ``question`` family's params: every mistake named by its key.

The facts (names, pools, holders), the question against them (an operation the pools allow,
facts that exist and that somebody holds, a lookup key whose pool names the looked-up facts),
the reporter, the scoring, the round count and the ``private`` templates (a placeholder must
name a fact the agent holds). Total over any value a YAML file can hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from marl.protocols.values import is_int
from marl.scenarios.families.common import (
    int_problem,
    is_name,
    pool_problems,
    private_problems,
)
from marl.scenarios.families.templates import template_problems
from marl.scenarios.problems import Problem, short

OPS = ("sum", "max", "concat", "lookup")
SCORINGS = ("exact", "partial")
FACT_KEYS = {"name", "pool", "holders"}
QUESTION_KEYS = {"op", "facts", "key", "separator", "text"}
MAX_FACTS = 64
MAX_SEPARATOR = 5


def _facts_problems(facts: object, agents: Sequence[str]) -> list[Problem]:
    if facts is None:
        return [Problem("facts", "required: a list of {name, pool, holders}")]
    if not isinstance(facts, list) or not facts:
        return [Problem("facts", f"must be a non-empty list of facts, got {short(facts)}")]
    if len(facts) > MAX_FACTS:
        return [Problem("facts", f"at most {MAX_FACTS} facts, got {len(facts)}")]
    problems: list[Problem] = []
    names: set[str] = set()
    for i, fact in enumerate(facts):
        path = f"facts[{i}]"
        if not isinstance(fact, Mapping):
            problems.append(Problem(path, "must be a mapping with name, pool and holders"))
            continue
        problems += [
            Problem(
                f"{path}.{short(k) if not isinstance(k, str) else k[:80]}",
                f"unknown key (allowed: {', '.join(sorted(FACT_KEYS))})",
            )
            for k in fact
            if k not in FACT_KEYS
        ]
        name = fact.get("name")
        if not is_name(name):
            problems.append(
                Problem(
                    f"{path}.name",
                    f"required, a name that starts with a letter and holds only letters, digits, "
                    f"'_' and '-', got {short(name)}",
                )
            )
        elif name in names or name in ("agent", "reporter"):
            problems.append(Problem(f"{path}.name", f"duplicate or reserved name {name!r}"))
        else:
            names.add(name)
        problems += pool_problems(fact.get("pool"), f"{path}.pool")
        holders = fact.get("holders", [])
        if not isinstance(holders, list):
            problems.append(Problem(f"{path}.holders", "must be a list of agents (may be empty)"))
            continue
        for j, holder in enumerate(holders):
            if not isinstance(holder, str) or holder not in agents:
                problems.append(Problem(f"{path}.holders[{j}]", f"unknown agent {short(holder)}"))
            elif holders.index(holder) != j:
                problems.append(Problem(f"{path}.holders[{j}]", f"duplicate agent {holder!r}"))
    return problems


def _question_problems(question: object, facts: dict[str, dict]) -> list[Problem]:
    """The question against the (already valid) facts, by name."""
    if not isinstance(question, Mapping):
        return [Problem("question", "required: a mapping with op and facts")]
    problems = [
        Problem(
            f"question.{short(k) if not isinstance(k, str) else k[:80]}",
            f"unknown key (allowed: {', '.join(sorted(QUESTION_KEYS))})",
        )
        for k in question
        if k not in QUESTION_KEYS
    ]
    op = question.get("op")
    if op not in OPS:
        problems.append(Problem("question.op", f"must be one of {', '.join(OPS)}, got {short(op)}"))
        return problems
    asked = question.get("facts")
    if not isinstance(asked, list) or not asked:
        problems.append(Problem("question.facts", "required, a non-empty list of fact names"))
        return problems

    def held(name: object, path: str) -> bool:
        if not isinstance(name, str) or name not in facts:
            problems.append(
                Problem(path, f"unknown fact {short(name)} (declared: {', '.join(facts)})")
            )
            return False
        if not facts[name].get("holders"):
            problems.append(
                Problem(path, f"fact {name!r} is held by nobody, so no one can know the answer")
            )
            return False
        return True

    for i, name in enumerate(asked):
        path = f"question.facts[{i}]"
        if not held(name, path):
            continue
        if asked.index(name) != i:
            problems.append(Problem(path, f"fact {name!r} is listed twice"))
        elif op in ("sum", "max"):
            words = [v for v in facts[name]["pool"] if not is_int(v)]
            if words:
                problems.append(
                    Problem(
                        path,
                        f"op {op!r} needs whole numbers; fact {name!r} has pool value "
                        f"{short(words[0])}",
                    )
                )
    if op == "lookup":
        key = question.get("key")
        if key is None:
            problems.append(Problem("question.key", "op 'lookup' needs the key fact"))
        elif held(key, "question.key"):
            if key in asked:
                problems.append(Problem("question.key", f"the key {key!r} looks itself up"))
            for value in facts[key]["pool"]:
                if value not in asked:
                    problems.append(
                        Problem(
                            "question.key",
                            f"pool value {short(value)} of fact {key!r} names no fact in "
                            f"question.facts ({', '.join(map(str, asked))})",
                        )
                    )
                    break
    elif "key" in question:
        problems.append(Problem("question.key", "only op 'lookup' takes a key"))
    if "separator" in question:
        sep = question["separator"]
        if op != "concat":
            problems.append(Problem("question.separator", "only op 'concat' takes a separator"))
        elif not (isinstance(sep, str) and len(sep) <= MAX_SEPARATOR and sep.isprintable()):
            problems.append(
                Problem(
                    "question.separator",
                    f"a string of at most {MAX_SEPARATOR} printable characters",
                )
            )
    if "text" in question:
        problems += template_problems(question["text"], ("reporter",), "question.text")
    return problems


def check_question(params: Mapping[str, Any], agents: Sequence[str]) -> list[Problem]:
    """Facts, question, reporter, scoring, round count and templates, each by its key (paths
    relative to ``params``)."""
    problems = _facts_problems(params.get("facts"), agents)
    problems += int_problem(params, "talk_rounds", 0, 50)
    reporter = params.get("reporter")
    if reporter is not None and reporter not in agents:
        problems.append(Problem("reporter", f"unknown agent {short(reporter)}"))
    if params.get("scoring", "exact") not in SCORINGS:
        problems.append(
            Problem("scoring", f"must be exact or partial, got {short(params['scoring'])}")
        )
    if problems:
        return problems
    facts = {f["name"]: f for f in params["facts"]}
    problems += _question_problems(params.get("question"), facts)

    def known(agent: str) -> set[str]:
        return {"agent", "reporter"} | {
            name for name, f in facts.items() if agent in f.get("holders", [])
        }

    problems += private_problems(params.get("private"), agents, known)
    return problems
