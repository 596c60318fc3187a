"""Shared prompts in generation (issue 10): identical prompts of one generate request, and the
n samples of each, share one prefill; results come back in order with correct logprobs.

Most tests here look at the length-bucketed prefill (``packed_prefill=False``: what a GPU runs,
and any model off the platform's attention) call by call; the last ones at the CPU's default,
one packed row in which every shared prefix runs once (issue 38)."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model_state_dict

from marl.agents.backends import SamplingConfig
from marl.agents.backends.hf import HFBackend
from marl.agents.logprobs import sequence_logprobs
from marl.agents.models import ModelSpec

LOGPROB_ATOL = 1e-4  # as in test_hf_backend.py: generate vs a fresh forward, fp32


class _Calls:
    """Every forward call of a model: the real tokens of each row (attention mask) and whether
    a key/value cache came in."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[tuple[list[list[int]], bool]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        width = ids.shape[1]
        if mask is None:
            mask = torch.ones_like(ids)
        rows = [
            [t for t, m in zip(row, mask[i, -width:].tolist()) if m]
            for i, row in enumerate(ids.tolist())
        ]
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        self.calls.append((rows, cache is not None and cache.get_seq_length() > 0))


def _prompts(tok) -> list[list[int]]:
    a, b, c = (tok.encode(t) for t in ("Say a colour:", "Count to three:", "Hi"))
    return [a, b, a, a, c, b]  # 3 distinct prompts in 6


def test_each_distinct_prompt_is_prefilled_once() -> None:
    backend = HFBackend(ModelSpec(seed=0), packed_prefill=False)
    prompts = _prompts(backend.tokenizer)
    calls = _Calls(backend.model)
    n = 3
    groups = backend.generate(prompts, SamplingConfig(max_new_tokens=6, n=n), seed=0)
    prefills = [rows for rows, cached in calls.calls if not cached]
    assert len(prefills) == 1  # one prefill call...
    distinct = sorted({tuple(p[:-1]) for p in prompts})
    assert sorted(map(tuple, prefills[0])) == distinct  # ...with each prompt once, not 6 x 3
    first_step = calls.calls[1][0]  # generate's first step: each row's last prompt token
    assert len(first_step) == len(prompts) * n
    assert all(len(row) == 1 for rows, _ in calls.calls[1:] for row in rows)
    for prompt, group in zip(prompts, groups):
        assert len(group) == n and all(g.prompt_ids == prompt for g in group)


def test_without_sharing_every_row_is_prefilled() -> None:
    backend = HFBackend(ModelSpec(seed=0), share_prompts=False)
    prompts = _prompts(backend.tokenizer)
    calls = _Calls(backend.model)
    backend.generate(prompts, SamplingConfig(max_new_tokens=4, n=2), seed=0)
    assert len(calls.calls[0][0]) == len(prompts) * 2
    assert sorted(map(tuple, calls.calls[0][0])) == sorted(tuple(p) for p in prompts * 2)


def test_distinct_prompts_with_n_one_are_prefilled_once_each_too() -> None:
    """Nothing repeats: the backend's own prefill still runs (its length buckets and in-place
    cache serve every call), each prompt but its last token once, then one token a row."""
    backend = HFBackend(ModelSpec(seed=0), packed_prefill=False)
    prompts = list({tuple(p): p for p in _prompts(backend.tokenizer)}.values())
    calls = _Calls(backend.model)
    backend.generate(prompts, SamplingConfig(max_new_tokens=4, n=1), seed=0)
    prefilled = [r for rows, _ in calls.calls if max(map(len, rows)) > 1 for r in rows]
    assert sorted(map(tuple, prefilled)) == sorted(tuple(p[:-1]) for p in prompts)
    assert [len(row) for row in calls.calls[-1][0]] == [1] * len(prompts)


