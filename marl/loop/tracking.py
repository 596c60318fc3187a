"""The one interface every tracker of ``marl train`` has, and the run it is handed.

A tracker is anything the loop measures or keeps beside the policies: the emergence metrics,
the held-out evaluation, the exact exploitability, the league, the role baselines, the
checkpoints (:mod:`marl.loop.trackers` lists them). As HF's ``TrainerCallback`` and Lightning's
``Callback`` do, each gets the same few hooks at fixed points of a step, and the driver walks
the list; a new measure is one :class:`Tracker` subclass and one line
(:func:`marl.loop.trackers.register`).

The points, for step ``s`` (0-based; ``s + 1`` updates done after it):

- :meth:`Tracker.on_start`: once, after the warm-up and before this process's first update,
  for ``run.start`` updates done. Not called when the run continues its own folder, whose
  events hold that step already (:mod:`marl.loop.resume`).
- :meth:`Tracker.on_rollout`: the step's episodes, before the update (influence re-simulates
  them with the policies that played them); its tags join the step's, and its time is
  ``perf/<name>_time``.
- :meth:`Tracker.on_update`: after the update and the weight sync; its tags join the step's,
  logged at ``s + 1``.
- :meth:`Tracker.on_logged`: after the step's tags are logged (an evaluation logs its own;
  a checkpoint is saved).

A tracker with a :attr:`Tracker.key` keeps state across a resume: :meth:`Tracker.state_dict`
is saved under that key in every checkpoint, and :meth:`Tracker.load_state_dict` gets it back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from marl.analysis.summary import RunSummary
    from marl.analysis.tensorboard import TensorBoardLogger
    from marl.config import Config
    from marl.runtime.local import Runtime
    from marl.runtime.policy_map import PolicyPlan
    from marl.runtime.rollout import RolloutResult

__all__ = ["Run", "Tracker", "implements"]

T = TypeVar("T", bound="Tracker")


@dataclass
class Run:
    """What the driver and every tracker share: the config, the policy plan (None for scripted
    agents), the runtime, the run folder, the TensorBoard logger and the end-of-run summary.

    start:     updates done when this process began (the resumed checkpoint's step, else 0).
    continued: the run continues its own folder (:mod:`marl.loop.resume`): step ``start`` is
               logged there already.
    trackers:  the run's trackers, in call order (:func:`marl.loop.trackers.build_trackers`).
    """

    config: Config
    plan: PolicyPlan | None
    runtime: Runtime
    run_dir: Path
    logger: TensorBoardLogger
    summary: RunSummary
    start: int = 0
    continued: bool = False
    trackers: list[Tracker] = field(default_factory=list)

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Log scalars at ``step`` to TensorBoard and keep the headline ones for the summary."""
        self.logger.scalars(metrics, step)
        self.summary.add(step, metrics)

    def find(self, kind: type[T]) -> T | None:
        """The run's tracker of class ``kind`` (None when it has none)."""
        return next((t for t in self.trackers if isinstance(t, kind)), None)


class Tracker:
    """A measure or a piece of state hung off the loop; every hook does nothing by default.

    name: the tracker's name (unique in the registry; ``perf/<name>_time`` for
          :meth:`on_rollout`). key: its field in every checkpoint (None: it keeps nothing).
    """

    name: ClassVar[str] = ""
    key: ClassVar[str | None] = None

    @classmethod
    def build(cls, run: Run) -> Tracker | None:
        """The tracker for ``run``, or None where it does not apply (built before the warm-up:
        build nothing that draws random numbers here, do it in :meth:`on_start`)."""
        return cls()

    def on_start(self, run: Run) -> None:
        """Before this process's first update: measure the policies it starts from, logged at
        ``run.start``."""

    def on_rollout(self, run: Run, step: int, rollout: RolloutResult) -> dict[str, float]:
        """Tags of step ``step``'s episodes, measured before the update."""
        return {}

    def on_update(self, run: Run, updates_done: int, rollout: RolloutResult) -> dict[str, float]:
        """Tags after the update and sync, logged with the step's at ``updates_done``."""
        return {}

    def on_logged(self, run: Run, updates_done: int) -> None:
        """After the step's tags are logged at ``updates_done``."""

    def state_dict(self) -> Any:
        """What a checkpoint keeps under :attr:`key`."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict` from a checkpoint."""


def implements(tracker: Tracker, hook: str) -> bool:
    """Whether ``tracker``'s class overrides ``hook`` (only those are timed)."""
    return getattr(type(tracker), hook) is not getattr(Tracker, hook)
