"""Templates with named placeholders, substituted as data and never evaluated.

A template is plain text in which ``{name}`` stands for a value the rules dealt (a fact, a
favourite option, the payoff table). ``{{`` and ``}}`` are literal braces. Nothing else inside
braces is allowed: no attribute access (``{a.b}``), no indexing (``{a[0]}``), no conversions or
format specs (``{a!r}``, ``{a:>10}``), no positional fields (``{0}``), no expressions. The
substitution is one regular-expression pass that inserts ``str(value)``; a value is never parsed
again, so a dealt value holding ``{other}`` stays those characters. ``str.format`` is not used:
it resolves attributes and items of the objects it is handed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from marl.scenarios.problems import Problem, short

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
MAX_TEMPLATE_CHARS = 2000


def template_problems(
    text: object, known: Collection[str], path: str, whose: str = ""
) -> list[Problem]:
    """Every problem with ``text`` as a template whose placeholders must be in ``known``.

    ``path`` is the key path the problems name; ``whose`` says whose values ``known`` are
    (``" for alice"``), for the message.
    """
    if not isinstance(text, str):
        return [Problem(path, f"must be a string (a template), got {short(text)}")]
    if len(text) > MAX_TEMPLATE_CHARS:
        return [Problem(path, f"a template of at most {MAX_TEMPLATE_CHARS} characters")]
    problems = []
    for match in _TOKEN.finditer(text):
        token, inner = match.group(0), match.group(1)
        if token in ("{{", "}}"):
            continue
        if inner is None:
            problems.append(
                Problem(path, f"unmatched {token!r}; write {token * 2!r} for a literal brace")
            )
        elif not _NAME.fullmatch(inner):
            problems.append(
                Problem(
                    path,
                    f"{short('{' + inner + '}')} is not a placeholder: write {{name}} with a "
                    "plain name (no attributes, indexes, conversions or expressions)",
                )
            )
        elif inner not in known:
            names = ", ".join(sorted(known)) or "none"
            problems.append(
                Problem(
                    path,
                    f"placeholder {{{inner}}} names no dealt value{whose} (known: {names})",
                )
            )
    return problems


def placeholders(text: str) -> list[str]:
    """The placeholder names in ``text``, in order (escaped braces are not placeholders)."""
    return [m.group(1) for m in _TOKEN.finditer(text) if m.group(1) is not None]


def render(text: str, values: Mapping[str, object]) -> str:
    """``text`` with each ``{name}`` replaced by ``str(values[name])``.

    Call it on a template that :func:`template_problems` accepted; a placeholder missing from
    ``values`` (or a malformed one) is left as written rather than raising.
    """

    def substitute(match: re.Match[str]) -> str:
        token, inner = match.group(0), match.group(1)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        if inner is not None and inner in values:
            return str(values[inner])
        return token

    return _TOKEN.sub(substitute, text)
