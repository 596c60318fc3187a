"""Decoding after the prefill with fixed shapes and no per-token host synchronisation.

transformers' ``generate`` loop costs host time every token: it reads ``unfinished.max() == 0``
on the host (a synchronisation), the cache grows by one position (new shapes, new views), and
each of a step's few hundred kernels is launched from Python. On a GPU the device then idles
most of the time. :class:`StaticDecoder` decodes with every tensor fixed for the whole call:

- **Cache.** Each layer's keys and values live in buffers ``(R, H_kv, L, D)`` allocated once,
  ``L`` at least the prompt layout width ``P`` minus one (the prefill's positions) plus the
  ``T`` new tokens. A step writes its position in place at a device index (``index_copy_``) and
  attention reads all ``L`` positions; a 4D mask hides the padding and the future positions.
- **Step.** One token per row: positions, write index and output column are device tensors
  advanced in place; the logits go through transformers' own temperature and top-p warpers, the
  token is the argmax (greedy) or an inverse-CDF draw from torch's RNG
  (:func:`sample_inverse_cdf`), its logprob is written into an ``(R, L)`` buffer, and a row that
  has produced an EOS gets the pad token from then on. Nothing in a step reads a value on the
  host; the loop looks at "every row finished" once every :data:`CHECK_EVERY` steps.
- **CUDA graphs.** Since a step has the same shapes and addresses every time, it is captured
  once in a ``torch.cuda.CUDAGraph`` (after warm-up steps on a side stream, as PyTorch's CUDA
  graph notes require) and replayed: one launch per token instead of hundreds. The HF backend
  keeps a decoder per (row bucket, length bucket), and in each a graph per (adapter,
  temperature, top-p), so later calls replay. Rows are padded to a bucket with dummy rows
  (finished from the start), and the cache length to a multiple of :data:`LENGTH_STEP`.
  Random draws inside a graph use the default CUDA generator, which graph capture registers
  (philox offsets advanced by each replay), so a seeded call draws what the same steps draw
  eagerly. A capture CUDA refuses makes the backend warn and decode eagerly.

**Adapters.** peft's per-row ``adapter_names`` path groups rows by name in Python and indexes
with Python lists (host-to-device copies), which a graph cannot capture. A call whose rows all
use one adapter (or the base model) is captured with that adapter made the only active one
(:func:`only_adapter`); a call mixing adapters is captured with every row routed to its own
adapter through stacked weights and a per-row index buffer
(:class:`marl.agents.mixed_lora.MixedAdapters`, BGMV-like); an adapter kind that routing does
not cover runs the same fixed-shape step eagerly, with ``adapter_names``.

On a CPU the same step runs eagerly, on the prefill's own buffers (no padding, no copy), and
looks at the rows every step (a host read costs nothing there): the loop ends when every row
has finished, and once at most :data:`COMPACT_BELOW` of its rows still run, it drops the
finished ones from the cache and every per-row tensor (a CPU step costs in proportion to its
rows). The running rows write into their call rows and take the random draws the whole call
would have taken, so the tokens are those of the loop without compaction, and of
transformers' ``generate`` (``HFBackend(decode="generate")``; ``bench/decode_loop.py`` compares
the two).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import Cache, StaticLayer

CHECK_EVERY = 8  # steps between the host's looks at "every row finished" (one sync each)
# an eager decoder on a CPU drops its finished rows once at most this share of them still run
COMPACT_BELOW = 0.75
LENGTH_STEP = 64  # a graph's cache length is a multiple of this (attention reads all of it)
WARMUP_STEPS = 3  # eager steps on a side stream before a capture


def row_bucket(rows: int) -> int:
    """The batch a graph decodes ``rows`` rows in: a power of two from 8 up to 128, then a
    multiple of 128 (at most 1/2, then 1/3 of dummy rows)."""
    if rows <= 128:
        return max(8, 1 << (rows - 1).bit_length())
    return -(-rows // 128) * 128


def length_bucket(length: int) -> int:
    """A graph's cache length for ``length`` positions: the next multiple of :data:`LENGTH_STEP`."""
    return -(-length // LENGTH_STEP) * LENGTH_STEP


def sample_inverse_cdf(logp: torch.Tensor, draw: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``logp`` (R, V) log-probabilities, drawn from ``exp(logp)``: the
    first index whose cumulative probability exceeds a uniform draw (``draw`` (R, 1) float64 in
    [0, 1), else drawn here). Zero-probability tokens (``-inf``, as top-p leaves them) are never
    chosen. Returns (R,) token ids. No host sync: a draw that rounds up to the total (very rare)
    takes the last token with any probability, where the cumulative distribution first reaches
    its total."""
    cdf = logp.double().exp().cumsum(dim=-1)  # (R, V), float64: no drift over 49k entries
    if draw is None:
        draw = torch.rand(logp.shape[0], 1, dtype=torch.float64, device=logp.device)  # (R, 1)
    total = cdf[:, -1:].contiguous()  # (R, 1)
    chosen = torch.searchsorted(cdf, draw * total, right=True)  # (R, 1), V when past the end
    last = torch.searchsorted(cdf, total, right=False)  # (R, 1): the last token with mass
    return torch.minimum(chosen, last).squeeze(-1)  # (R,); chosen <= last unless past the end


class FixedLayer(StaticLayer):
    """One layer's cache in fixed buffers ``(R, H_kv, L, D)``: an update writes its one
    position at the device index ``write_at`` (1,) and returns the whole buffers, or their
    first ``visible`` positions when that is set (an eager loop on a CPU)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, write_at: torch.Tensor) -> None:
        super().__init__(max_cache_len=keys.shape[2])
        self.keys, self.values = keys, values  # (R, H_kv, L, D) each
        self.write_at = write_at
        self.device = keys.device
        self.batch_size, self.num_heads = keys.shape[:2]
        self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
        self.is_initialized = True
        self.visible: int | None = None

    def get_seq_length(self) -> torch.Tensor:  # type: ignore[override]
        """Positions filled before this step's: a device tensor ``()``, as ``StaticLayer``'s."""
        return self.write_at[0]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key_states`` / ``value_states`` ``(R, H_kv, 1, D)`` at ``write_at``."""
        self.keys.index_copy_(2, self.write_at, key_states)
        self.values.index_copy_(2, self.write_at, value_states)
        if self.visible is not None:
            return self.keys[:, :, : self.visible], self.values[:, :, : self.visible]
        return self.keys, self.values  # (R, H_kv, L, D)


def mask_is_additive(model: nn.Module) -> bool | None:
    """How the model's attention takes a 4D mask: ``False`` a boolean one (``sdpa`` and the CPU
    decode attention), ``True`` an additive float one (``eager``), ``None`` when neither (flash
    or flex attention: the static step cannot serve it)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask

    from marl.agents.models import transformers_model

    implementation = transformers_model(model).config._attn_implementation
    function = ALL_MASK_ATTENTION_FUNCTIONS.get(implementation)
    if function is sdpa_mask:
        return False
    if function is eager_mask:
        return True
    return None


