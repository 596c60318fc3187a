"""Exact action distributions: a policy's probability of each move of a finite legal set.

Where a scenario's legal actions form a finite set (Kuhn Poker's check/bet/call/fold, a matrix
game's actions, signal's candidates), the policy's distribution over them need not be estimated
by sampling. :func:`action_scores` scores every action's reply text teacher-forced after its
prompt, all (prompt, action) rows in one forward pass, and normalises over each prompt's set.
Where the model runs the platform's attention (:mod:`marl.agents.attention`; an HF backend's
model does), that pass is one packed row (:mod:`marl.agents.packing`): the prompts and replies
as a token trie, so that every prefix the prompts share (the system prompt of all of them, a
scenario's text up to the message that differs) runs once. Otherwise each distinct prompt runs
once and its actions run on its key/value cache (``share_prompts``). The values are the same.

What one action's score includes: the log-probability of the tokens of its reply text (the
text the model would write after the prompt: after the response head when the prompt ends with
one, e.g. ``" bet"`` after ``ACTION:``), plus the log-probability of the end-of-turn token after
them (the tokenizer's eos, ``<|im_end|>`` for ChatML models), so that ``bet`` and ``betting``
differ: a reply that goes on after ``bet`` is not the reply ``bet``. Only the text's canonical
tokenization (``tokenizer.encode``) is scored; the same characters split into other tokens are
different, rarely sampled, sequences and count as "not on the set".

The unnormalised total ``mass`` (the sum of the actions' probabilities) is the probability that
a sampled reply is exactly one of the listed texts; ``1 - mass`` is what the model puts on
every other reply (malformed, or another spelling the environment may still accept: an upper
bound on the malformed share, not the malformed share itself).

Used by :mod:`marl.runtime.exploitability` (Kuhn Poker's 12 information sets as a table, issue 27)
and meant for the emergence measures that need action distributions (issue 26).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from marl.agents.logprobs import response_logprobs

__all__ = ["ActionScores", "action_scores", "reply_ids"]


@dataclass(frozen=True)
class ActionScores:
    """The scores of P prompts' legal sets, padded to the largest set, ``A``.

    actions:  per prompt, its action texts, in the order given.
    logprobs: ``(P, A)`` float64 on the CPU: each action's summed log-probability (reply tokens
              and the end-of-turn token); ``-inf`` on the padding after a prompt's last action.
    probs:    ``(P, A)``: softmax of ``logprobs`` over each prompt's set (rows sum to 1); 0 on
              the padding.
    mass:     ``(P,)``: the sum of ``exp(logprobs)`` over each prompt's set, unnormalised: the
              model's probability of replying exactly one of the listed texts.
    tokens:   per prompt, per action: the scored token ids (:func:`reply_ids`) and each one's
              log-probability, whose sum is ``logprobs[i, j]``: what a scored choice records as
              its reply (:mod:`marl.agents.generation`).
    """

    actions: tuple[tuple[str, ...], ...]
    logprobs: torch.Tensor
    probs: torch.Tensor
    mass: torch.Tensor
    tokens: tuple[tuple[tuple[tuple[int, ...], tuple[float, ...]], ...], ...] = ()

    @property
    def off_set(self) -> torch.Tensor:
        """``(P,)``: ``1 - mass``, the probability of a reply that is none of the listed texts
        (malformed, or a spelling other than the listed one)."""
        return (1.0 - self.mass).clamp(min=0.0)

    def distribution(self, i: int) -> dict[str, float]:
        """Prompt ``i``'s normalised distribution, ``{action text: probability}``."""
        return {a: float(self.probs[i, j]) for j, a in enumerate(self.actions[i])}


def reply_ids(tokenizer: Any, text: str, end_id: int | None) -> list[int]:
    """The tokens scored for one reply: ``text``'s canonical tokens (no special tokens added),
    then ``end_id`` (the end-of-turn token) unless it is None."""
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return ids + ([end_id] if end_id is not None else [])


def action_scores(
    model: nn.Module,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    actions: Sequence[Sequence[str]],
    *,
    temperature: float = 1.0,
    end_id: int | None = -1,
) -> ActionScores:
    """Each prompt's distribution over its legal actions, exact (no sampling).

    ``prompts``: P prompts as token ids, built as the rollout builds them (chat template and,
    when the run uses ``sampling.response_prefix``, the response head at the end).
    ``actions``: for each prompt, its legal actions as the reply text the model would write
    after that prompt (after the head, when the prompt holds one); nonempty, no repeats.
    ``temperature``: the logits are divided by it, as the sampler does (0, greedy, is scored at
    1: the model's own distribution; no top-p). ``end_id``: the end-of-turn token scored after
    each text; -1 (default) takes ``tokenizer.eos_token_id``; None scores the text alone.

    All ``sum(len(a) for a in actions)`` rows are scored in one batched pass (each distinct
    prompt once), under ``torch.no_grad`` (train with
    :func:`~marl.agents.logprobs.sequence_logprobs` instead).
    """
    if len(prompts) != len(actions):
        raise ValueError(f"action_scores: {len(prompts)} prompts but {len(actions)} action sets")
    for i, legal in enumerate(actions):
        if not legal:
            raise ValueError(f"action_scores: prompt {i} has no legal actions to score")
        if len(set(legal)) != len(legal):
            raise ValueError(f"action_scores: prompt {i} lists an action twice: {list(legal)!r}")
    if end_id == -1:
        end_id = tokenizer.eos_token_id
        if end_id is None:
            raise ValueError("action_scores: the tokenizer names no eos token; pass end_id")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows_prompt: list[list[int]] = []
    rows_reply: list[list[int]] = []
    for prompt, legal in zip(prompts, actions):
        for text in legal:
            rows_prompt.append(list(prompt))
            rows_reply.append(reply_ids(tokenizer, text, end_id))
    if any(not r for r in rows_reply):
        raise ValueError("action_scores: an empty action text with no end token scores nothing")
    with torch.no_grad():  # every shared prefix once: one packed row, or prompts deduplicated
        scored = response_logprobs(
            model,
            rows_prompt,
            rows_reply,
            temperature=temperature,
            pad_token_id=pad,
            share_prompts=True,
            packed=True,
        )
    token_logp, mask = scored.sampling, scored.mask  # (R, T), (R, T) with R = all actions
    sums = (token_logp.double() * mask.double()).sum(dim=1).cpu()  # (R,)
    per_token = token_logp.float().cpu().tolist()  # R rows of T; row r's first len(reply) count
    width = max(len(a) for a in actions)  # A
    logprobs = torch.full((len(prompts), width), -math.inf, dtype=torch.float64)  # (P, A)
    start = 0
    for i, legal in enumerate(actions):
        logprobs[i, : len(legal)] = sums[start : start + len(legal)]
        start += len(legal)
    mass = logprobs.exp().sum(dim=1)  # (P,) exp(-inf) = 0 on the padding
    probs = torch.softmax(logprobs, dim=1)  # (P, A) 0 on the padding
    rows = iter(zip(rows_reply, per_token))
    tokens = tuple(
        tuple((tuple(ids), tuple(lp[: len(ids)])) for ids, lp in (next(rows) for _ in legal))
        for legal in actions
    )
    return ActionScores(tuple(tuple(a) for a in actions), logprobs, probs, mass, tokens)
