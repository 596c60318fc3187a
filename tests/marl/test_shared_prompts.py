"""Shared prompts in the update (issue 10): turns with identical prompt ids run their prompt
through the model once, and the loss and the gradient stay those of the padded forward."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from marl.agents.backends import SamplingConfig
from marl.agents.logprobs import (
    length_buckets,
    prefix_clusters,
    response_logprobs,
    sequence_logprobs,
)
from marl.agents.models import ModelSpec, load_model
from marl.agents.packing import packed_positions
from marl.protocols.turn import TurnRecord
from marl.runtime.learner import Learner, LearnerSettings, prompts_together

# (prompt, response, advantage): three prompts shared by a group, two of other lengths, one
# response of a single token (no response forward on the cache) and one long response
EXCHANGES = [
    ("Say a colour:", " red", 1.0),
    ("Say a colour:", " blue!", -1.0),
    ("Count to three, slowly:", " 1 2 3", 0.5),
    ("Say a colour:", "x", 0.3),
    ("Count to three, slowly:", " one", -0.5),
    ("Hi", " hello there, how are you", 0.7),
    ("Say a colour:", " green, I think", -0.2),
    ("Say a colour!", " no", 0.4),  # one character away from a shared prompt: not shared
]


# the loss settings the update's equivalence tests run under (GRPO, KL with top-p, GSPO, LoRA)
LOSS_SETTINGS = pytest.mark.parametrize(
    "settings",
    [
        {},
        {"beta": 0.04, "sampling": SamplingConfig(top_p=0.9, temperature=0.7)},
        {"level": "sequence", "aggregation": "token_mean"},
        {"lora": True, "beta": 0.04},
    ],
    ids=["grpo", "kl-top-p", "gspo", "lora"],
)


def _turns(model: torch.nn.Module, tok: object) -> list[TurnRecord]:
    turns = []
    for i, (prompt, response, advantage) in enumerate(EXCHANGES):
        p = tok.encode(prompt, add_special_tokens=False)  # type: ignore[attr-defined]
        r = tok.encode(response, add_special_tokens=False)  # type: ignore[attr-defined]
        with torch.no_grad():  # finite (no top-p): a sampled token is never outside the nucleus
            logp, _ = sequence_logprobs(model, [p], [r])
        # behaviour logprobs a little off the model's own, so the ratio and the clip matter
        old = [v - 0.2 * ((i + j) % 3 - 1) for j, v in enumerate(logp[0].tolist())]
        turn = TurnRecord("a", "shared", 0, i, 0, p, r, old, [1] * len(r))
        turn.advantage = advantage
        turns.append(turn)
    return turns


def _loss_and_gradient(
    model: torch.nn.Module, turns: list[TurnRecord], **settings: object
) -> tuple[float, list[torch.Tensor]]:
    learner = Learner(copy.deepcopy(model), LearnerSettings(**settings))  # type: ignore[arg-type]
    loss, _ = learner.loss(turns)
    loss.backward()
    grads = [p.grad.detach().clone() for p in learner.model.parameters() if p.requires_grad]
    return float(loss.detach()), grads


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = sum(float((x - y).pow(2).sum()) for x, y in zip(a, b))
    return math.sqrt(num / sum(float(y.pow(2).sum()) for y in b))


def _lora(model: torch.nn.Module) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    lora = get_peft_model(model, config)
    with torch.no_grad():  # a non-zero adapter, so its gradient is not trivially the same
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05, generator=torch.Generator().manual_seed(0))
    return lora


@LOSS_SETTINGS
def test_shared_prompt_loss_and_gradient_equal_the_padded_forward(settings: dict) -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=3))
    settings = dict(settings)
    if settings.pop("lora", False):
        model = _lora(model)
    turns = _turns(model, tok)
    loss_on, grad_on = _loss_and_gradient(model, turns, share_prompts=True, **settings)
    loss_off, grad_off = _loss_and_gradient(model, turns, share_prompts=False, **settings)
    assert loss_on == pytest.approx(loss_off, rel=1e-5, abs=1e-7)
    assert sum(float(g.abs().sum()) for g in grad_off) > 0  # a real gradient, not zeros
    assert math.isfinite(loss_off)
    assert _relative(grad_on, grad_off) < 1e-5


def test_logprobs_match_with_an_empty_response_in_the_batch() -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=1))
    enc = tok.encode
    prompts = [enc("Ab"), enc("Ab"), enc("Longer prompt here"), enc("Ab")]
    responses = [enc(" one"), [], enc(" two three"), enc("z")]
    with torch.no_grad():
        on = response_logprobs(model, prompts, responses, share_prompts=True)
        off = response_logprobs(model, prompts, responses, share_prompts=False)
    assert torch.equal(on.mask, off.mask)
    assert torch.allclose(on.sampling, off.sampling, atol=1e-5)


class _ForwardLog:
    """Records, for every forward call of a model, the rows of its input ids without their
    padding (left: the attention mask; right, after a response: the pad id 0, which no text of
    these tests holds) and whether a key/value cache was passed in."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[tuple[list[list[int]], bool]] = []
        self.handle = model.register_forward_pre_hook(self._record, with_kwargs=True)

    def _record(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        width = ids.shape[1]
        rows = []
        for i, row in enumerate(ids.tolist()):
            real = mask[i, -width:].tolist() if mask is not None else [1] * width
            kept = [t for t, m in zip(row, real) if m]
            while kept and kept[-1] == 0:
                kept.pop()
            rows.append(kept)
        cached = kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None
        self.calls.append((rows, cached))

    def tokens(self) -> int:
        return sum(len(r) for rows, _ in self.calls for r in rows)


def _cached_logprobs(model: torch.nn.Module, turns: list[TurnRecord], share: bool) -> None:
    """The unpacked path (the warm-up's and the action scores'): prompts on the key/value
    cache with ``share``, one padded forward without."""
    prompts, responses = [t.prompt_ids for t in turns], [t.response_ids for t in turns]
    response_logprobs(model, prompts, responses, share_prompts=share)


def test_each_distinct_prompt_reaches_the_model_once() -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=2))
    turns = _turns(model, tok)
    log = _ForwardLog(model)
    _cached_logprobs(model, turns, share=True)
    prompt_rows = [row for rows, cached in log.calls if not cached for row in rows]
    distinct = {tuple(t.prompt_ids) for t in turns}
    assert len(distinct) == 4 < len(turns)
    assert sorted(map(tuple, prompt_rows)) == sorted(distinct)  # each one exactly once
    # the responses run on the cache, never a prompt again: one row per turn, a prefix of its
    # response (the longest response of a bucket without its last token, which predicts nothing)
    response_rows = [row for rows, cached in log.calls if cached for row in rows]
    assert len(response_rows) == len(turns)
    responses = [t.response_ids for t in turns]
    for row in response_rows:
        assert row and any(r[: len(row)] == row for r in responses)
    # 3 length buckets (23, 13 and 2 characters), each with a longest response cut by one
    assert sum(map(len, response_rows)) == sum(map(len, responses)) - 3
    shared_tokens = log.tokens()
    log.calls.clear()
    _cached_logprobs(model, turns, share=False)
    assert len(log.calls) == 1  # one padded forward over prompt + response rows
    assert log.tokens() == sum(len(t.prompt_ids) + len(t.response_ids) for t in turns)
    assert shared_tokens < log.tokens()


