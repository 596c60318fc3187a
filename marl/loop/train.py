"""``marl train``: the driver. One iteration is rollout -> credit -> update -> sync -> log ->
checkpoint; each phase is a function or a runtime method, and no phase reaches into another's
internals.

Policies come from ``sharing`` / ``policies`` / ``policy_map`` (:mod:`marl.runtime.policy_map`),
checked against the scenario's agents before anything is built. The phases run in this process
(``ray.enabled=false``) or on Ray actors (:mod:`marl.runtime.ray_runtime`); the loop is the same.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from marl.analysis.emergence import tracker_for
from marl.analysis.evaluation import due, evaluation_metrics
from marl.analysis.hparams import run_hparams, run_overrides, trial_id
from marl.analysis.listening_log import listening_tracker
from marl.analysis.metrics import rollout_metrics
from marl.analysis.summary import RunSummary
from marl.analysis.tensorboard import TensorBoardLogger
from marl.competition.exploitability_log import tracker_for as exploitability_tracker
from marl.competition.outcomes import episode_bonuses, outcome_metrics
from marl.config import Config, ConfigError, load_config
from marl.credit import is_counterfactual
from marl.credit.advantages import RoleBaselines, advantage_scope
from marl.loop.credit_phase import credit_phase, mean_influence
from marl.loop.timing import StepTimer
from marl.runtime.checkpoint import (
    check_resume,
    check_run_folder,
    check_saved_weights,
    check_weights,
    load_checkpoint,
    save_checkpoint,
)
from marl.runtime.local import Runtime, make_runtime
from marl.runtime.machine import fit_machine, local_gpu_count, memory_metrics
from marl.runtime.policy_map import PolicyPlan, assign_gpus, assign_shares, plan_for
from marl.runtime.rollout import RolloutResult
from marl.runtime.seeding import rng_states, seed_everything, set_rng_states
from marl.runtime.workers import step_seeds
from marl.scenarios.registry import make

__all__ = ["check_config", "policy_states", "run_dir_of", "step_seeds", "train"]


def run_dir_of(cfg: DictConfig) -> Path:
    """Hydra's output directory for this job (the current directory outside Hydra)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


def check_config(config: Config) -> PolicyPlan | None:
    """Every check that needs the scenario or the machine, before anything is built or started:
    the policy plan (None for scripted agents) and the device requests it can know of now (a
    joined Ray cluster's GPUs are checked once connected, before any actor starts)."""
    if config.agents == "scripted" and is_counterfactual(config.credit.name):
        raise ConfigError(
            f"credit.name: {config.credit.name!r} re-simulates with the policies' own "
            "generation; scripted agents (agents=scripted) support credit=team only"
        )
    plan = run_plan(config)
    if plan is None:
        return None
    _check_warmup(config)
    r = config.ray
    if not r.enabled:
        assign_gpus(plan, local_gpu_count(), source="torch.cuda.device_count()")
    elif not r.address and r.num_gpus is not None:
        workers = min(r.num_rollout_workers, config.train.seeds_per_step)
        assign_shares(plan, r.num_gpus, None, "ray.num_gpus", workers, r.worker_num_gpus)
    return plan


def run_plan(config: Config) -> PolicyPlan | None:
    """The run's policy plan: who plays with which policy, the league's frozen opponents
    included (None for scripted agents). Reads the scenario, not the machine."""
    if config.agents == "scripted":
        return None
    plan = plan_for(config)
    if config.league.enabled:
        from marl.competition.league import check_league, league_plan

        check_league(config, plan, list(plan.agent_policy))
        plan = league_plan(plan)
    return plan


def _check_warmup(config: Config) -> None:
    """The warm-up runs in this process, on bots the scenario has (or on a readable file)."""
    w = config.warmup
    if w.steps <= 0:
        return
    if config.ray.enabled:
        raise ConfigError(
            "warmup.steps: the imitation warm-up runs in one process; use ray=disabled, or "
            "warm up first and resume the checkpoint with Ray"
        )
    if w.data:
        from marl.loop.warmup import read_transcripts

        read_transcripts(w.data)
        return
    from marl.scenarios.bots import get_bot
    from marl.scenarios.problems import ScenarioError

    env = make(config.scenario.name, **config.scenario.overrides)
    for key, agents in (("warmup.bots", list(w.bots)), ("warmup.agents", w.agents)):
        unknown = sorted(set(agents) - set(env.possible_agents))
        if unknown:
            raise ConfigError(
                f"{key}: no agent {unknown[0]!r} in {env.spec.name} "
                f"(agents: {', '.join(env.possible_agents)})"
            )
    checks = [("warmup.bot", w.bot)] + [(f"warmup.bots.{a}", b) for a, b in w.bots.items()]
    for key, name in checks:
        try:
            get_bot(env.spec.rules, name)
        except ScenarioError as exc:
            raise ConfigError(f"{key}: {exc.problems[0].message}") from None


