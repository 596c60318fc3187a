"""The machine a run lands on: GPU packing for every shipped config on 0, 1 and 2 GPUs, the
``auto`` dtype from torch's capability checks (and the probe where they say nothing), the
warning for an emulated bf16, and the one line a run prints."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_module

import marl.agents.precision as precision
from marl.agents.models import ModelSpec
from marl.cli import register_scenario_options
from marl.config import Config, load_config
from marl.loop.train import check_config, train
from marl.runtime.machine import cpu_name, fit_machine
from marl.runtime.policy_map import assign_gpus

SHIPPED = ["train", "demo", "demo_full"]


def load(name: str, *overrides: str) -> Config:
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return load_config(compose(config_name=name, overrides=list(overrides)))


@pytest.fixture
def fresh_support():
    """Forget the process's bf16 verdicts before and after a test that fakes the checks."""
    precision._support.cache_clear()
    yield
    precision._support.cache_clear()


@pytest.mark.parametrize("name", SHIPPED)
@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_every_shipped_config_fits_0_1_and_2_gpus(name: str, gpus: int, no_gpu: None) -> None:
    config = load(name)
    plan = check_config(config)
    assert plan is not None
    requests = assign_gpus(plan, gpus, source="a fake device count")  # raises if it cannot fit
    _, _, machine = fit_machine(config, plan, gpus=gpus, gpu_name="NVIDIA H100 80GB HBM3")
    assert machine.requests == requests
    assert sum(requests.values()) <= gpus + 1e-9
    if gpus:
        assert all(0 < share <= 1 for share in requests.values())
        assert machine.device == "cuda" and "H100" in machine.line()
    else:
        assert set(requests.values()) == {0.0} and machine.device == "cpu"
        assert machine.line().startswith("devices: CPU (")


def test_the_demo_on_one_gpu_shares_it_between_its_two_adapters(no_gpu: None) -> None:
    config = load("demo")
    _, _, machine = fit_machine(config, check_config(config), gpus=1, gpu_name="H100")
    assert machine.requests == {"speaker": 0.5, "listener": 0.5}
    assert machine.line().startswith("devices: 1 GPU (H100): 2 policies and the rollout share")
    assert "; learners: listener, speaker on cuda:0; dtype" in machine.line()
    ray = load("demo", "ray=local", "warmup.steps=0")
    _, _, machine = fit_machine(ray, check_config(ray), gpus=1, gpu_name="H100")
    # under Ray the 2 rollout workers are actors too: 4 equal shares of the one GPU
    assert "2 policies share it (listener 0.25, speaker 0.25), and 2 rollout workers 0.25 each" in (
        machine.line()
    )
    assert "; learners: listener, speaker on its Ray actor's GPU; dtype" in machine.line()
    own = load("demo", "ray=local", "warmup.steps=0", "ray.worker_num_gpus=0")
    _, _, machine = fit_machine(own, check_config(own), gpus=1, gpu_name="H100")
    assert "2 policies share it (listener 0.5, speaker 0.5);" in machine.line()
    _, _, machine = fit_machine(config, check_config(config), gpus=0)
    assert "; learners: listener, speaker on cpu; dtype" in machine.line()


def test_auto_dtype_follows_the_devices_bf16_and_is_written_everywhere(no_gpu: None) -> None:
    config = load("demo", "+policies.extra.model.kind=embedded", "+policy_map.speaker=extra")
    assert config.model.dtype == "auto"
    resolved, plan, machine = fit_machine(config, check_config(config))
    expected = "bfloat16" if precision.bf16_support("cpu").fast else "float32"
    assert machine.dtype == resolved.model.dtype == expected
    assert resolved.policies["extra"].model.dtype == expected
    assert {spec.model.dtype for spec in plan.policies.values()} == {expected}
    assert machine.reason == precision.bf16_support("cpu").reason
    assert f"dtype {expected} (auto: " in machine.line()


def test_the_tiny_test_model_stays_float32_and_a_named_dtype_stays_as_written() -> None:
    assert precision.resolve_dtype("auto", "cpu", kind="tiny") == "float32"
    assert precision.resolve_dtype("float32", "cpu", kind="embedded") == "float32"
    assert precision.resolve_dtype("bfloat16", "cpu", kind="embedded") == "bfloat16"
    assert ModelSpec(kind="tiny").torch_dtype() == torch.float32
    with pytest.raises(ValueError, match="model.dtype: 'float16' is not one of"):
        ModelSpec(dtype="float16")


def test_cpu_bf16_comes_from_torchs_capability_checks(fresh_support: None) -> None:
    checks = precision._cpu_capabilities()
    support = precision.bf16_support("cpu")
    if checks is None:  # not x86: the probe decided
        assert support.reason.startswith("measured")
    else:
        assert support.fast == any(checks)
        assert support.reason in ("AVX512-BF16", "AMX") or support.reason.startswith(
            "no AVX512-BF16 or AMX"
        )


def test_the_probe_decides_where_the_checks_say_nothing(
    monkeypatch: pytest.MonkeyPatch, fresh_support: None
) -> None:
    monkeypatch.setattr(precision, "_cpu_capabilities", lambda: None)
    ratios = iter([0.45, 30.0])
    monkeypatch.setattr(precision, "bf16_slowdown", lambda device: next(ratios))
    fast = precision.bf16_support("cpu")
    assert fast.fast and "0.45x" in fast.reason
    precision._support.cache_clear()
    slow = precision.bf16_support("cpu")
    assert not slow.fast and "30x" in slow.reason


def test_the_probe_measures_a_real_ratio() -> None:
    ratio = precision.bf16_slowdown("cpu", repeats=2)
    assert math.isfinite(ratio) and ratio > 0


def test_explicit_bf16_on_an_emulating_cpu_warns_once_with_the_ratio(
    monkeypatch: pytest.MonkeyPatch, fresh_support: None, no_gpu: None
) -> None:
    monkeypatch.setattr(precision, "_cpu_capabilities", lambda: (False, False))  # AVX2 only
    config = load("demo", "model.dtype=bfloat16")
    resolved, _, machine = fit_machine(config, check_config(config))
    assert resolved.model.dtype == "bfloat16"  # as written
    assert "emulates bf16 (no AVX512-BF16 or AMX" in machine.warning
    assert "slower than in float32" in machine.warning
    auto = load("demo")
    resolved, _, machine = fit_machine(auto, check_config(auto))
    assert resolved.model.dtype == "float32" and not machine.warning
    assert "dtype float32 (auto: no AVX512-BF16 or AMX" in machine.line()


def test_a_run_prints_its_devices_once_and_records_the_resolved_dtype(
    tmp_path: Path, capsys: pytest.CaptureFixture, no_gpu: None
) -> None:
    config = {
        "scenario": {"name": "unison", "overrides": {"system_prompt": "", "agents": ["a", "b"]}},
        "model": {"kind": "tiny", "dtype": "auto"},
        "sampling": {"max_new_tokens": 4},
        "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2},
        "logging": {"progress": False, "tensorboard": False},
    }
    train(config, run_dir=tmp_path)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("devices:")]
    # The whole line, the CPU's name included as marl.runtime.machine reads it (names such as
    # "Intel(R) Xeon(R) Processor" hold parentheses of their own).
    assert lines == [
        f"devices: CPU ({cpu_name()}); learners: shared on cpu; dtype float32 (auto: the tiny "
        "test model stays float32)"
    ]
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["model"]["dtype"] == "float32"
