"""The learner does what its docs say (issue 9, items 4, 5 and 14-18): non-finite steps are
skipped, counted, rolled back and never checkpointed; top-p with a KL term stays finite; the
optimizer steps per minibatch; the turn mask is honoured; bf16 models keep fp32 master weights;
the gradient's scale does not depend on skipped turns or on beta; every tensor follows the
model's device."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from marl.agents.backends import SamplingConfig
from marl.agents.logprobs import sequence_logprobs
from marl.agents.models import ModelSpec, load_model
from marl.errors import RunError
from marl.loop.train import train
from marl.protocols.turn import TurnRecord
from marl.runtime.checkpoint import load_checkpoint
from marl.runtime.learner import Learner, LearnerSettings, NonFiniteUpdateError, nonfinite_tensors

EXCHANGES = [  # (prompt, response, advantage)
    ("Say a colour:", " red", 1.0),
    ("Say a colour:", " blue!", -1.0),
    ("Count to three:", " 1 2 3", 0.5),
    ("Count to three:", " one", -0.5),
    ("Name a fruit:", " pear", 0.0),
    ("Name a fruit:", " plum", 0.0),
]


def tiny_config(**overrides: object) -> dict:
    """A two-step unison run of the tiny model (as in test_train.py); ``section.key`` overrides."""
    config: dict = {
        "scenario": {"name": "unison", "overrides": {}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 12},
        "algo": {"lr": 3e-3},
        "train": {"steps": 2, "seeds_per_step": 1, "group_size": 4},
        "logging": {"progress": False, "transcripts_every": 0},
        "seed": 0,
    }
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        config.setdefault(section, {})[field] = value
    return config


def _tiny(dtype: str = "float32") -> tuple[torch.nn.Module, object]:
    return load_model(ModelSpec(kind="tiny", dtype=dtype))


def _turns(
    model: torch.nn.Module,
    tokenizer: object,
    exchanges: list[tuple[str, str, float]] = EXCHANGES,
    top_p: float = 1.0,
) -> list[TurnRecord]:
    """Turn records whose behaviour logprobs are the model's own (the ratio starts at 1)."""
    turns = []
    for i, (prompt, response, advantage) in enumerate(exchanges):
        p = tokenizer.encode(prompt, add_special_tokens=False)  # type: ignore[attr-defined]
        r = tokenizer.encode(response, add_special_tokens=False)  # type: ignore[attr-defined]
        with torch.no_grad():
            logp, _ = sequence_logprobs(model, [p], [r], top_p=top_p)
        turns.append(TurnRecord("a", "shared", 0, i, 0, p, r, logp[0].tolist(), [1] * len(r)))
        turns[-1].advantage = advantage
    return turns


def _sgd_gradient(learner: Learner, turns: list[TurnRecord]) -> list[torch.Tensor]:
    """The gradient of one update, read off plain SGD with lr 1 (delta = -gradient)."""
    learner.optimizer = torch.optim.SGD(learner.params, lr=1.0)
    before = [p.detach().clone() for p in learner.params]
    learner.update(turns)
    return [b - p.detach() for b, p in zip(before, learner.params)]


def _settings(**overrides: object) -> LearnerSettings:
    base = {"lr": 1e-3, "minibatch_size": 64, "max_grad_norm": 1e9}
    base.update(overrides)
    return LearnerSettings(**base)  # type: ignore[arg-type]


def _relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    num = sum(float((x - y).pow(2).sum()) for x, y in zip(a, b))
    den = sum(float(y.pow(2).sum()) for y in b)
    return math.sqrt(num / den)


# --- item 4: non-finite loss, gradient or weight -------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [({"lr": float("inf")}, "weights"), ({"max_grad_norm": float("nan")}, "gradient")],
)
def test_nonfinite_step_is_skipped_counted_and_stops_the_run(overrides: dict, problem: str) -> None:
    model, tok = _tiny()
    turns = _turns(model, tok)
    learner = Learner(model, _settings(**overrides, max_nonfinite_updates=3), name="shared")
    before = copy.deepcopy(model.state_dict())
    for n in (1, 2):
        with pytest.warns(RuntimeWarning, match=f"non-finite {problem}.*{n} in a row"):
            metrics = learner.update(turns)
        assert metrics["nonfinite_skips"] == 1.0 and metrics["optimizer_steps"] == 0.0
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), f"{name} changed in a skipped step"
    assert not nonfinite_tensors(learner.state_dict())
    with pytest.raises(NonFiniteUpdateError, match="shared.*3 optimizer steps in a row"):
        learner.update(turns)


def test_a_finite_step_resets_the_count_and_zero_skips_are_logged() -> None:
    model, tok = _tiny()
    turns = _turns(model, tok)
    learner = Learner(model, _settings())
    learner.optimizer.param_groups[0]["lr"] = float("inf")
    with pytest.warns(RuntimeWarning):
        learner.update(turns)
    assert learner.nonfinite_in_a_row == 1
    learner.optimizer.param_groups[0]["lr"] = 1e-3
    metrics = learner.update(turns)
    assert metrics["nonfinite_skips"] == 0.0 and metrics["optimizer_steps"] == 1.0
    assert learner.nonfinite_in_a_row == 0