class StaticDecoder:
    """Fixed buffers for decoding ``rows`` rows in a cache of ``length`` positions, and the step
    that advances them by one token. :meth:`load` puts a call's prefill in; :meth:`run` decodes
    (eagerly, or by replaying the graph :meth:`capture` made)."""

    def __init__(
        self,
        model: nn.Module,
        buffers: Sequence[tuple[torch.Tensor, torch.Tensor]],
        *,
        eos_ids: Sequence[int],
        pad_id: int,
        additive_mask: bool,
        cache_keyword: str,
        trim: bool = False,
    ) -> None:
        """``buffers``: per layer, the keys and values ``(R, H_kv, L, D)`` this decoder owns
        (fresh zeros, or the prefill's own buffers with their room). ``trim`` (eager only):
        attention reads only the positions filled so far, counted on the host. On a CPU that
        count costs nothing, the room is not read, and the floats are those of ``generate``
        (whose cache grows); a graph needs ``trim=False``, the same every step."""
        self.model = model
        keys = buffers[0][0]
        rows, length, device = keys.shape[0], keys.shape[2], keys.device
        self.rows, self.length = rows, length
        self.write_at = torch.zeros(1, dtype=torch.long, device=device)  # (1,) cache index
        self.column = torch.zeros(1, dtype=torch.long, device=device)  # (1,) output column
        self.cache = Cache(layers=[FixedLayer(k, v, self.write_at) for k, v in buffers])
        self.key_ok = torch.zeros(rows, length, dtype=torch.bool, device=device)  # (R, L)
        self.kv_index = torch.arange(length, device=device)  # (L,)
        self.tokens_in = torch.full((rows, 1), pad_id, dtype=torch.long, device=device)  # (R, 1)
        self.position = torch.zeros(rows, 1, dtype=torch.long, device=device)  # (R, 1)
        self.unfinished = torch.zeros(rows, dtype=torch.bool, device=device)  # (R,)
        self.tokens = torch.full((rows, length), pad_id, dtype=torch.long, device=device)  # (R, L)
        self.logprobs = torch.zeros(rows, length, device=device)  # (R, L)
        self.eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)  # (E,)
        self.pad_id = pad_id
        self.warpers: list[Any] = []  # per call (load): transformers' temperature / top-p
        self.sample = False  # per call: draw (else argmax)
        self.additive_mask = additive_mask
        self.cache_keyword = cache_keyword
        self.trim = trim
        self.filled = 0  # host side: positions filled before the current step (trim)
        self.loaded = rows  # rows of the call (trim): the first dimension of tokens / logprobs
        self.made = 0  # host side: tokens made so far this call (the output column)
        self.origin: torch.Tensor | None = None  # (R',) each running row's call row (trim)
        self.model_kwargs: dict[str, Any] = {}  # per call: peft's adapter_names when eager
        self.graphs: dict[Any, torch.cuda.CUDAGraph] = {}  # per (adapter, sampling) key
        self.mixed: dict[tuple[str, ...], Any] = {}  # MixedAdapters a graph reads, per set
        self.pool: Any = None  # the graphs' shared memory pool (they never run at once)

    def load(
        self,
        prefill: Cache | None,
        prompt_mask: torch.Tensor,
        last_tokens: torch.Tensor,
        warpers: Sequence[Any],
        sample: bool,
        adapter_names: list[str] | None = None,
    ) -> None:
        """Start a call: ``prompt_mask`` ``(r, P)`` (the layout of every row, its last token at
        ``P - 1``), ``last_tokens`` ``(r,)`` each row's last prompt token, ``prefill`` the cache
        of the first ``P - 1`` positions (copied into this decoder's buffers; None when they
        are the buffers already). Rows past ``r`` are dummies, finished from the start.
        ``warpers``: transformers' temperature / top-p warpers, ``sample``: draw (else argmax);
        a graph replays those it was captured with. ``adapter_names``: peft's, per row."""
        r, width = prompt_mask.shape
        filled = width - 1
        if prefill is not None:
            for layer, source in zip(self.cache.layers, prefill.layers, strict=True):
                layer.keys[:r, :, :filled] = source.keys  # (r, H_kv, P - 1, D)
                layer.values[:r, :, :filled] = source.values
        for layer in self.cache.layers:  # masked positions must hold finite values (0 x NaN)
            layer.keys[:r, :, filled:].zero_()
            layer.values[:r, :, filled:].zero_()
        self.key_ok.fill_(True)
        self.key_ok[:r, :width] = prompt_mask.bool()
        self.key_ok[r:, :filled] = False
        self.tokens_in.fill_(self.pad_id)
        self.tokens_in[:r, 0] = last_tokens
        self.position.zero_()
        self.position[:r, 0] = prompt_mask.sum(dim=-1) - 1  # real tokens before, as generate
        self.write_at.fill_(filled)
        self.filled = filled
        self.column.zero_()
        self.unfinished.zero_()
        self.unfinished[:r] = True
        self.warpers, self.sample = list(warpers), sample
        self.loaded, self.origin, self.made = self.rows, None, 0
        self.model_kwargs = {}
        if adapter_names is not None:
            dummies = [adapter_names[0]] * (self.rows - r)
            self.model_kwargs["adapter_names"] = [*adapter_names, *dummies]

    def step(self) -> None:
        """One token for every row, all on the device."""
        visible = self.key_ok & (self.kv_index <= self.write_at)  # (R, L): no future position
        if self.trim:
            self.filled += 1
            visible = visible[:, : self.filled]  # (R, n)
            for layer in self.cache.layers:
                layer.visible = self.filled
        mask = visible[:, None, None, :]  # (R, 1, 1, L)
        if self.additive_mask:
            dtype = self.cache.layers[0].keys.dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
                ~mask, torch.finfo(dtype).min
            )  # (R, 1, 1, L)
        out = self.model(
            input_ids=self.tokens_in,
            attention_mask=mask,
            position_ids=self.position,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_keyword: self.cache},
            **self.model_kwargs,
        )
        scores = out.logits[:, -1].float()  # (R, V), as generate hands them to processors
        for warper in self.warpers:
            scores = warper(self.tokens_in, scores)  # (R, V)
        logp = torch.log_softmax(scores, dim=-1)  # (R, V)
        if self.sample:
            draw = None
            if self.origin is not None:  # the draws of all the call's rows, as uncompacted
                draw = torch.rand(self.loaded, 1, dtype=torch.float64, device=logp.device)
                draw = draw[self.origin]  # (R', 1)
            chosen = sample_inverse_cdf(logp, draw)  # (R,)
        else:
            chosen = logp.argmax(dim=-1)  # (R,)
        chosen_logp = logp.gather(-1, chosen[:, None])  # (R, 1)
        chosen = torch.where(self.unfinished, chosen, self.pad_id)  # (R,) finished rows: pad
        if self.origin is None:
            self.tokens.index_copy_(1, self.column, chosen[:, None])
            self.logprobs.index_copy_(1, self.column, chosen_logp)
        else:  # compacted: each running row writes into its call row
            self.tokens[self.origin, self.made] = chosen
            self.logprobs[self.origin, self.made] = chosen_logp[:, 0]
        self.made += 1
        self.unfinished &= ~(chosen[:, None] == self.eos).any(dim=-1)  # (R,)
        self.tokens_in.copy_(chosen[:, None])
        self.position += 1
        self.write_at += 1
        self.column += 1

    def capture(self, key: Any) -> None:
        """Record :meth:`step` in a CUDA graph for ``key`` (the adapter setup and sampling it
        runs with, as loaded).
        Warm-up steps run eagerly first; they move the state and the RNG, so the caller loads
        the call again afterwards, and the RNG state is put back here."""
        device = self.kv_index.device
        rng = torch.cuda.get_rng_state(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(WARMUP_STEPS):
                self.step()
        torch.cuda.current_stream(device).wait_stream(side)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.step()
        torch.cuda.set_rng_state(rng, device)
        self.graphs[key] = graph

    def run(
        self, steps: int, rows: int, graph: torch.cuda.CUDAGraph | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode up to ``steps`` tokens (eagerly, or by replaying ``graph``, one of
        :attr:`graphs`); stops early when every row has finished. Returns the first ``rows``
        rows' tokens and logprobs, ``(rows, t)`` each with ``t <= steps``."""
        replay = graph.replay if graph is not None else self.step
        done = steps
        for t in range(1, steps + 1):
            replay()
            if self.trim and t < steps:  # eager on a CPU: a host read costs nothing here
                running = int(self.unfinished.sum())
                if not running:
                    done = t
                    break
                if running <= COMPACT_BELOW * self.unfinished.shape[0]:
                    self._compact()
            elif t % CHECK_EVERY == 0 and t < steps and not bool(self.unfinished.any()):
                done = t
                break
        return self.tokens[:rows, :done], self.logprobs[:rows, :done]  # (rows, t) each

    def _compact(self) -> None:
        """Drop the finished rows from every per-row tensor (an eager loop on a CPU, whose step
        costs in proportion to its rows). The running rows keep their call row in
        :attr:`origin`, through which a step writes its tokens and takes its random draws:
        the tokens are those of the loop without compaction."""
        keep = self.unfinished.nonzero().squeeze(-1)  # (R',) running rows, in order
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, keep)  # (R', H_kv, L, D)
            layer.values = layer.values.index_select(0, keep)
            layer.batch_size = int(keep.shape[0])
        self.key_ok = self.key_ok.index_select(0, keep)  # (R', L)
        self.tokens_in = self.tokens_in.index_select(0, keep)  # (R', 1)
        self.position = self.position.index_select(0, keep)  # (R', 1)
        self.unfinished = self.unfinished.index_select(0, keep)  # (R',)
        base = self.origin if self.origin is not None else torch.arange(self.loaded)
        self.origin = base.to(keep.device).index_select(0, keep)  # (R',)
        names = self.model_kwargs.get("adapter_names")
        if names is not None:
            self.model_kwargs["adapter_names"] = [names[i] for i in keep.tolist()]


@contextmanager
def only_adapter(model: nn.Module, name: str | None, base_name: str) -> Iterator[None]:
    """Run a peft model with the adapter ``name`` active for every row, without
    ``adapter_names`` (``base_name`` or None: every adapter disabled); a plain model is left
    alone. The active adapter and every parameter's ``requires_grad`` are restored after."""
    if not hasattr(model, "peft_config") or name is None:
        yield
        return
    if name == base_name:
        with model.disable_adapter():
            yield
        return
    previous = model.active_adapter
    grads = {p: p.requires_grad for p in model.parameters()}
    model.set_adapter(name)
    try:
        yield
    finally:
        model.set_adapter(previous)
        for parameter, flag in grads.items():
            parameter.requires_grad_(flag)


__all__ = [
    "CHECK_EVERY",
    "LENGTH_STEP",
    "FixedLayer",
    "StaticDecoder",
    "length_bucket",
    "mask_is_additive",
    "only_adapter",
    "row_bucket",
    "sample_inverse_cdf",
]
