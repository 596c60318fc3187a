"""The static decoding loop (:mod:`marl.agents.decode`) against transformers' ``generate``.

On a CPU the loop runs eagerly on the prefill's own buffers and must give what
``decode="generate"`` gives: the same tokens and finish reasons, with seeds, temperature, top-p,
shared prefixes, EOS at different steps, several LoRA adapters and ``n`` samples; the same
logprobs bit for bit while every row runs, to float rounding once finished rows are dropped.
The shapes a CUDA graph replays (rows and cache length in buckets, dummy rows, the whole cache
read each step) run eagerly on a CPU too; a CUDA-only test checks that graph replays give what
the same loop gives eagerly.
"""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model_state_dict

from marl.agents import decode as decode_module
from marl.agents.backends import SamplingConfig
from marl.agents.backends.base import BASE_ADAPTER
from marl.agents.backends.hf import HFBackend
from marl.agents.decode import StaticDecoder, length_bucket, only_adapter, row_bucket
from marl.agents.models import ModelSpec, load_model

SYSTEM = "You play a signalling game with a partner. Answer with one line of markup."


def _chat(tok, text: str, system: str | None = None) -> list[int]:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": text})
    return tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )


def _prompts(tok) -> list[list[int]]:
    return [_chat(tok, "hi"), _chat(tok, "what is two plus two?"), _chat(tok, "go north, then")]


def _system_prompts(tok) -> list[list[int]]:
    """Distinct prompts under one system prompt (a shared prefix), one of them twice."""
    texts = ["Target: red.", "You heard: blue circle. Pick one.", "Hi", "Target: red."]
    return [_chat(tok, text, SYSTEM) for text in texts]


def _no_generate(backend: HFBackend) -> HFBackend:
    """Make ``model.generate`` fail on this backend's model: the static loop must not call it."""

    def refuse(*args, **kwargs):
        raise AssertionError("model.generate ran; the static loop should have decoded")

    backend.model.generate = refuse
    return backend


def _pair(seed: int = 0, adapters: int = 0) -> tuple[HFBackend, HFBackend]:
    """Two backends on two copies of one tiny model (same weights and adapters): transformers'
    generate, and the static loop."""
    made = []
    for decode in ("generate", "static"):
        model, tok = load_model(ModelSpec(seed=seed))
        backend = HFBackend(model, tok, decode=decode)
        for i in range(adapters):
            _add_random_adapter(backend, f"lora{i}", seed=i + 1)
        made.append(backend)
    return made[0], _no_generate(made[1])


def _add_random_adapter(backend: HFBackend, name: str, seed: int) -> None:
    backend.add_adapter(name)
    state = get_peft_model_state_dict(backend.model, adapter_name=name)
    gen = torch.Generator().manual_seed(seed)
    random = {k: torch.randn(v.shape, generator=gen) * 0.5 for k, v in state.items()}
    backend.add_adapter(name, random)


def _outputs(groups) -> list[tuple[list[int], list[float], str]]:
    return [(g.response_ids, g.logprobs, g.finish_reason) for group in groups for g in group]


def _assert_same(got, want, bitwise: bool = False) -> None:
    """The same generations: tokens and finish reasons exactly, logprobs to float rounding (once
    the loop drops finished rows, a smaller batch's matmuls round differently), or bit for bit
    (``bitwise``)."""
    assert len(got) == len(want)
    for (ids_a, lp_a, why_a), (ids_b, lp_b, why_b) in zip(got, want, strict=True):
        assert ids_a == ids_b
        if bitwise:
            assert lp_a == lp_b
        else:
            torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5, rtol=0)
        assert why_a == why_b


SAMPLINGS = [
    pytest.param(SamplingConfig(max_new_tokens=12, temperature=0.0, n=2), None, id="greedy"),
    pytest.param(SamplingConfig(max_new_tokens=16, temperature=1.0, n=3), 7, id="sampled"),
    pytest.param(SamplingConfig(max_new_tokens=16, temperature=0.7, top_p=0.9, n=2), 1, id="top-p"),
    pytest.param(
        SamplingConfig(max_new_tokens=16, temperature=1.5, top_p=0.5, n=2), 2, id="hot-top-p"
    ),
]


