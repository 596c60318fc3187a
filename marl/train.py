"""``marl train``: the driver. One iteration is rollout -> credit -> update -> sync -> log ->
checkpoint; each phase is a function (STYLE.md habit 9).

This is the single-process trainer: one shared policy, generation and learning colocated on the
same model (the weight sync is a no-op).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from marl.checkpoint import load_checkpoint, save_checkpoint
from marl.config import Config, load_config
from marl.credit_phase import backend_generate, credit_phase, make_engine, mean_influence
from marl.metrics import rollout_metrics
from marl.policies import build_backend, build_learner, sampling_config
from marl.rollout import EpisodeSlot, RolloutResult, run_episodes
from marl.scenarios.registry import make
from marl.scenarios.transcript import render_transcript
from marl.seeding import rng_states, seed_everything, set_rng_states
from marl.tensorboard import TensorBoardLogger

SHARED = "shared"


def step_seeds(seed: int, step: int, count: int) -> list[int]:
    """The scenario seeds of one iteration: a pure function of (run seed, step)."""
    rng = random.Random(f"{seed}:{step}:scenario")
    return [rng.randrange(2**31) for _ in range(count)]


def rollout_phase(config: Config, envs: list, backend, step: int) -> RolloutResult:  # noqa: ANN001
    """Play B seeds x G episodes with the current policy."""
    t = config.train
    seeds = step_seeds(config.seed, step, t.seeds_per_step)
    slots = [
        EpisodeSlot(
            env=envs[b * t.group_size + g],
            seed=seeds[b],
            group_id=b,
            episode_id=b * t.group_size + g,
        )
        for b in range(t.seeds_per_step)
        for g in range(t.group_size)
    ]
    return run_episodes(
        slots,
        {SHARED: backend},
        lambda agent: SHARED,
        sampling_config(config),
        seed=config.seed * 1_000_003 + step,
    )


def run_dir_of(cfg: DictConfig) -> Path:
    """Hydra's output directory for this job (the current directory outside Hydra)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


def train(cfg: DictConfig | dict, run_dir: str | Path | None = None) -> dict[str, float]:
    """Train as configured; returns the last iteration's metrics."""
    config = load_config(cfg)
    run_dir = Path(run_dir) if run_dir is not None else run_dir_of(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(config)))
    seed_everything(config.seed)

    t = config.train
    envs = [
        make(config.scenario.name, **config.scenario.overrides)
        for _ in range(t.seeds_per_step * t.group_size)
    ]
    backend = build_backend(config)
    learner = build_learner(config, backend)
    start = 0
    if config.resume:
        state = load_checkpoint(config.resume)
        backend.model.load_state_dict(state["model"])
        learner.load_state_dict(state["learner"])
        set_rng_states(state["rng"])
        start = int(state["step"])

    engine = make_engine(
        config.credit,
        lambda: make(config.scenario.name, **config.scenario.overrides),
        backend_generate(
            {SHARED: backend}, lambda agent: SHARED, sampling_config(config), seed=config.seed + 7
        ),
    )
    logger = TensorBoardLogger(run_dir / "tensorboard", enabled=config.logging.tensorboard)
    logger.text("config", OmegaConf.to_yaml(OmegaConf.structured(config)), 0)
    progress = _progress(start, t.steps, config.logging.progress)
    metrics: dict[str, float] = {}
    try:
        for step in range(start, t.steps):
            began = time.perf_counter()
            rollout = rollout_phase(config, envs, backend, step)
            rollout_time = time.perf_counter() - began
            credit_result, credit_metrics = credit_phase(
                config.credit, rollout, engine, config.algo.advantage
            )
            update_began = time.perf_counter()
            policy_metrics = learner.update(rollout.turns)
            update_time = time.perf_counter() - update_began
            # sync: generation and learning share one model object here, nothing to push.
            metrics = rollout_metrics(rollout)
            metrics.update(credit_metrics)
            policy_metrics.pop("entropy_proxy", None)  # the rollout's estimate covers every turn
            metrics.update({f"policies/{SHARED}/{k}": v for k, v in policy_metrics.items()})
            step_time = time.perf_counter() - began
            metrics.update(
                {
                    "perf/step_time": step_time,
                    "perf/rollout_time": rollout_time,
                    "perf/update_time": update_time,
                    "perf/generated_tokens_per_s": rollout.generated_tokens
                    / max(rollout_time, 1e-9),
                    "perf/generate_calls": float(rollout.generate_calls),
                }
            )
            logger.scalars(metrics, step + 1)
            every = config.logging.transcripts_every
            if every and (step % every == 0 or step + 1 == t.steps):
                logger.text(
                    "transcripts/episode_0", render_transcript(rollout.slots[0].env), step + 1
                )
                influence = mean_influence(credit_result)
                if influence is not None:
                    logger.heatmap("credit/influence", *influence, step=step + 1)
            last = step + 1 == t.steps
            if last or (t.checkpoint_every and (step + 1) % t.checkpoint_every == 0):
                save_checkpoint(
                    run_dir,
                    step + 1,
                    {
                        "model": backend.model.state_dict(),
                        "learner": learner.state_dict(),
                        "rng": rng_states(),
                        "step": step + 1,
                        "config": asdict(config),
                    },
                )
            progress.update(1)
            progress.set_postfix(
                reward=f"{metrics.get('team/reward', 0.0):+.3f}", step_s=f"{step_time:.1f}"
            )
    finally:
        progress.close()
        logger.close()
    print(f"tensorboard logs: {run_dir / 'tensorboard'}  (view: tensorboard --logdir {run_dir})")
    return metrics


def _progress(start: int, total: int, enabled: bool):  # noqa: ANN202
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=start,
        desc="train",
        unit="step",
        disable=not enabled,
        dynamic_ncols=True,
    )
