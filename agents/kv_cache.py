"""Key/value caches for batched decoding: prefilled in length buckets, filled in place.

Two costs of a batched ``generate`` on a CPU that grow with the rows, and what this module does
about them:

- **Padding in the prefill.** Prompts of one call are padded to the longest, and a padded
  position costs what a real one does. :func:`prefill_buckets` splits the distinct prompts into
  groups of similar length; the HF backend prefills each group on its own and
  :func:`assemble_rows` lays the groups' caches side by side, padding between the shared
  prefix and each row's own tokens (where the backend's attention mask already has it).
- **Copies while decoding.** transformers' ``DynamicLayer`` appends each step's keys and values
  with ``torch.cat``, which copies the layer's whole cache at every step (16 rows of 350
  tokens on SmolLM2: 130 MB a step). A :class:`PreallocatedLayer` has room for the tokens to
  come, a step writes its position in place, and ``keys`` / ``values`` are views of the
  filled part.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

BUCKET_OVERHEAD = 32
"""What one more prefill forward costs, in padded positions (a forward's fixed cost on a CPU:
about 30 layers of small kernels, reading the weights once); :func:`prefill_buckets` opens a
bucket only when it saves more padding than this. Measured on SmolLM2 bf16, 2 threads
(``bench/prefill_overhead.py``): 37 positions reading a 1-row forward of 2 tokens against a
position of the largest buckets, 22 by a least-squares fit over bucket shapes; 32 lies between."""


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys and values live in buffers with spare positions.

    ``keys`` and ``values`` are always views ``(B, H, n, D)`` of the buffers' first ``n``
    positions, so everything that reads them (attention, masks, ``get_seq_length``) sees what a
    ``DynamicLayer`` would. When an update does not fit, or when something replaced ``keys``
    (``batch_select_indices``, ``crop``), the buffers are rebuilt from the current tensors with
    room again.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, filled: int, room: int) -> None:
        """``keys`` / ``values`` ``(B, H, size, D)``: buffers whose first ``filled`` positions
        hold the cache; ``room`` is the spare room a rebuild leaves."""
        super().__init__()
        self.device = keys.device
        self.is_initialized = True
        self.room = max(1, room)
        self._keys, self._values = keys, values
        self.keys, self.values = keys[:, :, :filled], values[:, :, :filled]

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole key and value buffers ``(B, H, size, D)``, the room after ``keys`` included
        (the static decoding loop of :mod:`marl.agents.decode` writes into them)."""
        return self._keys, self._values

    def _fits(self, incoming: int) -> bool:
        """True when ``keys`` is still the buffer's view and ``incoming`` more positions fit."""
        return (
            self.keys.data_ptr() == self._keys.data_ptr()
            and self.values.data_ptr() == self._values.data_ptr()
            and self.keys.shape[0] == self._keys.shape[0]
            and self.keys.shape[-2] + incoming <= self._keys.shape[-2]
        )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key_states`` / ``value_states`` ``(B, H, m, D)`` after the filled part and
        return the views of everything filled, ``(B, H, n + m, D)``."""
        n, incoming = self.keys.shape[-2], key_states.shape[-2]
        if not self._fits(incoming):
            size = n + incoming + self.room
            self._keys = _grown(self.keys, size)
            self._values = _grown(self.values, size)
        self._keys[:, :, n : n + incoming] = key_states
        self._values[:, :, n : n + incoming] = value_states
        self.keys = self._keys[:, :, : n + incoming]  # (B, H, n + m, D)
        self.values = self._values[:, :, : n + incoming]
        return self.keys, self.values


def _grown(tensor: torch.Tensor, size: int) -> torch.Tensor:
    """A new buffer ``(B, H, size, D)`` starting with ``tensor`` ``(B, H, n, D)``."""
    batch, heads, n, dim = tensor.shape
    buffer = tensor.new_empty(batch, heads, size, dim)
    buffer[:, :, :n] = tensor
    return buffer


def prefill_buckets(lengths: Sequence[int], overhead: int = BUCKET_OVERHEAD) -> list[list[int]]:
    """Split the indices of ``lengths`` into groups, each padded to its longest, so that the
    positions computed plus ``overhead`` per group are fewest. Groups come shortest first, and
    each is a run of the indices sorted by length. Exact (dynamic programming, O(n^2)).

    Not the learner's :func:`marl.agents.logprobs.length_buckets`, which bounds each bucket's
    share of padding: a prefill forward also has a fixed cost, so a bucket of a few short
    prompts (a share bound opens one for prompts of 2 and 3 tokens) costs more than the
    padding it saves."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0] + [0] * n  # best[j]: the cheapest split of order[:j]
    cut = [0] * (n + 1)  # cut[j]: where the last group of that split starts
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        best[j], cut[j] = min((best[i] + (j - i) * longest + overhead, i) for i in range(j))
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def assemble_rows(
    parts: Sequence[tuple[torch.Tensor, Any]],
    rows: torch.Tensor,
    prefix: int,
    own: int,
    room: int,
) -> Any:
    """One cache for the ``rows`` ``(R,)`` of a call out of the caches of its buckets.

    ``parts`` holds ``(members, cache)`` for every bucket: ``members`` ``(n_b,)`` are the
    distinct prompts it prefilled and ``cache`` holds, for each of them, the ``prefix`` shared
    positions then the bucket's ``span`` own positions (left-padded within the bucket). Row
    ``r`` takes distinct prompt ``rows[r]``. In the result every row has ``prefix + own``
    positions: the prefix, then zeros where its bucket was shorter than ``own``, then its
    bucket's positions; plus ``room`` spare positions a layer. The zeros sit where the caller's
    attention mask has padding (masked keys must hold finite values: a masked weight is 0, and
    0 x NaN is NaN). The buckets' caches are consumed: each layer's tensors are dropped once
    copied, so that the call never holds two whole caches."""
    template = parts[0][1]
    distinct = sum(len(members) for members, _ in parts)  # the buckets partition the prompts
    bucket_of = torch.empty(distinct, dtype=torch.long, device=rows.device)  # (D,)
    slot = torch.empty_like(bucket_of)  # (D,): each prompt's index within its bucket
    for b, (members, _) in enumerate(parts):
        bucket_of[members] = b
        slot[members] = torch.arange(len(members), device=rows.device)
    placed = []  # per bucket: (final rows (k,), their index in the bucket (k,))
    for b in range(len(parts)):
        final = (bucket_of[rows] == b).nonzero().squeeze(1)  # (k,)
        placed.append((final, slot[rows[final]]))
    result = copy.copy(template)
    result.layers = []
    end = prefix + own
    for layer_index in range(len(template.layers)):
        buffers = []
        for attribute in ("keys", "values"):
            first = getattr(parts[0][1].layers[layer_index], attribute)  # (n_0, H, P_0, D)
            buffer = first.new_empty(len(rows), first.shape[1], end + room, first.shape[-1])
            for (_, cache), (final, local) in zip(parts, placed, strict=True):
                tensor = getattr(cache.layers[layer_index], attribute)  # (n_b, H, prefix+span, D)
                span = tensor.shape[2] - prefix
                if prefix:
                    buffer[final, :, :prefix] = tensor[local, :, :prefix]
                if span < own:
                    buffer[final, :, prefix : end - span] = 0
                buffer[final, :, end - span : end] = tensor[local, :, prefix:]
            buffers.append(buffer)  # (R, H, prefix + own + room, D)
        for _, cache in parts:  # consumed layer by layer: at most one layer held twice
            cache.layers[layer_index].keys = cache.layers[layer_index].values = None
        result.layers.append(PreallocatedLayer(*buffers, filled=end, room=room))
    return result


def preallocatable(config: Any) -> bool:
    """True when a model with this ``config`` caches every layer in a plain ``DynamicLayer``:
    the layers :func:`assemble_rows` lays out (sliding-window or other layers keep
    transformers' own handling). Read from the cache transformers would build, before any
    forward."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)