@pytest.mark.parametrize(("sampling", "seed"), SAMPLINGS)
def test_static_loop_equals_generate(
    sampling: SamplingConfig, seed: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    generate, static = _pair()
    prompts = _prompts(generate.tokenizer)
    want = _outputs(generate.generate(prompts, sampling, seed=seed))
    got = _outputs(static.generate(prompts, sampling, seed=seed))
    _assert_same(got, want)
    monkeypatch.setattr(decode_module, "COMPACT_BELOW", 0.0)  # every row to the end, as generate
    _assert_same(_outputs(static.generate(prompts, sampling, seed=seed)), want, bitwise=True)
    if sampling.temperature > 0:  # n draws, not copies: the sampling really ran
        assert len({tuple(ids) for ids, _, _ in got[: sampling.n]}) > 1


def test_eager_attention_takes_an_additive_mask() -> None:
    """A model on transformers' ``eager`` attention gets a float mask (0 or the dtype's
    minimum), not a boolean one; still exactly what generate gives."""
    made = []
    for decode in ("generate", "static"):
        model, tok = load_model(ModelSpec(seed=1))
        model.set_attn_implementation("eager")
        made.append(HFBackend(model, tok, decode=decode))
    generate, static = made[0], _no_generate(made[1])
    assert static.model.config._attn_implementation == "eager"
    prompts = _system_prompts(static.tokenizer)
    for sampling, seed in [
        (SamplingConfig(max_new_tokens=12, temperature=0.0, n=2), None),
        (SamplingConfig(max_new_tokens=12, temperature=0.8, top_p=0.9, n=2), 3),
    ]:
        want = _outputs(generate.generate(prompts, sampling, seed=seed))
        _assert_same(_outputs(static.generate(prompts, sampling, seed=seed)), want)


def test_rows_stopping_at_eos_at_different_steps() -> None:
    # A random 101-token model emits EOS about once in 100 draws; at temperature 3 over
    # 3 x 8 rows x 40 tokens some rows stop (at different steps) and some run to the limit.
    generate, static = _pair()
    prompts = _prompts(generate.tokenizer)
    sampling = SamplingConfig(max_new_tokens=40, temperature=3.0, n=8)
    want = _outputs(generate.generate(prompts, sampling, seed=0))
    rows: list[int] = []  # each forward's batch: the prefill's, then every decoding step's
    hook = static.model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    got = _outputs(static.generate(prompts, sampling, seed=0))
    hook.remove()
    _assert_same(got, want)  # the rows dropped on the way took the same draws
    steps = rows[-max(len(ids) for ids, _, _ in got) :]  # the decoding steps
    assert steps[0] == 24 and steps[-1] < 24, steps  # finished rows were dropped...
    assert steps == sorted(steps, reverse=True)  # ...never to come back
    stopped = [ids for ids, _, why in got if why == "stop"]
    assert stopped and any(why == "length" for _, _, why in got)
    assert len({len(ids) for ids in stopped}) > 1
    assert all(ids[-1] == static.tokenizer.eos_token_id for ids in stopped)


def test_every_row_finished_stops_the_loop_early() -> None:
    """Prompts ending in EOS: the tiny tied-embedding model greedily repeats its last token, so
    every row stops at once. The eager loop on a CPU looks every step and ends after the first,
    not at 40; the fixed shapes of a CUDA graph look every 8 steps."""
    generate, static = _pair()
    eos = static.tokenizer.eos_token_id
    prompts = [p + [eos] for p in _prompts(static.tokenizer)]
    sampling = SamplingConfig(max_new_tokens=40, temperature=0.0)
    forwards = []
    hook = static.model.register_forward_pre_hook(lambda *args: forwards.append(1))
    got = _outputs(static.generate(prompts, sampling))
    hook.remove()
    _assert_same(got, _outputs(generate.generate(prompts, sampling)))
    assert [ids for ids, _, _ in got] == [[eos]] * 3
    steps = len(forwards) - 1  # one prefill forward (no shared prefix, one length bucket)
    assert steps == 1
    # a finished row decodes on with the pad token (as in generate), not with what it samples
    static._fixed_shapes_on_cpu = True  # a decoder the backend keeps, to look into
    static.generate(prompts, sampling)
    decoder = next(iter(static._decoders.values()))
    pad = static.tokenizer.pad_token_id
    assert pad != eos
    assert decoder.tokens[:3, :8].tolist() == [[eos] + [pad] * 7] * 3
    assert decoder.column.item() == 8 and not decoder.unfinished.any()


@pytest.mark.parametrize(("sampling", "seed"), SAMPLINGS[:3])
def test_shared_prefixes(sampling: SamplingConfig, seed: int | None) -> None:
    generate, static = _pair(seed=3)
    prompts = _system_prompts(generate.tokenizer)
    want = _outputs(generate.generate(prompts, sampling, seed=seed))
    got = _outputs(static.generate(prompts, sampling, seed=seed))
    _assert_same(got, want)


@pytest.mark.parametrize(("sampling", "seed"), SAMPLINGS[:3])
def test_several_lora_adapters_in_one_call(sampling: SamplingConfig, seed: int | None) -> None:
    generate, static = _pair(seed=2, adapters=3)
    tok = generate.tokenizer
    prompts = [*_system_prompts(tok), *_prompts(tok)]
    adapters = ["lora0", "lora1", None, "lora0", "lora2", None, "lora1"]
    want = _outputs(generate.generate(prompts, sampling, adapters=adapters, seed=seed))
    got = _outputs(static.generate(prompts, sampling, adapters=adapters, seed=seed))
    _assert_same(got, want)
    # the adapters matter: the same prompt under another adapter gives other logprobs
    alone = _outputs(static.generate([prompts[0]], sampling, adapters=["lora1"], seed=seed))
    assert alone[0][1][:3] != got[0][1][:3]


def test_graph_shapes_on_a_cpu_match_generate() -> None:
    """The code a CUDA graph replays, run eagerly: rows padded to a bucket with dummy rows,
    the cache copied into buffers of a bucketed length, every position read with a mask.
    Reading masked positions changes float rounding only: the same tokens, logprobs to 1e-5."""
    generate, static = _pair(adapters=2)
    static._fixed_shapes_on_cpu = True
    prompts = _prompts(static.tokenizer)
    greedy = SamplingConfig(max_new_tokens=12, temperature=0.0, n=2)  # 6 rows in a bucket of 8
    for adapters in (None, ["lora0", "lora1", None], ["lora1"] * 3):
        want = _outputs(generate.generate(prompts, greedy, adapters=adapters))
        got = _outputs(static.generate(prompts, greedy, adapters=adapters))
        for (ids_a, lp_a, _), (ids_b, lp_b, _) in zip(got, want, strict=True):
            assert ids_a == ids_b
            torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5, rtol=0)
    assert len(static._decoders) == 1  # one bucket: the decoder is reused by each call
    (rows, length), decoder = next(iter(static._decoders.items()))
    width = max(len(p) for p in prompts)  # no shared prefix here: the layout is the longest
    assert (rows, length) == (8, length_bucket(width - 1 + 12)) == (8, 64)
    assert decoder.rows == 8 and decoder.length == 64
    # sampled with a seed: 8 rows fill their bucket, so the RNG draws what generate draws
    sampled = SamplingConfig(max_new_tokens=16, temperature=1.0, n=2)
    four = [*prompts, _chat(static.tokenizer, "and then?")]
    want = _outputs(generate.generate(four, sampled, seed=4))
    got = _outputs(static.generate(four, sampled, seed=4))
    for (ids_a, lp_a, _), (ids_b, lp_b, _) in zip(got, want, strict=True):
        assert ids_a == ids_b
        torch.testing.assert_close(torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5, rtol=0)


