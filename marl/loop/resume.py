"""What ``resume=`` does: the checkpoint it names, the one line that says what happens, and how
the resumed run carries on its folder's TensorBoard run.

A run resumed in the folder its checkpoint belongs to (``marl train resume=<run>`` without
``hydra.run.dir`` runs there, :mod:`marl.loop.run_folder`; ``train(cfg, run_dir=<run>)``)
*continues* it, so TensorBoard shows one run with every step once:

- its event writer starts with ``purge_step`` = the checkpoint's step + 1: TensorBoard's reader
  drops what the first process logged after the checkpoint (a crashed tail), and the steps
  after it are this run's. Not where the warm-up logged past the checkpoint's step (its
  ``warmup/*`` curves share the step axis, and the purge would hide them);
- nothing is measured again at the checkpoint's step (the folder's events hold it); the config
  and the placement it continues with are logged as text at that step;
- its HParams session start repeats the run's first hparams: TensorBoard reads the first
  session start and the first session end a run holds (so where the first process ended with
  ``failure``, the HParams tab keeps saying so); the ``final/*`` scalars are the newest.

A run resumed in another folder (``hydra.run.dir=`` or ``run_dir=`` elsewhere) is a new
TensorBoard run there; the line says so, and its hparams name the checkpoint
(``resumed_from``). With nothing left to train the line says so and nothing is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marl.analysis.hparams import HParamValue, read_session
from marl.config import Config
from marl.loop.run_folder import RESUME_KEYS, run_folder
from marl.runtime.checkpoint import (
    check_resume,
    check_weights,
    load_checkpoint,
    resolve_checkpoint,
)
from marl.runtime.local import Runtime
from marl.runtime.seeding import set_rng_states

__all__ = ["Resume", "open_resume", "policy_states", "without_resume"]


def policy_states(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per-policy learner states of a checkpoint: policy id -> weights, learner state, version."""
    return state["policies"]


@dataclass(frozen=True)
class Resume:
    """A loaded, checked checkpoint to resume, and where it came from.

    given: ``resume=`` as written. checkpoint: the step folder it names. step: its updates
    done. folder: its run folder (None for a step outside any run).
    """

    given: str
    checkpoint: Path
    state: dict[str, Any]
    step: int
    folder: Path | None

    def continues(self, run_dir: Path) -> bool:
        """Whether a run in ``run_dir`` continues the checkpoint's own run."""
        return self.folder is not None and self.folder.resolve() == Path(run_dir).resolve()

    def line(self, steps: int, run_dir: Path) -> str:
        """The one line: which checkpoint, which step, how many steps are left, and where the
        run goes on."""
        left = max(0, steps - self.step)
        head = f"resume: {self.given} is step {self.step}; train.steps={steps}: "
        if not left:
            return head + "nothing to train (raise train.steps to continue it); nothing written"
        head += f"{left} step(s) to train, "
        if self.continues(run_dir):
            return head + f"continuing {run_dir} and its TensorBoard run"
        return head + (
            f"in a new folder {run_dir} (a new TensorBoard run; its hparams say "
            f"resumed_from={self.checkpoint})"
        )

    def restore(self, runtime: Runtime, config: Config) -> int:
        """Load the policies and RNG states into the built ``runtime``; the step to go on
        from."""
        check_weights(policy_states(self.state), runtime.state(), self.state.get("config"), config)
        runtime.load_state(policy_states(self.state))
        set_rng_states(self.state["rng"])
        return self.step

    def purge_step(self) -> int | None:
        """The TensorBoard ``purge_step`` of a run continuing its folder: what was logged after
        the checkpoint is dropped (None where the warm-up logged past it)."""
        saved = self.state.get("config") or {}
        warmup = int((saved.get("warmup") or {}).get("steps") or 0)
        return None if warmup > self.step else self.step + 1

    def hparams(self, hparams: dict[str, HParamValue], run_dir: Path) -> dict[str, HParamValue]:
        """The HParams of the resumed run: continuing, the run's first ones (``hparams`` where
        it logged none); elsewhere ``hparams`` and ``resumed_from``, the checkpoint."""
        if self.continues(run_dir):
            first, _, _ = read_session(Path(run_dir) / "tensorboard")
            return first or hparams
        return {**hparams, "resumed_from": str(self.checkpoint)}


def open_resume(config: Config, extra_fields: Sequence[str] = ()) -> Resume | None:
    """The checkpoint ``resume=`` names, loaded and checked before anything is built (None
    without ``resume``); ``extra_fields``: the registered trackers' checkpoint fields."""
    if not config.resume:
        return None
    where = resolve_checkpoint(config.resume)
    state = load_checkpoint(where, extra_fields=extra_fields)
    check_resume(state, config)  # the scenario it was trained on
    return Resume(str(config.resume), where, state, int(state["step"]), run_folder(where))


def without_resume(overrides: Sequence[str]) -> list[str]:
    """Hydra overrides without ``resume=`` (a resumed run's HParams name it otherwise)."""
    return [o for o in overrides if o.split("=", 1)[0] not in RESUME_KEYS]
