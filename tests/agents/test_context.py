"""A prompt that does not fit its model's context is refused at the generate call, in one line
naming the agent and the numbers, before the backend runs (issue 42 item 3): where the model is
known (:func:`marl.agents.context.backend_context`), every row of every call is checked, the
prompt and the new tokens it may still get together, and a prompt is never cut."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from marl.agents.backends.base import MAX_NEW_TOKENS, Generation, SamplingConfig
from marl.agents.backends.hf import HFBackend
from marl.agents.context import ContextLengthError, backend_context, check_fits, spec_context
from marl.agents.generation import PromptRequest, generate_by_policy
from marl.agents.models import ModelSpec, build_char_tokenizer
from marl.agents.prompts import turn_prompt

CONTEXT = 256  # the tiny model's positions here (characters: its tokenizer has one per character)


class CountingBackend:
    """A backend with a known context that counts its calls and replies with nothing."""

    model = None
    options: frozenset[str] = frozenset()

    def __init__(self, context: int | None) -> None:
        self.tokenizer = build_char_tokenizer()
        self.max_model_len = context
        self.calls = 0

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        adapters: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[list[Generation]]:
        self.calls += 1
        return [[Generation(list(p), [], [], "", "stop")] for p in prompts]


def request_of(length: int, agent: str = "alice") -> PromptRequest:
    """A request whose prompt is exactly ``length`` tokens with the tiny tokenizer."""
    tokenizer = build_char_tokenizer()
    bare = len(turn_prompt(tokenizer, "", "", None, response_prefix=False).ids)
    return PromptRequest(agent, "", "x" * (length - bare))


def test_the_message_is_one_line_naming_the_agent_and_the_numbers() -> None:
    check_fits("alice", 200, 56, 256)  # exactly fits
    check_fits("alice", 10**6, 10, None)  # context unknown: nothing to check
    with pytest.raises(ContextLengthError) as info:
        check_fits("alice", 5_000, 48, 4_096, " (policy shared)")
    assert str(info.value) == (
        "agent 'alice' (policy shared): a prompt of 5,000 tokens + 48 new tokens = 5,048, over "
        "the model's context of 4,096 tokens; shorten the scenario's text (system_prompt, roles, "
        "messages.max_chars, episode.rounds) or lower sampling.max_new_tokens"
    )


def test_the_context_is_read_from_the_model_or_the_engine() -> None:
    spec = ModelSpec(max_position_embeddings=CONTEXT)
    backend = HFBackend(spec)
    assert spec_context(spec) == backend_context(backend) == CONTEXT
    view = SimpleNamespace(base=backend, adapter="a")  # a LoRA policy's view of a shared base
    assert backend_context(view) == CONTEXT
    assert backend_context(CountingBackend(1000)) == 1000  # vLLM's max_model_len
    assert backend_context(CountingBackend(None)) is None


def test_a_prompt_that_fits_is_generated_and_one_that_does_not_is_refused_first() -> None:
    sampling = SamplingConfig(max_new_tokens=16)
    backend = HFBackend(ModelSpec(max_position_embeddings=CONTEXT))
    fits = request_of(CONTEXT - 16)
    replies, calls = generate_by_policy({"p": backend}, lambda a: "p", [fits], sampling, 0)
    assert calls == 1 and len(replies[0][0].prompt_ids) == CONTEXT - 16  # not cut

    counting = CountingBackend(CONTEXT)
    too_long = [fits, request_of(CONTEXT - 15, agent="bob")]
    with pytest.raises(ContextLengthError, match="^agent 'bob' \\(policy p\\): a prompt of 241 "):
        generate_by_policy({"p": counting}, lambda a: "p", too_long, sampling, 0)
    assert counting.calls == 0  # refused before the backend ran


def test_a_reply_budget_over_the_absolute_limit_is_refused_when_the_config_loads() -> None:
    SamplingConfig(max_new_tokens=MAX_NEW_TOKENS)
    with pytest.raises(ValueError, match="^sampling.max_new_tokens: 100,000,000, over the limit"):
        SamplingConfig(max_new_tokens=100_000_000)
