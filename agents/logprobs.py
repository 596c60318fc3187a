"""Per-token logprobs of given responses, recomputed with one padded forward pass.

The learner calls :func:`response_logprobs` with gradients enabled to get the current policy's
logprobs of the tokens a behaviour policy sampled: under the sampling distribution for the
importance ratio, and without top-p for the KL term, which is then finite for every token. The
HF backend's tests call :func:`sequence_logprobs` to check the logprobs that ``generate``
reports. :func:`top_p_filter` is the nucleus filter of the sampling distribution, written to
match transformers' ``TopPLogitsWarper``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import nn


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to ``-inf`` the logits outside the nucleus of mass ``top_p`` (last dim = vocabulary).

    Same rule as transformers' ``TopPLogitsWarper`` with ``min_tokens_to_keep=1``: sort the
    probabilities ascending and drop the tokens whose cumulative mass is at most ``1 - top_p``;
    the most likely token is always kept.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)  # (..., V)
    cum_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (..., V)
    sorted_remove = cum_probs <= (1 - top_p)  # (..., V)
    sorted_remove[..., -1:] = False  # keep at least the most likely token
    remove = sorted_remove.scatter(-1, sorted_idx, sorted_remove)  # (..., V) back in vocab order
    return logits.masked_fill(remove, float("-inf"))


def sampling_logprobs(
    logits: torch.Tensor, temperature: float = 1.0, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probabilities of the sampling distribution: ``logits / temperature``, then top-p.

    ``temperature == 0`` (greedy) is reported as temperature 1: the model's own distribution.
    Works on any shape ``(..., V)``; computed in float32.
    """
    scaled = logits.float()
    if temperature > 0 and temperature != 1.0:
        scaled = scaled / temperature
    return torch.log_softmax(top_p_filter(scaled, top_p), dim=-1)  # (..., V)


class ResponseLogprobs(NamedTuple):
    """Per-token logprobs of B responses, left-aligned and padded to the longest, ``T``.

    ``sampling``: ``(B, T)`` under the sampling distribution (temperature, then top-p), the one
    the behaviour policy drew from; ``-inf`` for a token outside the nucleus. The importance ratio
    compares these. ``untruncated``: ``(B, T)`` under the temperature-scaled distribution without
    top-p, finite for every token; the KL to a reference uses these (the same tensor as
    ``sampling`` when ``top_p >= 1``, ``None`` when not asked for). ``mask``: ``(B, T)``, 1 on
    each row's response tokens and 0 on the padding after them (where both logprobs are 0.0).
    """

    sampling: torch.Tensor
    untruncated: torch.Tensor | None
    mask: torch.Tensor


def sequence_logprobs(
    model: nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    top_p: float = 1.0,
    pad_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of every response token given its prompt, for B (prompt, response) pairs.

    One forward pass over the left-padded concatenations ``prompt + response``. Differentiable:
    call it with gradients enabled to train. Only the last ``T + 1`` positions go through the
    output layer (``logits_to_keep``), so a large vocabulary does not cost ``B x L x V`` memory.

    Returns ``(logprobs, mask)``, both ``(B, T)`` with ``T`` the longest response, left-aligned:
    row ``b`` holds its response's logprobs in columns ``0 .. len(response_b) - 1``, mask 1 there
    and 0 (logprob 0.0) on the padding after it. See :func:`response_logprobs` for the
    untruncated (no top-p) logprobs of the same forward pass.
    """
    out = response_logprobs(
        model, prompt_ids_list, response_ids_list, temperature, top_p, pad_token_id
    )
    return out.sampling, out.mask


def response_logprobs(
    model: nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    top_p: float = 1.0,
    pad_token_id: int = 0,
    untruncated: bool = False,
) -> ResponseLogprobs:
    """:func:`sequence_logprobs`, plus (``untruncated=True``) the logprobs of the same tokens
    without the top-p filter, from the same forward pass. Every tensor is built on the model's
    device."""
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(
            f"sequence_logprobs: {len(prompt_ids_list)} prompts but "
            f"{len(response_ids_list)} responses"
        )
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("sequence_logprobs: every prompt needs at least one token")
    device = next(model.parameters()).device
    batch = len(prompt_ids_list)
    lens = [len(r) for r in response_ids_list]
    t_max = max(lens, default=0)
    if batch == 0 or t_max == 0:
        empty = torch.zeros(batch, 0, device=device)
        return ResponseLogprobs(empty, empty.clone() if untruncated else None, empty.clone())

    seqs = [list(p) + list(r) for p, r in zip(prompt_ids_list, response_ids_list)]
    length = max(len(s) for s in seqs)
    padded = [[pad_token_id] * (length - len(s)) + s for s in seqs]
    input_ids = torch.tensor(padded, dtype=torch.long, device=device)  # (B, L) left-padded
    attention = torch.tensor(
        [[0] * (length - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long, device=device
    )  # (B, L)
    # Positions count real tokens only, as generate() does for left-padded prompts.
    position_ids = (attention.cumsum(dim=-1) - 1).clamp(min=0)  # (B, L)

    out = model(
        input_ids=input_ids,
        attention_mask=attention,
        position_ids=position_ids,
        logits_to_keep=t_max + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]  # (B, T, V): column j predicts token L - T + j
    targets = input_ids[:, length - t_max :].unsqueeze(-1)  # (B, T, 1) right-aligned responses

    # Move each row's response from the right end to the left: column j <- T - len_b + j.
    resp_lens = torch.tensor(lens, device=device)  # (B,)
    cols = torch.arange(t_max, device=device).unsqueeze(0)  # (1, T)
    mask = cols < resp_lens.unsqueeze(1)  # (B, T) left-aligned validity
    src = (cols + t_max - resp_lens.unsqueeze(1)).clamp(max=t_max - 1)  # (B, T)

    def left_aligned(logp_all: torch.Tensor) -> torch.Tensor:
        token_logp = logp_all.gather(-1, targets).squeeze(-1)  # (B, T) right-aligned
        return token_logp.gather(1, src).masked_fill(~mask, 0.0)  # (B, T) left-aligned

    sampling = left_aligned(sampling_logprobs(logits, temperature, top_p))  # (B, T)
    full = None
    if untruncated:
        full = sampling if top_p >= 1.0 else left_aligned(sampling_logprobs(logits, temperature))
    return ResponseLogprobs(sampling, full, mask.to(sampling.dtype))
