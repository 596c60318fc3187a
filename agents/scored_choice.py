"""Scored choice: answer a finite-choice turn with one of its legal texts, drawn by their scores.

A policy with ``policies.<id>.choice: scored`` does not write the reply of a turn that is one
action of a finite legal set and nothing else (a signal listener's pick; the environment lists
such a turn's legal texts as its info's ``choices``: :mod:`marl.scenarios.base`). It scores each
legal reply ``ACTION: <text>`` teacher-forced after the turn's prompt, in one packed pass
(:func:`marl.agents.action_scores.action_scores`: the text's canonical tokens and the
end-of-turn token, at the policy's temperature), and samples one reply from the scores
normalised over the set. This is the action head of GLAM (Carta et al., 2023, "Grounding Large
Language Models in Interactive Environments with Online Reinforcement Learning"): the policy
is ``pi(a | s) = p(a | s) / sum_b p(b | s)`` over the legal set, so it never writes a malformed
answer and its exploration is exactly its spread over the candidates.

The reply is recorded as a sampled one would be: the chosen text's tokens and each token's
log-probability under the sampling distribution. The learner needs nothing else. Its loss on
the chosen text's log-probability ``log p(a | s)`` differs from ``log pi(a | s)`` by the log of
the normaliser, which does not depend on the action, so with advantages that are zero-mean
over a group's choices (GRPO's group baseline) the two gradients agree in expectation.

Greedy (temperature 0) takes the highest-scoring text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marl.agents.action_scores import action_scores
from marl.agents.backends import PolicyBackend, backend_target
from marl.agents.context import backend_context, check_fits
from marl.agents.decode import only_adapter
from marl.agents.heads import ACTION_HEAD
from marl.agents.prompts import turn_prompt

__all__ = ["ScoredReply", "choices_of", "choose_by_score", "replies_after_head"]

BASE_ADAPTER = "__base__"  # peft's name for "no adapter": a frozen view of the base model


@dataclass(frozen=True)
class ScoredReply:
    """One chosen reply: the prompt it was scored after (head included), the reply text the
    environment gets (head + chosen text), its scored tokens and their log-probabilities."""

    prompt_ids: list[int]
    text: str
    response_ids: list[int]
    logprobs: list[float]


def choices_of(info: Mapping[str, Any] | None) -> list[str]:
    """The legal texts a turn lists (its info's ``choices``); ``[]`` for a turn that is not one
    action of a finite set."""
    return list((info or {}).get("choices") or [])


def replies_after_head(
    tokenizer: Any,
    request: Any,
    replies: Sequence[str],
    *,
    response_prefix: bool,
) -> tuple[list[int], str, list[str]]:
    """A turn's prompt ids, its head, and each full reply (``"ACTION: 2"``) with the head cut
    from its start: what is scored after the prompt. ``request`` is a
    :class:`~marl.agents.generation.PromptRequest`."""
    turn = turn_prompt(
        tokenizer,
        request.system_prompt,
        request.observation,
        request.info,
        response_prefix=response_prefix,
    )
    head = turn.head
    if any(not reply.startswith(head) for reply in replies):
        raise RuntimeError(f"the response head {head!r} does not start {list(replies)}")
    return turn.ids, head, [reply[len(head) :] for reply in replies]


def choose_by_score(
    backend: PolicyBackend,
    policy_id: str,
    requests: Sequence[Any],
    *,
    temperature: float,
    response_prefix: bool,
    seed: int,
) -> list[list[ScoredReply]]:
    """Each request's ``n`` replies, each one of its ``choices`` drawn by its score (module
    docstring), in request order; one scoring pass for all of them, draws seeded by ``seed``.

    Every request must list its choices. A backend that does not hold its model (vLLM given a
    model directory) is refused, naming the policy's ``choice`` key."""
    base, adapter = backend_target(backend)
    if base is not backend and adapter is None:  # a view of the plain base: no adapter at all
        adapter = BASE_ADAPTER
    model = getattr(base, "model", None)
    if model is None:
        raise ValueError(
            f"policies.{policy_id}.choice: scored answers are scored by the model the backend "
            "holds, and this backend holds none (use backend=hf, or choice: sample)"
        )
    tokenizer = backend.tokenizer
    limit = backend_context(backend)
    prompts: list[list[int]] = []
    heads: list[str] = []
    texts: list[list[str]] = []
    for request in requests:
        legal = choices_of(request.info)
        if not legal:
            raise ValueError(f"scored choice: {request.agent!r}'s turn lists no choices")
        ids, head, after = replies_after_head(
            tokenizer,
            request,
            [f"{ACTION_HEAD} {text}" for text in legal],
            response_prefix=response_prefix,
        )
        longest = max(len(tokenizer.encode(t, add_special_tokens=False)) for t in after) + 1
        check_fits(request.agent, len(ids), longest, limit, f" (policy {policy_id})")
        prompts.append(ids)
        heads.append(head)
        texts.append(after)
    was_training = model.training
    model.eval()  # no dropout while scoring, as while generating
    try:
        with only_adapter(model, adapter, BASE_ADAPTER):
            scores = action_scores(model, tokenizer, prompts, texts, temperature=temperature)
    finally:
        model.train(was_training)
    generator = torch.Generator().manual_seed(seed)
    out: list[list[ScoredReply]] = []
    for i, request in enumerate(requests):
        probs = scores.probs[i, : len(texts[i])]  # (A_i,) the normalised choice
        if temperature == 0:
            picks = [int(probs.argmax())] * request.n
        else:
            picks = torch.multinomial(probs, request.n, replacement=True, generator=generator)
            picks = picks.tolist()
        row = []
        for j in picks:
            ids, logprobs = scores.tokens[i][j]
            row.append(
                ScoredReply(list(prompts[i]), heads[i] + texts[i][j], list(ids), list(logprobs))
            )
        out.append(row)
    return out
