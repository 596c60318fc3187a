"""Packed rows (marl.agents.packing): many turns in one forward, shared prefixes once, and the
same logprobs and gradient as a padded forward of every ``prompt + response``."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from marl.agents.attention import MARL_ATTENTION, runs_marl_attention, use_marl_attention
from marl.agents.logprobs import response_logprobs
from marl.agents.models import ModelSpec, load_model
from marl.agents.packing import (
    PrefixCounter,
    pack_turns,
    packed_positions,
    packed_response_logprobs,
)


def _grouped(
    rng: random.Random,
    system: int,
    groups: int,
    own: tuple[int, int],
    replies: int,
    reply: tuple[int, int],
    lead: bool = False,
) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """A ``system``-token prompt, then ``groups`` prompts on it (each with ``own`` = (lo, hi)
    more tokens), each followed by ``replies`` replies of (lo, hi) random tokens; with ``lead``
    each reply starts with one of 4 shared first tokens. Returns (system, prompts, replies)."""
    head = [rng.randrange(1, 100) for _ in range(system)]
    prompts, responses = [], []
    for _ in range(groups):
        prompt = head + [rng.randrange(1, 100) for _ in range(rng.randrange(*own))]
        for k in range(replies):
            tail = [rng.randrange(1, 100) for _ in range(rng.randrange(*reply))]
            prompts.append(prompt)
            responses.append([1 + k % 4, *tail] if lead else tail)
    return head, prompts, responses


def _pairs(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts sharing a 20-token system prefix, each shown to 3 responses (a GRPO group), one
    prompt that is a prefix of another, a one-token prompt and an empty response."""
    system, prompts, responses = _grouped(random.Random(seed), 20, 4, (3, 30), 3, (1, 12))
    prompts += [system[:5], prompts[0][:-2], [7], prompts[3]]
    responses += [[4, 5, 6], [9], [8, 9], []]
    return prompts, responses


def _model(lora: bool = False) -> torch.nn.Module:
    model, _ = load_model(ModelSpec(kind="tiny", seed=3))
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
        with torch.no_grad():  # a non-zero adapter
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(0))
    return use_marl_attention(model)


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = sum(float((x - y).pow(2).sum()) for x, y in zip(a, b))
    return math.sqrt(num / sum(float(y.pow(2).sum()) for y in b))


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("lora", [False, True])
def test_packed_logprobs_and_gradient_equal_the_padded_forward(share: bool, lora: bool) -> None:
    model = _model(lora)
    prompts, responses = _pairs()
    options = {"temperature": 0.7, "top_p": 0.9, "untruncated": True}
    padded = response_logprobs(model, prompts, responses, **options)  # type: ignore[arg-type]
    packed = packed_response_logprobs(model, prompts, responses, share=share, **options)
    assert torch.equal(packed.mask, padded.mask)
    real = padded.mask.bool()
    for new, old in ((packed.sampling, padded.sampling), (packed.untruncated, padded.untruncated)):
        assert new is not None and old is not None
        assert torch.equal(new.isfinite(), old.isfinite())  # the same tokens outside the nucleus
        both = real & old.isfinite()
        assert torch.allclose(new[both], old[both], atol=1e-5)
        assert torch.all(new[~real] == 0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    weights = torch.linspace(0.5, 1.5, real.numel()).view_as(padded.mask)
    grad_padded = torch.autograd.grad((padded.untruncated * weights).sum(), trainable)
    grad_packed = torch.autograd.grad((packed.untruncated * weights).sum(), trainable)
    assert sum(float(g.abs().sum()) for g in grad_padded) > 0
    assert _relative(list(grad_packed), list(grad_padded)) < 1e-5


def test_one_forward_runs_every_shared_prefix_once() -> None:
    model = _model()
    prompts, responses = _pairs()
    rows: list[torch.Tensor] = []
    handle = model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"]), with_kwargs=True
    )
    packed_response_logprobs(model, prompts, responses)
    handle.remove()
    assert len(rows) == 1 and rows[0].shape[0] == 1  # one call, one row
    trie = {tuple(p + r)[:d] for p, r in zip(prompts, responses) for d in range(1, len(p + r) + 1)}
    # a response's last node with nothing below it predicts nothing: never run
    final_leaves = {tuple(p + r) for p, r in zip(prompts, responses)} - {node[:-1] for node in trie}
    assert final_leaves  # the sampled responses end in leaves of their own
    run = len(trie) - len(final_leaves)
    assert rows[0].shape[1] == run == packed_positions(prompts, responses)
    assert run < sum(len(p) + len(r) for p, r in zip(prompts, responses)) / 2
    unshared = pack_turns(prompts, responses, share=False)
    # (a turn with no response keeps its last prompt node)
    assert unshared.nodes == sum(len(p) + len(r) - bool(r) for p, r in zip(prompts, responses))
    assert unshared.nodes == packed_positions(prompts, responses, share=False)


