"""Observation text -> chat prompt token ids, through the model's own chat template."""

from __future__ import annotations

from typing import Any


def chat_messages(system_prompt: str, observation: str) -> list[dict[str, str]]:
    """The chat an agent is shown: the scenario's system prompt, then its observation."""
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": observation})
    return messages


def prompt_ids(
    tokenizer: Any, system_prompt: str, observation: str, max_prompt_tokens: int | None = None
) -> list[int]:
    """Token ids of the rendered chat, ending with the assistant generation prompt.

    When ``max_prompt_tokens`` is set, the oldest tokens of the rendering are dropped from the
    left (the observation's newest lines are at its end).
    """
    ids = tokenizer.apply_chat_template(
        chat_messages(system_prompt, observation), add_generation_prompt=True, tokenize=True
    )
    if hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    ids = list(ids)
    if max_prompt_tokens is not None and len(ids) > max_prompt_tokens:
        ids = ids[-max_prompt_tokens:]
    return ids
