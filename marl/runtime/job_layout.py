"""Where a sweep job's in-run Ray actors go: the bundles the launcher reserved for them.

A job with in-run Ray (``ray.enabled=true``) reserves ONE placement group at launch: bundle 0
for its own process, then one bundle per learner, then one per rollout worker
(:func:`marl.sweep.demand.job_demand`). The job's process runs in bundle 0 and finds the layout
in its environment (:data:`LAYOUT_ENV`); :class:`marl.runtime.ray_runtime.RayRuntime` then puts
each actor in its bundle instead of asking the cluster again. Every resource a job will use is
held before it starts, so jobs can never wait on each other's CPUs (no deadlock).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from marl.errors import RunError

__all__ = ["LAYOUT_ENV", "JobLayout", "sweep_job_layout"]

LAYOUT_ENV = "MARL_SWEEP_LAYOUT"  # {"learners": [bundle, ...], "workers": [bundle, ...]}


@dataclass(frozen=True)
class JobLayout:
    """The job's placement group and the bundle index of each learner and rollout worker."""

    group: Any
    learners: tuple[int, ...]
    workers: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """The environment variable that hands this layout to the job's process."""
        return {LAYOUT_ENV: json.dumps({"learners": self.learners, "workers": self.workers})}

    def strategy(self, bundle: int) -> Any:
        """The scheduling strategy that places an actor in ``bundle`` of the job's group."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=bundle
        )

    def check(self, learners: int, workers: int) -> None:
        """The run wants the actors the launcher reserved for (else a bug: one line)."""
        if (learners, workers) != (len(self.learners), len(self.workers)):
            raise RunError(
                f"sweep: this job reserved {len(self.learners)} learner and "
                f"{len(self.workers)} rollout worker bundle(s), but the run starts {learners} "
                f"and {workers}; the launcher and the run disagree on the config"
            )


def sweep_job_layout() -> JobLayout | None:
    """The layout when this process is a sweep job with reserved actor bundles, else None."""
    raw = os.environ.get(LAYOUT_ENV)
    if not raw:
        return None
    from ray.util import get_current_placement_group

    group = get_current_placement_group()
    if group is None:
        return None
    data = json.loads(raw)
    return JobLayout(group, tuple(data["learners"]), tuple(data["workers"]))