def test_training_with_overflowing_lr_stops_and_never_checkpoints_nan(tmp_path: Path) -> None:
    """lr=1e39 is finite (it passes config checks) but overflows float32 weights. The KL term
    (beta > 0) gives every turn a gradient, so every step tries an update."""
    config = tiny_config(
        **{"algo.lr": 1e39, "algo.beta": 0.01, "train.steps": 5, "train.checkpoint_every": 1},
    )
    config["algo"]["max_nonfinite_updates"] = 2
    with pytest.warns(RuntimeWarning), pytest.raises(RunError, match="max_nonfinite_updates=2"):
        train(config, run_dir=tmp_path)
    written = sorted((tmp_path / "checkpoints").glob("step_*"))
    assert written, "the first (skipped, finite) step should still be checkpointed"
    state = load_checkpoint(tmp_path / "checkpoints")
    assert not nonfinite_tensors(state), "a checkpoint holds NaN/inf"


@pytest.mark.slow
@pytest.mark.subprocess
def test_cli_reports_nonfinite_stop_in_one_line(marl_cli, tmp_path: Path) -> None:
    completed = marl_cli(
        "train",
        "model=tiny",
        "algo.lr=1e39",
        "algo.beta=0.01",
        "algo.max_nonfinite_updates=1",
        "train.steps=2",
        "train.group_size=2",
        "sampling.max_new_tokens=4",
        "logging.progress=false",
        f"hydra.run.dir={tmp_path / 'run'}",
        timeout=300,
    )
    assert completed.returncode == 2, completed.stderr[-2000:]
    assert "Traceback" not in completed.stderr
    assert "non-finite weights" in completed.stderr
    assert "algo.max_nonfinite_updates=1" in completed.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_checkpoint_refuses_nonfinite_state() -> None:
    from marl.loop.trackers import _refuse_nonfinite

    good = {"weights": {"w": torch.ones(3)}, "learner": {"optimizer": {"state": {}}}}
    _refuse_nonfinite({"shared": good}, step=4)
    bad = copy.deepcopy(good)
    bad["learner"]["master"] = [torch.tensor([1.0, float("nan")])]
    with pytest.raises(RunError, match=r"step 4: policy 'other'.*learner\.master\.0"):
        _refuse_nonfinite({"shared": good, "other": bad}, step=4)


# --- item 5: top-p with a KL term ----------------------------------------------------------


def test_kl_is_finite_for_tokens_outside_the_nucleus() -> None:
    """A sampled token outside the top-p nucleus of policy and reference: k3 was inf - inf."""
    model, tok = _tiny()
    prompt = tok.encode("Say a colour:", add_special_tokens=False)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1]  # (V,)
    rare = int(logits.argmin())  # outside any nucleus of mass 0.9
    full_logp, _ = sequence_logprobs(model, [prompt], [[rare]])  # the untruncated logprob
    turn = TurnRecord("a", "shared", 0, 0, 0, prompt, [rare], full_logp[0].tolist(), [1])
    turn.advantage = 1.0
    learner = Learner(model, _settings(beta=0.04, sampling=SamplingConfig(top_p=0.9), epochs=2))
    metrics = learner.update([turn, copy.deepcopy(turn)])
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["kl"])
    assert not nonfinite_tensors(model.state_dict())
    assert metrics["nonfinite_skips"] == 0.0


def test_top_p_with_kl_and_two_epochs_trains_finite(tmp_path: Path) -> None:
    overrides = {"sampling.top_p": 0.9, "algo.beta": 0.04, "algo.epochs": 2, "train.steps": 3}
    metrics = train(tiny_config(**overrides), run_dir=tmp_path)
    for key in ("loss", "kl", "pg_loss", "grad_norm"):
        assert math.isfinite(metrics[f"policies/shared/{key}"]), key
    assert metrics["policies/shared/nonfinite_skips"] == 0.0
    assert not nonfinite_tensors(load_checkpoint(tmp_path / "checkpoints"))


# --- item 14: one optimizer step per minibatch ---------------------------------------------


def test_optimizer_steps_per_minibatch_and_the_clip_binds_in_the_second() -> None:
    model, tok = _tiny()
    turns = _turns(model, tok, [("Say a colour:", " red", 1.0)] * 4)
    one_batch = Learner(copy.deepcopy(model), _settings(lr=0.05, minibatch_size=4))
    metrics = one_batch.update(turns)
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clip_frac"] == 0.0
    two_batches = Learner(model, _settings(lr=0.05, minibatch_size=2))
    metrics = two_batches.update(turns)
    # the first minibatch has ratio exactly 1 and no clipping: the rest comes from the second
    assert metrics["ratio_mean"] > 1.1
    assert metrics["clip_frac"] > 0.25
    assert metrics["optimizer_steps"] == 2.0


