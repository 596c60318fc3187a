"""The HF backend on the tiny model: batched generation, logprobs, seeds, EOS, LoRA adapters."""

from __future__ import annotations

import pytest
import torch
from peft import get_peft_model_state_dict

from marl.agents.backends import PolicyBackend, SamplingConfig, make_backend
from marl.agents.backends.hf import HFBackend
from marl.agents.logprobs import sequence_logprobs
from marl.agents.models import ModelSpec, load_model

# Logprobs from generate() vs a fresh forward pass: same fp32 maths, different padding and
# KV-cache path, so they agree to float rounding. 1e-4 nats leaves a wide margin.
LOGPROB_ATOL = 1e-4


def _chat(tok, text: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


@pytest.fixture
def backend() -> HFBackend:
    return HFBackend(ModelSpec(seed=0))


@pytest.fixture
def prompts(backend: HFBackend) -> list[list[int]]:
    tok = backend.tokenizer
    return [_chat(tok, "hi"), _chat(tok, "what is two plus two?"), _chat(tok, "go north, then")]


def _flat(groups):
    return [g for group in groups for g in group]


def _padded(lists: list[list[float]], width: int) -> torch.Tensor:
    out = torch.zeros(len(lists), width)  # (B, T)
    for i, row in enumerate(lists):
        out[i, : len(row)] = torch.tensor(row)
    return out


def test_registered_and_built_from_spec_or_model() -> None:
    built = make_backend("hf", spec=ModelSpec(seed=2))
    assert isinstance(built, HFBackend) and isinstance(built, PolicyBackend)
    model, tok = load_model(ModelSpec(seed=2))
    assert HFBackend(model, tok).model is model
    with pytest.raises(ValueError, match="tokenizer"):
        HFBackend(model)


def test_batched_generation_shapes_and_n_samples(backend, prompts) -> None:
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0, n=4)
    groups = backend.generate(prompts, sampling, seed=0)
    assert len(groups) == len(prompts)
    for prompt, group in zip(prompts, groups):
        assert len(group) == 4
        for gen in group:
            assert gen.prompt_ids == prompt
            assert 1 <= len(gen.response_ids) <= 12
            assert len(gen.logprobs) == len(gen.response_ids)
            assert all(lp <= 0.0 for lp in gen.logprobs)
            assert gen.text == backend.tokenizer.decode(gen.response_ids, skip_special_tokens=True)
        # n samples of one prompt are independent draws, not copies
        assert len({tuple(g.response_ids) for g in group}) > 1


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (1.5, 0.5)])
def test_logprobs_match_a_recomputation(backend, prompts, temperature, top_p) -> None:
    sampling = SamplingConfig(max_new_tokens=16, temperature=temperature, top_p=top_p, n=2)
    gens = _flat(backend.generate(prompts, sampling, seed=1))
    with torch.no_grad():
        logp, mask = sequence_logprobs(
            backend.model,
            [g.prompt_ids for g in gens],
            [g.response_ids for g in gens],
            temperature=temperature,
            top_p=top_p,
            pad_token_id=backend.tokenizer.pad_token_id,
        )  # (B, T), (B, T)
    reported = _padded([g.logprobs for g in gens], logp.shape[1])  # (B, T)
    assert mask.sum().item() == sum(len(g.response_ids) for g in gens)
    assert torch.isfinite(reported).all()  # a sampled token is always inside the nucleus
    torch.testing.assert_close(reported * mask, logp * mask, atol=LOGPROB_ATOL, rtol=0)
    if top_p < 1.0:  # nucleus renormalisation makes logprobs higher than the plain ones
        with torch.no_grad():
            plain, _ = sequence_logprobs(
                backend.model,
                [g.prompt_ids for g in gens],
                [g.response_ids for g in gens],
                temperature=temperature,
            )
        assert ((reported - plain) * mask).sum() > 0


def test_greedy_picks_the_argmax_and_reports_model_logprobs(backend, prompts) -> None:
    sampling = SamplingConfig(max_new_tokens=10, temperature=0.0, n=2)
    groups = backend.generate(prompts, sampling)
    for group in groups:
        assert group[0].response_ids == group[1].response_ids  # greedy: n copies agree
    for gen in _flat(groups):
        seq = torch.tensor([gen.prompt_ids + gen.response_ids])  # (1, L)
        with torch.no_grad():
            logits = backend.model(seq).logits[0]  # (L, V)
        start = len(gen.prompt_ids) - 1
        steps = logits[start : start + len(gen.response_ids)]  # (T, V)
        assert steps.argmax(dim=-1).tolist() == gen.response_ids
        expected = (
            torch.log_softmax(steps, dim=-1)
            .gather(-1, torch.tensor(gen.response_ids).unsqueeze(-1))
            .squeeze(-1)
        )  # (T,)
        torch.testing.assert_close(torch.tensor(gen.logprobs), expected, atol=LOGPROB_ATOL, rtol=0)


