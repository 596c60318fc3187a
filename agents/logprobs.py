"""Per-token logprobs of given responses, recomputed with one padded forward pass.

The learner calls :func:`response_logprobs` with gradients enabled to get the current policy's
logprobs of the tokens a behaviour policy sampled: under the sampling distribution for the
importance ratio, and without top-p for the KL term, which is then finite for every token. The
HF backend's tests call :func:`sequence_logprobs` to check the logprobs that ``generate``
reports. :func:`top_p_filter` is the nucleus filter of the sampling distribution, written to
match transformers' ``TopPLogitsWarper``.

**Shared prompts** (``share_prompts=True``). The G episodes of a GRPO group often show an agent
the same prompt. Then each distinct prompt runs through the model once (with ``use_cache``), its
key/value cache is indexed out to every row that has that prompt, and the responses run on top
of it. Indexing is differentiable, so the gradient reaching the prompt's keys and values from
all its responses flows back through the one prompt forward: the logprobs and their gradient
are those of the padded forward over ``prompt + response`` rows, to float rounding. Distinct
prompts that begin alike (the same system prompt, say) run that common prefix once too
(:func:`prefix_clusters`): prefix, then the rest of each prompt on its cache, then the responses
on theirs. Within such a group, the rests are put in length buckets (:func:`length_buckets`),
each its own forward, so that a short prompt is not padded to the longest one.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from marl.agents.models import transformers_model

# Distinct prompts that share at least this many leading tokens (a system prompt) run that
# prefix once: below it, the extra forward call costs more than the tokens it saves.
MIN_SHARED_PREFIX = 16


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
    ``entropy``: ``(B, T)`` the entropy (nats) of the sampling distribution at each response
    token's position, over the whole vocabulary (0.0 on the padding); differentiable; ``None``
    when not asked for.
    """

    sampling: torch.Tensor
    untruncated: torch.Tensor | None
    mask: torch.Tensor
    entropy: torch.Tensor | None = None

    @classmethod
    def empty(
        cls, batch: int, device: torch.device, untruncated: bool, entropy: bool
    ) -> ResponseLogprobs:
        """``batch`` responses with no tokens: ``(B, 0)`` tensors, ``None`` where not asked."""
        none = torch.zeros(batch, 0, device=device)  # (B, 0)
        return cls(
            none,
            none.clone() if untruncated else None,
            none.clone(),
            none.clone() if entropy else None,
        )


def token_entropy(logp_all: torch.Tensor) -> torch.Tensor:
    """``(..., V)`` log-probabilities -> ``(...)`` their distribution's entropy in nats,
    ``-sum p log p``, with ``0 log 0 = 0`` (a token top-p removed, at ``-inf``, adds nothing)."""
    return torch.special.entr(logp_all.exp()).sum(-1)  # (...)


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
    share_prompts: bool = False,
    max_padding: float = 0.125,
    min_prefix: int = MIN_SHARED_PREFIX,
    packed: bool = False,
    entropy: bool = False,
) -> ResponseLogprobs:
    """:func:`sequence_logprobs`, plus (``untruncated=True``) the logprobs of the same tokens
    without the top-p filter, from the same forward pass. Every tensor is built on the model's
    device. ``share_prompts``: run each distinct prompt once, in length buckets that pad at most
    ``max_padding`` of their tokens (1.0 = one bucket), a prefix of at least ``min_prefix``
    tokens common to several distinct prompts once (0 = never), and the responses on the
    key/value cache (the module docstring); same values and gradient. ``packed``: every turn in
    one packed row instead (:mod:`marl.agents.packing`; shared prefixes once when
    ``share_prompts``), where the model runs :data:`marl.agents.attention.MARL_ATTENTION`; same
    values and gradient, one forward call. ``entropy``: also the sampling distribution's
    entropy at each response position (:func:`token_entropy`), from the same logits."""
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
        return ResponseLogprobs.empty(batch, device, untruncated, entropy)
    if packed:
        from marl.agents.attention import runs_marl_attention
        from marl.agents.packing import packed_response_logprobs

        if runs_marl_attention(model):
            return packed_response_logprobs(
                model,
                prompt_ids_list,
                response_ids_list,
                temperature,
                top_p,
                untruncated=untruncated,
                share=share_prompts,
                entropy=entropy,
            )

    if share_prompts:
        logits, targets = _shared_prompt_logits(
            model,
            prompt_ids_list,
            response_ids_list,
            pad_token_id,
            device,
            max_padding,
            min_prefix,
        )  # (B, T, V), (B, T, 1) left-aligned
        resp_lens = torch.tensor(lens, device=device)  # (B,)
        cols = torch.arange(t_max, device=device).unsqueeze(0)  # (1, T)
        valid = cols < resp_lens.unsqueeze(1)  # (B, T)

        def gathered(logp_all: torch.Tensor) -> torch.Tensor:
            return logp_all.gather(-1, targets).squeeze(-1).masked_fill(~valid, 0.0)  # (B, T)

        logp_all = sampling_logprobs(logits, temperature, top_p)  # (B, T, V)
        sampling = gathered(logp_all)  # (B, T)
        full = None
        if untruncated:
            full = sampling if top_p >= 1.0 else gathered(sampling_logprobs(logits, temperature))
        spread = token_entropy(logp_all).masked_fill(~valid, 0.0) if entropy else None  # (B, T)
        return ResponseLogprobs(sampling, full, valid.to(sampling.dtype), spread)

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

    logp_all = sampling_logprobs(logits, temperature, top_p)  # (B, T, V) right-aligned
    sampling = left_aligned(logp_all)  # (B, T)
    full = None
    if untruncated:
        full = sampling if top_p >= 1.0 else left_aligned(sampling_logprobs(logits, temperature))
    spread = None
    if entropy:  # (B, T) right-aligned -> left-aligned
        spread = token_entropy(logp_all).gather(1, src).masked_fill(~mask, 0.0)
    return ResponseLogprobs(sampling, full, mask.to(sampling.dtype), spread)


