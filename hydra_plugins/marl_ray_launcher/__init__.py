"""Hydra's side of the marl Ray launcher: ``hydra/launcher=ray`` (``marl train -m launcher=ray``).

Hydra finds launchers in the ``hydra_plugins`` namespace package. This module only registers the
launcher's config (:class:`marl.sweep.settings.LauncherSettings`) and adapts Hydra's ``Launcher``
interface to :func:`marl.sweep.driver.launch`; the work is in :mod:`marl.sweep`. The ``marl``
command also registers the launcher itself (:func:`register`), since an editable install hides
this package from Hydra's plugin scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from marl.sweep.settings import LauncherSettings

ConfigStore.instance().store(
    group="hydra/launcher", name="ray", node=LauncherSettings, provider="marl"
)


class MarlRayLauncher(Launcher):
    """Every job of a sweep as a Ray task (docs/sweeps.md)."""

    def __init__(self, **settings: Any) -> None:
        self.settings = LauncherSettings(**settings)
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None
        self.remote_job: Any = None  # the job's Ray remote function, made when a sweep starts

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        """Keep what Hydra hands over: its context, the task and the sweep's config."""
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        """Run the jobs on Ray; one :class:`JobReturn` per job (exits when any failed)."""
        from marl.sweep.driver import launch

        return launch(self, job_overrides, initial_job_idx)


def register() -> None:
    """Make the launcher known to Hydra in this process (idempotent)."""
    Plugins.instance().register(MarlRayLauncher)
