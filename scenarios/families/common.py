"""What the declarative rule families share: checks of YAML values that name their key, the
per-agent ``private`` templates, and total parsing of the actions a model writes.

Every check here takes any value a YAML file (or a Python override) can hold and returns
problems instead of raising, so ``marl validate`` reports a mistake by its key and never shows a
traceback. Every parser takes any string and returns ``None`` when it finds nothing valid.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Collection, Mapping, Sequence

from marl.protocols.values import is_finite_number, is_int
from marl.scenarios.families.templates import placeholders, render, template_problems
from marl.scenarios.problems import Problem, short

MAX_NAME_CHARS = 40  # an action, option or fact name
MAX_VALUE_CHARS = 80  # a string value in a pool
MAX_CHOICES = 32  # actions of one player, options of a vote
MAX_POOL = 1000  # values in one pool
MAX_INT = 10**12  # integer pool values; sums of them stay exact floats
MAX_SEARCHED_CHOICES = 200  # choices looked for inside a longer reply
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]*")


def int_problem(params: Mapping, key: str, low: int, high: int) -> list[Problem]:
    """``params[key]``, when given, must be an integer from ``low`` to ``high``."""
    if key in params and not (is_int(params[key]) and low <= params[key] <= high):
        return [Problem(key, f"must be an integer from {low} to {high}, got {short(params[key])}")]
    return []


def number_problem(params: Mapping, key: str) -> list[Problem]:
    """``params[key]``, when given, must be a finite number."""
    if key in params and not is_finite_number(params[key]):
        return [Problem(key, f"must be a finite number, got {short(params[key])}")]
    return []


def name_list_problems(value: object, path: str, what: str) -> list[Problem]:
    """``value`` must be a non-empty list of distinct names (letters first; letters, digits,
    ``_`` and ``-``; at most MAX_NAME_CHARS characters), distinct when case is ignored."""
    if not isinstance(value, list) or not value:
        return [Problem(path, f"must be a non-empty list of {what} names, got {short(value)}")]
    if len(value) > MAX_CHOICES:
        return [Problem(path, f"at most {MAX_CHOICES} {what}s, got {len(value)}")]
    problems = []
    seen: set[str] = set()
    for i, name in enumerate(value):
        if not is_name(name):
            problems.append(
                Problem(
                    f"{path}[{i}]",
                    f"{what} name {short(name)} must start with a letter and hold only letters, "
                    f"digits, '_' and '-' (at most {MAX_NAME_CHARS} characters)",
                )
            )
        elif normalise(name) in seen:  # the form a reply is matched in
            problems.append(
                Problem(
                    f"{path}[{i}]",
                    f"duplicate {what} {short(name)} (names must differ by more than case or "
                    "a trailing '_')",
                )
            )
        else:
            seen.add(normalise(name))
    return problems


def is_name(value: object) -> bool:
    """Whether ``value`` is a valid action, option or fact name."""
    return isinstance(value, str) and len(value) <= MAX_NAME_CHARS and bool(_NAME.fullmatch(value))


def pool_problems(value: object, path: str) -> list[Problem]:
    """A pool: a non-empty list of whole numbers or short one-line strings."""
    if not isinstance(value, list) or not value:
        return [Problem(path, f"must be a non-empty list of values, got {short(value)}")]
    if len(value) > MAX_POOL:
        return [Problem(path, f"at most {MAX_POOL} values, got {len(value)}")]
    problems = []
    for i, item in enumerate(value):
        if is_int(item):
            if abs(item) > MAX_INT:
                problems.append(Problem(f"{path}[{i}]", f"a whole number within ±{MAX_INT}"))
        elif isinstance(item, str):
            if not item.strip() or len(item) > MAX_VALUE_CHARS or not item.isprintable():
                problems.append(
                    Problem(
                        f"{path}[{i}]",
                        f"a string value must be non-blank, printable, one line and at most "
                        f"{MAX_VALUE_CHARS} characters, got {short(item)}",
                    )
                )
        else:
            problems.append(
                Problem(f"{path}[{i}]", f"must be a whole number or a string, got {short(item)}")
            )
    return problems


def private_problems(
    value: object, agents: Sequence[str], known: Callable[[str], Collection[str]]
) -> list[Problem]:
    """The ``private`` template: one string for every agent, or a mapping agent -> template.

    ``known(agent)`` is the set of placeholder names dealt to ``agent``.
    """
    if value is None:
        return []
    if isinstance(value, str):
        every = set().union(*(known(a) for a in agents))
        problems = template_problems(value, every, "private")
        if problems:
            return problems
        for name in dict.fromkeys(placeholders(value)):
            lacking = [a for a in agents if name not in known(a)]
            if lacking:
                holders = ", ".join(a for a in agents if a not in lacking)
                problems.append(
                    Problem(
                        "private",
                        f"placeholder {{{name}}} names no value dealt to {', '.join(lacking)} "
                        f"(held only by {holders}); give those agents a template of their own",
                    )
                )
        return problems
    if not isinstance(value, Mapping):
        return [Problem("private", "must be a template string or a mapping agent -> template")]
    problems = []
    for agent, text in value.items():
        path = f"private.{short(agent) if not isinstance(agent, str) else agent[:80]}"
        if agent not in agents:
            problems.append(Problem(path, f"unknown agent {short(agent)}"))
        else:
            problems += template_problems(text, known(agent), path, f" for {agent}")
    return problems


def render_private(value: object, agent: str, values: Mapping[str, object]) -> str | None:
    """The ``private`` template of ``agent`` filled with ``values``, or None when none is set."""
    if isinstance(value, str):
        return render(value, values)
    if isinstance(value, Mapping) and isinstance(value.get(agent), str):
        return render(value[agent], values)
    return None


# --- parsing actions ------------------------------------------------------------------------


def normalise(text: str) -> str:
    """Case-folded NFKC text with runs of whitespace made one space, stripped of quotes,
    backticks, brackets and end punctuation around it."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = " ".join(text.split())
    return text.strip(" \"'`*_.,;:!?()[]<>")


