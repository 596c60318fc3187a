"""The Hugging Face transformers backend: batched generate with logprobs, LoRA adapters.

Every call to :meth:`HFBackend.generate` is ONE ``model.generate`` over all prompts x ``n``
samples, left-padded. Identical prompts (the G episodes of a GRPO group often show an agent the
same one) and the ``n`` samples of a prompt share one prefill: each distinct prompt (with its
adapter) runs through the model once, its key/value cache is indexed out to all its rows, and
``generate`` continues from that cache. When the distinct prompts under one adapter begin with
the same 16 tokens or more (a system prompt), that prefix runs once too, once per adapter, and
the padding goes between it and the rest of each prompt. The rest runs in buckets of similar
length, and decoding writes into a cache with room for the new tokens
(:mod:`marl.agents.kv_cache`); ``share_prompts=False`` turns all this off. On a CPU the prefill
is instead one packed row per adapter (``packed_prefill``, :meth:`HFBackend._packed_prefill`):
the distinct prompts as a token trie, so that every prefix they share runs once at whatever
depth they part (a scenario's text in the prompts of its group's episodes, not only the system
prompt), with no padding and one forward; the cache is gathered from it into left-padded rows.
A GPU keeps the buckets, whose shapes its decoding graphs replay. Several LoRA
adapters share the base model and still fit in that one call: peft routes each row to its
adapter through ``adapter_names=[...]`` (``"__base__"`` = no adapter).
The logprob reported for each sampled token is under the distribution it was sampled from
(temperature-scaled, top-p applied, by transformers' own warpers); for greedy decoding it is the
model's own distribution (temperature 1). A last logits processor draws each token itself (by
inverting the cumulative distribution, far cheaper than ``torch.multinomial`` over the whole
vocabulary) and records its logprob step by step, so memory stays ``rows x vocab`` rather than
``rows x tokens x vocab``. Decoding steps on a CPU use :mod:`marl.agents.attention`.

After the prefill, ``decode`` picks the decoding loop: ``"generate"`` is transformers'
``model.generate`` with the processors above; ``"static"`` is :mod:`marl.agents.decode`'s
fixed-shape step (same sampling, a cache of fixed size, no per-token host synchronisation);
``"graph"`` replays that step from a CUDA graph (mixed-adapter calls run it eagerly; on a CPU it
is ``"static"``). ``"auto"``: ``"graph"`` on CUDA, ``"static"`` on a CPU. There a step of
either loop costs the same (``bench/decode_loop.py``, fp32, one thread: 79 vs 79 ms at 4 rows,
139 vs 142 ms at 16) and gives the same floats, but a CPU step's cost grows with its rows, so
the static loop drops the rows that have finished (:meth:`StaticDecoder.run`): a call whose
replies end at different lengths decodes only the rows still running.
The static loops need our prefill; a call without it
(``share_prompts=False``, one-token prompts, a model with sliding-window layers, or flash/flex
attention) runs ``generate``.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from marl.agents.attention import runs_marl_attention, use_marl_attention
from marl.agents.backends.base import (
    BASE_ADAPTER,
    Generation,
    SamplingConfig,
    check_adapter_name,
    copy_weights,
    peft_lora_config,
    register_backend,
)
from marl.agents.decode import (
    StaticDecoder,
    length_bucket,
    mask_is_additive,
    only_adapter,
    row_bucket,
    sample_inverse_cdf,
)
from marl.agents.logprobs import (
    MIN_SHARED_PREFIX,
    cache_keyword,
    cache_rows,
    common_prefix_length,
    output_cache,
)
from marl.agents.mixed_lora import MixedAdapters, supports
from marl.agents.models import (
    ModelSpec,
    contiguous_head_input,
    load_model,
    transformers_model,
    with_lora,
)

DecodeMode = Literal["auto", "generate", "static", "graph"]
DECODE_MODES: tuple[str, ...] = ("auto", "generate", "static", "graph")
MAX_DECODERS = 4  # CUDA decoders kept (each holds a (rows, H, length, D) cache per layer)


@register_backend("hf")
class HFBackend:
    """A causal LM on one device, sampled with ``model.generate``.

    Build it from a loaded ``(model, tokenizer)`` or from a :class:`ModelSpec`. The first
    :meth:`add_adapter` wraps the model in place in a peft ``PeftModel``; removing the last
    adapter unwraps it again.
    """

    options: ClassVar[frozenset[str]] = frozenset({"share_prompts"})  # the run's, offered

    def __init__(
        self,
        model: nn.Module | ModelSpec | None = None,
        tokenizer: Any = None,
        *,
        spec: ModelSpec | None = None,
        device: str | torch.device | None = None,
        lora_config: Any = None,
        share_prompts: bool = True,
        decode: DecodeMode = "auto",
        packed_prefill: bool = True,
    ) -> None:
        if decode not in DECODE_MODES:
            choices = ", ".join(DECODE_MODES)
            raise ValueError(f"HFBackend: decode={decode!r} is not one of {choices}")
        if isinstance(model, ModelSpec):
            model, spec = None, model
        if model is None:
            if spec is None:
                raise ValueError("HFBackend needs either (model, tokenizer) or spec=ModelSpec(...)")
            model, tokenizer = load_model(spec, device)
        elif tokenizer is None:
            raise ValueError("HFBackend(model, tokenizer): the tokenizer is missing")
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"
        if device is not None:
            model = model.to(device)
        self.model: Any = use_marl_attention(contiguous_head_input(model.eval()))
        self.tokenizer = tokenizer
        self.lora_config = lora_config
        self.share_prompts = share_prompts  # one prefill per distinct prompt (module docstring)
        self.decode = decode  # the decoding loop after the prefill (module docstring)
        # a CPU's prefill as one packed row (module docstring); False: the length buckets
        self.packed_prefill = packed_prefill
        # CUDA: static decoders (with their graphs) by (row bucket, length bucket),
        # least recently used first, valid for the parameters at _decoder_weights' addresses
        self._decoders: OrderedDict[tuple[Any, ...], StaticDecoder] = OrderedDict()
        self._decoder_weights: tuple[int, ...] = ()
        # CUDA's fixed shapes (row and length buckets, the whole cache read every step) on a
        # CPU too, eagerly: lets the CPU tests run that code (not a user option)
        self._fixed_shapes_on_cpu = False
        self.graph_error: str | None = None  # why a CUDA graph capture failed (then: eager)
        # A model handed over already wrapped by peft keeps its adapters.
        self.adapters: set[str] = set(getattr(model, "peft_config", {}) or {})
        self.eos_ids = _eos_ids(model, tokenizer)
        # A clean generation config, so that sampling defaults shipped with a checkpoint
        # (temperature, top_k, min_p, repetition penalty...) never change what is sampled.
        from transformers import GenerationConfig

        self.model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=sorted(self.eos_ids),
            pad_token_id=tokenizer.pad_token_id,
        )

    # ------------------------------------------------------------------ generation

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live."""
        return next(self.model.parameters()).device

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        adapters: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[list[Generation]]:
        """``sampling.n`` completions for every prompt, from ONE batched decoding loop
        (``model.generate`` or the static loop, as ``decode`` says: module docstring)."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            bad = [i for i, p in enumerate(prompts) if len(p) == 0]
            raise ValueError(f"generate: prompts {bad} are empty; every prompt needs a token")
        n = sampling.n
        names: list[str] | None = None
        if self.adapters:
            names = self._adapter_rows(prompts, adapters)
        elif adapters is not None and any(a is not None for a in adapters):
            unknown = sorted({a for a in adapters if a is not None})
            raise KeyError(f"generate: unknown adapter(s) {unknown}; no adapters are loaded")
        # D distinct (prompt, adapter) pairs; prompt i fills rows i*n .. i*n+n-1 (R rows), each
        # a copy of its distinct pair's padded row
        distinct: dict[tuple[tuple[int, ...], str | None], int] = {}
        keys = [(tuple(p), names[i] if names else None) for i, p in enumerate(prompts)]
        source = [distinct.setdefault(key, len(distinct)) for key in keys for _ in range(n)]
        rows = torch.tensor(source)  # (R,): each row's distinct pair
        texts = [list(p) for p, _ in distinct]
        pair_adapters = [a for _, a in distinct]  # (D,)
        prefixes = [0] * len(texts)  # (D,): the prefix each shares with its adapter's prompts
        packed = self._packs_prefill(texts)  # one packed row: plain left padding, no head area
        if self.share_prompts and not packed:
            prefixes = shared_prefixes(texts, pair_adapters)
        unique_ids, unique_mask = self._left_pad(texts, prefixes)  # (D, P)
        input_ids, attention = unique_ids[rows], unique_mask[rows]  # (R, P), (R, P)
        kwargs: dict[str, Any] = {}
        if names is not None:
            kwargs["adapter_names"] = [name for name in names for _ in range(n)]

        if self.model.training:  # peft's per-row adapters need eval mode; no dropout in sampling
            self.model.eval()
        path = self._decode_path(unique_ids.shape[1])
        if path != "generate":
            with torch.inference_mode(), _seeded(seed, self.device):
                room = 0 if self._fixed_shapes() else sampling.max_new_tokens
                if packed:
                    prefill = self._packed_prefill(
                        texts,
                        rows.to(self.device),
                        pair_adapters if names is not None else None,
                        room,
                    )
                else:
                    prefill = self._prefill(
                        unique_ids,
                        unique_mask,
                        rows.to(self.device),
                        pair_adapters if names is not None else None,
                        prefixes,
                        room=room,
                    )
                new_tokens, token_logp = self._decode_static(
                    prefill, input_ids, attention, kwargs.get("adapter_names"), sampling, path
                )  # (R, t), (R, t)
            return self._collect(prompts, new_tokens.cpu(), token_logp.cpu(), n)
        from transformers import LogitsProcessorList

        recorder = _SampleAndRecord(sample=sampling.temperature > 0)
        processors = LogitsProcessorList([*_sampling_processors(sampling), recorder])
        with torch.inference_mode(), _seeded(seed, self.device):
            # our prefill even when nothing repeats: its length buckets and in-place cache
            # serve every call (share_prompts=False leaves all of it to transformers)
            if packed:
                kwargs[cache_keyword(self.model)] = self._packed_prefill(
                    texts,
                    rows.to(self.device),
                    pair_adapters if names is not None else None,
                    sampling.max_new_tokens,
                )
            elif self.share_prompts and unique_ids.shape[1] > 1:
                kwargs[cache_keyword(self.model)] = self._prefill(
                    unique_ids,
                    unique_mask,
                    rows.to(self.device),
                    pair_adapters if names is not None else None,
                    prefixes,
                    room=sampling.max_new_tokens,
                )
            sequences = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                generation_config=self._generation_config(sampling),
                logits_processor=processors,
                **kwargs,
            )  # (R, P + T)
        new_tokens = sequences[:, input_ids.shape[1] :]  # (R, T)
        token_logp = recorder.finish(new_tokens)  # (R, T)
        return self._collect(prompts, new_tokens.cpu(), token_logp.cpu(), n)

    def _decode_path(self, width: int) -> str:
        """The decoding loop of a call whose prompt layout is ``width`` wide: ``decode``
        resolved on this device, ``"generate"`` when the static loops cannot serve it."""
        from marl.agents.kv_cache import preallocatable

        cuda = self.device.type == "cuda"
        mode = ("graph" if cuda else "static") if self.decode == "auto" else self.decode
        if mode == "generate":
            return mode
        served = (
            self.share_prompts
            and width > 1
            and preallocatable(transformers_model(self.model).config)
            and mask_is_additive(self.model) is not None
        )
        if not served:
            return "generate"
        return "static" if mode == "graph" and not self._fixed_shapes() else mode

    def _decode_static(
        self,
        prefill: Any,
        input_ids: torch.Tensor,
        attention: torch.Tensor,
        row_names: list[str] | None,
        sampling: SamplingConfig,
        path: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode the rows ``input_ids`` / ``attention`` ``(R, P)`` from their ``prefill`` with
        a :class:`~marl.agents.decode.StaticDecoder`: eagerly, or on CUDA (``path="graph"``)
        by replaying its graph for the call's one adapter (``row_names``: peft's per row).
        Returns tokens and logprobs, ``(R, t)`` each."""
        r, width = input_ids.shape
        steps = sampling.max_new_tokens
        last = input_ids[:, -1]  # (R,) each row's last prompt token
        how = (_sampling_processors(sampling), sampling.temperature > 0)  # warpers, sample
        if not self._fixed_shapes():  # a CPU: the prefill's own buffers and room, trimmed
            buffers = [layer.buffers() for layer in prefill.layers]
            decoder = self._decoder(buffers, trim=True)
            if row_names is None or len(set(row_names)) == 1:  # one adapter for every row:
                adapter = row_names[0] if row_names else None  # made the only active one,
                with only_adapter(self.model, adapter, BASE_ADAPTER):  # not routed per row
                    decoder.load(None, attention, last, *how)
                    return decoder.run(steps, r)
            decoder.load(None, attention, last, *how, row_names)
            return decoder.run(steps, r)
        decoder = self._cached_decoder(prefill, r, width - 1 + steps)
        if path == "graph" and not self.graph_error:
            routed = self._graph_routing(decoder, row_names)
            if routed is not None:
                route, context = routed
                key = (route, sampling.temperature, sampling.top_p)
                with context:
                    if key not in decoder.graphs:
                        decoder.load(prefill, attention, last, *how)
                        self._capture(decoder, key)
                    if key in decoder.graphs:
                        decoder.load(prefill, attention, last, *how)
                        return decoder.run(steps, r, decoder.graphs[key])
        decoder.load(prefill, attention, last, *how, row_names)
        return decoder.run(steps, r)

    def _graph_routing(
        self, decoder: StaticDecoder, row_names: list[str] | None
    ) -> tuple[Any, Any] | None:
        """How a graph routes the call's rows to adapters: (the graph key's route, the context
        to capture and replay in), or None when no graph can (an adapter kind the stacked
        routing does not cover). One adapter for every row: made the only active one. Mixed
        adapters: :class:`~marl.agents.mixed_lora.MixedAdapters`, one per decoder and set of
        adapters (its buffers are what the graph reads), refreshed from the live weights and
        loaded with this call's rows."""
        if row_names is None or len(set(row_names)) == 1:
            adapter = row_names[0] if row_names else None
            return adapter, only_adapter(self.model, adapter, BASE_ADAPTER)
        names = tuple(sorted({n for n in row_names if n not in (None, BASE_ADAPTER)}))
        mixed = decoder.mixed.get(names)
        if mixed is None:
            if not supports(self.model, names):
                return None
            mixed = decoder.mixed[names] = MixedAdapters(self.model, names, decoder.rows)
        mixed.refresh()
        mixed.load(row_names)
        return ("mixed", names), mixed.active()

    def _capture(self, decoder: StaticDecoder, key: Any) -> None:
        """Capture ``decoder``'s step for ``key``; a capture CUDA refuses makes this backend
        warn once and decode eagerly from then on."""
        try:
            decoder.capture(key)
        except RuntimeError as err:
            self.graph_error = f"{type(err).__name__}: {err}"
            warnings.warn(
                f"HFBackend: CUDA graph capture failed, decoding eagerly from now "
                f"on ({self.graph_error})",
                RuntimeWarning,
                stacklevel=3,
            )

    def _fixed_shapes(self) -> bool:
        """Decode in bucketed shapes that a CUDA graph can replay (on CUDA, or when a test
        asks for them on a CPU)."""
        return self.device.type == "cuda" or self._fixed_shapes_on_cpu

    def _decoder(
        self, buffers: list[tuple[torch.Tensor, torch.Tensor]], trim: bool = False
    ) -> StaticDecoder:
        """A static decoder on ``buffers`` (per layer, keys and values)."""
        return StaticDecoder(
            self.model,
            buffers,
            eos_ids=sorted(self.eos_ids),
            pad_id=self.tokenizer.pad_token_id,
            additive_mask=bool(mask_is_additive(self.model)),
            cache_keyword=cache_keyword(self.model),
            trim=trim,
        )

    def _cached_decoder(self, prefill: Any, rows: int, length: int) -> StaticDecoder:
        """The CUDA decoder for ``rows`` rows and ``length`` cache positions, both rounded up to
        their buckets: reused when a call of those buckets ran before (its graphs
        with it), else made with zeroed buffers shaped like ``prefill``'s, the least recently
        used dropped past :data:`MAX_DECODERS`. All are dropped when a parameter moved (a graph
        reads the addresses it was captured with)."""
        weights = tuple(p.data_ptr() for p in self.model.parameters())
        if weights != self._decoder_weights:
            self._decoders.clear()
            self._decoder_weights = weights
        rb, lb = row_bucket(rows), length_bucket(length)
        key = (rb, lb)
        decoder = self._decoders.pop(key, None)
        if decoder is None:
            while len(self._decoders) >= MAX_DECODERS:
                self._decoders.popitem(last=False)
            buffers = []
            for layer in prefill.layers:
                k, v = layer.keys, layer.values  # (R, H_kv, P - 1, D)
                buffers.append(
                    (
                        k.new_zeros(rb, k.shape[1], lb, k.shape[3]),  # (Rb, H_kv, Lb, D)
                        v.new_zeros(rb, v.shape[1], lb, v.shape[3]),
                    )
                )
            decoder = self._decoder(buffers)
        self._decoders[key] = decoder  # the most recently used last
        return decoder

    def _packs_prefill(self, texts: Sequence[Sequence[int]]) -> bool:
        """Whether a call's prefill runs as one packed row (:meth:`_packed_prefill`): with
        ``share_prompts``, on the platform's attention, a model whose cache can be laid out
        (no sliding-window layers), on a CPU (a GPU keeps the fixed buckets its graphs
        replay), and some prompt with more than its last token."""
        from marl.agents.kv_cache import preallocatable

        return (
            self.share_prompts
            and self.packed_prefill
            and not self._fixed_shapes()
            and runs_marl_attention(self.model)
            and preallocatable(transformers_model(self.model).config)
            and max(len(t) for t in texts) > 1
        )

    def _packed_prefill(
        self,
        texts: Sequence[Sequence[int]],
        rows: torch.Tensor,
        adapter_names: list[str | None] | None,
        room: int,
    ) -> Any:
        """The key/value cache of every distinct prompt's tokens but its last (``texts``, D of
        them), laid out for the ``rows`` ``(R,)`` as :meth:`_left_pad` lays out the prompts
        with no prefixes (each right-aligned in ``W`` = the longest minus one), with ``room``
        spare positions a layer: from one forward per adapter over a packed row
        (:func:`marl.agents.packing.pack_prompts`) in which every prefix the prompts share
        runs once, at whatever depth they part (the system prompt of all of them, a scenario's
        text in the prompts of its group's episodes), and no position is padding. Positions
        are depths, as the left-padded rows' are; each layer's keys and values are gathered
        from the packed nodes into the rows."""
        from transformers.cache_utils import DynamicCache

        from marl.agents.kv_cache import PreallocatedLayer
        from marl.agents.packing import pack_prompts

        width = max(len(t) for t in texts) - 1  # W
        names = adapter_names if adapter_names is not None else [None] * len(texts)
        groups: dict[str | None, list[int]] = {}
        for i, name in enumerate(names):
            if len(texts[i]) > 1:  # a one-token prompt has nothing to prefill: all padding
                groups.setdefault(name, []).append(i)
        keys: list[torch.Tensor] = []  # per layer (D, H_kv, W + room, D_h); zeros on padding
        values: list[torch.Tensor] = []
        for name, members in groups.items():
            layout, where = pack_prompts([texts[i][:-1] for i in members], self.device)
            captured: list[tuple[torch.Tensor, torch.Tensor]] = []
            extra = {"adapter_names": [name]} if adapter_names is not None else {}
            self.model(
                input_ids=layout.input_ids,  # (1, N)
                position_ids=layout.position_ids,  # (1, N) depths
                attention_mask=layout.chunk_mask,  # 4D: passed on unchanged
                packed_layout=layout,
                packed_kv=captured,
                logits_to_keep=1,
                use_cache=False,
                **extra,
            )
            span = where.shape[1]  # w: this adapter's longest prompt but its last token
            index = torch.tensor(members, device=self.device)  # (n,)
            flat = where.reshape(-1)  # (n * w,) node indices, N on the padding
            for layer, pair in enumerate(captured):
                if len(keys) <= layer:
                    k0 = pair[0]  # (1, H_kv, N, D_h)
                    shape = (len(texts), k0.shape[1], width + room, k0.shape[3])
                    keys.append(k0.new_zeros(shape))
                    values.append(k0.new_zeros(shape))
                for target, tensor in zip((keys[layer], values[layer]), pair, strict=True):
                    nodes = torch.cat([tensor[0], tensor.new_zeros(tensor[0, :, :1].shape)], 1)
                    gathered = nodes.index_select(1, flat)  # (H_kv, n * w, D_h)
                    gathered = gathered.view(nodes.shape[0], len(members), span, -1)
                    target[index, :, width - span : width] = gathered.transpose(0, 1)
        same_rows = len(rows) == len(texts) and bool(
            (rows == torch.arange(len(texts), device=rows.device)).all()
        )  # each distinct prompt is its own row (n = 1, nothing repeated): no copy
        cache = DynamicCache()
        for k, v in zip(keys, values, strict=True):  # (D, H_kv, W + room, D_h) -> (R, ...)
            if not same_rows:
                k, v = k.index_select(0, rows), v.index_select(0, rows)
            cache.layers.append(PreallocatedLayer(k, v, width, room))
        return cache

    def _prefill(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        rows: torch.Tensor,
        adapter_names: list[str | None] | None,
        prefixes: Sequence[int],
        room: int = 0,
    ) -> Any:
        """The key/value cache of every distinct prompt's tokens but its last, ``ids`` and
        ``mask`` ``(D, P)`` (laid out by :meth:`_left_pad` with ``prefixes``), computed once and
        laid out for the ``rows`` ``(R,)``: ``generate`` then runs only each row's last prompt
        token before sampling.

        A prompt's first ``prefixes[i]`` tokens are common to all the prompts of its adapter
        (:func:`shared_prefixes`): each such prefix runs once, in one forward for all adapters
        (a row each, left-padded to the longest; an adapter changes the keys and values, so
        rows under different adapters cannot share them). The rest of each prompt runs on its
        prefix's cache in buckets of similar length
        (:func:`~marl.agents.kv_cache.prefill_buckets`), so that a short prompt is not padded
        to the longest of the call. Each layer of the cache returned has ``room`` spare
        positions, which decoding fills in place (:mod:`marl.agents.kv_cache`)."""
        from marl.agents.kv_cache import assemble_rows, preallocatable, prefill_buckets

        d, width = ids.shape
        prefix = max(prefixes)  # the head area: each row's prefix, right-aligned in it
        own = width - 1 - prefix  # positions between the head area and the last token
        head_cache, head_of = self._prefill_heads(ids, mask, adapter_names, prefixes)
        lengths = mask[:, prefix:-1].sum(dim=-1).tolist()  # (D,) each row's own positions
        if not prefix:  # nothing cached yet: every bucket runs a forward, of one position at least
            lengths = [max(1, length) for length in lengths]
        starts = torch.tensor(prefixes, device=ids.device)  # (D,) where each own part begins
        plain = preallocatable(transformers_model(self.model).config)
        buckets = prefill_buckets(lengths) if plain else [list(range(d))]
        parts: list[tuple[torch.Tensor, Any]] = []
        for bucket in buckets:
            members = torch.tensor(bucket, dtype=torch.long, device=ids.device)  # (n_b,)
            cache = None
            if head_cache is not None:
                cache = cache_rows(head_cache, head_of[members])  # (n_b, ...) copies
            span = max(lengths[i] for i in bucket)
            if span:
                window = slice(width - 1 - span, width - 1)  # the bucket's longest own part
                own_mask = mask[members, window]  # (n_b, span), left-padded
                kwargs: dict[str, Any] = {}
                if adapter_names is not None:
                    kwargs["adapter_names"] = [adapter_names[i] for i in bucket]
                if cache is not None:
                    kwargs[cache_keyword(self.model)] = cache
                out = self.model(
                    input_ids=ids[members, window],  # (n_b, span)
                    attention_mask=torch.cat([mask[members, :prefix], own_mask], dim=1),
                    position_ids=starts[members, None] + (own_mask.cumsum(dim=-1) - 1).clamp(min=0),
                    use_cache=True,
                    logits_to_keep=1,
                    **kwargs,
                )
                cache = output_cache(out)
            assert cache is not None  # P > 1: a prefix, or at least one token before the last
            parts.append((members, cache))
        if not plain:  # one bucket, transformers' own row selection, without room
            cache = parts[0][1]
            cache.batch_select_indices(rows)
            return cache
        # (R, H, prefix + own + room, D) a layer: each row's head area, padding, own positions
        return assemble_rows(parts, rows, prefix, own, room)

    def _prefill_heads(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        adapter_names: list[str | None] | None,
        prefixes: Sequence[int],
    ) -> tuple[Any, torch.Tensor]:
        """The caches of the call's shared prefixes, ``(heads, H, head area, D)`` a layer (None
        when no prompt shares one), and for each distinct prompt ``(D,)`` the index of its
        prefix's row. A head is a distinct ``(adapter, prefix length)``, its tokens those of its
        first prompt. When some prompt shares nothing, a last row of zeros (masked) serves it."""
        d, area = ids.shape[0], max(prefixes)
        if not area:
            return None, torch.zeros(d, dtype=torch.long, device=ids.device)
        keys = [(adapter_names[i] if adapter_names else None, prefixes[i]) for i in range(d)]
        heads: dict[tuple[str | None, int], int] = {}
        first: list[int] = []  # (heads,) the prompt whose tokens run for each head
        for i, key in enumerate(keys):
            if key[1] and key not in heads:
                heads[key] = len(heads)
                first.append(i)
        head_of = torch.tensor([heads.get(k, len(heads)) for k in keys], device=ids.device)
        chosen = torch.tensor(first, device=ids.device)  # (heads,)
        head_mask = mask[chosen, :area]  # (heads, area), left-padded
        extra = {"adapter_names": [keys[i][0] for i in first]} if adapter_names else {}
        out = self.model(
            input_ids=ids[chosen, :area],
            attention_mask=head_mask,
            position_ids=(head_mask.cumsum(dim=-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
            **extra,
        )
        cache = output_cache(out)
        padding = head_mask == 0  # (heads, area); none with one head or prefixes of one length
        padded = bool(padding.any())
        unshared = bool((head_of == len(heads)).any())  # a prompt with no prefix of its own
        if padded or unshared:
            for layer in cache.layers:
                for attribute in ("keys", "values"):
                    tensor = getattr(layer, attribute)  # (heads, H, area, D)
                    if padded:  # masked positions hold zeros (0 x NaN would be NaN)
                        tensor = tensor.masked_fill(padding[:, None, :, None], 0)
                    if unshared:
                        tensor = torch.cat([tensor, tensor.new_zeros(tensor[:1].shape)])
                    setattr(layer, attribute, tensor)
        return cache, head_of

    def _left_pad(
        self, rows: list[list[int]], prefixes: Sequence[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-pad token id lists into ``(input_ids, attention_mask)``, both (R, P). With
        ``prefixes`` (a shared prefix length per row) each row is laid out in two areas: its
        prefix right-aligned in a head area as wide as the longest prefix, then the rest of the
        row right-aligned after it. Rows whose prefixes are the same then hold it at the same
        positions, and so does every row's last token. With no prefixes: plain left padding."""
        prefixes = list(prefixes) if prefixes is not None else [0] * len(rows)
        area = max(prefixes)
        length = area + max(len(r) - p for r, p in zip(rows, prefixes, strict=True))
        ids = torch.full((len(rows), length), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(rows), length, dtype=torch.long)
        for i, (row, prefix) in enumerate(zip(rows, prefixes, strict=True)):
            rest = len(row) - prefix
            ids[i, length - rest :] = torch.tensor(row[prefix:], dtype=torch.long)
            mask[i, length - rest :] = 1
            if prefix:
                ids[i, area - prefix : area] = torch.tensor(row[:prefix], dtype=torch.long)
                mask[i, area - prefix : area] = 1
        return ids.to(self.device), mask.to(self.device)

    def _generation_config(self, sampling: SamplingConfig) -> Any:
        """Greedy, with no processor of its own: ours are passed explicitly, and the last of
        them (:class:`_SampleAndRecord`) does the sampling and leaves one token to take."""
        from transformers import GenerationConfig

        return GenerationConfig(
            do_sample=False,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=sorted(self.eos_ids),
            num_beams=1,
        )

    def _collect(
        self, prompts: Sequence[Sequence[int]], tokens: torch.Tensor, logp: torch.Tensor, n: int
    ) -> list[list[Generation]]:
        """Cut each row after its first EOS (kept) and group the rows by prompt."""
        results: list[list[Generation]] = []
        for i, prompt in enumerate(prompts):
            group = []
            for row in range(i * n, (i + 1) * n):
                ids = tokens[row].tolist()
                stop = next((j for j, t in enumerate(ids) if t in self.eos_ids), None)
                end = len(ids) if stop is None else stop + 1
                response = ids[:end]
                group.append(
                    Generation(
                        prompt_ids=list(prompt),
                        response_ids=response,
                        logprobs=logp[row, :end].tolist(),
                        text=self.tokenizer.decode(response, skip_special_tokens=True),
                        finish_reason="length" if stop is None else "stop",
                    )
                )
            results.append(group)
        return results

    # ------------------------------------------------------------------ weights and adapters

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy base-model weights in (names as in the plain model's ``state_dict()``).

        Works whether or not adapters are loaded. Keys not given keep their values; a key the
        model does not have is an error.
        """
        copy_weights(self._base_parameters(), state_dict)

    def _base_parameters(self) -> dict[str, torch.Tensor]:
        """The base model's tensors by their plain (un-peft-wrapped) names."""
        base = transformers_model(self.model)
        out = {}
        for name, tensor in base.state_dict(keep_vars=True).items():
            if "lora_" in name:
                continue
            out[name.replace(".base_layer.", ".")] = tensor
        return out

    def add_adapter(
        self, name: str, state_dict: Mapping[str, torch.Tensor] | None = None, config: Any = None
    ) -> None:
        """Add (or overwrite) the LoRA adapter ``name``.

        ``state_dict`` is as returned by ``peft.get_peft_model_state_dict`` (``None`` = a fresh
        adapter, which leaves the outputs unchanged until trained). ``config`` is a peft
        ``LoraConfig``; default: the adapter's own for one already loaded, else the backend's
        ``lora_config`` or :class:`LoraSettings`'s defaults. New weights for a loaded adapter of
        the same shape (a learner's sync) are copied into its tensors in place: nothing is
        allocated, and captured decoding graphs stay valid.
        """
        from peft import PeftModel, set_peft_model_state_dict

        check_adapter_name(name)
        if name in self.adapters and state_dict is not None:
            loaded = self.model.peft_config[name]
            if config is None or _same_lora_shape(config, loaded):
                result = set_peft_model_state_dict(self.model, dict(state_dict), adapter_name=name)
                if result.unexpected_keys:
                    raise KeyError(
                        f"add_adapter {name!r}: state dict keys do not fit the model, e.g. "
                        f"{list(result.unexpected_keys)[:3]}"
                    )
                self.model.eval()
                return
        self._decoders.clear()  # their graphs hold the adapters' old parameters
        config = config or self.lora_config or peft_lora_config()
        if name in self.adapters:
            self.remove_adapter(name)
        if not isinstance(self.model, PeftModel):
            self.model = with_lora(self.model, config, name)
        else:
            self.model.add_adapter(name, config)
        self.adapters.add(name)
        if state_dict is not None:
            result = set_peft_model_state_dict(self.model, dict(state_dict), adapter_name=name)
            if result.unexpected_keys:
                self.remove_adapter(name)
                raise KeyError(
                    f"add_adapter {name!r}: state dict keys do not fit the model, e.g. "
                    f"{list(result.unexpected_keys)[:3]}"
                )
        self.model.eval()

    def remove_adapter(self, name: str) -> None:
        """Drop the adapter ``name``; dropping the last one restores the plain model."""
        if name not in self.adapters:
            known = ", ".join(sorted(self.adapters)) or "none"
            raise KeyError(f"remove_adapter: unknown adapter {name!r}; loaded adapters: {known}")
        self._decoders.clear()
        if len(self.adapters) == 1:
            self.model = self.model.unload().eval()  # drops every LoRA layer, returns the base
        else:
            with warnings.catch_warnings():  # "active adapter deleted": rows name theirs anyway
                warnings.simplefilter("ignore", UserWarning)
                self.model.delete_adapter(name)
        self.adapters.discard(name)

    def _adapter_rows(
        self, prompts: Sequence[Sequence[int]], adapters: Sequence[str | None] | None
    ) -> list[str]:
        """Per prompt, the peft adapter name (``"__base__"`` for None)."""
        if adapters is None:
            return [BASE_ADAPTER] * len(prompts)
        if len(adapters) != len(prompts):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(adapters)} adapter names")
        unknown = sorted({a for a in adapters if a is not None and a not in self.adapters})
        if unknown:
            raise KeyError(
                f"generate: unknown adapter(s) {unknown}; loaded adapters: {sorted(self.adapters)}"
            )
        return [BASE_ADAPTER if a is None else a for a in adapters]


def shared_prefixes(texts: Sequence[Sequence[int]], adapters: Sequence[str | None]) -> list[int]:
    """For each of ``texts`` (distinct prompts, each under ``adapters[i]``), the length of the
    prefix it shares with every other prompt of its adapter: run once a call for all of them.
    0 for a prompt alone under its adapter, or when the common part is shorter than
    ``MIN_SHARED_PREFIX`` tokens; a prompt keeps at least one token after its prefix."""
    groups: dict[str | None, list[int]] = {}
    for i, adapter in enumerate(adapters):
        groups.setdefault(adapter, []).append(i)
    prefixes = [0] * len(texts)
    for members in groups.values():
        length = common_prefix_length([texts[i] for i in members])
        if length >= MIN_SHARED_PREFIX:
            for i in members:
                prefixes[i] = length
    return prefixes


def _same_lora_shape(config: Any, loaded: Any) -> bool:
    """Whether the LoRA ``config`` builds the same tensors and scaling as the ``loaded`` one."""
    keys = ("r", "lora_alpha", "use_rslora", "bias", "lora_dropout")
    same = all(getattr(config, k, None) == getattr(loaded, k, None) for k in keys)
    return same and set(config.target_modules or ()) == set(loaded.target_modules or ())


def _sampling_processors(sampling: SamplingConfig) -> list[Any]:
    """transformers' own temperature and top-p warpers, for the list that ends in the recorder."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    if sampling.temperature == 0:
        return []  # greedy: the recorder sees the raw logits
    warpers: list[Any] = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=sampling.top_p, min_tokens_to_keep=1))
    return warpers


class _SampleAndRecord:
    """Last logits processor: draws each row's next token itself and keeps its logprob.

    It sees the exact scores the token is drawn from (after temperature and top-p). Greedy
    decoding takes the argmax; sampling inverts the cumulative distribution at one uniform draw
    per row (torch's RNG, so ``_seeded`` makes it reproducible). That is the same distribution as
    ``torch.multinomial``, which transformers' sampling calls, but multinomial draws an
    exponential variate for every vocabulary entry of every row: 49,152 per row and step on
    SmolLM2, about a quarter of a 16-row decoding step on this CPU. It returns scores that are
    ``-inf`` but at the chosen token, and ``generate`` runs greedy, so it takes that token.
    Memory stays one ``(R, V)`` distribution at a time (``output_scores`` keeps ``R x T x V``).
    """

    def __init__(self, sample: bool) -> None:
        self.sample = sample
        self.steps: list[torch.Tensor] = []  # T tensors of (R,): each chosen token's logprob

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(scores.float(), dim=-1)  # (R, V)
        if self.sample:
            chosen = sample_inverse_cdf(logp)  # (R,)
        else:
            chosen = logp.argmax(dim=-1)  # (R,)
        self.steps.append(logp.gather(-1, chosen[:, None]).squeeze(-1))  # (R,)
        only = torch.full_like(scores, float("-inf"))  # (R, V)
        return only.scatter_(-1, chosen[:, None], 0.0)

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """Logprob of every generated token, (R, T), given the generated tokens (R, T)."""
        if len(self.steps) != new_tokens.shape[1]:
            raise RuntimeError(
                f"logprob recorder saw {len(self.steps)} steps for {new_tokens.shape[1]} tokens"
            )
        return torch.stack(self.steps, dim=1)  # (R, T)


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG for one block, then restore the caller's RNG state (no seed: no-op)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


def _eos_ids(model: nn.Module, tokenizer: Any) -> set[int]:
    """Every token id that ends a response: the tokenizer's eos and the model's."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(e) for e in gen_eos)
    if not ids:
        raise ValueError("HFBackend: the tokenizer and the model name no eos token")
    return ids


__all__ = ["DECODE_MODES", "HFBackend", "sample_inverse_cdf"]
