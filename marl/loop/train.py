"""``marl train``: the driver. ``train`` reads as its phases: prepare, resume, set up, warm up,
then each step rollout -> credit -> measure -> update -> sync -> log, and report. Each phase is
a function or a runtime method; no phase reaches into another's internals.

What is measured or kept beside the policies (emergence, the held-out evaluation and listening,
exploitability, the league, the role baselines, checkpoints) hangs off the loop as trackers
(:mod:`marl.loop.tracking`, listed in :mod:`marl.loop.trackers`): the loop calls their hooks at
fixed points of each step, and a new measure is one class and one line. A resumed run continues
its own folder and TensorBoard run where it can, and says so in one line (:mod:`marl.loop.resume`).

Policies come from ``sharing`` / ``policies`` / ``policy_map`` (:mod:`marl.runtime.policy_map`),
checked against the scenario's agents before anything is built. The phases run in this process
(``ray.enabled=false``) or on Ray actors (:mod:`marl.runtime.ray_runtime`); the loop is the same.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from marl.analysis.hparams import run_hparams, run_overrides, trial_id
from marl.analysis.metrics import rollout_metrics
from marl.analysis.summary import RunSummary
from marl.analysis.tensorboard import TensorBoardLogger
from marl.competition.outcomes import episode_bonuses, outcome_metrics
from marl.config import Config, ConfigError, load_config
from marl.credit import is_counterfactual
from marl.loop.credit_phase import credit_phase, mean_influence
from marl.loop.resume import Resume, open_resume, policy_states, without_resume
from marl.loop.timing import StepTimer
from marl.loop.trackers import (
    Baselines,
    LeagueTracker,
    build_trackers,
    save_state,
    tracker_fields,
)
from marl.loop.tracking import Run, implements
from marl.runtime.checkpoint import check_run_folder
from marl.runtime.context_check import check_context
from marl.runtime.curriculum import check_curriculum, stage_at
from marl.runtime.local import Runtime, make_runtime
from marl.runtime.machine import fit_machine, local_gpu_count, memory_metrics
from marl.runtime.policy_map import PolicyPlan, assign_gpus, assign_shares, plan_for
from marl.runtime.rollout import RolloutResult
from marl.runtime.seeding import seed_everything
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
    check_curriculum(config)
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


def train(cfg: DictConfig | dict, run_dir: str | Path | None = None) -> dict[str, float]:
    """Train as configured; returns the last iteration's metrics."""
    config, plan = _prepare(cfg)
    resume = open_resume(config, tracker_fields())
    run_dir = Path(run_dir) if run_dir is not None else run_dir_of(cfg)
    check_run_folder(run_dir, config.resume)  # never over another run's checkpoints or events
    if resume is not None and not _announce(resume, config, run_dir):
        return {}  # nothing to train: the run's folder is left as it is
    config_yaml = _set_up(config, run_dir)
    runtime = make_runtime(config, plan)
    run: Run | None = None
    status = "failure"
    try:
        start = resume.restore(runtime, config) if resume is not None else 0
        run = _open_run(config, plan, runtime, run_dir, resume, start)
        _describe(run, config_yaml)
        build_trackers(run, resume.state if resume is not None else None)
        if resume is None and config.warmup.steps > 0:
            _warm_up(run)
        metrics = _train_steps(run)
        status = "success"
    finally:
        if run is not None:
            run.logger.end_session(run.summary.finals(), run.summary.last_step(start), status)
            run.logger.close()
        runtime.close()
    _report(run)
    return metrics


def _prepare(cfg: DictConfig | dict) -> tuple[Config, PolicyPlan | None]:
    """The config, checked and fitted to this machine, and its policy plan; one line says
    where the policies go."""
    config = load_config(cfg)
    plan = check_config(config)
    check_context(config, plan)  # every first prompt + sampling.max_new_tokens fits its model
    config, plan, machine = fit_machine(config, plan)
    if plan is not None:
        print(machine.line(), flush=True)
        if machine.warning:
            print(machine.warning, file=sys.stderr, flush=True)
    return config, plan


