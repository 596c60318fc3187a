"""``marl play``: one episode of a scenario, printed as a readable transcript."""

from __future__ import annotations

import random

from omegaconf import DictConfig

from marl.config import load_config
from marl.scenarios.bots import get_bot
from marl.scenarios.registry import make
from marl.scenarios.transcript import render_header, render_transcript


def play_scripted(scenario: str, bot: str, seed: int, overrides: dict | None = None) -> str:
    """Play one episode with scripted bots for every agent; returns the transcript."""
    env = make(scenario, **(overrides or {}))
    policy = get_bot(env.spec.rules, bot)
    rng = random.Random(seed)
    observations, infos = env.reset(seed=seed)
    header = render_header(env)
    while env.agents:
        actions = {a: policy(a, observations[a], infos[a], rng) for a in env.agents}
        observations, _, _, _, infos = env.step(actions)
    return header + "\n" + render_transcript(env)


def play_llm(cfg: DictConfig) -> str:
    """Play one episode with the configured model for every agent; returns the transcript."""
    from marl.policies import build_backend, sampling_config
    from marl.rollout import EpisodeSlot, run_episodes
    from marl.seeding import seed_everything

    config = load_config(cfg)
    seed_everything(config.seed)
    env = make(config.scenario.name, **config.scenario.overrides)
    backend = build_backend(config)
    env.reset(seed=config.seed)
    header = render_header(env)
    slot = EpisodeSlot(env=env, seed=config.seed, group_id=0, episode_id=0)
    run_episodes(
        [slot],
        {"shared": backend},
        lambda agent: "shared",
        sampling_config(config),
        seed=config.seed,
    )
    return header + "\n" + render_transcript(env)


def play(cfg: DictConfig) -> None:
    """Hydra task of ``marl play``."""
    config = load_config(cfg)
    if config.agents == "scripted":
        print(
            play_scripted(config.scenario.name, config.bot, config.seed, config.scenario.overrides)
        )
    else:
        print(play_llm(cfg))
