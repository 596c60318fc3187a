"""The two SmolLM2 jobs compose and resolve: ``demo`` (``make run``: an adapter per agent over one
frozen base, within the 4 GB budget) and ``demo_full`` (a full model per agent, the recipe the
documented experiments were measured with)."""

from __future__ import annotations

from hydra import compose, initialize_config_module

from marl.cli import _register_scenario_options
from marl.config import Config, load_config
from marl.policy_map import plan_for


def load(name: str) -> Config:
    _register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return load_config(compose(config_name=name))


def test_make_run_trains_one_adapter_per_agent_over_one_frozen_base() -> None:
    config = load("demo")
    plan = plan_for(config)
    assert plan.agent_policy == {"speaker": "speaker", "listener": "listener"}
    specs = plan.policies.values()
    assert all(s.lora is not None and s.lora.r == 16 and s.trainable for s in specs)
    assert {s.adapter for s in specs} == {"speaker_adapter", "listener_adapter"}
    assert len({s.base_key for s in specs}) == 1  # one base model under both adapters
    assert config.algo.microbatch_size == 4 and config.warmup.agents == ["listener"]


def test_demo_full_is_the_same_job_with_a_full_model_per_agent() -> None:
    demo, full = load("demo"), load("demo_full")
    plan = plan_for(full)
    assert all(s.lora is None and s.trainable for s in plan.policies.values())
    assert full.sharing == "independent" and full.algo.lr == 2e-5
    assert full.algo.microbatch_size is None and full.warmup.lr == 5e-5
    # everything else is the demo's: scenario, model, sampling, steps, warm-up data
    assert (full.scenario, full.model, full.sampling, full.train) == (
        demo.scenario,
        demo.model,
        demo.sampling,
        demo.train,
    )
    assert (full.warmup.bot, full.warmup.agents, full.warmup.steps) == ("rule", ["listener"], 8)
