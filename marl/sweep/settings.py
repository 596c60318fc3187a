"""The Ray launcher's settings: ``hydra.launcher.*`` when ``hydra/launcher=ray`` (``launcher=ray``).

Every field is documented here, once; docs/sweeps.md shows them at work.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LAUNCHER_TARGET", "LauncherSettings"]

LAUNCHER_TARGET = "hydra_plugins.marl_ray_launcher.MarlRayLauncher"


@dataclass
class LauncherSettings:
    """How a sweep's jobs are placed on Ray.

    address:       null = start a local Ray for the sweep (stopped at its end); ``auto`` or
                   ``host:port`` joins a running cluster (``ray start --head`` first; a token is
                   sent as for ``ray=cluster``). The sweep folder must then be a path every node
                   sees (a shared filesystem).
    num_cpus, num_gpus: the local Ray's logical CPUs and GPUs (null = this machine's).
    cpus_per_job:  CPUs one job's own process reserves, and the torch threads it runs; null =
                   the job's ``runtime.threads`` when set, else 1. A job with in-run Ray
                   (``ray.enabled=true``) reserves its learners' and rollout workers' CPUs too,
                   all at once with this (one placement group), so jobs never wait on each other.
    gpus_per_job:  the GPU share of a job that trains on a GPU in its own process; null =
                   ``1 / jobs_per_gpu``. Ignored on a cluster without GPUs. A job with in-run Ray
                   reserves its actors' shares as the run computes them (``policies.<id>.num_gpus``,
                   ``ray.worker_num_gpus``).
    jobs_per_gpu:  with ``gpus_per_job: null``, how many one-process jobs share a GPU (8: eight
                   SmolLM2-135M runs in bf16 fit in well under 80 GB).
    max_parallel:  at most this many jobs at once (null = as many as the resources hold).
    skip_finished: a job whose directory holds its finished run (its final checkpoint and the
                   launcher's record) is not run again; one stopped after a checkpoint resumes
                   from it. false = every job trains from scratch (its old folder moved aside).
    """

    _target_: str = LAUNCHER_TARGET
    address: str | None = None
    num_cpus: int | None = None
    num_gpus: int | None = None
    cpus_per_job: float | None = None
    gpus_per_job: float | None = None
    jobs_per_gpu: int = 8
    max_parallel: int | None = None
    skip_finished: bool = True