@pytest.mark.parametrize("chunk", [16, 64, 256])
def test_every_query_chunk_size_gives_the_same_logprobs(chunk: int) -> None:
    model = _model()
    prompts, responses = _pairs(1)
    with torch.no_grad():
        auto = packed_response_logprobs(model, prompts, responses)
        layout = pack_turns(prompts, responses, chunk=chunk)
        fixed = packed_response_logprobs(model, prompts, responses, layout=layout)
    assert layout.chunk_queries.shape[1] == chunk
    assert torch.allclose(auto.sampling, fixed.sampling, atol=1e-5)


def test_the_layout_positions_are_depths_and_every_node_has_one_slot() -> None:
    prompts, responses = [[1, 2, 3], [1, 2, 4], [1, 2, 3], [1, 2]], [[5, 6], [7], [5, 8], [3]]
    layout = pack_turns(prompts, responses, chunk=16)
    # the trie: 1 2 3 5 6 | 4 7 | 8 (the third turn shares 1 2 3 5 with the first, the fourth is
    # 1 2 3 again); the final leaves 6, 7 and 8 predict nothing and are not run, while 3, the
    # fourth turn's last response token, has nodes below it and stays
    assert layout.input_ids.tolist() == [[1, 2, 3, 5, 4]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert layout.nodes == packed_positions(prompts, responses)
    slots = layout.node_slot.tolist()
    assert len(set(slots)) == len(slots) == 5  # each node's output has a slot of its own
    assert layout.targets.tolist() == [[5, 6], [7, 0], [5, 8], [3, 0]]
    assert layout.valid.tolist() == [[True, True], [True, False], [True, True], [True, False]]
    # each response token's predictor is its parent: the prompt's last node (shared by turns 0
    # and 2), then the token before it; the dropped leaves are targets, never predictors
    predicted_by = layout.predictors[layout.predictor_of].tolist()
    real = [
        [n for n, ok in zip(row, valid) if ok]
        for row, valid in zip(predicted_by, layout.valid.tolist())
    ]
    assert real == [[2, 3], [4], [2, 3], [1]]


def test_the_prefix_counter_counts_the_nodes_a_row_adds() -> None:
    counter = PrefixCounter()
    assert counter.add([1, 2, 3]) == 3
    assert counter.cost([1, 2, 4, 5]) == 2 and counter.nodes == 3  # cost does not add
    assert counter.add([1, 2, 4, 5]) == 2
    assert counter.add([1, 2]) == 0 and counter.nodes == 5
    plain = PrefixCounter(share=False)
    assert plain.add([1, 2, 3]) == 3 and plain.add([1, 2, 3]) == 3 and plain.nodes == 6


def test_packed_needs_the_platform_attention_and_falls_back_without_it() -> None:
    model = _model()
    assert runs_marl_attention(model)
    assert model.config._attn_implementation == MARL_ATTENTION
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    assert use_marl_attention(eager) is eager and not runs_marl_attention(eager)
    prompts, responses = _pairs(2)
    calls: list[int] = []
    handle = eager.register_forward_pre_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        fallback = response_logprobs(eager, prompts, responses, share_prompts=True, packed=True)
        packed = response_logprobs(model, prompts, responses, share_prompts=True, packed=True)
    handle.remove()
    assert len(calls) > 1  # the key/value-cache path: several calls, not one packed row
    assert torch.allclose(fallback.sampling, packed.sampling, atol=1e-5)


def test_bad_turns_are_refused_with_a_message() -> None:
    with pytest.raises(ValueError, match="every prompt needs at least one token"):
        pack_turns([[1], []], [[2], [3]])
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        pack_turns([[1], [2]], [[3]])


def _scored_replies(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """What an exact action scoring packs: 3 prompts of 60-80 tokens on a common system prompt,
    each followed by 12 short reply texts (2-4 tokens, some sharing a first token)."""
    _, prompts, replies = _grouped(random.Random(seed), 30, 3, (30, 50), 12, (1, 4), lead=True)
    return prompts, replies


def test_sibling_replies_share_a_chunk_and_each_query_sees_exactly_its_ancestors() -> None:
    prompts, replies = _scored_replies()
    layout = pack_turns(prompts, replies)
    chunks, size = layout.chunk_queries.shape
    assert chunks < len(prompts) // 2  # a chunk per reply would be 36 or more
    # every (query slot, key slot) pair against the turns' paths, by brute force: the trie's
    # nodes in creation order (the packed row's order), but the replies' final leaves, which
    # predict nothing and are not run
    turns = [(*prompt, *reply) for prompt, reply in zip(prompts, replies)]
    prefixes = list(dict.fromkeys(turn[: d + 1] for turn in turns for d in range(len(turn))))
    leaves = set(turns) - {prefix[:-1] for prefix in prefixes}
    assert len(leaves) > len(turns) // 2  # most replies end in a leaf of their own
    trie = {prefix: n for n, prefix in enumerate(p for p in prefixes if p not in leaves)}
    paths = [
        [trie[turn[: d + 1]] for d in range(len(turn)) if turn[: d + 1] in trie] for turn in turns
    ]
    tokens = layout.input_ids[0].tolist()
    assert [prefix[-1] for prefix in trie] == tokens  # the numbering is the row's
    ancestors = {n: set() for n in range(len(tokens))}
    for path in paths:
        for i, n in enumerate(path):
            ancestors[n] = set(path[: i + 1])
    slot_of = {s: n for n, s in enumerate(layout.node_slot.tolist())}
    mask = layout.chunk_mask[:, 0]  # (R, C, K)
    keys = layout.chunk_keys.tolist()
    for r in range(chunks):
        for i in range(size):
            node = slot_of.get(r * size + i)
            if node is None:  # a padded query slot: it sees something, never nothing
                assert bool(mask[r, i].any())
                continue
            seen = {keys[r][j] for j in range(len(keys[r])) if mask[r, i, j]}
            assert seen == ancestors[node]


def test_merged_chunks_give_the_padded_forwards_logprobs_and_gradient() -> None:
    model = _model(lora=True)
    prompts, replies = _scored_replies(1)
    assert pack_turns(prompts, replies).chunk_queries.shape[0] < len(prompts) // 2
    padded = response_logprobs(model, prompts, replies)
    packed = packed_response_logprobs(model, prompts, replies)
    real = padded.mask.bool()
    assert torch.allclose(packed.sampling[real], padded.sampling[real], atol=1e-5)
    trainable = [p for p in model.parameters() if p.requires_grad]
    grad_padded = torch.autograd.grad(padded.sampling[real].sum(), trainable)
    grad_packed = torch.autograd.grad(packed.sampling[real].sum(), trainable)
    assert _relative(list(grad_packed), list(grad_padded)) < 1e-5


@pytest.mark.parametrize("packed", [False, True])
def test_responses_without_tokens_give_empty_tensors_only_where_asked(packed: bool) -> None:
    model = _model()
    prompts, responses = [[5, 6, 7], [8]], [[], []]
    # packed: the packed path's own entry (response_logprobs returns before reaching it)
    logprobs = packed_response_logprobs if packed else response_logprobs
    for untruncated, entropy in ((False, False), (True, True)):
        out = logprobs(model, prompts, responses, untruncated=untruncated, entropy=entropy)
        assert out.sampling.shape == out.mask.shape == (2, 0)
        assert (out.untruncated is not None) == untruncated
        assert (out.entropy is not None) == entropy
        if untruncated:
            assert out.untruncated.shape == out.entropy.shape == (2, 0)