def length_buckets(lengths: Sequence[int], max_waste: float = 0.125) -> list[list[int]]:
    """Indices of ``lengths`` cut into buckets of similar length, longest first.

    Sorted by length (descending), a bucket takes the next item while padding every member to
    the bucket's longest leaves at most ``max_waste`` of its padded tokens as padding. A forward
    per bucket then computes at most that share of padding, at the cost of one more call.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    buckets: list[list[int]] = []
    real = 0
    for i in order:
        if buckets:
            longest = lengths[buckets[-1][0]]
            padded = longest * (len(buckets[-1]) + 1)
            if padded - (real + lengths[i]) <= max_waste * padded:
                buckets[-1].append(i)
                real += lengths[i]
                continue
        buckets.append([i])
        real = lengths[i]
    return buckets


def _shared_prompt_logits(
    model: nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device,
    max_padding: float = 0.125,
    min_prefix: int = MIN_SHARED_PREFIX,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits predicting every response token, each distinct prompt run once, and a common
    prefix of several distinct prompts (a system prompt) run once for all of them.

    Returns ``(logits, targets)``: ``(B, T, V)`` and ``(B, T, 1)``, left-aligned (column ``j`` of
    row ``b`` predicts response token ``j``), padding after each response (its logits are
    meaningless and masked by the caller; its target is ``pad_token_id``).
    """
    batch = len(prompt_ids_list)
    t_max = max(len(r) for r in response_ids_list)
    distinct: dict[tuple[int, ...], int] = {}
    prompt_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids_list]  # (B,)
    prompts = list(distinct)  # K distinct prompts
    rows_of: list[list[int]] = [[] for _ in prompts]
    for row, k in enumerate(prompt_of):
        rows_of[k].append(row)
    responses = torch.tensor(
        [list(r) + [pad_token_id] * (t_max - len(r)) for r in response_ids_list],
        dtype=torch.long,
        device=device,
    )  # (B, T) right-padded
    parts: list[torch.Tensor] = []
    order: list[int] = []  # the rows of `parts`, in the order they were computed
    clusters = prefix_clusters(prompts, min_prefix)
    alone = [k for length, members in clusters if not length for k in members]
    groups = [(length, members) for length, members in clusters if length]
    if alone:  # prompts with no common prefix worth a call share the length buckets
        groups.append((0, alone))
    for prefix_len, members in groups:
        head = None  # the common prefix's cache, computed once for the whole group
        if prefix_len:
            out = model(
                input_ids=torch.tensor([list(prompts[members[0]][:prefix_len])], device=device),
                logits_to_keep=1,
                use_cache=True,
            )  # (1, c) tokens
            head = output_cache(out)
        suffixes = [prompts[k][prefix_len:] for k in members]
        for bucket in length_buckets([len(x) for x in suffixes], max_padding):
            ks = [members[i] for i in bucket]
            rows = [row for k in ks for row in rows_of[k]]
            local = {k: i for i, k in enumerate(ks)}
            index = torch.tensor([local[prompt_of[r]] for r in rows], device=device)  # (b,)
            width = max(1, max(len(response_ids_list[r]) for r in rows))  # this bucket's T_b
            cache = None
            if head is not None:  # one copy of the prefix per prompt of the bucket
                cache = cache_rows(head, torch.zeros(len(ks), dtype=torch.long, device=device))
            part = _prompt_then_responses(
                model,
                prefix_len,
                cache,
                [suffixes[i] for i in bucket],
                index,
                responses[rows, :width],
                pad_token_id,
            )  # (b, T_b, V)
            parts.append(torch.nn.functional.pad(part, (0, 0, 0, t_max - width)))  # (b, T, V)
            order += rows
    logits = torch.cat(parts, dim=0)  # (B, T, V) in `order`
    inverse = torch.empty(batch, dtype=torch.long, device=device)
    inverse[torch.tensor(order, device=device)] = torch.arange(batch, device=device)
    return logits[inverse], responses.unsqueeze(-1)  # (B, T, V), (B, T, 1)