def test_greedy_outputs_equal_the_unshared_backend_in_order() -> None:
    shared = HFBackend(ModelSpec(seed=4), packed_prefill=False)
    plain = HFBackend(ModelSpec(seed=4), share_prompts=False)
    prompts = _prompts(shared.tokenizer)
    greedy = SamplingConfig(max_new_tokens=10, temperature=0.0, n=2)
    got = shared.generate(prompts, greedy)
    want = plain.generate(prompts, greedy)
    assert len({tuple(g[0].response_ids) for g in want}) > 1  # a wrong order would show
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert a.prompt_ids == b.prompt_ids and a.response_ids == b.response_ids
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_ATOL, rtol=0
            )


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_logprobs_match_a_recomputation(temperature: float, top_p: float) -> None:
    backend = HFBackend(ModelSpec(seed=1), packed_prefill=False)
    prompts = _prompts(backend.tokenizer)
    sampling = SamplingConfig(max_new_tokens=12, temperature=temperature, top_p=top_p, n=4)
    groups = backend.generate(prompts, sampling, seed=5)
    gens = [g for group in groups for g in group]
    assert [g.prompt_ids for g in gens] == [p for p in prompts for _ in range(4)]
    assert len({tuple(g.response_ids) for g in groups[0]}) > 1  # n draws, not copies
    with torch.no_grad():
        logp, mask = sequence_logprobs(
            backend.model,
            [g.prompt_ids for g in gens],
            [g.response_ids for g in gens],
            temperature=temperature,
            top_p=top_p,
            pad_token_id=backend.tokenizer.pad_token_id,
        )  # (B, T), (B, T)
    reported = torch.zeros_like(logp)
    for i, g in enumerate(gens):
        reported[i, : len(g.logprobs)] = torch.tensor(g.logprobs)
    assert torch.isfinite(reported).all()
    torch.testing.assert_close(reported * mask, logp * mask, atol=LOGPROB_ATOL, rtol=0)


def test_the_same_prompt_under_two_adapters_is_not_shared() -> None:
    backend = HFBackend(ModelSpec(seed=2), packed_prefill=False)
    backend.add_adapter("alice")
    with torch.no_grad():  # a non-zero adapter: its rows differ from the base model's
        for name, p in backend.model.named_parameters():
            if "lora_B" in name and "alice" in name:
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    prompt = _prompts(backend.tokenizer)[0]
    greedy = SamplingConfig(max_new_tokens=10, temperature=0.0, n=2)
    calls = _Calls(backend.model)
    mixed = backend.generate([prompt, prompt, prompt], greedy, adapters=["alice", None, "alice"])
    assert len(calls.calls[0][0]) == 2  # (prompt, alice) and (prompt, base): two prefill rows
    alone_a = backend.generate([prompt], greedy, adapters=["alice"])[0][0]
    alone_base = backend.generate([prompt], greedy, adapters=[None])[0][0]
    # greedy tokens may coincide on the tiny model; the adapter shows in the logprobs
    first = min(len(alone_a.logprobs), len(alone_base.logprobs))
    gap = max(abs(a - b) for a, b in zip(alone_a.logprobs[:first], alone_base.logprobs[:first]))
    assert gap > 1e-2, "the adapter should change the distribution"
    assert mixed[0][0].response_ids == mixed[2][1].response_ids == alone_a.response_ids
    assert mixed[1][1].response_ids == alone_base.response_ids
    torch.testing.assert_close(
        torch.tensor(mixed[0][0].logprobs), torch.tensor(alone_a.logprobs), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        torch.tensor(mixed[1][1].logprobs), torch.tensor(alone_base.logprobs), atol=1e-4, rtol=0
    )


SYSTEM = "You play a signalling game with a partner. Answer with one line of markup."


def _system_prompts(tok) -> list[list[int]]:
    def chat(user: str) -> list[int]:
        return tok.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )

    return [chat("Target: red."), chat("You heard: blue circle. Pick one."), chat("Hi")]


def test_a_system_prompt_common_to_every_prompt_is_prefilled_once() -> None:
    backend = HFBackend(ModelSpec(seed=3), packed_prefill=False)
    prompts = _system_prompts(backend.tokenizer)  # all distinct, one system prompt
    calls = _Calls(backend.model)
    groups = backend.generate(prompts, SamplingConfig(max_new_tokens=5, n=1), seed=0)
    uncached = [rows for rows, cached in calls.calls if not cached]
    assert len(uncached) == 1 and len(uncached[0]) == 1  # one call, one row: the prefix
    prefix = uncached[0][0]
    assert len(prefix) > len(SYSTEM)  # the chat template's system turn and more
    assert all(p[: len(prefix)] == prefix for p in prompts)
    # then each prompt's rest but its last token, on the cache (in buckets of similar length),
    # before generate's steps of one token a row
    rests = [r for rows, _ in calls.calls[1:] if max(map(len, rows)) > 1 for r in rows]
    assert sorted(map(tuple, rests)) == sorted(tuple(p[len(prefix) : -1]) for p in prompts)
    assert [g[0].prompt_ids for g in groups] == prompts


