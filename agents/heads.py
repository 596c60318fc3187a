"""Response heads: start an agent's reply with the markup its turn needs (``SAY:``/``ACTION:``).

A small model that never writes the markup on its own (SmolLM2-135M wrote `ACTION:` in 3% of
its replies, docs/communication.md) still answers in it when the assistant turn already starts
with the head: the head is appended to the prompt, so it is context, never a trained token, and
the reply the environment sees is ``head + generated text``.

The head is read off the environment's info dict for the agent (``needs_action`` and
``neighbours``, which every scenario's ``infos`` carry), so this module knows no scenario.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SAY_HEAD = "SAY:"
ACTION_HEAD = "ACTION:"


def response_head(info: Mapping[str, Any] | None) -> str:
    """``SAY:`` when the agent can only talk this round, ``ACTION:`` when it can only act, and
    ``""`` when it may do both (the reply's shape is then the agent's choice) or neither."""
    if not info:
        return ""
    acts = bool(info.get("needs_action"))
    talks = bool(info.get("neighbours"))
    if talks and not acts:
        return SAY_HEAD
    if acts and not talks:
        return ACTION_HEAD
    return ""


def turn_head(info: Mapping[str, Any] | None, response_prefix: bool) -> str:
    """The head a turn's reply starts with: :func:`response_head` when heads are on
    (``sampling.response_prefix``), else ``""``. The prompt builder
    (:func:`marl.agents.prompts.turn_prompt`) and the warm-up's transcripts both read it here."""
    return response_head(info) if response_prefix else ""


def head_ids(tokenizer: Any, head: str) -> list[int]:
    """The head's token ids, to append after the generation prompt (no special tokens)."""
    return list(tokenizer.encode(head, add_special_tokens=False)) if head else []


def response_note(info: Mapping[str, Any] | None) -> str:
    """The scenario's note for the agent's turn (``info["response_note"]``, "" when none): words
    the prompt puts before the head as the start of the reply, such as Kuhn Poker's ``My card
    is J.`` (``params.restate_card``). Context only: it is never trained, and the environment
    gets ``head + generated text`` without it."""
    return str((info or {}).get("response_note") or "")


def prompt_head(head: str, note: str) -> str:
    """What the prompt ends with: ``note head`` when there is a head and a note, else the head
    (no head, no note: a reply without a head is the model's own from its first word)."""
    return f"{note} {head}" if head and note else head