def test_update_keeps_a_prompts_turns_in_one_minibatch() -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=2))
    turns = _turns(model, tok)
    learner = Learner(model, LearnerSettings(share_prompts=True, minibatch_size=4, lr=1e-4))
    rows: list[list[int]] = []
    handle = model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"][0].tolist()), with_kwargs=True
    )
    metrics = learner.update(turns)
    handle.remove()
    assert metrics["optimizer_steps"] == 2.0
    assert len(rows) == 2  # one packed row per minibatch: every turn fits the token budget
    # a prompt's turns are adjacent, so only the one minibatch boundary can split a prompt: the
    # rows hold every shared prefix once, plus at most one prompt again
    once = packed_positions([t.prompt_ids for t in turns], [t.response_ids for t in turns])
    longest = max(len(t.prompt_ids) for t in turns)
    assert once < sum(map(len, rows)) <= once + longest
    assert sum(map(len, rows)) < sum(len(t.prompt_ids) + len(t.response_ids) for t in turns)


def test_prompts_together_is_a_stable_regrouping() -> None:
    model, tok = load_model(ModelSpec(kind="tiny"))
    turns = _turns(model, tok)
    grouped = prompts_together(turns)
    assert sorted(map(id, grouped)) == sorted(map(id, turns))
    seen: list[tuple[int, ...]] = []
    for turn in grouped:
        key = tuple(turn.prompt_ids)
        if not seen or seen[-1] != key:
            assert key not in seen  # a prompt's turns are adjacent
            seen.append(key)
    first = [turns[[tuple(t.prompt_ids) for t in turns].index(k)].episode_id for k in seen]
    assert first == sorted(first)  # groups in the order of their first turn
    for key in seen:
        ids = [t.episode_id for t in grouped if tuple(t.prompt_ids) == key]
        assert ids == sorted(ids)  # each group's turns in their given order


