"""The two decoding speed-ups of the HF backend, checked by behaviour: the token sampler draws
from the right distribution, and decoding on the CPU folds grouped-query heads instead of
calling the slow ``enable_gqa`` kernel, with the same tokens and logprobs as transformers'
own ``sdpa``."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from marl.agents.attention import MARL_ATTENTION, use_marl_attention
from marl.agents.backends import SamplingConfig
from marl.agents.backends.hf import HFBackend, sample_inverse_cdf
from marl.agents.models import build_char_tokenizer, prepare_tokenizer

PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])


def test_inverse_cdf_sampling_matches_the_distribution() -> None:
    logp = PROBS.log().expand(40_000, -1)  # (R, V); the last token has probability 0 (-inf)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        drawn = sample_inverse_cdf(logp)  # (R,)
    freq = torch.bincount(drawn, minlength=5).double() / drawn.numel()  # (V,)
    # 4 standard errors of a binomial share at n = 40,000 is at most 0.01
    torch.testing.assert_close(freq, PROBS.double(), atol=0.01, rtol=0)
    assert int(freq[4] * drawn.numel()) == 0  # a token of probability zero is never drawn


def test_inverse_cdf_sampling_is_reproducible_under_a_seed() -> None:
    logp = torch.log_softmax(torch.randn(64, 1000), dim=-1)  # (R, V)
    runs = []
    for _ in range(2):
        with torch.random.fork_rng():
            torch.manual_seed(3)
            runs.append(sample_inverse_cdf(logp))
    assert torch.equal(runs[0], runs[1])
    assert runs[0].min() >= 0 and runs[0].max() < 1000


def _gqa_backend(attention: str) -> HFBackend:
    """A tiny Llama with 4 query heads on 2 key/value heads, its weights fixed by the seed."""
    tokenizer = prepare_tokenizer(build_char_tokenizer())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    # transformers' own generate loop: on sdpa, the reference this test compares against
    backend = HFBackend(model, tokenizer, decode="generate")
    backend.model.set_attn_implementation(attention)
    return backend


@pytest.mark.parametrize("padded", [False, True])
def test_folded_decoding_equals_transformers_sdpa(monkeypatch, padded) -> None:
    ours, theirs = _gqa_backend(MARL_ATTENTION), _gqa_backend("sdpa")
    tok = ours.tokenizer
    texts = ["abcdefgh", "hgfedcba", "aabbccdd"] if not padded else ["ab", "hello there", "xyz"]
    prompts = [tok.encode(t, add_special_tokens=False) for t in texts]
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, n=2)

    calls: list[tuple[int, bool]] = []  # (query length, enable_gqa) of every attention call
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        calls.append((query.shape[2], bool(kwargs.get("enable_gqa"))))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    mine = [g for group in ours.generate(prompts, sampling, seed=5) for g in group]
    decoding = [gqa for q_len, gqa in calls if q_len <= 2]  # folded: 2 heads a key/value head
    assert decoding and not any(decoding)  # every decoding step folded, none on enable_gqa
    calls.clear()
    reference = [g for group in theirs.generate(prompts, sampling, seed=5) for g in group]
    if not padded:  # the control: transformers itself takes enable_gqa on an unpadded batch
        assert any(gqa for q_len, gqa in calls if q_len == 1)
    assert [g.response_ids for g in mine] == [g.response_ids for g in reference]
    for a, b in zip(mine, reference, strict=True):
        torch.testing.assert_close(
            torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0
        )


def test_a_model_on_another_attention_is_left_alone() -> None:
    backend = _gqa_backend("eager")
    assert use_marl_attention(backend.model).config._attn_implementation == "eager"
    fresh = _gqa_backend("sdpa")
    assert use_marl_attention(fresh.model).config._attn_implementation == (MARL_ATTENTION)


def test_a_draw_at_the_very_top_takes_the_last_token_with_probability(monkeypatch) -> None:
    logp = PROBS.log().expand(3, -1)  # (R, V): token 4 has probability 0
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape, **kw))
    assert sample_inverse_cdf(logp).tolist() == [3, 3, 3]  # never the filtered token 4
