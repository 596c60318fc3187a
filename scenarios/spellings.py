"""The spellings of an action that a scenario's parser accepts: what exact action distributions
score, so that a measure holds when a model answers in its own words.

A scenario's :meth:`~marl.scenarios.rules.Rules.legal_actions` gives one canonical text per
action (``"2"``, ``"bet"``, ``"red circle"``). A model may write ``Bet``, ``bet.``, ``I bet`` or
``Red Circle``, and the parser reads each of them as the same action. Scoring only the canonical
text would put that mass in ``off_set`` (the "neither legal reply as written" mass), and the
normalised distribution would describe replies the model rarely writes.

:func:`accepted_texts` expands each canonical text with its common variants (case, a trailing
full stop, ``I bet``, ``the red circle``) and keeps a variant only where the scenario's own parser
(:meth:`~marl.scenarios.rules.Rules.parse_action`) reads it as the same action, so a
variant can never move mass to another action. The set stays finite and small (at most
:data:`MAX_SPELLINGS` texts per action), so ``off_set`` is then the mass on replies outside it:
an upper bound on what the parser rejects, and a much tighter one than the canonical texts
alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from marl.scenarios.rules import Rules

MAX_SPELLINGS = 12  # texts scored per action: each is one more row of the exact scoring pass


def variants(text: str) -> list[str]:
    """``text`` in the spellings a model commonly writes, canonical first, no repeats, each
    bare and with a full stop: Capitalised; a one-word move also UPPER and after ``I``
    (``I bet``); a name of several words also Title Case and after ``the``/``The``
    (``the red circle``); a number as it is."""
    words = text.split()
    forms = [text, text[:1].upper() + text[1:]]
    if len(words) == 1 and text.isalpha():
        forms += [text.upper(), f"I {text}"]
    elif len(words) > 1:
        forms += [text.title(), f"the {text}", f"The {text}"]
    out: list[str] = []
    for form in forms:
        for candidate in (form, f"{form}."):
            if candidate not in out:
                out.append(candidate)
    return out


def accepted_texts(rules: Rules, agent: str) -> dict[str, str] | None:
    """``{reply text: action}``: every canonical text of ``agent``'s legal actions and those of
    its :func:`variants` that the parser reads as the same action (at most
    :data:`MAX_SPELLINGS` per action); ``None`` where ``legal_actions`` is ``None``."""
    legal = rules.legal_actions(agent)
    if legal is None:
        return None
    out: dict[str, str] = dict(legal)
    per_action: dict[str, int] = {}
    for action in legal.values():
        per_action[action] = per_action.get(action, 0) + 1
    for text, action in legal.items():
        for variant in variants(text)[1:]:
            if variant in out or per_action[action] >= MAX_SPELLINGS:
                continue
            if rules.parse_action(agent, variant) == action:
                out[variant] = action
                per_action[action] += 1
    return out