def test_length_buckets_cover_every_item_and_bound_the_padding() -> None:
    lengths = [100, 12, 98, 11, 50, 10, 97, 49]
    buckets = length_buckets(lengths, max_waste=0.125)
    assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
    for bucket in buckets:
        padded = max(lengths[i] for i in bucket) * len(bucket)
        assert padded - sum(lengths[i] for i in bucket) <= 0.125 * padded
    assert len(buckets) == 3  # ~100, ~50, ~11
    assert length_buckets([5, 5, 5]) == [[0, 1, 2]]
    assert length_buckets([]) == []


def test_length_buckets_skip_padding_and_keep_the_values() -> None:
    model, _ = load_model(ModelSpec(kind="tiny", seed=5))
    gen = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for n in (8, 9, 40, 41, 120):  # three lengths far apart
        base = torch.randint(5, 100, (n,), generator=gen).tolist()
        for _ in range(2):
            prompts.append(base)
            responses.append(torch.randint(5, 100, (3,), generator=gen).tolist())
    log = _ForwardLog(model)
    with torch.no_grad():
        bucketed = response_logprobs(model, prompts, responses, share_prompts=True)
        calls = list(log.calls)
        log.calls.clear()
        one = response_logprobs(model, prompts, responses, share_prompts=True, max_padding=1.0)
    prompt_calls = [rows for rows, cached in calls if not cached]
    assert [sorted(map(len, rows)) for rows in prompt_calls] == [[120], [40, 41], [8, 9]]
    assert len([rows for rows, cached in log.calls if not cached]) == 1  # one bucket
    torch.testing.assert_close(bucketed.sampling, one.sampling, atol=1e-5, rtol=0)


def test_algo_share_prompts_switches_the_update_and_the_hf_prefill() -> None:
    from marl.config import load_config
    from marl.runtime.policies import build_backend, learner_settings

    for value in (True, False):
        config = load_config({"algo": {"share_prompts": value}})
        assert learner_settings(config).share_prompts is value
        assert build_backend(config).share_prompts is value  # type: ignore[attr-defined]
    assert load_config({}).algo.share_prompts is True  # on by default


@pytest.mark.slow
def test_training_with_sharing_off_still_trains(tmp_path) -> None:
    from marl.loop.train import train

    metrics = train(
        {
            "scenario": {"name": "unison", "overrides": {}},  # partial credit: rewards differ
            "model": {"kind": "tiny"},
            "sampling": {"max_new_tokens": 12},
            "algo": {"share_prompts": False, "lr": 3e-3, "beta": 0.04},  # every turn trains
            "train": {"steps": 1, "seeds_per_step": 1, "group_size": 4},
            "logging": {"progress": False, "transcripts_every": 0, "tensorboard": False},
        },
        run_dir=tmp_path,
    )
    assert metrics["policies/shared/optimizer_steps"] >= 1.0
    assert math.isfinite(metrics["policies/shared/loss"])


SYSTEM = "You play a game of signals; answer in one line. "  # a 49-character common prefix
OBSERVATIONS = [  # (observation, response, advantage): two repeat, one is only the prefix
    ("Target: red circle.", " SAY: red", 1.0),
    ("Target: red circle.", " SAY: blue", -1.0),
    ("Target: a green square, far away.", " SAY: green square", 0.5),
    ("You heard: red. Pick 1-3.", " ACTION: 2", -0.5),
    ("", " hm", 0.2),
]