def _announce(resume: Resume, config: Config, run_dir: Path) -> bool:
    """The resume line; whether there is anything to train (the line goes to stderr if not)."""
    left = config.train.steps > resume.step
    print(resume.line(config.train.steps, run_dir), file=sys.stdout if left else sys.stderr)
    sys.stdout.flush()
    return left


def _set_up(config: Config, run_dir: Path) -> str:
    """The run folder with its ``config.yaml``, the seeds and the torch threads; the config as
    YAML."""
    run_dir.mkdir(parents=True, exist_ok=True)
    config_yaml = OmegaConf.to_yaml(OmegaConf.structured(config))
    (run_dir / "config.yaml").write_text(config_yaml)
    seed_everything(config.seed)
    if config.runtime.threads is not None:  # the CLI applies the default at process start
        import torch

        torch.set_num_threads(config.runtime.threads)
    return config_yaml


def _open_run(
    config: Config,
    plan: PolicyPlan | None,
    runtime: Runtime,
    run_dir: Path,
    resume: Resume | None,
    start: int,
) -> Run:
    """The run's TensorBoard logger with its HParams session open, and its summary. A run that
    continues its folder continues its TensorBoard run (:mod:`marl.loop.resume`)."""
    overrides = run_overrides()
    hparams = run_hparams(config, without_resume(overrides) if resume else overrides)
    if resume is not None:  # read before this run's writer purges the crashed tail
        hparams = resume.hparams(hparams, run_dir)
    continued = resume is not None and resume.continues(run_dir)
    purge = resume.purge_step() if resume is not None and continued else None
    logger = TensorBoardLogger(
        run_dir / "tensorboard", enabled=config.logging.tensorboard, purge_step=purge
    )
    logger.start_session(hparams, trial_id(run_dir))
    t = config.train
    summary = RunSummary(t.seeds_per_step * t.group_size)
    return Run(config, plan, runtime, run_dir, logger, summary, start, continued)


def _describe(run: Run, config_yaml: str) -> None:
    """The config and the placement, as text (at the step a continued run goes on from) and in
    ``placement.json``."""
    step = run.start if run.continued else 0
    placement = json.dumps(run.runtime.placement(), indent=2, default=str)
    run.logger.text("config", config_yaml, step)
    (run.run_dir / "placement.json").write_text(placement)
    run.logger.text("placement", f"```\n{placement}\n```", step)


def _warm_up(run: Run) -> None:
    """The imitation warm-up (``warmup.steps``), then the warmed-up policies' checkpoint: what
    RL starts from (step 0)."""
    from marl.loop.warmup import run_warmup

    assert run.plan is not None
    config = run.config
    learners = run.runtime.learners  # type: ignore[attr-defined]
    progress = config.logging.progress
    run_warmup(config, learners, run.plan.policy_of, log=run.logger.scalars, progress=progress)
    run.runtime.sync()
    if config.train.checkpoint_every:
        save_state(run, 0)


def _train_steps(run: Run) -> dict[str, float]:
    """The trackers' start, then every step left; the last step's metrics."""
    t = run.config.train
    progress = _progress(run.start, t.steps, run.config.logging.progress)
    metrics: dict[str, float] = {}
    try:
        if not run.continued:  # a continued run's folder holds its start step already
            for tracker in run.trackers:
                tracker.on_start(run)
        for step in range(run.start, t.steps):
            metrics = _train_step(run, step)
            progress.update(1)
            progress.set_postfix(
                reward=f"{metrics.get('team/reward', 0.0):+.3f}",
                step_s=f"{metrics['perf/step_time']:.1f}",
            )
    finally:
        progress.close()
    return metrics


