"""The update shaped for a device (issue 37): microbatches by a token budget
(``algo.microbatch_tokens``) give the minibatch's gradient; the packed update equals the padded
one; the host reads the device once per optimizer step, however many microbatches; the
reference's logprobs are computed once per update."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from marl.agents.models import ModelSpec, load_model
from marl.config import ConfigError, load_config
from marl.losses import aggregation_denominator, metrics_to_host
from marl.runtime.learner import Learner, LearnerSettings

from .test_shared_prompts import LOSS_SETTINGS, _lora, _relative, _turns


def _accumulated(
    model: torch.nn.Module, turns: list, **settings: object
) -> tuple[dict[str, float], list[torch.Tensor], int]:
    """The metrics and the gradient of one minibatch of ``turns``, as ``_minibatch_step``
    accumulates them before its optimizer step, and the number of microbatches."""
    learner = Learner(copy.deepcopy(model), LearnerSettings(**settings))  # type: ignore[arg-type]
    s = learner.settings
    denominator = aggregation_denominator(
        [t.mask for t in turns], learner.aggregation, s.sampling.max_new_tokens
    )
    learner._zero_grad()
    metrics = metrics_to_host(learner._accumulate_gradients(turns, denominator))
    grads = [p.grad for p in learner.model.parameters() if p.requires_grad]
    return metrics, grads, len(learner.microbatches(turns))


@pytest.mark.parametrize(
    "settings",
    [{}, {"level": "sequence", "aggregation": "token_mean"}, {"aggregation": "constant"}],
    ids=["grpo", "gspo", "dr_grpo"],
)
@pytest.mark.parametrize("budget", [1, 12])
def test_microbatches_give_the_minibatch_gradient(settings: dict, budget: int) -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=5))
    turns = _turns(model, tok)
    whole, grad_whole, one = _accumulated(model, turns, microbatch_tokens=10_000, **settings)
    split, grad_split, many = _accumulated(model, turns, microbatch_tokens=budget, **settings)
    assert one == 1 and many > 1
    assert sum(float(g.abs().sum()) for g in grad_whole) > 0  # a real gradient, not zeros
    assert _relative(grad_split, grad_whole) < 1e-5
    for key in ("loss", "pg_loss", "n_tokens", "clip_frac", "ratio_mean", "approx_kl_old"):
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key


def test_microbatches_follow_the_token_budget() -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=5))
    turns = _turns(model, tok)
    learner = Learner(model, LearnerSettings(microbatch_tokens=40))
    chunks = learner.microbatches(turns)
    assert [t for chunk in chunks for t in chunk] == turns  # in order, each turn once
    from marl.agents.packing import packed_positions

    for chunk in chunks:
        size = packed_positions([t.prompt_ids for t in chunk], [t.response_ids for t in chunk])
        assert size <= 40 or len(chunk) == 1  # only a turn longer than the budget goes over
    assert len(chunks) > 1
    assert len(Learner(model, LearnerSettings(microbatch_tokens=1)).microbatches(turns)) == len(
        turns
    )


@LOSS_SETTINGS
def test_the_packed_update_equals_the_padded_one(settings: dict) -> None:
    """Today's padded path (a model on eager attention cannot take packed rows) against the
    packed one, on the same weights: the same loss, metrics and gradient."""
    model, tok = load_model(ModelSpec(kind="tiny", seed=3))
    settings = dict(settings)
    if settings.pop("lora", False):
        model = _lora(model)
    turns = _turns(model, tok)
    padded_model = copy.deepcopy(model)
    padded_model.set_attn_implementation("eager")
    results = []
    for m in (model, padded_model):
        learner = Learner(copy.deepcopy(m), LearnerSettings(**settings))  # type: ignore[arg-type]
        loss, metrics = learner.loss(turns)
        loss.backward()
        grads = [p.grad.detach().clone() for p in learner.model.parameters() if p.requires_grad]
        results.append((learner.packed, metrics, grads))
    (packed, m_packed, g_packed), (padded, m_padded, g_padded) = results
    assert packed and not padded
    assert sum(float(g.abs().sum()) for g in g_padded) > 0
    assert _relative(g_packed, g_padded) < 1e-5
    for key, value in m_padded.items():
        assert m_packed[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


class _HostReads(TorchDispatchMode):
    """Counts the calls that make the host wait for a device: a scalar read (``.item()``,
    ``float()``, ``bool()``, ``int()`` of a tensor: ``aten._local_scalar_dense``, whoever calls
    it), and ``.tolist()``, ``.cpu()``, ``.numpy()`` and ``torch.cuda.synchronize``."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def _host_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HostReads]:
    mode = _HostReads()

    def counted(name: str, owner: object) -> None:
        real = getattr(owner, name)

        def wrapper(*args: object, **kwargs: object) -> object:
            mode.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for name in ("tolist", "cpu", "numpy"):
        counted(name, torch.Tensor)
    counted("synchronize", torch.cuda)
    with mode:
        yield mode
    monkeypatch.undo()


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_the_host_reads_the_device_once_per_optimizer_step(
    monkeypatch: pytest.MonkeyPatch, beta: float
) -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=5))
    base = _turns(model, tok)
    turns = [copy.copy(base[i % len(base)]) for i in range(32)]  # 32 turns, 2 steps of 16
    for i, turn in enumerate(turns):
        turn.advantage = 0.5 if i % 2 else -0.5
    counts = {}
    for budget in (10_000, 1):  # 1 microbatch per step, then 16 (each turn alone)
        learner = Learner(
            copy.deepcopy(model),
            LearnerSettings(minibatch_size=16, microbatch_tokens=budget, beta=beta),
        )
        assert len(learner.microbatches(turns[:16])) == (1 if budget > 1 else 16)
        with _host_reads(monkeypatch) as reads:
            metrics = learner.update(turns)
        assert metrics["optimizer_steps"] == 2.0
        counts[budget] = reads.count
    # one read per optimizer step (loss, norm, metrics, the last step's weight check), plus
    # the last step's weight check at the end of the update
    assert counts == {10_000: 3, 1: 3}