# --- item 15: the turn mask ----------------------------------------------------------------


def _reference_gradient(
    model: torch.nn.Module, turns: list[TurnRecord], eps: float = 0.2
) -> list[torch.Tensor]:
    """GRPO's seq_mean clipped loss written out turn by turn, masked tokens left out."""
    model = copy.deepcopy(model)
    losses = []
    for t in turns:
        ids = torch.tensor([t.prompt_ids + t.response_ids])  # (1, L)
        logits = model(input_ids=ids).logits[0, len(t.prompt_ids) - 1 : -1]  # (R, V)
        logp = torch.log_softmax(logits.float(), -1).gather(
            -1, torch.tensor(t.response_ids).unsqueeze(-1)
        )[:, 0]  # (R,)
        kept = [i for i, m in enumerate(t.mask) if m]
        if not kept:
            continue
        terms = []
        for i in kept:
            ratio = torch.exp(logp[i] - t.logprobs[i])
            clipped = ratio.clamp(1 - eps, 1 + eps)
            terms.append(-torch.minimum(ratio * t.advantage, clipped * t.advantage))
        losses.append(torch.stack(terms).mean())
    torch.stack(losses).mean().backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def test_masked_tokens_get_no_gradient() -> None:
    model, tok = _tiny()
    turns = _turns(model, tok, EXCHANGES[:4])
    for t in turns:  # every other token was not generated by the agent
        t.mask = [i % 2 for i in range(len(t.response_ids))]
        t.logprobs = [v - 0.3 * (i % 3) for i, v in enumerate(t.logprobs)]  # ratio != 1
    got = _sgd_gradient(Learner(copy.deepcopy(model), _settings()), turns)
    want = _reference_gradient(model, turns)
    assert _relative(got, want) < 1e-4
    unmasked = copy.deepcopy(turns)
    for t in unmasked:
        t.mask = [1] * len(t.response_ids)
    assert _relative(_reference_gradient(model, unmasked), want) > 0.1  # the mask matters here


# --- item 16: bf16 with fp32 master weights ------------------------------------------------


def _changed_fraction(before: list[torch.Tensor], after: list[torch.Tensor]) -> float:
    changed = sum(int((a != b).sum()) for a, b in zip(after, before))
    return changed / sum(b.numel() for b in before)


def test_bf16_model_keeps_fp32_masters_and_a_small_step_changes_every_weight() -> None:
    fractions = {}
    for dtype in ("float32", "bfloat16"):
        model, tok = _tiny(dtype)
        learner = Learner(model, _settings(lr=1e-5, max_grad_norm=1.0))
        assert all(p.dtype == torch.float32 for p in learner.params)
        before = [p.detach().clone() for p in learner.params]
        metrics = learner.update(_turns(model, tok))
        assert metrics["optimizer_steps"] == 1.0
        fractions[dtype] = _changed_fraction(before, [p.detach() for p in learner.params])
        if dtype == "bfloat16":
            assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # fast forward
            for p, master in learner.masters.pairs:
                assert torch.equal(p, master.to(torch.bfloat16))  # the model holds the rounding
    assert fractions["float32"] > 0.5
    assert fractions["bfloat16"] >= 0.99 * fractions["float32"], fractions


def test_bf16_masters_survive_a_checkpoint_round_trip() -> None:
    model, tok = _tiny("bfloat16")
    learner = Learner(model, _settings(lr=1e-5))
    learner.update(_turns(model, tok))
    state = copy.deepcopy(learner.state_dict())
    fresh, _ = _tiny("bfloat16")
    fresh.load_state_dict(model.state_dict())
    restored = Learner(fresh, _settings(lr=1e-5))
    restored.load_state_dict(state)
    for a, b in zip(restored.params, learner.params):
        assert torch.equal(a, b)


# --- item 17: zero-advantage turns and beta ------------------------------------------------


def test_gradient_scale_does_not_depend_on_skipped_turns_or_beta() -> None:
    model, tok = _tiny()
    turns = _turns(model, tok)  # two of the six have advantage 0
    without_kl = _sgd_gradient(Learner(copy.deepcopy(model), _settings(beta=0.0)), turns)
    tiny_kl = _sgd_gradient(Learner(copy.deepcopy(model), _settings(beta=1e-12)), turns)
    assert _relative(without_kl, tiny_kl) < 1e-5


# --- item 18: devices ----------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [{}, {"beta": 0.04, "sampling": SamplingConfig(top_p=0.9)}])
def test_every_tensor_follows_the_model_device(overrides: dict) -> None:
    """With meta as the default device, a tensor built without the model's device (CPU here)
    lands on meta, and mixing it with the model's tensors fails."""
    model, tok = _tiny()
    turns = _turns(model, tok)
    learner = Learner(model, _settings(**overrides))
    with torch.device("meta"):
        metrics = learner.update(turns)
    assert metrics["optimizer_steps"] == 1.0
    assert all(p.device.type == "cpu" for p in model.parameters())