def _train_step(run: Run, step: int) -> dict[str, float]:
    """One iteration: rollout -> credit -> measure -> update -> sync -> log; the trackers'
    tags join the step's, and their after-log hooks (evaluation, checkpoint) close it."""
    runtime, league = run.runtime, run.find(LeagueTracker)
    _announce_stage(run.config, step, first=step == run.start)
    timer = StepTimer()  # perf/<phase>_time for each phase below, and perf/step_time
    with timer.phase("rollout"):
        matchup = league.draw(run, step) if league is not None else None
        rollout = runtime.rollout(step, matchup)
    bonuses = episode_bonuses(rollout, step)
    with timer.phase("credit"):
        credit, credit_metrics = _credit(run, step, rollout, bonuses, league is not None)
    measured: dict[str, float] = {}
    for tracker in (t for t in run.trackers if implements(t, "on_rollout")):
        with timer.phase(tracker.name):  # before the update: the policies that played
            measured.update(tracker.on_rollout(run, step, rollout))
    with timer.phase("update"):
        updates = runtime.update(rollout.turns)
    with timer.phase("sync"):
        runtime.sync()
    metrics = rollout_metrics(rollout.turns, rollout.episodes)
    metrics.update(measured)
    metrics.update(credit_metrics)
    metrics.update(outcome_metrics(rollout, step, bonuses))
    metrics.update(_policy_metrics(updates))
    for tracker in run.trackers:
        metrics.update(tracker.on_update(run, step + 1, rollout))
    metrics.update(_perf_metrics(timer, rollout))
    if run.config.train.curriculum:  # the stage this step trained (its last: the task itself)
        metrics["curriculum/stage"] = float(stage_at(run.config, step))
    run.log(metrics, step + 1)
    _log_samples(run, rollout, credit, step)
    for tracker in run.trackers:
        tracker.on_logged(run, step + 1)
    return metrics


def _announce_stage(config: Config, step: int, first: bool) -> None:
    """One line where a ``train.curriculum`` stage begins, and at the run's first step (a
    resumed run's included)."""
    if not config.train.curriculum:
        return
    stage = stage_at(config, step)
    if not first and stage == stage_at(config, step - 1):
        return
    stages = config.train.curriculum
    what = (
        f"overrides {stages[stage].overrides}"
        if stage < len(stages)
        else "the scenario as configured"
    )
    print(
        f"curriculum: step {step + 1}: stage {stage + 1} of {len(stages) + 1}, {what}", flush=True
    )


def _credit(
    run: Run, step: int, rollout: RolloutResult, bonuses: Any, league: bool
) -> tuple[Any, dict[str, float]]:
    """The credit phase (:mod:`marl.loop.credit_phase`); a counterfactual method re-simulates
    on the runtime first, and under a league only the trainable policies' turns get credit."""
    config, plan = run.config, run.plan
    baselines = run.find(Baselines)
    computed = run.runtime.credit(step, rollout) if is_counterfactual(config.credit.name) else None
    return credit_phase(
        config.credit,
        rollout,
        None,
        config.algo.advantage,
        bonuses,
        computed=computed,
        baselines=baselines.baselines if baselines is not None else None,
        game=config.scenario.name,
        trainable=plan.trainable if league and plan is not None else None,
    )


def _perf_metrics(timer: StepTimer, rollout: RolloutResult) -> dict[str, float]:
    """``perf/*``: each phase's time and the step's, generation throughput and memory."""
    metrics = timer.metrics()
    metrics["perf/generated_tokens_per_s"] = rollout.generated_tokens / max(
        timer.seconds["rollout"], 1e-9
    )
    metrics["perf/generate_calls"] = float(rollout.generate_calls)
    metrics.update(memory_metrics())
    return metrics


def _report(run: Run | None) -> None:
    """The end-of-run summary lines, the curves' PNG and where the TensorBoard logs are."""
    if run is None:
        return
    for line in run.summary.lines():
        print(line)
    png = run.summary.plot(run.run_dir / "curves.png") if run.summary.history else None
    if png is not None:
        print(f"curves: {png}")
    run_dir = run.run_dir
    print(f"tensorboard logs: {run_dir / 'tensorboard'}  (view: tensorboard --logdir {run_dir})")


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


def _log_samples(run: Run, rollout: RolloutResult, credit: Any, step: int) -> None:
    """Episode 0's transcript and the credit's influence heatmap, every
    ``logging.transcripts_every`` steps and at the last."""
    every = run.config.logging.transcripts_every
    if not every or not (step % every == 0 or step + 1 == run.config.train.steps):
        return
    run.logger.text("transcripts/episode_0", rollout.episodes[0].transcript, step + 1)
    influence = mean_influence(credit)
    if influence is not None:
        run.logger.heatmap("credit/influence", *influence, step=step + 1)


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
