"""The single-process GRPO trainer: parameters change, reward rises, runs are reproducible and
resume exactly, and the CLI writes TensorBoard events that TensorBoard's own reader reads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.agents.models import ModelSpec, load_model
from marl.loop.train import train
from marl.runtime.checkpoint import load_checkpoint


def tiny_config(**overrides: object) -> dict:
    config = {
        "scenario": {"name": "unison", "overrides": {}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 12},
        "algo": {"lr": 3e-3},
        "train": {"steps": 2, "seeds_per_step": 1, "group_size": 4},
        "logging": {"progress": False, "transcripts_every": 1},
        "seed": 0,
    }
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if field:
            config.setdefault(section, {})[field] = value
        else:
            config[key] = value
    return config


def _comparable(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


def _assert_same_run(first: dict[str, float], second: dict[str, float]) -> None:
    """Bit for bit on the CPU. With a GPU the run trains on it, and CUDA's kernels (atomic
    adds in the backward pass) reorder sums from run to run: there, to 1e-6 relative."""
    first, second = _comparable(first), _comparable(second)
    if torch.cuda.is_available():
        assert first == pytest.approx(second, rel=1e-6, abs=1e-9)
    else:
        assert first == second


def test_two_steps_change_parameters_and_keep_loss_finite(tmp_path: Path) -> None:
    metrics = train(tiny_config(), run_dir=tmp_path)
    assert math.isfinite(metrics["policies/shared/loss"])
    assert metrics["policies/shared/trained_turns"] > 0
    initial, _ = load_model(ModelSpec(kind="tiny"))
    trained = load_checkpoint(tmp_path / "checkpoints")["policies"]["shared"]["weights"]
    changed = [
        name for name, p in initial.state_dict().items() if not torch.equal(p, trained[name])
    ]
    assert len(changed) > len(trained) // 2, f"only {changed} changed"


@pytest.mark.slow
def test_same_seed_gives_same_metrics(tmp_path: Path) -> None:
    first = train(tiny_config(), run_dir=tmp_path / "a")
    second = train(tiny_config(), run_dir=tmp_path / "b")
    _assert_same_run(first, second)
    other = train(tiny_config(seed=1), run_dir=tmp_path / "c")
    assert _comparable(first) != _comparable(other)


def test_resume_continues_exactly(tmp_path: Path) -> None:
    straight = train(tiny_config(**{"train.steps": 3}), run_dir=tmp_path / "straight")
    train(tiny_config(**{"train.steps": 2}), run_dir=tmp_path / "first")
    resumed = train(
        tiny_config(**{"train.steps": 3}, resume=str(tmp_path / "first" / "checkpoints")),
        run_dir=tmp_path / "resumed",
    )
    _assert_same_run(straight, resumed)
    assert (tmp_path / "resumed" / "checkpoints" / "step_000003" / "state.pt").is_file()


def test_tiny_model_learns_unison(tmp_path: Path) -> None:
    """Mean reward rises clearly on the smoke-test scenario (trend, not timing).

    Over seeds 0-3 the last three steps' mean reward beat the first three's by 0.04 to 0.06
    (from about 0.01); a learner that does not learn gains nothing. Seed 2 gains 0.06, twice
    the margin asserted."""
    config = tiny_config(
        **{"train.steps": 12, "train.group_size": 8, "train.seeds_per_step": 1, "seed": 2}
    )
    config["scenario"]["overrides"] = {"system_prompt": "", "agents": ["a"]}
    train(config, run_dir=tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    rewards = [e.value for e in events.Scalars("team/reward")]
    assert len(rewards) == 12
    early, late = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert late > early + 0.03 and late > 2 * early, rewards


@pytest.mark.slow
@pytest.mark.subprocess
def test_cli_train_writes_tensorboard_events(marl_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    completed = marl_cli(
        "train",
        "model=tiny",
        "train.steps=2",
        "train.group_size=2",
        "sampling.max_new_tokens=8",
        "logging.progress=false",
        f"hydra.run.dir={run_dir}",
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr
    assert (run_dir / "config.yaml").is_file()
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for agent in ("speaker", "listener"):
        for metric in ("reward", "response_length", "parse_failure_rate"):
            assert f"agents/{agent}/{metric}" in scalars
    for metric in ("loss", "kl", "clip_frac", "entropy_proxy"):
        assert f"policies/shared/{metric}" in scalars
    assert len(events.Scalars("agents/speaker/reward")) == 2
    # every phase of the loop is timed at every step, within the step's own time
    phases = ("rollout", "credit", "emergence", "update", "sync")
    for step in range(2):
        times = [events.Scalars(f"perf/{phase}_time")[step].value for phase in phases]
        assert min(times) >= 0.0 and times[0] > 0.0
        assert events.Scalars("perf/step_time")[step].value >= 0.999 * sum(times)
    assert any(tag.startswith("transcripts/") for tag in events.Tags()["tensors"])
    # the HParams session: the command line's overrides and the final metrics (docs/sweeps.md)
    from marl.analysis.hparams import read_session

    hparams, finals, status = read_session(run_dir / "tensorboard")
    assert status == "success"
    assert hparams["model"] == "tiny" and hparams["train.steps"] == 2.0
    assert hparams["scenario.name"] == "signal-v0" and hparams["seed"] == 0.0
    rewards = [e.value for e in events.Scalars("team/reward")]
    assert finals["final/team/reward"] == pytest.approx(sum(rewards) / 2, rel=1e-5, abs=1e-7)
    assert "final/team/parse_failure_rate" in finals  # LLM agents: parse failures are counted


@pytest.mark.slow
@pytest.mark.subprocess
def test_cli_train_rejects_impossible_config_without_traceback(marl_cli, tmp_path: Path) -> None:
    completed = marl_cli(
        "train", "model=tiny", "train.group_size=0", f"hydra.run.dir={tmp_path}", timeout=120
    )
    assert completed.returncode != 0
    assert "train.group_size" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_a_warmup_is_checkpointed_as_step_0_and_a_resume_from_it_does_not_repeat_it(
    tmp_path: Path,
) -> None:
    warm = {"warmup.steps": 2, "warmup.bot": "rule", "train.checkpoint_every": 1}
    train(tiny_config(**warm, **{"train.steps": 0}), run_dir=tmp_path / "warm")
    step0 = tmp_path / "warm" / "checkpoints" / "step_000000"
    assert (step0 / "state.pt").is_file()
    initial, _ = load_model(ModelSpec(kind="tiny"))
    warmed = load_checkpoint(step0)["policies"]["shared"]["weights"]
    assert any(not torch.equal(p, warmed[n]) for n, p in initial.state_dict().items())
    straight = train(tiny_config(**warm, **{"train.steps": 1}), run_dir=tmp_path / "straight")
    resumed = train(
        tiny_config(**warm, **{"train.steps": 1}, resume=str(step0)), run_dir=tmp_path / "r"
    )
    _assert_same_run(straight, resumed)  # the warm-up ran once, before step 0, in both


def test_the_warmed_up_step_0_checkpoint_holds_every_field_a_later_one_does(
    tmp_path: Path,
) -> None:
    """One builder for every checkpoint: step 0 (after the warm-up) once lacked the role
    baselines; a resume from it and from step N restore the same fields."""
    run = {
        "warmup.steps": 1,
        "warmup.bot": "rule",
        "train.checkpoint_every": 1,
        "train.steps": 1,
        "algo.advantage": "rae",
    }
    train(tiny_config(**run), run_dir=tmp_path / "run")
    step0 = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_000000")
    step1 = load_checkpoint(tmp_path / "run" / "checkpoints" / "step_000001")
    assert set(step0) == set(step1) and {"advantage", "emergence"} <= set(step0)
    for source in ("step_000000", "step_000001"):
        resumed = train(
            tiny_config(**{**run, "train.steps": 2},
                        resume=str(tmp_path / "run" / "checkpoints" / source)),
            run_dir=tmp_path / f"from_{source}",
        )  # fmt: skip
        assert resumed
