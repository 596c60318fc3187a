"""The Ray launcher's loop: every job of a sweep as a Ray task in its own placement group.

:func:`launch` composes each job's config as Hydra's basic launcher does, decides from the job's
folder whether it runs, resumes or is skipped (:mod:`marl.sweep.job_dirs`), reserves what the job
needs (:mod:`marl.sweep.demand`; a job no node could hold is refused before anything starts), and
runs the jobs as Ray tasks (:func:`marl.sweep.job.run_sweep_job`), each in a process of its own.
It prints one line as each job ends and a summary; a failed job does not stop the others, and the
exit status is the number of jobs that failed (at most 125). Ctrl-C cancels every running job
(their processes and actors are killed) and exits 130; launching the same sweep again resumes.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from marl.errors import INTERRUPTED_EXIT
from marl.runtime.job_layout import JobLayout
from marl.sweep.demand import JobDemand, job_demand, refusal
from marl.sweep.job import OUTPUT_LOG, JobOutcome, JobSpec, last_error_line, run_sweep_job
from marl.sweep.job_dirs import JobState, job_state, set_aside, write_record
from marl.sweep.settings import LauncherSettings

__all__ = ["SweepJob", "launch", "format_seconds"]

MAX_EXIT_STATUS = 125  # 126 and above mean other things to a shell


@dataclass
class SweepJob:
    """One job of the sweep as the launcher sees it."""

    num: int
    overrides: list[str]
    config: DictConfig  # composed, hydra node included
    job_dir: Path
    state: JobState
    demand: JobDemand | None = None
    error: str = ""  # why it did not run (refused, another run's folder, a config error)
    outcome: JobOutcome | None = None
    extra: list[str] = field(default_factory=list)  # overrides the launcher added (resume=)
    common: frozenset[str] = frozenset()  # overrides every job of the sweep has

    @property
    def label(self) -> str:
        """``#3 seed=1 algo=gspo``: the job's number and the overrides that tell it from the
        sweep's other jobs, for the launcher's lines."""
        shown = " ".join(o for o in self.overrides if o not in self.common)
        return f"#{self.num} {shown}".rstrip()


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it is under it (as the user typed it),
    else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def format_seconds(seconds: float) -> str:
    """``45s``, ``3m07s``, ``1h02m``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _compose(hydra_context: Any, config: DictConfig, overrides: list[str], num: int) -> DictConfig:
    from hydra.core.hydra_config import HydraConfig

    sweep_config = hydra_context.config_loader.load_sweep_config(config, overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = num
        sweep_config.hydra.job.num = num
    HydraConfig.instance().set_config(sweep_config)
    return sweep_config


def _job_dir(sweep_config: DictConfig) -> Path:
    root = str(OmegaConf.select(sweep_config, "hydra.sweep.dir"))
    sub = str(OmegaConf.select(sweep_config, "hydra.sweep.subdir"))
    return Path(os.path.abspath(os.path.join(root, sub)))


def _task_config(sweep_config: DictConfig) -> DictConfig:
    cfg = copy.deepcopy(sweep_config)
    with read_write(cfg), open_dict(cfg):
        del cfg["hydra"]
    return cfg


def _prepare(launcher: Any, overrides: list[str], num: int, nodes: list, where: str) -> SweepJob:
    """Compose the job, read its folder, size its reservation."""
    from marl.errors import remote_cause, user_errors

    settings: LauncherSettings = launcher.settings
    sweep_config = _compose(launcher.hydra_context, launcher.config, overrides, num)
    job_dir = _job_dir(sweep_config)
    steps = OmegaConf.select(sweep_config, "train.steps", default=None)
    state = job_state(job_dir, overrides, steps, settings.skip_finished)
    job = SweepJob(num, overrides, sweep_config, job_dir, state)
    if state.kind == "foreign":
        job.error = (
            f"not run: {shown(job_dir)} {state.detail}; nothing there was touched (choose another "
            "hydra.sweep.dir, or move that folder away)"
        )
        return job
    if state.kind == "resume":
        job.extra = [f"resume={state.checkpoint}"]
        job.config = _compose(launcher.hydra_context, launcher.config, overrides + job.extra, num)
    try:
        job.demand = job_demand(_task_config(job.config), settings, nodes)
    except user_errors() as exc:
        job.error = f"error: {remote_cause(exc)}"
        return job
    refused = refusal(job.demand, nodes, where)
    if refused:
        job.error = f"refused: {refused}"
    return job


def _submit(launcher: Any, job: SweepJob) -> tuple[Any, Any]:
    """Reserve the job's placement group and start its task; returns (task ref, group)."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from marl.runtime.threads import thread_env

    assert job.demand is not None
    from hydra.core.singleton import Singleton

    d = job.demand
    group = placement_group(list(d.bundles), strategy=d.strategy)
    env = thread_env(d.threads)
    if d.learners or d.workers:
        first = 1 + d.learners
        layout = JobLayout(group, tuple(range(1, first)), tuple(range(first, first + d.workers)))
        env.update(layout.env())
    if job.state.kind == "restart":
        set_aside(job.job_dir, Path(str(launcher.config.hydra.sweep.dir)))
    spec = JobSpec(
        num=job.num,
        overrides=job.overrides + job.extra,
        job_dir=str(job.job_dir),
        cwd=os.getcwd(),
        sweep_config=job.config,
        task_function=launcher.task_function,
        hydra_context=launcher.hydra_context,
        singleton_state=Singleton.get_state(),
    )
    ref = launcher.remote_job.options(
        num_cpus=d.own.get("CPU", 0.0),
        num_gpus=d.own.get("GPU", 0.0),
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=0
        ),
        runtime_env={"env_vars": env},
    ).remote(spec)
    return ref, group


def _died(job: SweepJob, exc: BaseException, wall: float) -> JobOutcome:
    """The outcome of a job whose process died (killed, out of memory, crashed)."""
    from marl.errors import remote_cause

    reason = str(remote_cause(exc)).strip().splitlines()
    line = last_error_line(job.job_dir / OUTPUT_LOG, reason[0] if reason else type(exc).__name__)
    error = f"its process died: {line}"
    write_record(
        job.job_dir, status="failed", wall_s=wall, error=error, num=job.num, overrides=job.overrides
    )
    return JobOutcome(job.num, "failed", wall, error)


def _connect(settings: LauncherSettings) -> tuple[bool, str]:
    from marl.config import RayConfig
    from marl.runtime.ray_runtime import connect

    started = connect(
        RayConfig(
            enabled=True,
            address=settings.address,
            num_cpus=settings.num_cpus,
            num_gpus=settings.num_gpus,
        )
    )
    where = f"the Ray cluster at {settings.address}" if settings.address else "the local Ray"
    return started, where


def _result_line(job: SweepJob) -> str:
    o = job.outcome
    assert o is not None
    if o.status == "finished":
        values = [f"{k} {o.metrics[k]:+.3f}" for k in ("team/reward",) if k in o.metrics]
        tail = f" ({', '.join(values)})" if values else ""
        return f"  {job.label}: finished in {format_seconds(o.wall_s)}{tail}"
    return (
        f"  {job.label}: FAILED after {format_seconds(o.wall_s)} in {shown(job.job_dir)}: {o.error}"
    )


def _job_return(job: SweepJob) -> Any:
    from hydra.core.utils import JobReturn, JobStatus

    o = job.outcome
    if o is not None and o.job_return is not None:
        return o.job_return
    ret = JobReturn(overrides=job.overrides, cfg=_task_config(job.config), hydra_cfg=job.config)
    ret.working_dir = os.getcwd()
    ret.status = JobStatus.COMPLETED if job.state.kind == "finished" else JobStatus.FAILED
    ret._return_value = None if ret.status == JobStatus.COMPLETED else RuntimeError(job.error)
    return ret


def launch(launcher: Any, job_overrides: Any, initial_job_idx: int) -> list[Any]:
    """Run every job of ``job_overrides`` on Ray (see the module docstring); the launcher is
    :class:`hydra_plugins.marl_ray_launcher.MarlRayLauncher`, already set up by Hydra."""
    import ray
    from hydra.core.utils import configure_log, setup_globals
    from ray.util.placement_group import remove_placement_group
    from tqdm import tqdm

    from marl.runtime.ray_runtime import cluster_nodes

    setup_globals()
    config = launcher.config
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    settings: LauncherSettings = launcher.settings
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    begun = time.time()
    started, where = _connect(settings)
    # one remote function for the sweep (Ray exports it once); a process per job (max_calls=1)
    launcher.remote_job = ray.remote(max_calls=1, max_retries=0)(run_sweep_job)
    groups: dict[int, Any] = {}
    running: dict[Any, tuple[SweepJob, float]] = {}
    jobs: list[SweepJob] = []
    try:
        nodes = cluster_nodes()
        jobs = [
            _prepare(launcher, list(o), initial_job_idx + i, nodes, where)
            for i, o in enumerate(job_overrides)
        ]
        if len(jobs) > 1:
            common = frozenset.intersection(*(frozenset(j.overrides) for j in jobs))
            for job in jobs:
                job.common = common
        refused = [j for j in jobs if j.error.startswith("refused:")]
        if refused:
            for job in refused:
                print(
                    f"error: sweep job {job.label}: {job.error[len('refused: ') :]}",
                    file=sys.stderr,
                )
            raise SystemExit(2)
        todo = [j for j in jobs if not j.error and j.state.kind != "finished"]
        skipped = [j for j in jobs if j.state.kind == "finished"]
        cpus = sum(n.get("CPU", 0.0) for n in nodes)
        gpus = sum(n.get("GPU", 0.0) for n in nodes)
        per_job = todo[0].demand.describe() if todo and todo[0].demand else "nothing"
        print(
            f"sweep: {len(jobs)} job(s) on {where} ({len(nodes)} node(s), {cpus:g} CPUs, "
            f"{gpus:g} GPUs); {len(todo)} to run, each reserving {per_job}; "
            f"{len(skipped)} finished before; output: {shown(sweep_dir)}/<job>/{OUTPUT_LOG}",
            flush=True,
        )
        for job in skipped:
            print(f"  {job.label}: skipped, finished before in {shown(job.job_dir)}", flush=True)
        for job in jobs:
            if job.error:
                print(f"  {job.label}: {job.error}", file=sys.stderr, flush=True)
            elif job.state.kind == "resume":
                print(f"  {job.label}: resumes from {shown(job.state.checkpoint)}", flush=True)
        limit = settings.max_parallel or len(todo) or 1
        queue = list(todo)
        progress = OmegaConf.select(config, "logging.progress", default=True)
        counts = (-1, -1)
        with tqdm(
            total=len(todo), desc="sweep", unit="job", disable=not progress, file=sys.stderr
        ) as bar:
            while queue or running:
                while queue and len(running) < limit:
                    job = queue.pop(0)
                    ref, groups[job.num] = _submit(launcher, job)
                    running[ref] = (job, time.time())
                ready, _ = ray.wait(list(running), num_returns=1, timeout=0.25)  # Ctrl-C: at once
                for ref in ready:
                    job, t0 = running.pop(ref)
                    try:
                        job.outcome = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        job.outcome = _died(job, exc, time.time() - t0)
                    remove_placement_group(groups.pop(job.num))
                    bar.write(_result_line(job))
                    bar.update(1)
                if (len(running), len(queue)) != counts:
                    counts = (len(running), len(queue))
                    bar.set_postfix(running=counts[0], queued=counts[1])
    except KeyboardInterrupt:
        for ref in running:
            ray.cancel(ref, force=True)
        print(
            f"\ninterrupted: stopped {len(running)} running job(s); launch the same sweep "
            "again to resume them",
            file=sys.stderr,
        )
        raise SystemExit(INTERRUPTED_EXIT) from None
    finally:
        for group in groups.values():
            try:
                remove_placement_group(group)
            except ray.exceptions.RayError:
                pass
        if started and ray.is_initialized():
            ray.shutdown()
    return _summarize(jobs, time.time() - begun)


def _summarize(jobs: list[SweepJob], wall: float) -> list[Any]:
    """Print the sweep's summary; exit with the number of failed jobs when any failed."""
    failed = [j for j in jobs if j.error or (j.outcome and j.outcome.status == "failed")]
    ran = [j for j in jobs if j.outcome and j.outcome.status == "finished"]
    resumed = [j for j in ran if j.state.kind == "resume"]
    skipped = [j for j in jobs if j.state.kind == "finished" and not j.error]
    print(
        f"sweep: {len(jobs)} job(s) in {format_seconds(wall)}: {len(ran)} finished "
        f"({len(resumed)} resumed), {len(skipped)} skipped (finished before), "
        f"{len(failed)} failed",
        flush=True,
    )
    for job in failed:
        error = job.error or (job.outcome.error if job.outcome else "")
        print(f"  failed {job.label}: {shown(job.job_dir)}: {error}", file=sys.stderr, flush=True)
    if failed:
        raise SystemExit(min(len(failed), MAX_EXIT_STATUS))
    return [_job_return(j) for j in jobs]
