"""The run folder a checkpoint belongs to, and ``marl train resume=...`` continuing in it.

A run writes ``<run>/checkpoints/step_N``; ``resume=`` may name the step, the ``checkpoints``
folder or the run folder itself. Without ``hydra.run.dir``, Hydra would start a new timestamped
folder for the resumed run, so its curves would be a second TensorBoard run beside the first;
:func:`continue_in_place` gives Hydra the checkpoint's own run folder instead, and the run
continues there as one curve (:mod:`marl.loop.resume`); Hydra writes no ``.hydra/`` there, so
the folder's keeps the overrides of the launch that made the run (a sweep reads them). Pure path
logic: no torch, no Hydra.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

__all__ = ["continue_in_place", "run_folder"]

RESUME_KEYS = ("resume", "+resume", "++resume")
RUN_DIR_KEYS = ("hydra.run.dir", "+hydra.run.dir", "++hydra.run.dir")
MULTIRUN = ("-m", "--multirun")
NO_SUBDIR = "hydra.output_subdir=null"  # the run's .hydra/ keeps the launch that made it


def run_folder(path: str | Path) -> Path | None:
    """The run folder of the checkpoint ``path`` names (a step, a ``checkpoints`` folder or a
    run folder holding one), read from the path alone; None for a step outside any run."""
    path = Path(path)
    if path.parent.name == "checkpoints":
        return path.parent.parent
    if path.name == "checkpoints":
        return path.parent
    if (path / "checkpoints").is_dir():
        return path
    return None


def continue_in_place(args: Sequence[str]) -> list[str]:
    """``marl train`` overrides with ``hydra.run.dir`` set to the run folder of ``resume=`` (and
    ``hydra.output_subdir=null``), so a resumed run continues its own folder; unchanged for a
    sweep (``-m``), when ``hydra.run.dir`` is given, without a ``resume=`` or where the folder
    holds no checkpoints."""
    args = list(args)
    values = dict(arg.split("=", 1) for arg in args if "=" in arg)
    if any(a in MULTIRUN for a in args) or any(k in values for k in RUN_DIR_KEYS):
        return args
    given = next((values[k] for k in RESUME_KEYS if k in values), "").strip().strip("'\"")
    if given in ("", "null", "None"):
        return args
    folder = run_folder(given)
    if folder is None or not (folder / "checkpoints").is_dir():
        return args
    if any(c in str(folder) for c in "'\\$"):  # Hydra's grammar would read them otherwise
        return args  # the run then writes a new folder, and says so (marl.loop.resume)
    keep = [] if any(k.lstrip("+") == "hydra.output_subdir" for k in values) else [NO_SUBDIR]
    return [*args, f"hydra.run.dir='{folder}'", *keep]
