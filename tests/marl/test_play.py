"""``marl play agents=llm`` plays the policy plan ``marl train`` would build: ``sharing``,
``policies``, ``policy_map`` and LoRA adapters are honoured, and their mistakes are refused."""

from __future__ import annotations

from typing import Any

import pytest

from marl.config import ConfigError, load_config
from marl.play import play_llm

BASE: dict[str, Any] = {
    "scenario": {"name": "signal-v0", "overrides": {}},
    "model": {"kind": "tiny"},
    "sampling": {"max_new_tokens": 12},
    "agents": "llm",
    "seed": 4,
}


def play(**overrides: Any) -> str:
    return play_llm({**BASE, **overrides})


def test_the_default_shared_policy_plays_as_one_backend_did() -> None:
    """Behaviour kept: the plan's one ``shared`` policy is the single backend play used."""
    from marl.runtime.policies import build_backend
    from marl.runtime.rollout import EpisodeSlot, run_episodes
    from marl.runtime.seeding import seed_everything
    from marl.scenarios.registry import make
    from marl.scenarios.transcript import render_header, render_transcript

    config = load_config(BASE)
    seed_everything(config.seed)
    env = make(config.scenario.name)
    backend = build_backend(config)
    env.reset(seed=config.seed)
    header = render_header(env)
    run_episodes(
        [EpisodeSlot(env=env, seed=config.seed, group_id=0, episode_id=0)],
        {"shared": backend},
        lambda agent: "shared",
        config.sampling,
        seed=config.seed,
    )
    assert play() == header + "\n" + render_transcript(env)


def test_declared_policies_and_the_policy_map_decide_who_plays_what() -> None:
    # Every agent on a declared policy whose base model has another seed: the transcript is
    # that model's, not the run's `model`.
    custom = play(
        sharing="custom",
        policies={"other": {"model": {"kind": "tiny", "seed": 7}}},
        policy_map={"*": "other"},
    )
    assert custom == play(model={"kind": "tiny", "seed": 7})
    assert custom != play()
    # independent policies: one full copy of the same model per agent (same weights, same play)
    assert play(sharing="independent") == play()


def test_lora_policies_play_through_their_adapters() -> None:
    # A fresh LoRA adapter starts as the identity (B = 0), so the play is the base model's.
    assert play(sharing="lora") == play()


def test_plan_mistakes_are_refused_before_any_model_loads() -> None:
    with pytest.raises(ConfigError, match="^policy_map: agent 'speaker' has no policy"):
        play(sharing="custom")
    with pytest.raises(ConfigError, match="^policy_map.nobody: the scenario has no agent"):
        play(policy_map={"nobody": "shared"})