def prefix_clusters(
    prompts: Sequence[Sequence[int]], min_prefix: int = MIN_SHARED_PREFIX
) -> list[tuple[int, list[int]]]:
    """Indices of ``prompts`` grouped by a common prefix of at least ``min_prefix`` tokens, as
    ``(prefix length, indices)``; a prompt with no such neighbour is a group of its own with
    prefix length 0. Every member keeps at least one token after the prefix. Greedy over the
    prompts in lexicographic order, where prompts with long common prefixes are neighbours.
    """
    groups: list[tuple[int, list[int]]] = []
    for i in sorted(range(len(prompts)), key=lambda j: list(prompts[j])):
        p = prompts[i]
        if groups and min_prefix > 0:
            length, members = groups[-1]
            first = prompts[members[0]]
            if len(members) == 1:
                length = len(first) - 1
            common = _common_prefix(first, p, min(length, len(p) - 1))
            if common >= min_prefix:
                groups[-1] = (common, [*members, i])
                continue
        groups.append((0, [i]))
    return groups


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the prefix common to all ``prompts``, leaving each at least one token after
    it (0 for fewer than two prompts)."""
    if len(prompts) < 2:
        return 0
    length = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for p in prompts[1:]:
        length = _common_prefix(first, p, length)
    return max(0, length)


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the common prefix of ``a`` and ``b``, at most ``limit``."""
    n = 0
    for x, y in zip(a[:limit], b[:limit]):
        if x != y:
            break
        n += 1
    return n


def _prompt_then_responses(
    model: nn.Module,
    c: int,
    prefix_cache: Any,
    prompts: Sequence[Sequence[int]],
    index: torch.Tensor,
    responses: torch.Tensor,
    pad_token_id: int,
) -> torch.Tensor:
    """The K ``prompts`` (the rest after a common prefix of ``c`` tokens whose cache, one row per
    prompt, is ``prefix_cache``; ``c == 0`` and None for no prefix), left-padded so that the
    padding sits between prefix and prompt and is masked; then the ``responses`` ``(b, T)`` on
    the cache rows ``index`` ``(b,)``. The ``(b, T, V)`` logits predicting each response
    token."""
    device = responses.device
    k = len(prompts)
    extra: dict[str, Any] = {}
    if prefix_cache is not None:
        extra[cache_keyword(model)] = prefix_cache
    length = max(len(p) for p in prompts)
    ids = torch.tensor(
        [[pad_token_id] * (length - len(p)) + list(p) for p in prompts],
        dtype=torch.long,
        device=device,
    )  # (K, P) left-padded
    own = torch.tensor(
        [[0] * (length - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long, device=device
    )  # (K, P)
    attention = torch.cat([own.new_ones(k, c), own], dim=1)  # (K, c + P)
    out = model(
        input_ids=ids,
        attention_mask=attention,
        position_ids=c + (own.cumsum(dim=-1) - 1).clamp(min=0),  # (K, P)
        logits_to_keep=1,
        use_cache=True,
        **extra,
    )
    first = out.logits[:, -1, :][index].unsqueeze(1)  # (b, 1, V): predicts response token 0
    t_max = responses.shape[1]
    if t_max == 1:
        return first
    cache = output_cache(out)
    cache.batch_select_indices(index)  # every layer's keys/values: (K, ...) -> (b, ...)
    inputs = responses[:, :-1]  # (b, T - 1): the last token predicts nothing we need
    steps = torch.arange(t_max - 1, device=device).unsqueeze(0)  # (1, T - 1)
    rest = model(
        input_ids=inputs,
        # the prompt's padding stays masked; response padding only follows real tokens, which
        # the causal mask already hides it from
        attention_mask=torch.cat([attention[index], torch.ones_like(inputs)], dim=1),
        position_ids=(c + own.sum(dim=-1))[index].unsqueeze(1) + steps,  # (b, T - 1)
        use_cache=True,
        **{cache_keyword(model): cache},
    ).logits  # (b, T - 1, V)
    return torch.cat([first, rest], dim=1)  # (b, T, V)


def cache_rows(cache: Any, index: torch.Tensor) -> Any:
    """A new key/value cache holding the rows ``index`` ``(b,)`` of ``cache``, which is left as
    it is (differentiable: indexing)."""
    rows = copy.copy(cache)
    rows.layers = [copy.copy(layer) for layer in cache.layers]
    rows.batch_select_indices(index)  # replaces each copied layer's tensors, not the originals
    return rows


def cache_keyword(model: nn.Module) -> str:
    """The forward keyword that takes a key/value cache: ``cache`` from transformers 5.24 on
    (``past_key_values`` is deprecated there), ``past_key_values`` before."""
    params = inspect.signature(transformers_model(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The key/value cache a forward with ``use_cache=True`` returned."""
    cache = getattr(out, "cache", None)
    return out.past_key_values if cache is None else cache