def test_prefix_sharing_keeps_greedy_outputs_and_logprobs() -> None:
    shared = HFBackend(ModelSpec(seed=3), packed_prefill=False)
    plain = HFBackend(ModelSpec(seed=3), share_prompts=False)
    prompts = _system_prompts(shared.tokenizer)
    prompts = prompts + prompts[:1]  # a repeat as well
    greedy = SamplingConfig(max_new_tokens=10, temperature=0.0, n=2)
    got, want = shared.generate(prompts, greedy), plain.generate(prompts, greedy)
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            assert a.response_ids == b.response_ids
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_ATOL, rtol=0
            )
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.8, top_p=0.9, n=3)
    gens = [g for group in shared.generate(prompts, sampling, seed=2) for g in group]
    with torch.no_grad():
        logp, mask = sequence_logprobs(
            shared.model,
            [g.prompt_ids for g in gens],
            [g.response_ids for g in gens],
            temperature=0.8,
            top_p=0.9,
            pad_token_id=shared.tokenizer.pad_token_id,
        )  # (B, T), (B, T)
    reported = torch.zeros_like(logp)
    for i, g in enumerate(gens):
        reported[i, : len(g.logprobs)] = torch.tensor(g.logprobs)
    torch.testing.assert_close(reported * mask, logp * mask, atol=LOGPROB_ATOL, rtol=0)


def test_prefix_sharing_under_one_lora_adapter_equals_no_sharing() -> None:
    outputs = []
    for share in (True, False):
        backend = HFBackend(ModelSpec(seed=2), share_prompts=share, packed_prefill=False)
        torch.manual_seed(0)  # the adapter's A matrices
        backend.add_adapter("alice")
        with torch.no_grad():
            for name, p in backend.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
        prompts = _system_prompts(backend.tokenizer)
        calls = _Calls(backend.model.get_base_model().model)  # peft calls it, with hooks
        greedy = SamplingConfig(max_new_tokens=8, temperature=0.0, n=2)
        groups = backend.generate(prompts, greedy, adapters=["alice"] * 3)
        outputs.append([[(g.response_ids, g.logprobs) for g in group] for group in groups])
        first_rows = len(calls.calls[0][0])
        assert first_rows == (1 if share else 6)  # the prefix alone, or every row
    for got, want in zip(*outputs):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(got, want):
            assert ids_a == ids_b
            torch.testing.assert_close(
                torch.tensor(lp_a), torch.tensor(lp_b), atol=LOGPROB_ATOL, rtol=0
            )


