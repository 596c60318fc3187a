"""A model too large for the device is refused before anything is allocated, in one line that
names the settings (issue 42: ``model.hidden_size=65536`` swapped for minutes, then died in the
allocator)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from marl.agents.memory import ModelTooLargeError, build_bytes, check_model_fits, free_memory_bytes
from marl.agents.models import ModelSpec, estimate_parameters, load_model


def test_the_estimate_is_the_built_model_s_size() -> None:
    spec = ModelSpec(kind="tiny", hidden_size=32, num_heads=4, num_layers=3)
    model, _ = load_model(spec)
    assert estimate_parameters(spec) == sum(p.numel() for p in model.parameters())
    assert build_bytes(spec, torch.bfloat16) == 4 * estimate_parameters(spec)  # built in fp32


def test_a_model_larger_than_free_memory_is_one_line_naming_its_settings() -> None:
    free = free_memory_bytes("cpu")
    hidden = 64  # doubled until the weights exceed the free RAM
    while build_bytes(ModelSpec(kind="tiny", hidden_size=hidden), torch.float32) <= free:
        hidden *= 2
    spec = ModelSpec(kind="tiny", hidden_size=hidden)
    start = time.monotonic()
    with pytest.raises(ModelTooLargeError) as refused:
        load_model(spec)
    assert time.monotonic() - start < 5  # nothing was allocated
    message = str(refused.value)
    assert "\n" not in message and f"model.hidden_size={hidden}" in message
    assert "free on cpu" in message
    check_model_fits(ModelSpec(kind="tiny"), "cpu", torch.float32)  # the test model fits


@pytest.mark.slow
@pytest.mark.subprocess
def test_marl_train_refuses_it_in_one_line(marl_cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = marl_cli(
        "train", "model=tiny", "model.hidden_size=65536", "train.steps=1", f"hydra.run.dir={run}",
        timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model.hidden_size=65536" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert not (run / "checkpoints").exists()