def test_the_reference_runs_once_per_update_whatever_the_epochs() -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=5))
    turns = _turns(model, tok)
    learner = Learner(model, LearnerSettings(beta=0.04, epochs=3, minibatch_size=3))
    calls: list[int] = []
    assert learner.reference is not None
    learner.reference.register_forward_pre_hook(lambda *_: calls.append(1))
    metrics = learner.update(turns)
    assert metrics["optimizer_steps"] == 3 * 3  # 3 epochs of 3 minibatches
    assert len(calls) == 1  # every turn in one packed row, once
    assert metrics["kl"] > 0


def test_a_bad_microbatch_budget_names_the_key() -> None:
    with pytest.raises(ConfigError, match="algo.microbatch_tokens"):
        load_config({"algo": {"microbatch_tokens": 0}})


def test_a_null_budget_is_sized_from_free_memory_in_powers_of_two() -> None:
    from marl.runtime.learner import (
        MAX_MICROBATCH_TOKENS,
        MIN_MICROBATCH_TOKENS,
        default_microbatch_tokens,
        microbatch_tokens_for,
    )

    mb = 1 << 20
    assert microbatch_tokens_for(80 << 30, mb, "cuda") == 16384  # a quarter of 80 GiB
    assert microbatch_tokens_for(20 << 30, mb, "cpu") == 1024  # a CPU shares its RAM: 5%
    # a little more or less free memory gives the same budget (a resumed run's microbatches)
    assert microbatch_tokens_for(int(20.5 * (1 << 30)), mb, "cpu") == 1024
    assert microbatch_tokens_for(1 << 20, mb, "cuda") == MIN_MICROBATCH_TOKENS
    assert microbatch_tokens_for(1 << 50, mb, "cuda") == MAX_MICROBATCH_TOKENS
    model, _ = load_model(ModelSpec(kind="tiny"))
    budget = default_microbatch_tokens(model)
    assert budget & (budget - 1) == 0 and MIN_MICROBATCH_TOKENS <= budget
    assert Learner(model, LearnerSettings()).microbatch_tokens == budget
    assert Learner(model, LearnerSettings(microbatch_tokens=300)).microbatch_tokens == 300


def test_the_old_microbatch_key_says_what_replaced_it() -> None:
    replaced = "algo.microbatch_size: .* replaced by algo.microbatch_tokens"
    with pytest.raises(ConfigError, match=replaced):
        load_config({"algo": {"microbatch_size": 4}})