def match_choice(text: str | None, choices: Sequence[str]) -> str | None:
    """The one choice ``text`` names, or None.

    The whole text equal to a choice (ignoring case, spacing and surrounding punctuation)
    wins; otherwise the text must mention exactly one choice as a whole word ("I will defect").
    """
    if not text:
        return None
    text = text[:2000]  # a choice name is short; a 20,000-character reply is not searched whole
    wanted = normalise(text)
    by_key = {normalise(c): c for c in choices}
    if wanted in by_key:
        return by_key[wanted]
    if len(by_key) > MAX_SEARCHED_CHOICES:  # a lookup over huge pools: exact answers only
        return None
    found = {
        choice
        for key, choice in by_key.items()
        if key and re.search(rf"(?<![\w\-]){re.escape(key)}(?![\w\-])", wanted)
    }
    return found.pop() if len(found) == 1 else None


_INTEGER = re.compile(r"(?<![0-9])-?[0-9]{1,18}(?![0-9])")
_UNSIGNED = re.compile(r"(?<![0-9])[0-9]{1,18}(?![0-9])")
MAX_PARSED_CHARS = 2000  # a reply is searched for a number this far


def parse_int(text: str | None, signed: bool = True) -> int | None:
    """The first whole number in a reply ``text``, or None: the one parser every scenario uses
    to read a number out of an action.

    A number is a run of ASCII digits, at most 18 of them, so ``int()`` stays cheap: a longer
    run (a hostile 5,000-digit reply) is not a number, and the search goes on past it. Only
    the first :data:`MAX_PARSED_CHARS` characters are searched. A ``-`` right before the
    digits makes the number negative; with ``signed=False`` it is ignored (``option-2`` is 2),
    for answers that can only be positive.
    """
    if not text:
        return None
    match = (_INTEGER if signed else _UNSIGNED).search(text[:MAX_PARSED_CHARS])
    return int(match.group()) if match else None
