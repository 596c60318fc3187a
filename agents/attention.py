"""The platform's attention function: packed training rows, and decoding on a CPU.

:data:`MARL_ATTENTION` is one name transformers knows (with ``sdpa``'s masks). It serves:

- **packed rows** (:mod:`marl.agents.packing`): a forward called with ``packed_layout=...``
  runs :func:`marl.agents.packing.packed_attention`, each node attending to its ancestors;
  with ``packed_kv=[]`` too, each layer appends its keys and values there (a packed prefill);
- **one-token decoding steps on a CPU**, folded as below;
- everything else through transformers' own ``sdpa`` function, unchanged.

Decoding on a CPU: the fast kernel whether or not the batch is padded.

While decoding, each row has one query token. transformers' ``sdpa`` attention then takes one of
two paths for a model whose query heads share key/value heads (grouped-query attention, as in
SmolLM2: 9 query heads on 3 key/value heads). With a padding mask it folds a key/value head's
query heads into a few query rows (``pack_gqa``). With no mask, when every row of the batch has
the same length, it passes ``enable_gqa=True`` instead. On this CPU, in bfloat16, that second
kernel is 5 to 7 times slower: 2.6 ms against 0.4 ms a layer for 16 rows of 300 tokens, about
half of a 16-row decoding step (``bench/decode_step.py``). Equal-length batches are common in
GRPO: the G episodes of a group often show an agent prompts of the same length.

:func:`use_marl_attention` installs the function, which folds the heads on every CPU decoding
step. Prefill and unpacked training are untouched; so is any model not on ``sdpa``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

MARL_ATTENTION = "marl_sdpa"


def marl_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: ``query`` (B, H, Q, D), ``key`` and ``value``
    (B, H_kv, K, D), ``attention_mask`` None or (B, 1, Q, K); returns ((B, Q, H, D), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    layout = kwargs.get("packed_layout")
    if layout is not None:
        from marl.agents.packing import packed_attention

        captured = kwargs.get("packed_kv")
        if captured is not None:  # a packed prefill keeps every layer's keys and values
            captured.append((key, value))  # (1, H_kv, N, D) each, keys after RoPE
        return packed_attention(query, key, value, layout, scaling), None

    groups = int(getattr(module, "num_key_value_groups", 1))
    batch, heads, q_len, dim = query.shape
    foldable = (
        q_len == 1
        and groups > 1
        and query.device.type == "cpu"
        and (attention_mask is None or attention_mask.shape[1] == 1)
        and kwargs.get("position_bias") is None
        and kwargs.get("softcap") is None
    )
    if not foldable:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    folded = query.reshape(batch, heads // groups, groups, dim)  # (B, H_kv, G, D)
    out = torch.nn.functional.scaled_dot_product_attention(
        folded, key, value, attn_mask=attention_mask, scale=scaling
    )  # (B, H_kv, G, D); the mask (B, 1, 1, K) broadcasts over the G folded heads
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None  # (B, 1, H, D)


def _register() -> None:
    """Make :data:`MARL_ATTENTION` a name transformers knows, with ``sdpa``'s masks."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(MARL_ATTENTION, marl_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(MARL_ATTENTION, sdpa_mask)


def use_marl_attention(model: nn.Module) -> nn.Module:
    """Switch a transformers model from ``sdpa`` to :func:`marl_attention`, in place (a model on
    any other attention implementation is left alone). Returns the model."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return model
    _register()
    model.set_attn_implementation(MARL_ATTENTION)
    return model


def runs_marl_attention(model: nn.Module) -> bool:
    """Whether ``model`` runs :func:`marl_attention` (so it can take packed rows)."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) == MARL_ATTENTION
