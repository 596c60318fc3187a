"""What a sweep job's directory already holds, and the record the job leaves there.

Re-launching a sweep (same command, same ``hydra.sweep.dir``) looks at each job's directory:

- **finished**: the launcher's record says the job finished and its final checkpoint
  (``checkpoints/step_<train.steps>``) is complete: the job is skipped.
- **resume**: the same job (same overrides) stopped after a complete checkpoint: it resumes
  from the newest one (``resume=<that step>``), in the same directory.
- **restart**: the same job stopped before any checkpoint: its folder is moved aside, whole
  (:func:`set_aside`), and the job runs from scratch.
- **foreign**: the directory holds something else (another job's run: other overrides, or no
  ``.hydra/overrides.yaml``): the job is not run, and the launcher says why. Nothing is
  overwritten.

The record, ``sweep_job.json``, says ``running``, ``finished``, ``failed`` or ``interrupted``
(stopped from outside: :mod:`marl.sweep.job`), with the overrides, the wall time and, for a
failure, the last error line.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from marl.runtime.checkpoint import complete_checkpoints

__all__ = ["RECORD", "JobState", "job_state", "read_record", "set_aside", "write_record"]

RECORD = "sweep_job.json"
RESUME_KEYS = ("resume=", "+resume=", "++resume=")


@dataclass(frozen=True)
class JobState:
    """What to do with a job, given its directory (see the module docstring)."""

    kind: Literal["fresh", "finished", "resume", "restart", "foreign"]
    checkpoint: Path | None = None
    detail: str = ""


def _own(overrides: list[str]) -> list[str]:
    """The overrides that name the job (a ``resume=`` the launcher added is not one)."""
    return [o for o in overrides if not o.startswith(RESUME_KEYS)]


def read_record(job_dir: Path) -> dict[str, Any]:
    """The job's record ({} when there is none or it cannot be read)."""
    try:
        data = json.loads((job_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_record(job_dir: Path, **fields: Any) -> None:
    """Write the job's record (replaced in one rename: a reader never sees half of it)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    tmp = job_dir / f".{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(fields, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, job_dir / RECORD)


def _saved_overrides(job_dir: Path) -> list[str] | None:
    from marl.scenarios.problems import ScenarioError
    from marl.scenarios.reader import read_yaml

    try:  # the bounded reader: a crafted file cannot take the launcher's memory
        data = read_yaml(job_dir / ".hydra" / "overrides.yaml")
    except ScenarioError:
        return None
    return [str(o) for o in data] if isinstance(data, list) else None


def job_state(job_dir: Path, overrides: list[str], steps: int, skip_finished: bool) -> JobState:
    """What the launcher does with the job of ``overrides`` (``train.steps`` = ``steps``) whose
    directory is ``job_dir``."""
    if not job_dir.exists() or not any(job_dir.iterdir()):
        return JobState("fresh")
    saved = _saved_overrides(job_dir)
    if saved is None:
        return JobState("foreign", detail="it holds files but no .hydra/overrides.yaml")
    if _own(saved) != _own(overrides):
        return JobState("foreign", detail=f"it holds the run of other overrides: {' '.join(saved)}")
    steps_done = complete_checkpoints(job_dir)
    if not skip_finished:
        return JobState("restart", detail="hydra.launcher.skip_finished=false")
    final = job_dir / "checkpoints" / f"step_{steps:06d}"
    if read_record(job_dir).get("status") == "finished" and final in steps_done:
        return JobState("finished")
    earlier = [p for p in steps_done if int(p.name.split("_")[1]) < steps]
    if earlier:
        return JobState("resume", earlier[-1])
    return JobState("restart", detail="it stopped before its first checkpoint")


def set_aside(job_dir: Path, sweep_dir: Path) -> Path:
    """Move ``job_dir`` out of the sweep, whole, to ``<sweep_dir>.set-aside/<name>-<time>``
    (outside the sweep folder, so ``marl report`` on the sweep never reads it); returns where."""
    aside = Path(f"{sweep_dir}.set-aside") / f"{job_dir.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    n = 1
    while aside.exists():
        n += 1
        aside = aside.with_name(f"{aside.name.rsplit('~', 1)[0]}~{n}")
    aside.parent.mkdir(parents=True, exist_ok=True)
    os.replace(job_dir, aside)
    return aside