class _FakeGraphs:
    """Stand-ins for torch.cuda's graph API on a CPU: "capturing" runs the step once and keeps
    it, a replay runs it again. The RNG calls use the CPU generator. Exercises the backend's
    capture and replay logic (warm-up steps move the state, which must be loaded again; the
    RNG must be put back; one capture per adapter setup), not CUDA itself."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from contextlib import contextmanager, nullcontext

        self.captures: list[StaticDecoder] = []
        fakes = self

        class Graph:
            def replay(self) -> None:
                StaticDecoder.step(self.decoder)

        @contextmanager
        def graph(g: Graph, pool: object = None):
            real = StaticDecoder.step

            def record(decoder: StaticDecoder) -> None:
                g.decoder = decoder
                fakes.captures.append(decoder)
                real(decoder)

            monkeypatch.setattr(StaticDecoder, "step", record)
            yield
            monkeypatch.setattr(StaticDecoder, "step", real)

        class Stream:
            def __init__(self, *args: object) -> None:
                pass

            def wait_stream(self, other: object) -> None:
                pass

        cuda = torch.cuda
        monkeypatch.setattr(cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(cuda, "graph", graph)
        monkeypatch.setattr(cuda, "Stream", Stream)
        monkeypatch.setattr(cuda, "stream", lambda stream: nullcontext())
        monkeypatch.setattr(cuda, "current_stream", lambda device=None: Stream())
        monkeypatch.setattr(cuda, "graph_pool_handle", lambda: object())
        monkeypatch.setattr(cuda, "get_rng_state", lambda device=None: torch.get_rng_state())
        monkeypatch.setattr(
            cuda, "set_rng_state", lambda state, device=None: torch.set_rng_state(state)
        )


def test_capture_and_replay_logic_with_fake_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph path's control flow on a CPU (fake graph API): the first call of a shape
    captures, later calls replay; the results equal generate's (greedy: 6 rows among 8;
    sampled: 8 rows, so the same RNG draws), so warm-up left no trace in the state or RNG."""
    fakes = _FakeGraphs(monkeypatch)
    generate, graph = _pair(adapters=1)
    graph.decode = "graph"
    graph._fixed_shapes_on_cpu = True
    prompts = _prompts(graph.tokenizer)
    four = [*prompts, _chat(graph.tokenizer, "and then?")]
    calls = [
        (prompts, SamplingConfig(max_new_tokens=12, temperature=0.0, n=2), None, None),
        (four, SamplingConfig(max_new_tokens=16, temperature=1.0, n=2), 4, ["lora0"] * 4),
        (four, SamplingConfig(max_new_tokens=16, temperature=1.0, n=2), 4, None),
        (four, SamplingConfig(max_new_tokens=16, temperature=1.0, n=2), 4, ["lora0", None] * 2),
    ]
    for prompts_, sampling, seed, adapters in calls:
        want = _outputs(generate.generate(prompts_, sampling, adapters=adapters, seed=seed))
        for _ in range(2):  # capture (the first time), then replay
            got = _outputs(graph.generate(prompts_, sampling, adapters=adapters, seed=seed))
            for (ids_a, lp_a, _), (ids_b, lp_b, _) in zip(got, want, strict=True):
                assert ids_a == ids_b
                torch.testing.assert_close(
                    torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5, rtol=0
                )
    # one decoder (8 rows, 64 positions) for every call, with a graph for greedy under the
    # base model, then T=1 under lora0, under the base model, and mixed (lora0 and the base
    # routed per row by the stacked adapters); every later call replayed
    graphs = {key: list(d.graphs) for key, d in graph._decoders.items()}
    assert graphs == {
        (8, 64): [
            (BASE_ADAPTER, 0.0, 1.0),
            ("lora0", 1.0, 1.0),
            (BASE_ADAPTER, 1.0, 1.0),
            (("mixed", ("lora0",)), 1.0, 1.0),
        ],
    }
    assert len(fakes.captures) == 4
    assert graph.graph_error is None