def policy_states(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-policy learner states of a checkpoint: policy id -> weights, learner state, version."""
    return state["policies"]


def train(cfg: DictConfig | dict, run_dir: str | Path | None = None) -> dict[str, float]:
    """Train as configured; returns the last iteration's metrics."""
    config = load_config(cfg)
    plan = check_config(config)
    config, plan, machine = fit_machine(config, plan)
    if plan is not None:
        print(machine.line(), flush=True)
        if machine.warning:
            print(machine.warning, file=sys.stderr, flush=True)
    resume = load_checkpoint(config.resume) if config.resume else None
    if resume is not None:
        check_resume(resume, config)  # the scenario it was trained on
        check_saved_weights(resume)  # dense, finite, floating-point tensors, before any build
    run_dir = Path(run_dir) if run_dir is not None else run_dir_of(cfg)
    check_run_folder(run_dir, config.resume)  # never over another run's checkpoints or events
    run_dir.mkdir(parents=True, exist_ok=True)
    config_yaml = OmegaConf.to_yaml(OmegaConf.structured(config))
    (run_dir / "config.yaml").write_text(config_yaml)
    seed_everything(config.seed)
    if config.runtime.threads is not None:  # the CLI applies the default at process start
        import torch

        torch.set_num_threads(config.runtime.threads)

    runtime = make_runtime(config, plan)
    logger = TensorBoardLogger(run_dir / "tensorboard", enabled=config.logging.tensorboard)
    t = config.train
    start = 0
    progress = None
    metrics: dict[str, float] = {}
    summary = RunSummary(t.seeds_per_step * t.group_size)
    logger.start_session(run_hparams(config, run_overrides()), trial_id(run_dir))
    status = "failure"
    try:
        if resume is not None:
            check_weights(policy_states(resume), runtime.state(), resume.get("config"), config)
            runtime.load_state(policy_states(resume))
            set_rng_states(resume["rng"])
            start = int(resume["step"])
            left = max(0, t.steps - start)
            print(
                f"resume: {config.resume} is step {start}; train.steps={t.steps}: "
                + (f"{left} step(s) to train" if left else "nothing to train (raise train.steps "
                   "to continue it)"),
                file=sys.stderr if not left else sys.stdout,
                flush=True,
            )  # fmt: skip
        placement = runtime.placement()
        logger.text("config", config_yaml, 0)
        placement_json = json.dumps(placement, indent=2, default=str)
        (run_dir / "placement.json").write_text(placement_json)
        logger.text("placement", f"```\n{placement_json}\n```", 0)
        emergence = tracker_for(config, runtime.influence)
        if resume is not None:
            emergence.load_state_dict(resume.get("emergence"))
        baselines = _baselines(config, resume)
        league = _league(config, plan, run_dir, resume)
        if resume is None and config.warmup.steps > 0:
            from marl.loop.warmup import run_warmup

            assert plan is not None
            run_warmup(
                config,
                runtime.learners,  # type: ignore[attr-defined]
                plan.policy_of,
                log=logger.scalars,
                progress=config.logging.progress,
            )
            runtime.sync()
            if t.checkpoint_every:  # the warmed-up policies: what RL starts from (step 0)
                save_checkpoint(
                    run_dir, 0, _checkpoint(config, runtime, 0, emergence, baselines, league)
                )
        counterfactual = is_counterfactual(config.credit.name)
        progress = _progress(start, t.steps, config.logging.progress)
        listen = listening_tracker(config, plan, runtime)
        _evaluate(runtime, config, start, logger, summary)
        _listen(listen, start, logger, summary)
        exploitability = exploitability_tracker(config, plan, runtime)
        if exploitability is not None:  # before the first update of this run
            scored = exploitability.step(start, force=True)
            logger.scalars(scored, start)
            summary.add(start, scored)
        for step in range(start, t.steps):
            timer = StepTimer()  # perf/<phase>_time for each phase below, and perf/step_time
            with timer.phase("rollout"):
                matchup = None
                if league is not None:
                    assert plan is not None
                    matchup = _league_matchup(
                        league, runtime, plan.trainable[0], step, t.seeds_per_step
                    )
                rollout = runtime.rollout(step, matchup)
            bonuses = episode_bonuses(rollout, step)
            with timer.phase("credit"):
                computed = runtime.credit(step, rollout) if counterfactual else None
                credit_result, credit_metrics = credit_phase(
                    config.credit,
                    rollout,
                    None,
                    config.algo.advantage,
                    bonuses,
                    computed=computed,
                    baselines=baselines,
                    game=config.scenario.name,
                    trainable=plan.trainable if league is not None and plan is not None else None,
                )
            # influence re-simulates the rollout's episodes with the policies that played them:
            # before the update
            with timer.phase("emergence"):
                emergence_metrics = emergence.step([e.emergence for e in rollout.episodes], step)
            with timer.phase("update"):
                updates = runtime.update(rollout.turns)
            with timer.phase("sync"):
                runtime.sync()
            metrics = rollout_metrics(rollout.turns, rollout.episodes)
            metrics.update(emergence_metrics)
            metrics.update(credit_metrics)
            metrics.update(outcome_metrics(rollout, step, bonuses))
            metrics.update(_policy_metrics(updates))
            if league is not None and matchup is not None:
                metrics.update(league.record(matchup, rollout.episodes))
            if exploitability is not None:
                metrics.update(exploitability.step(step + 1))
            metrics.update(timer.metrics())
            metrics["perf/generated_tokens_per_s"] = rollout.generated_tokens / max(
                timer.seconds["rollout"], 1e-9
            )
            metrics["perf/generate_calls"] = float(rollout.generate_calls)
            metrics.update(memory_metrics())
            logger.scalars(metrics, step + 1)
            summary.add(step + 1, metrics)
            _log_samples(logger, config, rollout, credit_result, step)
            if due(step + 1, t.steps, t.eval_every):
                _evaluate(runtime, config, step + 1, logger, summary)
                _listen(listen, step + 1, logger, summary)
            last = step + 1 == t.steps
            if last or (t.checkpoint_every and (step + 1) % t.checkpoint_every == 0):
                state = _checkpoint(config, runtime, step + 1, emergence, baselines, league)
                save_checkpoint(run_dir, step + 1, state)
            progress.update(1)
            progress.set_postfix(
                reward=f"{metrics.get('team/reward', 0.0):+.3f}",
                step_s=f"{metrics['perf/step_time']:.1f}",
            )
        status = "success"
    finally:
        if progress is not None:
            progress.close()
        logger.end_session(summary.finals(), summary.last_step(default=start), status)
        logger.close()
        runtime.close()
    for line in summary.lines():
        print(line)
    png = summary.plot(run_dir / "curves.png") if summary.history else None
    if png is not None:
        print(f"curves: {png}")
    print(f"tensorboard logs: {run_dir / 'tensorboard'}  (view: tensorboard --logdir {run_dir})")
    return metrics


def _baselines(config: Config, resume: dict[str, Any] | None) -> RoleBaselines | None:
    """The role baselines of a role estimator (``algo.advantage=rae``), restored on resume;
    None for the other estimators."""
    if advantage_scope(config.algo.advantage) != "role":
        return None
    baselines = RoleBaselines(config.algo.baseline_decay)
    if resume is not None and resume.get("advantage") is not None:
        baselines.load_state_dict(resume["advantage"])
    return baselines


def _league(
    config: Config, plan: PolicyPlan | None, run_dir: Path, resume: dict[str, Any] | None
) -> Any:
    """The run's :class:`~marl.competition.league.League` (None without one), restored on resume."""
    if not config.league.enabled or plan is None:
        return None
    from marl.competition.league import League

    league = League(config.league, list(plan.agent_policy), run_dir / "league", seed=config.seed)
    if resume is not None and resume.get("league") is not None:
        league.load_state_dict(resume["league"])
    return league


def _league_matchup(league: Any, runtime: Runtime, learner: str, step: int, groups: int) -> Any:
    """Snapshot the learner when due, draw the step's opponent and load its weights into the
    league's frozen policy (skipped when the workers already hold that snapshot)."""
    from marl.competition.league import LEAGUE_POLICY
    from marl.runtime.policies import WeightPayload

    if league.due(step):
        league.add_snapshot(step, runtime.policy_weights(learner).state)
    matchup = league.draw(step, groups)
    if matchup.policy is not None and league.loaded != matchup.opponent:
        weights = league.load_weights(matchup.opponent)
        runtime.load_frozen(WeightPayload(LEAGUE_POLICY, "full", weights, version=step))
        league.loaded = matchup.opponent
    return matchup


def _evaluate(
    runtime: Runtime, config: Config, updates_done: int, logger: TensorBoardLogger, summary: Any
) -> None:
    """The held-out evaluation (``train.eval_episodes``), logged at ``updates_done``: its
    metrics, each scenario's outcome by scenario seed (text ``eval/successes``) and the paired
    comparison with the run's first evaluation (``eval/paired/*``, McNemar)."""
    from marl.analysis.evaluation import evaluation_successes

    if not config.train.eval_episodes:
        return
    began = time.perf_counter()
    rollout = runtime.evaluate(config.train.eval_episodes, updates_done)
    metrics = evaluation_metrics(rollout)
    metrics["perf/eval_time"] = time.perf_counter() - began
    successes = evaluation_successes(rollout)
    if successes is not None:
        outcomes = {str(seed): int(ok) for seed, ok in successes.items()}
        logger.text("eval/successes", json.dumps(outcomes), updates_done)
    metrics.update(summary.add_evaluation(updates_done, successes))
    logger.scalars(metrics, updates_done)
    summary.add(updates_done, metrics)


def _listen(
    listen: Callable[[int], dict[str, float]],
    updates_done: int,
    logger: TensorBoardLogger,
    summary: Any,
) -> None:
    """The exact listening measures on held-out scenarios (:mod:`marl.analysis.listening_log`),
    logged at ``updates_done`` beside the held-out evaluation; nothing where they do not apply."""
    metrics = listen(updates_done)
    if metrics:
        logger.scalars(metrics, updates_done)
        summary.add(updates_done, metrics)


def _policy_metrics(updates: dict[str, dict[str, float]]) -> dict[str, float]:
    """``policies/<id>/<metric>``; timings go under ``perf/``."""
    out: dict[str, float] = {}
    for pid, values in updates.items():
        values = dict(values)
        values.pop("entropy_proxy", None)  # the rollout's estimate covers every turn
        duration = values.pop("update_time", None)
        if duration is not None:
            out[f"perf/policies/{pid}/update_time"] = duration
        out.update({f"policies/{pid}/{k}": v for k, v in values.items()})
    return out


def _log_samples(
    logger: TensorBoardLogger, config: Config, rollout: RolloutResult, credit: Any, step: int
) -> None:
    every = config.logging.transcripts_every
    if not every or not (step % every == 0 or step + 1 == config.train.steps):
        return
    logger.text("transcripts/episode_0", rollout.episodes[0].transcript, step + 1)
    influence = mean_influence(credit)
    if influence is not None:
        logger.heatmap("credit/influence", *influence, step=step + 1)


def _checkpoint(
    config: Config,
    runtime: Runtime,
    step: int,
    emergence: Any,
    baselines: RoleBaselines | None,
    league: Any,
) -> dict[str, Any]:
    """The one checkpoint state, the same fields at every step (the warmed-up step 0 too):
    policies, RNG states, step, config, the emergence tracker's state, and the role baselines'
    and the league's when the run has them."""
    policies = runtime.state()
    _refuse_nonfinite(policies, step)
    state = {
        "policies": policies,
        "rng": rng_states(),
        "step": step,
        "config": asdict(config),
        "emergence": emergence.state_dict(),
    }
    if baselines is not None:
        state["advantage"] = baselines.state_dict()
    if league is not None:
        state["league"] = league.state_dict()
    return state


def _refuse_nonfinite(policies: dict[str, dict[str, Any]], step: int) -> None:
    """A checkpoint never holds a NaN or inf: weights, masters and optimizer state are checked
    before anything is written, so ``latest`` stays on the last good checkpoint."""
    from marl.errors import RunError
    from marl.runtime.learner import nonfinite_tensors

    for pid, state in policies.items():
        bad = nonfinite_tensors(state)
        if bad:
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise RunError(
                f"refusing to checkpoint step {step}: policy {pid!r} has non-finite values in "
                f"{shown}; the previous checkpoint is kept"
            )


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
