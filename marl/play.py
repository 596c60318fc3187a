"""``marl play``: one episode of a scenario, printed as a readable transcript.

With ``agents=llm`` the agents play the same policies ``marl train`` would build for them:
``sharing``, ``policies`` and ``policy_map`` are resolved by
:func:`marl.runtime.policy_map.plan_for` and the inference side is
:class:`marl.runtime.policies.InferencePolicies` (a backend per full policy, one shared base with an
adapter per LoRA policy), so every agent generates with its own policy, in one batched call per
policy and round. A prompt longer than its model's context is refused in one line, before any
model loads for the first turn (:mod:`marl.runtime.context_check`) and at any later one.
"""

from __future__ import annotations

import random

from omegaconf import DictConfig

from marl.config import load_config
from marl.scenarios.bots import get_bot, play_bot_episode
from marl.scenarios.registry import make
from marl.scenarios.transcript import render_header, render_transcript


def play_scripted(scenario: str, bot: str, seed: int, overrides: dict | None = None) -> str:
    """Play one episode with scripted bots for every agent; returns the transcript."""
    env = make(scenario, **(overrides or {}))
    get_bot(env.spec.rules, bot)  # an unknown bot fails before anything is played
    env.reset(seed=seed)
    header = render_header(env)  # the state as dealt, before anyone acts
    play_bot_episode(env, bot, seed, random.Random(seed))
    return header + "\n" + render_transcript(env)


def play_llm(cfg: DictConfig) -> str:
    """Play one episode with the configured policies (as ``marl train`` builds them, before any
    update); returns the transcript."""
    from marl.runtime.context_check import check_context
    from marl.runtime.policies import InferencePolicies
    from marl.runtime.policy_map import plan_for
    from marl.runtime.rollout import EpisodeSlot, run_episodes
    from marl.runtime.seeding import seed_everything

    config = load_config(cfg)
    plan = plan_for(config)  # checked against the scenario's agents before any model loads
    check_context(config, plan)  # every first prompt fits its model, before any model loads
    seed_everything(config.seed)
    env = make(config.scenario.name, **config.scenario.overrides)
    policies = InferencePolicies(plan, config)
    env.reset(seed=config.seed)
    header = render_header(env)
    slot = EpisodeSlot(env=env, seed=config.seed, group_id=0, episode_id=0)
    run_episodes(
        [slot],
        policies.backends,
        plan.policy_of,
        config.sampling,
        seed=config.seed,
        temperatures=plan.temperatures,
        scored=plan.scored,
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
