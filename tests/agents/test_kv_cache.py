"""Length buckets for the prefill and key/value caches filled in place (issue 10): the buckets
are the cheapest split, a preallocated layer gives what transformers' own layer gives, and a
bucketed prefill generates what an unshared one does while computing less padding."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from marl.agents.backends import SamplingConfig
from marl.agents.backends.hf import HFBackend
from marl.agents.kv_cache import PreallocatedLayer, preallocatable, prefill_buckets
from marl.agents.models import ModelSpec

LOGPROB_ATOL = 1e-4  # as in test_hf_backend.py: fp32


def _cost(groups: list[list[int]], lengths: list[int], overhead: int) -> int:
    return sum(len(g) * max(lengths[i] for i in g) + overhead for g in groups)


def _brute_force(lengths: list[int], overhead: int) -> int:
    """The cheapest split of the sorted indices into runs, by trying every set of cuts."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best = None
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        groups, current = [], [order[0]]
        for index, cut in zip(order[1:], cuts):
            if cut:
                groups.append(current)
                current = []
            current.append(index)
        groups.append(current)
        cost = _cost(groups, lengths, overhead)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(30))
def test_prefill_buckets_are_the_cheapest_split(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randrange(1, 20), rng.randrange(50, 400)]) for _ in range(9)]
    overhead = rng.choice([0, 8, 32, 500])
    groups = prefill_buckets(lengths, overhead)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    assert _cost(groups, lengths, overhead) == _brute_force(lengths, overhead)
    tops = [max(lengths[i] for i in g) for g in groups]
    assert tops == sorted(tops), "shortest bucket first"


def test_equal_lengths_make_one_bucket_and_a_far_outlier_its_own() -> None:
    assert prefill_buckets([100] * 16) == [list(range(16))]
    groups = prefill_buckets([100] * 15 + [400], overhead=32)
    assert groups == [list(range(15)), [15]]


def test_only_plain_dynamic_layers_are_preallocated() -> None:
    from transformers import LlamaConfig, MistralConfig

    assert preallocatable(LlamaConfig(num_hidden_layers=2))
    assert not preallocatable(MistralConfig(num_hidden_layers=2, sliding_window=16))


def test_a_preallocated_layer_gives_what_a_dynamic_layer_gives() -> None:
    torch.manual_seed(0)
    keys, values = torch.randn(3, 2, 5, 4), torch.randn(3, 2, 5, 4)  # (B, H, n, D)
    buffers = [torch.cat([t, torch.empty(3, 2, 2, 4)], dim=2) for t in (keys, values)]
    ours, theirs = PreallocatedLayer(*buffers, filled=5, room=2), DynamicLayer()
    theirs.update(keys, values)
    start = ours._keys.data_ptr()
    for step in range(5):  # two fit in the room; the third grows the buffers
        new_k, new_v = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
        got, want = ours.update(new_k, new_v), theirs.update(new_k, new_v)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert ours.get_seq_length() == theirs.get_seq_length() == 6 + step
        if step < 2:
            assert ours._keys.data_ptr() == start, "written in place"
    rows = torch.tensor([2, 0])
    ours.batch_select_indices(rows)  # replaces keys: the next update rebuilds the buffers
    theirs.batch_select_indices(rows)
    new_k, new_v = torch.randn(2, 2, 1, 4), torch.randn(2, 2, 1, 4)
    torch.testing.assert_close(ours.update(new_k, new_v), theirs.update(new_k, new_v))


class _Prefills:
    """The positions each prefill forward computes (rows x tokens, padding included), and the
    shape of every forward."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.positions: list[int] = []
        self.shapes: list[tuple[int, int]] = []
        model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids = kwargs["input_ids"]
        self.shapes.append(tuple(ids.shape))
        if ids.shape[1] > 1:
            self.positions.append(ids.numel())


def _chat(tok, user: str) -> list[int]:
    return tok.apply_chat_template(
        [
            {"role": "system", "content": "You play a game. Answer with one line."},
            {"role": "user", "content": user},
        ],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


def test_a_bucketed_prefill_pads_less_and_generates_the_same() -> None:
    shared = HFBackend(ModelSpec(seed=5), packed_prefill=False)
    plain = HFBackend(ModelSpec(seed=5), share_prompts=False)
    tok = shared.tokenizer
    long = "Messages you received: " + "the target is the red circle near the bridge. " * 6
    prompts = [_chat(tok, text) for text in ("Hi", "Go.", "Ok", long, long + " Pick one.")]
    prefills = _Prefills(shared.model)
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0, n=2)
    got, want = shared.generate(prompts, greedy, seed=0), plain.generate(prompts, greedy, seed=0)
    assert len(prefills.positions) >= 3, "the prefix, then more than one bucket"
    padded = len(prompts) * (max(map(len, prompts)) - 1)
    assert sum(prefills.positions) < 0.7 * padded
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            assert a.response_ids == b.response_ids
            torch.testing.assert_close(
                torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=LOGPROB_ATOL, rtol=0
            )
    sampled = SamplingConfig(max_new_tokens=8, temperature=1.0, n=3)
    again = shared.generate(prompts, sampled, seed=1)
    assert [[g.response_ids for g in group] for group in again] == [
        [g.response_ids for g in group] for group in shared.generate(prompts, sampled, seed=1)
    ]


def test_one_token_prompts_beside_long_ones_without_a_common_prefix() -> None:
    """No shared prefix and a prompt with nothing before its last token: the buckets still
    each run a forward, and greedy decoding matches the unshared backend."""
    shared = HFBackend(ModelSpec(seed=6), packed_prefill=False)
    plain = HFBackend(ModelSpec(seed=6), share_prompts=False)
    rng = random.Random(0)
    long = [[rng.randrange(3, 90) for _ in range(60 + i)] for i in range(6)]
    prompts = [[7], *long, [9]]
    prefills = _Prefills(shared.model)
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    got, want = shared.generate(prompts, greedy), plain.generate(prompts, greedy)
    # the two one-token prompts: a bucket of their own, one (masked) position each; decoding
    # steps have all 8 rows
    assert (2, 1) in prefills.shapes and (6, 64) in prefills.shapes, prefills.shapes
    for g, w in zip(got, want, strict=True):
        assert g[0].response_ids == w[0].response_ids
        torch.testing.assert_close(
            torch.tensor(g[0].logprobs), torch.tensor(w[0].logprobs), atol=LOGPROB_ATOL, rtol=0
        )