def test_only_adapter_routes_every_row_and_restores_the_model() -> None:
    """What a graph captures for a one-adapter call: no ``adapter_names``, the adapter made the
    only active one; the same logits as peft's per-row routing, and the model as it was."""
    backend = HFBackend(ModelSpec(seed=0))
    _add_random_adapter(backend, "alice", seed=1)
    _add_random_adapter(backend, "bob", seed=2)
    model = backend.model
    ids = torch.tensor([_prompts(backend.tokenizer)[1]] * 2)  # (2, P)
    active, grads = model.active_adapter, [p.requires_grad for p in model.parameters()]
    with torch.no_grad():
        for name in ("bob", BASE_ADAPTER):
            routed = model(input_ids=ids, adapter_names=[name] * 2).logits  # (2, P, V)
            with only_adapter(model, name, BASE_ADAPTER):
                alone = model(input_ids=ids).logits  # (2, P, V)
            assert torch.equal(alone, routed)
        other = model(input_ids=ids, adapter_names=["alice"] * 2).logits
        assert not torch.allclose(other, routed)  # the adapters differ from the base
    assert model.active_adapter == active
    assert [p.requires_grad for p in model.parameters()] == grads


def test_buckets() -> None:
    assert [row_bucket(r) for r in (1, 8, 9, 100, 128, 129, 256, 300)] == [
        8,
        8,
        16,
        128,
        128,
        256,
        256,
        384,
    ]
    assert [length_bucket(n) for n in (1, 64, 65, 700)] == [64, 64, 128, 704]