def test_seed_makes_sampling_reproducible_without_touching_global_rng(backend, prompts) -> None:
    sampling = SamplingConfig(max_new_tokens=16, temperature=1.0, n=2)
    rng_before = torch.get_rng_state()
    first = _flat(backend.generate(prompts, sampling, seed=7))
    assert torch.equal(torch.get_rng_state(), rng_before)
    again = _flat(backend.generate(prompts, sampling, seed=7))
    other = _flat(backend.generate(prompts, sampling, seed=8))
    assert [g.response_ids for g in first] == [g.response_ids for g in again]
    assert [g.logprobs for g in first] == [g.logprobs for g in again]
    assert [g.response_ids for g in first] != [g.response_ids for g in other]


def test_responses_stop_after_the_first_eos(backend, prompts) -> None:
    # A random 101-token model emits EOS about once in 100 draws; at temperature 3 over
    # 3 x 8 rows x 40 tokens some rows stop and some run to the length limit.
    sampling = SamplingConfig(max_new_tokens=40, temperature=3.0, n=8)
    gens = _flat(backend.generate(prompts, sampling, seed=0))
    eos = backend.tokenizer.eos_token_id
    stopped = [g for g in gens if g.finish_reason == "stop"]
    ran_out = [g for g in gens if g.finish_reason == "length"]
    assert stopped and ran_out
    for gen in stopped:
        assert gen.response_ids[-1] == eos
        assert eos not in gen.response_ids[:-1]
        assert len(gen.logprobs) == len(gen.response_ids)
    for gen in ran_out:
        assert len(gen.response_ids) == 40 and eos not in gen.response_ids
    # The stopped rows carry no padding: lengths vary with where EOS fell.
    assert len({len(g.response_ids) for g in stopped}) > 1


def test_sequence_logprobs_is_differentiable_and_padding_free(backend, prompts) -> None:
    pairs = [(prompts[0], [40, 41, 4]), (prompts[1], [50]), (prompts[2], [60, 61, 62, 63, 64])]
    model = backend.model
    logp, mask = sequence_logprobs(model, [p for p, _ in pairs], [r for _, r in pairs])
    assert logp.shape == mask.shape == (3, 5)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    (logp * mask).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    with torch.no_grad():  # each pair alone gives the same numbers as the padded batch
        for i, (prompt, response) in enumerate(pairs):
            alone, _ = sequence_logprobs(model, [prompt], [response])  # (1, T_i)
            torch.testing.assert_close(
                alone[0], logp[i, : len(response)].detach(), atol=1e-5, rtol=0
            )


def _random_adapter(backend: HFBackend, name: str, seed: int) -> dict[str, torch.Tensor]:
    backend.add_adapter(name)
    state = get_peft_model_state_dict(backend.model, adapter_name=name)
    gen = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=gen) * 0.5 for k, v in state.items()}


def test_mixed_adapter_batch_equals_each_adapter_alone(backend, prompts) -> None:
    greedy = SamplingConfig(max_new_tokens=12, temperature=0.0)
    base_alone = backend.generate(prompts, greedy)
    state_a = _random_adapter(backend, "alice", seed=1)
    state_b = _random_adapter(backend, "bob", seed=2)
    backend.add_adapter("alice", state_a)
    backend.add_adapter("bob", state_b)
    names = ["alice", "bob", None]
    mixed = backend.generate(prompts, greedy, adapters=names)
    for i, name in enumerate(names):
        alone = backend.generate([prompts[i]], greedy, adapters=[name])[0][0]
        assert mixed[i][0].response_ids == alone.response_ids
        torch.testing.assert_close(
            torch.tensor(mixed[i][0].logprobs),
            torch.tensor(alone.logprobs),
            atol=LOGPROB_ATOL,
            rtol=0,
        )
    # None really is the base model, and the adapters really change the outputs.
    assert mixed[2][0].response_ids == base_alone[2][0].response_ids
    as_a = backend.generate(prompts, greedy, adapters=["alice"] * 3)
    assert [g[0].response_ids for g in as_a] != [g[0].response_ids for g in base_alone]
    with pytest.raises(KeyError, match="zzz"):
        backend.generate(prompts, greedy, adapters=["alice", "zzz", None])


def test_new_weights_for_a_loaded_adapter_are_copied_in_place(backend, prompts) -> None:
    greedy = SamplingConfig(max_new_tokens=12, temperature=0.0)
    state = _random_adapter(backend, "alice", seed=4)  # "alice" is loaded, fresh
    tensors = get_peft_model_state_dict(backend.model, adapter_name="alice")
    addresses = {k: v.data_ptr() for k, v in tensors.items()}
    backend.add_adapter("alice", state)  # a learner's sync: same shape, new values
    after = get_peft_model_state_dict(backend.model, adapter_name="alice")
    assert {k: v.data_ptr() for k, v in after.items()} == addresses  # nothing reallocated
    assert all(torch.equal(after[k], state[k]) for k in state)
    in_place = backend.generate(prompts, greedy, adapters=["alice"] * 3)
    other = make_backend("hf", spec=ModelSpec(seed=0))
    other.add_adapter("alice", state)  # the same weights, added afresh
    fresh = other.generate(prompts, greedy, adapters=["alice"] * 3)
    assert [g[0].response_ids for g in in_place] == [g[0].response_ids for g in fresh]
    assert [g[0].logprobs for g in in_place] == [g[0].logprobs for g in fresh]
    with pytest.raises(KeyError, match="do not fit"):
        backend.add_adapter("alice", {"base_model.model.nowhere.lora_A.weight": torch.zeros(1)})


