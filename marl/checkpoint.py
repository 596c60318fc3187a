"""Checkpoints: model weights, optimizer, RNG states and step, written atomically.

A checkpoint is a directory ``<run>/checkpoints/step_<N>/`` holding ``state.pt``. It is written
to a temporary directory first and renamed into place, so a crash never leaves half a checkpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from marl.errors import RunError


def save_checkpoint(run_dir: str | Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` as the checkpoint of ``step``; returns its directory."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step:06d}.", dir=root))
    try:
        torch.save(state, tmp / "state.pt")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    (root / "latest").write_text(final.name + "\n")
    return final


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory ``path`` names: a step directory, or a run/checkpoints dir."""
    path = Path(path)
    candidates = [path, path / "checkpoints"]
    for candidate in candidates:
        if (candidate / "state.pt").is_file():
            return candidate
        latest = candidate / "latest"
        if latest.is_file():
            step_dir = candidate / latest.read_text().strip()
            if (step_dir / "state.pt").is_file():
                return step_dir
    raise RunError(
        f"resume: no checkpoint found at {path} (expected a step_N directory with state.pt)"
    )


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint saved by :func:`save_checkpoint`."""
    directory = resolve_checkpoint(path)
    return torch.load(directory / "state.pt", map_location="cpu", weights_only=False)
