"""The SmolLM2 jobs compose and resolve: ``demo`` (``make run``: an adapter per agent over one
frozen base, within the 4 GB budget), ``demo_full`` (a full model per agent, the recipe the
documented experiments were measured with) and ``code`` (the demo's pair on signal-code-v0, a
code learned by RL alone)."""

from __future__ import annotations

import math
from pathlib import Path

from hydra import compose, initialize_config_module

from marl.cli import register_scenario_options
from marl.config import Config, load_config
from marl.runtime.policy_map import plan_for


def load(name: str, *overrides: str) -> Config:
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return load_config(compose(config_name=name, overrides=list(overrides)))


def test_make_run_trains_one_adapter_per_agent_over_one_frozen_base() -> None:
    config = load("demo")
    plan = plan_for(config)
    assert plan.agent_policy == {"speaker": "speaker", "listener": "listener"}
    specs = plan.policies.values()
    assert all(s.lora is not None and s.lora.r == 16 and s.trainable for s in specs)
    assert {s.adapter for s in specs} == {"speaker_adapter", "listener_adapter"}
    assert len({s.base_key for s in specs}) == 1  # one base model under both adapters
    assert config.algo.microbatch_tokens is None and config.warmup.agents == ["listener"]


def test_demo_full_is_the_same_job_with_a_full_model_per_agent() -> None:
    demo, full = load("demo"), load("demo_full")
    plan = plan_for(full)
    assert all(s.lora is None and s.trainable for s in plan.policies.values())
    assert full.sharing == "independent" and full.algo.lr == 2e-5
    assert full.algo.microbatch_tokens is None and full.warmup.lr == 5e-5
    # everything else is the demo's: scenario, model, sampling, steps, warm-up data
    assert (full.scenario, full.model, full.sampling, full.train) == (
        demo.scenario,
        demo.model,
        demo.sampling,
        demo.train,
    )
    assert (full.warmup.bot, full.warmup.agents, full.warmup.steps) == ("rule", ["listener"], 8)


def test_code_is_the_demo_on_a_code_drawn_from_the_run_seed_with_a_format_only_warmup() -> None:
    demo, code = load("demo"), load("code")
    assert code.scenario.name == "signal-code-v0"
    assert code.scenario.overrides == {"params": {"code_seed": code.seed}}
    assert load("code", "seed=7").scenario.overrides == {"params": {"code_seed": 7}}
    # the warm-up teaches the listener the format, never the code (the rule bot would)
    assert (code.warmup.bot, code.warmup.agents) == ("format", ["listener"])
    assert code.warmup.bots == {}
    # the demo's pair, sampling and update; more RL steps, same batch shape
    assert (code.model, code.sharing, code.policy_defaults, code.sampling, code.algo) == (
        demo.model,
        demo.sharing,
        demo.policy_defaults,
        demo.sampling,
        demo.algo,
    )
    assert (code.train.group_size, code.train.seeds_per_step) == (
        demo.train.group_size,
        demo.train.seeds_per_step,
    )
    assert code.train.steps >= 40


def test_code_trains_one_step_with_a_tiny_model(tmp_path: Path) -> None:
    import torch

    from marl.loop.train import train

    register_scenario_options()
    overrides = [
        "model=tiny",
        "train.steps=1",
        "train.seeds_per_step=1",
        "train.eval_episodes=2",
        "train.checkpoint_every=0",
        "warmup.steps=1",
        "warmup.episodes=2",
        "emergence.influence_every=0",
        "logging.progress=false",
        "logging.tensorboard=false",
        "logging.transcripts_every=0",
        "seed=3",
    ]
    torch.set_num_threads(1)
    with initialize_config_module(config_module="marl.configs", version_base=None):
        cfg = compose(config_name="code", overrides=overrides)
    metrics = train(cfg, run_dir=tmp_path)
    assert metrics and all(math.isfinite(v) for v in metrics.values() if isinstance(v, float))