def test_an_adapter_given_no_config_has_the_lora_settings_defaults(backend) -> None:
    from marl.agents.backends.base import LoraSettings

    backend.add_adapter("plain")
    made = backend.model.peft_config["plain"]
    want = LoraSettings()
    assert (made.r, made.lora_alpha, made.lora_dropout) == (want.r, want.alpha, want.dropout)
    assert set(made.target_modules) == set(want.target_modules)


def test_fresh_adapter_is_a_no_op_and_removal_restores_the_base(backend, prompts) -> None:
    greedy = SamplingConfig(max_new_tokens=12, temperature=0.0)
    base = [g[0].response_ids for g in backend.generate(prompts, greedy)]
    backend.add_adapter("fresh")
    fresh = backend.generate(prompts, greedy, adapters=["fresh"] * 3)
    assert [g[0].response_ids for g in fresh] == base
    backend.add_adapter("loud", _random_adapter(backend, "loud", seed=3))
    backend.remove_adapter("loud")
    backend.remove_adapter("fresh")
    assert backend.adapters == set()
    assert [g[0].response_ids for g in backend.generate(prompts, greedy)] == base
    with pytest.raises(KeyError, match="loud"):
        backend.remove_adapter("loud")
    with pytest.raises(KeyError, match="no adapters"):
        backend.generate(prompts, greedy, adapters=["loud", None, None])


@pytest.mark.parametrize("with_adapter", [False, True])
def test_load_weights_changes_outputs(backend, prompts, with_adapter) -> None:
    # Seeded sampling, not greedy: a random tied-embedding model greedily repeats its last token
    # whatever its weights, so greedy outputs would not tell two models apart.
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0)
    if with_adapter:
        backend.add_adapter("alice")  # the base weights must still be reachable under peft
    before = _flat(backend.generate(prompts, sampling, seed=0))
    donor, _ = load_model(ModelSpec(seed=1))
    expected = _flat(HFBackend(donor, backend.tokenizer).generate(prompts, sampling, seed=0))
    assert [g.response_ids for g in expected] != [g.response_ids for g in before]
    backend.load_weights(donor.state_dict())
    after = _flat(backend.generate(prompts, sampling, seed=0))
    assert [g.response_ids for g in after] == [g.response_ids for g in expected]
    for got, want in zip(after, expected):
        torch.testing.assert_close(
            torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=LOGPROB_ATOL, rtol=0
        )
    with pytest.raises(KeyError, match="unknown weight"):
        backend.load_weights({"model.not_a_layer.weight": torch.zeros(1)})


@pytest.mark.parametrize("name", ["__base__", "a", "lora", "x.y", ""])
def test_adapter_names_peft_would_mishandle_are_refused(backend, name) -> None:
    with pytest.raises(ValueError, match="adapter name"):
        backend.add_adapter(name)
    assert backend.adapters == set()


def test_checkpoint_sampling_defaults_do_not_leak_into_generation(prompts) -> None:
    model, tok = load_model(ModelSpec(seed=0))
    # A checkpoint may ship its own sampling defaults; the backend must sample as asked.
    model.generation_config.temperature = 0.05
    model.generation_config.top_k = 3
    model.generation_config.repetition_penalty = 3.0
    backend = HFBackend(model, tok)
    gens = _flat(backend.generate(prompts, SamplingConfig(max_new_tokens=16, n=2), seed=0))
    with torch.no_grad():
        logp, mask = sequence_logprobs(
            model, [g.prompt_ids for g in gens], [g.response_ids for g in gens]
        )  # (B, T)
    reported = _padded([g.logprobs for g in gens], logp.shape[1])  # (B, T)
    torch.testing.assert_close(reported * mask, logp * mask, atol=LOGPROB_ATOL, rtol=0)


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_filter_matches_transformers(top_p) -> None:
    from transformers import TopPLogitsWarper

    from marl.agents.logprobs import top_p_filter

    logits = torch.randn(6, 101, generator=torch.Generator().manual_seed(0)) * 3  # (B, V)
    expected = TopPLogitsWarper(top_p=top_p)(torch.zeros(6, 1, dtype=torch.long), logits.clone())
    assert torch.equal(top_p_filter(logits, top_p), expected)


def test_a_peft_wrapped_model_keeps_its_adapters(prompts) -> None:
    from peft import get_peft_model

    from marl.agents.backends.base import peft_lora_config

    model, tok = load_model(ModelSpec(seed=0))
    peft_model = get_peft_model(model, peft_lora_config(), adapter_name="carol")
    backend = HFBackend(peft_model, tok)
    assert backend.adapters == {"carol"}
    greedy = SamplingConfig(max_new_tokens=4, temperature=0.0)
    assert len(backend.generate(prompts, greedy, adapters=["carol", None, "carol"])) == 3