def test_a_call_mixing_adapters_runs_the_common_prefix_once_per_adapter() -> None:
    outputs = []
    for share in (True, False):
        backend = HFBackend(ModelSpec(seed=2), share_prompts=share, packed_prefill=False)
        torch.manual_seed(0)  # the adapters' A matrices
        for name in ("alice", "bob", "carol"):
            backend.add_adapter(name)
        with torch.no_grad():  # three different non-zero adapters
            for i, (name, p) in enumerate(backend.model.named_parameters()):
                if "lora_B" in name:
                    p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(i))
        tok = backend.tokenizer
        prompts = _system_prompts(tok)
        longer = tok.apply_chat_template(  # shares more than the system turn with prompt 2
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi there"}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        # (prompt 0, bob) is distinct from (prompt 0, alice); the base model's two prompts
        # share a longer prefix than alice's or bob's; carol's one prompt shares nothing
        prompts = [*prompts, prompts[0], prompts[1], longer, prompts[0]]
        adapters = ["alice", "bob", None, "bob", "alice", None, "carol"]
        calls = _Calls(backend.model.get_base_model().model)
        greedy = SamplingConfig(max_new_tokens=8, temperature=0.0, n=2)
        groups = backend.generate(prompts, greedy, adapters=adapters)
        outputs.append([[(g.response_ids, g.logprobs) for g in group] for group in groups])
        first = calls.calls[0][0]
        if share:  # each adapter's shared prefix once: three rows of one forward
            assert len(first) == 3
            alice, bob, base = first
            assert alice == bob == prompts[0][: len(alice)] == prompts[1][: len(alice)]
            assert len(alice) > len(SYSTEM) // 4  # the system turn, not a token or two
            assert len(base) > len(alice) and base == longer[: len(base)] == prompts[2][: len(base)]
            assert not any(cached for _, cached in calls.calls[:1])
        else:
            assert len(first) == 14  # every row, whole
    for got, want in zip(*outputs, strict=True):
        for (ids_a, lp_a), (ids_b, lp_b) in zip(got, want, strict=True):
            assert ids_a == ids_b
            torch.testing.assert_close(
                torch.tensor(lp_a), torch.tensor(lp_b), atol=LOGPROB_ATOL, rtol=0
            )
    alice, bob = outputs[0][0][0][1], outputs[0][3][0][1]  # prompt 0 under each adapter
    assert max(abs(a - b) for a, b in zip(alice, bob)) > 1e-2, "the adapters differ"


def test_shared_prefixes_are_per_adapter_and_leave_a_token() -> None:
    from marl.agents.backends.hf import shared_prefixes
    from marl.agents.logprobs import MIN_SHARED_PREFIX

    system = list(range(100, 100 + MIN_SHARED_PREFIX))
    texts = [
        system + [1, 2, 3],  # alice
        system + [1, 2, 4],  # alice: shares system + [1, 2]
        system + [9],  # bob: alone under bob
        [7] * (MIN_SHARED_PREFIX + 1),  # base
        [7] * (MIN_SHARED_PREFIX + 1) + [5],  # base: all of the shorter but its last token
        system[:3] + [8],  # carol
        system[:3] + [6],  # carol: 3 tokens in common, too few
    ]
    adapters = ["alice", "alice", "bob", None, None, "carol", "carol"]
    want = [MIN_SHARED_PREFIX + 2] * 2 + [0] + [MIN_SHARED_PREFIX] * 2 + [0, 0]
    assert shared_prefixes(texts, adapters) == want
    assert shared_prefixes(texts, ["one"] * len(texts)) == [0] * len(texts)  # 3 in common


def _trie_nodes(prompts: list[list[int]]) -> int:
    """Positions of a token trie of ``prompts``: each shared prefix counted once."""
    return len({tuple(p[: i + 1]) for p in prompts for i in range(len(p))})


def test_the_packed_prefill_runs_every_shared_prefix_once() -> None:
    """The CPU default: one forward, one row of exactly the trie's positions (prompts but their
    last token); prompts that part at different depths each share what they share."""
    backend = HFBackend(ModelSpec(seed=3))
    tok = backend.tokenizer
    system = tok.encode("You play a game with a partner. ")
    prompts = [
        system + tok.encode("Round 1. Colour: red. Say it."),
        system + tok.encode("Round 1. Colour: blue. Say it."),
        system + tok.encode("Round 1. Colour: red. Say it."),  # a repeat: nothing new
        system + tok.encode("Round 2."),
        tok.encode("Hi"),  # shares nothing
    ]
    calls = _Shapes(backend.model)
    backend.generate(prompts, SamplingConfig(max_new_tokens=4, n=2), seed=0)
    calls.handle.remove()
    (packed,) = [width for width, rows in calls.shapes if rows == 1 and width > 1]
    assert packed == _trie_nodes([p[:-1] for p in prompts])
    assert packed < sum(len(p) - 1 for p in {tuple(p) for p in prompts})


class _Shapes:
    """The (width, rows) of every forward's input ids."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        rows, width = kwargs["input_ids"].shape
        self.shapes.append((width, rows))


@pytest.mark.parametrize("adapters", ["none", "one", "mixed"])
def test_the_packed_prefill_generates_what_the_buckets_generate(adapters: str) -> None:
    """Same tokens and finish reasons, logprobs to float rounding, with and without adapters,
    a one-token prompt, n samples and sampling."""
    made = []
    for packed in (False, True):
        backend = HFBackend(ModelSpec(seed=3), packed_prefill=packed)
        if adapters != "none":
            for i, scale in enumerate((0.5, 0.3)):
                backend.add_adapter(f"lora{i}")
                state = get_peft_model_state_dict(backend.model, adapter_name=f"lora{i}")
                gen = torch.Generator().manual_seed(i + 1)
                backend.add_adapter(
                    f"lora{i}",
                    {k: torch.randn(v.shape, generator=gen) * scale for k, v in state.items()},
                )
        made.append(backend)
    tok = made[0].tokenizer
    system = tok.encode("You are a helpful agent in a game. ")
    prompts = [system + tok.encode(t) for t in ("Say a colour:", "Say a colour: red", "Count:")]
    prompts.append(tok.encode("x"))
    names = {"none": None, "one": ["lora1"] * 4, "mixed": ["lora0", "lora1", None, "lora0"]}
    sampling = SamplingConfig(max_new_tokens=10, temperature=1.0, n=3)
    want, got = (
        [g for grp in b.generate(prompts, sampling, adapters=names[adapters], seed=1) for g in grp]
        for b in made
    )
    assert [g.response_ids for g in got] == [g.response_ids for g in want]
    assert [g.finish_reason for g in got] == [g.finish_reason for g in want]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(
            torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0
        )
