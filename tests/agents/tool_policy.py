"""A policy that writes tool calls, for tests: its text is scripted, its logprobs are real.

A randomly initialised tiny model never writes ``CALL calculator: ...``, so the tool loop is
driven here by :class:`ScriptedTextBackend`: ``script(prompt_text)`` says what to write next
given the prompt so far (the reply so far included, tool results too), the text is tokenized
with the real tokenizer, and its logprobs are those of the real tiny model on exactly those
tokens, computed as the HF backend's would be (one forward pass over ``prompt + response``).
The backend implements the :class:`~marl.agents.backends.PolicyBackend` generate interface, so
the generation loop, the rollout, the learner and the counterfactual engine run unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from marl.agents.backends import Generation, SamplingConfig
from marl.agents.logprobs import sequence_logprobs
from marl.agents.models import ModelSpec, load_model


class ScriptedTextBackend:
    """Writes ``script(prompt_text)`` (cut at ``max_new_tokens``), ended by EOS, scored by the
    tiny model. ``calls`` counts generate calls."""

    def __init__(self, script: Callable[[str], str], seed: int = 0) -> None:
        self.model, self.tokenizer = load_model(ModelSpec(kind="tiny", seed=seed))
        self.model.eval()
        self.script = script
        self.calls = 0
        self.prompts: list[list[int]] = []

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        adapters: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[list[Generation]]:
        self.calls += 1
        out = []
        tok = self.tokenizer
        for prompt in prompts:
            self.prompts.append(list(prompt))
            text = self.script(tok.decode(prompt, skip_special_tokens=False))
            ids = list(tok.encode(text, add_special_tokens=False)) + [tok.eos_token_id]
            ids = ids[: sampling.max_new_tokens]
            with torch.no_grad():
                logp, _ = sequence_logprobs(
                    self.model,
                    [list(prompt)],
                    [ids],
                    temperature=sampling.temperature,
                    pad_token_id=tok.pad_token_id or 0,
                )
            finish = "stop" if ids[-1] == tok.eos_token_id else "length"
            out.append(
                [
                    Generation(
                        prompt_ids=list(prompt),
                        response_ids=ids,
                        logprobs=logp[0, : len(ids)].tolist(),
                        text=tok.decode(ids, skip_special_tokens=True),
                        finish_reason=finish,
                    )
                ]
            )
        return out

    def load_weights(self, state_dict: Any) -> None:  # noqa: D102 - not used by these tests
        raise NotImplementedError

    def add_adapter(self, name: str, state_dict: Any = None) -> None:  # noqa: D102
        raise NotImplementedError

    def remove_adapter(self, name: str) -> None:  # noqa: D102
        raise NotImplementedError


def ledger_script(prompt: str) -> str:
    """Plays ledger-v0 the way its rule bot does, one tool call at a time, reading the results
    from the prompt (the reply so far included): what an LLM that uses the tools would write."""
    reply = prompt.split("<|im_start|>assistant")[-1]
    item = re.search(r"The item in question: (\w+)\.", prompt).group(1)
    results = re.findall(r"RESULT (\w+): ([^\n]*)", reply)
    if "You keep the price list" in prompt:
        if not results:
            return f"Let me look.\nCALL lookup: {item}\nSAY: this line is never seen"
        return f"SAY: the unit price of {item} is {results[-1][1]}"
    if "Reply with" not in prompt or "ACTION" not in prompt.split("Your turn")[-1]:
        return "SAY: ready"
    prices = re.findall(r"\bis (\d+)", prompt.split("Messages you received:")[-1])
    price = prices[-1] if prices else "0"
    if not results:
        return f"CALL lookup: {item}\n"
    if len(results) == 1:
        return f"CALL calculator: {price}*{results[0][1]}\n"
    return f"ACTION: {results[-1][1]}"
