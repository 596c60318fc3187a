"""Per-token logprobs of given responses, recomputed with one padded forward pass.

The learner calls :func:`sequence_logprobs` with gradients enabled to get the current policy's
logprobs of the tokens a behaviour policy sampled; the HF backend's tests call it to check the
logprobs that ``generate`` reports. :func:`top_p_filter` is the nucleus filter of the sampling
distribution, written to match transformers' ``TopPLogitsWarper``.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    and 0 (logprob 0.0) on the padding after it.
    """
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(
            f"sequence_logprobs: {len(prompt_ids_list)} prompts but "
            f"{len(response_ids_list)} responses"
        )
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("sequence_logprobs: every prompt needs at least one token")
    device = next(model.parameters()).device
    batch = len(prompt_ids_list)
    resp_lens = torch.tensor([len(r) for r in response_ids_list], device=device)  # (B,)
    t_max = int(resp_lens.max().item()) if batch else 0
    if batch == 0 or t_max == 0:
        empty = torch.zeros(batch, 0, device=device)
        return empty, empty.clone()

    seqs = [list(p) + list(r) for p, r in zip(prompt_ids_list, response_ids_list)]
    length = max(len(s) for s in seqs)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)  # (B, L)
    attention = torch.zeros(batch, length, dtype=torch.long)  # (B, L)
    for b, seq in enumerate(seqs):
        input_ids[b, length - len(seq) :] = torch.tensor(seq, dtype=torch.long)
        attention[b, length - len(seq) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
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
    targets = input_ids[:, length - t_max :]  # (B, T), right-aligned responses (+ prompt tail)
    logp_all = sampling_logprobs(logits, temperature, top_p)  # (B, T, V)
    token_logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T) right-aligned

    # Move each row's response from the right end to the left: column j <- T - len_b + j.
    cols = torch.arange(t_max, device=device).unsqueeze(0)  # (1, T)
    mask = cols < resp_lens.unsqueeze(1)  # (B, T) left-aligned validity
    src = (cols + t_max - resp_lens.unsqueeze(1)).clamp(max=t_max - 1)  # (B, T)
    left = token_logp.gather(1, src)  # (B, T)
    left = left.masked_fill(~mask, 0.0)  # (B, T)
    return left, mask.to(left.dtype)
