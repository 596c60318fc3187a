"""What one sweep job reserves, read from its own composed config.

A job is one placement group (reserved whole, or not at all):

- bundle 0, the job's own process: ``hydra.launcher.cpus_per_job`` CPUs (null: the run's
  ``runtime.threads``, else 1), which are also its torch threads; and, when the run would train
  on a GPU in that process, ``hydra.launcher.gpus_per_job`` of one (null: ``1/jobs_per_gpu``).
- with in-run Ray (``ray.enabled=true``): one bundle per learner (``ray.learner_num_cpus``, the
  policy's GPU share) and one per rollout worker (``ray.worker_num_cpus``,
  ``ray.worker_num_gpus``), the GPU shares packed as the run itself packs them
  (:func:`marl.runtime.policy_map.packed_shares`).

:func:`refusal` is the one line that refuses, at launch, a job no node could ever hold, naming
the key that sized the bundle too big.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from omegaconf import DictConfig

from marl.sweep.settings import LauncherSettings

__all__ = ["JobDemand", "job_demand", "refusal"]

Resources = Mapping[str, float]
_EPS = 1e-6


@dataclass(frozen=True)
class JobDemand:
    """The bundles of one job's placement group, the keys that sized each, and its threads.

    bundles:  bundle 0 = the job's process, then the learners', then the rollout workers'.
    keys:     per bundle, the config keys of its CPUs and of its GPUs (for refusals).
    strategy: the placement group's strategy (the run's ``ray.placement_strategy``; PACK for a
              one-process run).
    threads:  torch threads of the job's process (its reserved CPUs, at least 1).
    learners, workers: how many actor bundles follow bundle 0.
    """

    bundles: tuple[dict[str, float], ...]
    keys: tuple[tuple[str, str], ...]
    strategy: str
    threads: int
    learners: int = 0
    workers: int = 0

    @property
    def own(self) -> dict[str, float]:
        """The job process's bundle."""
        return self.bundles[0]

    def total(self) -> dict[str, float]:
        """CPUs and GPUs of all bundles together."""
        return {r: sum(b.get(r, 0.0) for b in self.bundles) for r in ("CPU", "GPU")}

    def describe(self) -> str:
        """``1 CPU`` / ``3 CPUs, 0.125 GPU`` for the launcher's lines."""
        total = self.total()
        cpus = f"{total['CPU']:g} CPU{'s' if total['CPU'] != 1 else ''}"
        return cpus + (f", {total['GPU']:g} GPU" if total["GPU"] > 0 else "")


def job_demand(
    cfg: DictConfig, settings: LauncherSettings, nodes: Sequence[Resources]
) -> JobDemand:
    """The placement group of the job whose task config (Hydra's, without ``hydra:``) is
    ``cfg``, on a cluster of ``nodes`` (each live node's CPU and GPU totals)."""
    from marl.config import load_config
    from marl.loop.train import run_plan
    from marl.runtime.machine import fit_machine
    from marl.runtime.policy_map import packed_shares
    from marl.runtime.ray_runtime import learner_bundles

    config = load_config(cfg)
    gpus = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    total_gpus = sum(n.get("GPU", 0.0) for n in nodes)
    if settings.cpus_per_job is not None:
        cpus, cpu_key = float(settings.cpus_per_job), "hydra.launcher.cpus_per_job"
    elif config.runtime.threads is not None:
        cpus, cpu_key = float(config.runtime.threads), "runtime.threads"
    else:
        cpus, cpu_key = 1.0, "hydra.launcher.cpus_per_job"
    own: dict[str, float] = {"CPU": cpus}
    gpu_key = "hydra.launcher.gpus_per_job"
    plan = run_plan(config)
    if not config.ray.enabled:
        if gpus > 0 and plan is not None:  # scripted agents have no model to put on a GPU
            _, _, machine = fit_machine(config, plan, gpus=int(gpus), gpu_name="GPU")
            if machine.device == "cuda":
                share = settings.gpus_per_job
                if share is None:
                    share, gpu_key = (
                        1.0 / max(1, settings.jobs_per_gpu),
                        "hydra.launcher.jobs_per_gpu",
                    )
                own["GPU"] = float(share)
        return JobDemand((own,), ((cpu_key, gpu_key),), "PACK", max(1, int(cpus)))
    r = config.ray
    workers = min(r.num_rollout_workers, config.train.seeds_per_step)
    requests, worker_gpus = packed_shares(plan, total_gpus, workers, r.worker_num_gpus)
    learners = learner_bundles(plan, requests, r.learner_num_cpus)
    worker = {"CPU": r.worker_num_cpus, **({"GPU": worker_gpus} if worker_gpus > 0 else {})}
    ids = plan.trainable if plan is not None else []
    keys = [(cpu_key, gpu_key)]
    keys += [("ray.learner_num_cpus", f"policies.{pid}.num_gpus") for pid in ids]
    keys += [("ray.worker_num_cpus", "ray.worker_num_gpus")] * workers
    strategy = "SPREAD" if r.placement_strategy == "STRICT_SPREAD" else r.placement_strategy
    return JobDemand(
        (own, *learners, *([worker] * workers)),
        tuple(keys),
        strategy,
        max(1, int(cpus)),
        len(learners),
        workers,
    )


def _fits(bundle: Resources, node: Resources) -> bool:
    return all(node.get(r, 0.0) + _EPS >= v for r, v in bundle.items() if v > 0)


def refusal(demand: JobDemand, nodes: Sequence[Resources], where: str) -> str | None:
    """Why no node of the cluster (``nodes``: totals) could ever hold the job, in one line
    naming the key to change; None when it fits. ``where`` names the cluster."""
    from marl.runtime.ray_runtime import can_place

    cpus = [n.get("CPU", 0.0) for n in nodes]
    sizes = f"CPUs per node {cpus}, GPUs {[n.get('GPU', 0.0) for n in nodes]}"
    for bundle, (cpu_key, gpu_key) in zip(demand.bundles, demand.keys):
        if any(_fits(bundle, node) for node in nodes):
            continue
        cpu_short = not any(c + _EPS >= bundle.get("CPU", 0.0) for c in cpus)
        resource = "CPU" if cpu_short else "GPU"
        key, value = (cpu_key if cpu_short else gpu_key), bundle.get(resource, 0.0)
        return (
            f"{key}={value:g}: a job asks {value:g} {resource}s on one node, more than any "
            f"node of {where} has ({sizes})"
        )
    if demand.strategy == "STRICT_PACK":
        learners, workers = list(demand.bundles), []
    else:
        learners, workers = [], list(demand.bundles)
    if can_place(learners, demand.strategy, workers, nodes) is False:
        total = demand.total()
        return (
            f"ray.placement_strategy={demand.strategy}: a job's {len(demand.bundles)} bundles "
            f"({total['CPU']:g} CPUs, {total['GPU']:g} GPUs: the job, ray.num_rollout_workers x "
            f"ray.worker_num_cpus, the learners x ray.learner_num_cpus) never fit {where} "
            f"({sizes})"
        )
    return None