def test_unknown_decode_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="decode='fast'"):
        HFBackend(ModelSpec(seed=0), decode="fast")  # type: ignore[arg-type]


def test_auto_is_static_on_a_cpu_and_static_needs_the_prefill() -> None:
    auto = HFBackend(ModelSpec(seed=0))
    assert auto._decode_path(width=10) == ("graph" if auto.device.type == "cuda" else "static")
    static = HFBackend(ModelSpec(seed=0), decode="graph")
    assert static._decode_path(width=10) == ("graph" if static.device.type == "cuda" else "static")
    assert static._decode_path(width=1) == "generate"  # one-token prompts: no prefill to reuse
    unshared = HFBackend(ModelSpec(seed=0), decode="static", share_prompts=False)
    assert unshared._decode_path(width=10) == "generate"


NEEDS_CUDA = "needs a CUDA device: run on a GPU machine"


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA)
def test_cuda_graph_replays_equal_the_eager_static_loop() -> None:
    """On CUDA, ``decode="graph"`` (captured once, replayed) against ``decode="static"`` (the
    same decoder and shapes, stepped eagerly): the same tokens, logprobs to float rounding. The
    first call captures, the second replays the cached graph; both equal the eager loop."""
    backends = {}
    for decode in ("static", "graph"):
        model, tok = load_model(ModelSpec(seed=0))
        backends[decode] = HFBackend(model, tok, device="cuda", decode=decode)
        _add_random_adapter(backends[decode], "alice", seed=1)
    eager, graph = backends["static"], backends["graph"]
    prompts = [*_prompts(eager.tokenizer), *_system_prompts(eager.tokenizer)]
    calls = [
        (SamplingConfig(max_new_tokens=24, temperature=0.0, n=2), None, None),
        (SamplingConfig(max_new_tokens=24, temperature=1.0, n=2), 3, None),
        (SamplingConfig(max_new_tokens=24, temperature=0.7, top_p=0.9, n=2), 5, ["alice"] * 7),
        (SamplingConfig(max_new_tokens=24, temperature=1.0, n=2), 3, [None] * 7),
        (SamplingConfig(max_new_tokens=24, temperature=1.0, n=2), 3, ["alice", None] * 3 + [None]),
    ]
    for sampling, seed, adapters in calls:
        want = _outputs(eager.generate(prompts, sampling, adapters=adapters, seed=seed))
        for _ in range(2):  # capture, then replay
            got = _outputs(graph.generate(prompts, sampling, adapters=adapters, seed=seed))
            for (ids_a, lp_a, _), (ids_b, lp_b, _) in zip(got, want, strict=True):
                assert ids_a == ids_b
                torch.testing.assert_close(
                    torch.tensor(lp_a), torch.tensor(lp_b), atol=1e-5, rtol=0
                )
    # a graph per (route, temperature, top-p): greedy and T=1.0 under the base model (the call
    # with adapters=[None] * 7 replayed T=1.0's), top-p under alice, and the mixed call's rows
    # routed to alice or the base by the stacked adapters (a set: the routes mix str and tuple)
    graphs = [key for d in graph._decoders.values() for key in d.graphs]
    assert len(graphs) == 4 and set(graphs) == {
        (BASE_ADAPTER, 0.0, 1.0),
        (BASE_ADAPTER, 1.0, 1.0),
        ("alice", 0.7, 0.9),
        (("mixed", ("alice",)), 1.0, 1.0),
    }
    assert len(graph._decoders) == 1  # 14 rows in 16, one length bucket: one decoder
    assert all(isinstance(d, StaticDecoder) for d in graph._decoders.values())