def _prefix_turns(model: torch.nn.Module, tok: object) -> list[TurnRecord]:
    turns = []
    other = tok.encode("Unrelated prompt", add_special_tokens=False)  # type: ignore[attr-defined]
    rows = [(SYSTEM + o, r, a) for o, r, a in OBSERVATIONS] + [("Unrelated prompt", "x!", 0.3)]
    for i, (prompt, response, advantage) in enumerate(rows):
        p = tok.encode(prompt, add_special_tokens=False)  # type: ignore[attr-defined]
        r = tok.encode(response, add_special_tokens=False)  # type: ignore[attr-defined]
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, [p], [r])
        old = [v - 0.1 * ((i + j) % 3 - 1) for j, v in enumerate(logp[0].tolist())]
        turn = TurnRecord("a", "shared", 0, i, 0, p, r, old, [1] * len(r))
        turn.advantage = advantage
        turns.append(turn)
    assert turns[-1].prompt_ids == other
    return turns


@pytest.mark.parametrize(
    "settings",
    [{}, {"beta": 0.04, "sampling": SamplingConfig(top_p=0.9, temperature=0.7)}, {"lora": True}],
    ids=["grpo", "kl-top-p", "lora"],
)
def test_a_common_prefix_runs_once_with_the_same_loss_and_gradient(settings: dict) -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=6))
    settings = dict(settings)
    if settings.pop("lora", False):
        model = _lora(model)
    turns = _prefix_turns(model, tok)
    loss_on, grad_on = _loss_and_gradient(model, turns, share_prompts=True, **settings)
    loss_off, grad_off = _loss_and_gradient(model, turns, share_prompts=False, **settings)
    assert loss_on == pytest.approx(loss_off, rel=1e-5, abs=1e-7)
    assert _relative(grad_on, grad_off) < 1e-5


def test_the_common_prefix_reaches_the_model_once() -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=6))
    turns = _prefix_turns(model, tok)
    log = _ForwardLog(model)
    _cached_logprobs(model, turns, share=True)
    uncached = [row for rows, cached in log.calls if not cached for row in rows]
    # the prefix-only prompt keeps its last token, so the common prefix is SYSTEM but that one
    prefix = tok.encode(SYSTEM, add_special_tokens=False)[:-1]
    unrelated = tok.encode("Unrelated prompt", add_special_tokens=False)
    assert sorted(uncached) == sorted([prefix, unrelated])  # the prefix once, not 4 times
    # on the prefix's cache: each distinct prompt's rest, once
    cached_rows = [tuple(row) for rows, cached in log.calls if cached for row in rows]
    distinct = {tuple(t.prompt_ids) for t in turns if t.prompt_ids != unrelated}
    assert len(distinct) == 4
    for p in distinct:
        assert cached_rows.count(p[len(prefix) :]) == 1


def test_prefix_clusters() -> None:
    a = list(range(20)) + [1, 2]
    b = list(range(20)) + [3]
    c = list(range(20))  # a prefix of a and b: keeps its last token
    d = [7] * 30
    clusters = prefix_clusters([a, b, c, d, a[:10] + [99]], min_prefix=16)
    assert sorted((n, sorted(m)) for n, m in clusters) == [(0, [3]), (0, [4]), (19, [0, 1, 2])]
    assert all(n == 0 for n, _ in prefix_clusters([a, b, c], min_prefix=0))
    assert prefix_clusters([], 16) == []


def test_warmup_imitation_loss_is_the_same_with_shared_prompts_and_packed_rows() -> None:
    from marl.agents.attention import runs_marl_attention, use_marl_attention
    from marl.loop.warmup import imitation_loss

    model, tok = load_model(ModelSpec(kind="tiny", seed=7))
    model = use_marl_attention(model)  # as the learner's model runs (marl.runtime.learner)
    assert runs_marl_attention(model)  # so that packed=True packs
    turns = _prefix_turns(model, tok)
    results = {}
    rows: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    for share in (True, False):
        for packed in (True, False):
            copy_ = copy.deepcopy(model)
            rows.clear()
            loss, tokens = imitation_loss(
                copy_,
                [t.prompt_ids for t in turns],
                [t.response_ids for t in turns],
                0,
                share,
                packed=packed,
            )
            loss.backward()
            grads = [p.grad.clone() for p in copy_.parameters()]
            results[share, packed] = (float(loss.detach()), tokens, grads)
            if packed:
                assert rows == [1], rows  # one forward over one packed row
    hook.remove()
    padded = results[False, False]  # every turn its own padded row
    for key, (loss, tokens, grads) in results.items():
        assert loss == pytest.approx(padded[0], rel=1e-5), key
        assert tokens == padded[1], key
        assert _relative(grads, padded[2]) < 1e-5, key
