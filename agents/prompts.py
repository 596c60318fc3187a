"""Observation text -> chat prompt token ids, through the model's own chat template.

Trust: the chat template is trusted, the text put into it is not. System prompts and
observations carry scenario text, agent names and other agents' messages, so a message such as
``<|im_end|><|im_start|>system ...`` must reach the receiver as the characters it is, never as
the control tokens that would forge a turn. :func:`prompt_ids` therefore renders the template
around placeholders, tokenizes the template's own text with special tokens recognised, and
tokenizes every piece of content with no special or added token recognised, whatever the
tokenizer.

A turn's whole prompt (the chat, then the scenario's note and the response head its reply starts
with) is built by :func:`turn_prompt` and nothing else: the rollout samples from it, and the
warm-up, the exact exploitability table and the listening scorer score the same ids.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from marl.agents.heads import prompt_head, response_note, turn_head


def chat_messages(system_prompt: str, observation: str) -> list[dict[str, str]]:
    """The chat an agent is shown: the scenario's system prompt, then its observation."""
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": observation})
    return messages


def prompt_ids(tokenizer: Any, system_prompt: str, observation: str) -> list[int]:
    """Token ids of the rendered chat, ending with the assistant generation prompt.

    Special tokens come only from the chat template: no substring of ``system_prompt`` or
    ``observation`` becomes a special or added token (see :func:`untrusted_ids`). Nothing is
    cut: a prompt too long for the model is refused where the model is known
    (:mod:`marl.agents.context`), never shortened from the left, which would drop the system
    prompt and the template's start.
    """
    messages = chat_messages(system_prompt, observation)
    nonce = secrets.token_hex(8)  # content cannot guess it, so it cannot fake a placeholder
    slots = {f"\x00marl-{nonce}-{i}\x00": m["content"] for i, m in enumerate(messages)}
    templated = [{**m, "content": slot} for m, slot in zip(messages, slots, strict=True)]
    rendered = tokenizer.apply_chat_template(templated, add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    for piece, is_slot in _split_at(rendered, slots):
        if is_slot:
            ids += untrusted_ids(tokenizer, slots[piece])
        elif piece:
            ids += _encode(tokenizer, piece, split_special_tokens=False)
    return ids


@dataclass(frozen=True)
class TurnPrompt:
    """One agent's turn as the policy is shown it.

    ids:  the prompt's token ids: the chat (:func:`prompt_ids`), then the scenario's note and the
          response head (:func:`marl.agents.heads.prompt_head`; none without a head).
    head: the response head the reply starts with, ``""`` when none: the environment gets
          ``head + generated text``, and a reply scored after ``ids`` is its text after ``head``.
    """

    ids: list[int]
    head: str


def turn_prompt(
    tokenizer: Any,
    system_prompt: str,
    observation: str,
    info: Mapping[str, Any] | None,
    *,
    response_prefix: bool,
) -> TurnPrompt:
    """The one builder of a turn's prompt, for what is trained and what is measured alike.

    ``info``: the environment's info dict for the agent (its head and note: ``needs_action``,
    ``neighbours``, ``response_note``); ``response_prefix``: ``sampling.response_prefix``. The
    note and head are tokenized as untrusted text, like the observation: a note is scenario text
    and never becomes a control token.
    """
    head = turn_head(info, response_prefix)
    ids = prompt_ids(tokenizer, system_prompt, observation)
    return TurnPrompt(ids + untrusted_ids(tokenizer, prompt_head(head, response_note(info))), head)


def _split_at(text: str, separators: Iterable[str]) -> list[tuple[str, bool]]:
    """``text`` cut at every occurrence of the ``separators`` (literal strings, none a prefix of
    another), as ``(piece, is_separator)`` pairs in order. Plain ``str.split``: a regular
    expression built from the per-call nonce would be compiled anew on every call and would
    evict the other compiled patterns from ``re``'s cache."""
    pieces = [(text, False)]
    for sep in separators:
        cut: list[tuple[str, bool]] = []
        for piece, is_sep in pieces:
            if is_sep or sep not in piece:
                cut.append((piece, is_sep))
                continue
            for j, part in enumerate(piece.split(sep)):
                if j:
                    cut.append((sep, True))
                cut.append((part, False))
        pieces = cut
    return pieces


def untrusted_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` in which no special or added token is recognised.

    Special tokens are split into ordinary tokens (``split_special_tokens``). Added tokens that
    are not special (which that flag leaves whole) and any other token the tokenizer would still
    produce are spelled character by character; an id that remains a control token even then is
    dropped. The unknown token is allowed: it is what a tokenizer gives an unknown character.
    """
    protected_ids, pattern = _protected(tokenizer)
    ids: list[int] = []
    for piece in pattern.split(text) if pattern else [text]:
        if not piece:
            continue
        part = _encode(tokenizer, piece, split_special_tokens=True)
        if protected_ids.intersection(part):
            part = [i for ch in piece for i in _encode(tokenizer, ch, split_special_tokens=True)]
            part = [i for i in part if i not in protected_ids]
        ids += part
    return ids


def _protected(tokenizer: Any) -> tuple[set[int], re.Pattern[str] | None]:
    """The control token ids of ``tokenizer`` and a pattern matching their strings."""
    tokens = {int(i): str(t) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    for token, i in zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=True):
        tokens[int(i)] = str(token)
    strings = sorted({t for t in tokens.values() if t}, key=len, reverse=True)
    pattern = re.compile(f"({'|'.join(map(re.escape, strings))})") if strings else None
    protected_ids = set(tokens) - {tokenizer.unk_token_id}
    return protected_ids, pattern


def _encode(tokenizer: Any, text: str, *, split_special_tokens: bool) -> list[int]:
    """Token ids of ``text`` with no BOS/EOS added (the template places those)."""
    out = tokenizer(text, add_special_tokens=False, split_special_tokens=split_special_tokens)
    return list(out["input_ids"])
