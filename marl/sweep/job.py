"""One sweep job, in its own Ray worker process: what Hydra's basic launcher does for a job.

:func:`run_sweep_job` sets Hydra's state as the launcher had it, runs the job with Hydra's own
``run_job`` (so the job writes the same ``.hydra/`` files, log and run folder as under the basic
launcher), and returns a :class:`JobOutcome` of plain data. The process's output (fds 1 and 2:
Python's and the libraries') goes to ``<job dir>/output.log``; the job's record
(:mod:`marl.sweep.job_dirs`) says ``running`` while it runs and ``finished`` or ``failed`` after.
A job that exits (``marl``'s user errors exit 2 after printing ``error: ...``) is a failure whose
last error line is the one it printed. A job stopped from outside is recorded ``interrupted``, not
failed (its last printed line is no error of its own): by Ctrl-C (``marl`` exits 130), or by Ray
(the launcher's cancel on Ctrl-C, a node shutting down: Ray's SIGTERM handler raises a
``SystemExit`` that carries ``ray_terminate_msg``).
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl.errors import INTERRUPTED_EXIT
from marl.sweep.job_dirs import write_record

__all__ = [
    "JobExit",
    "JobOutcome",
    "JobSpec",
    "OUTPUT_LOG",
    "exits_as_errors",
    "last_error_line",
    "run_sweep_job",
    "was_interrupted",
]

OUTPUT_LOG = "output.log"
INTERRUPTED_ERROR = "interrupted: the sweep was stopped; launching it again resumes this job"


@dataclass
class JobSpec:
    """Everything a job's process needs, as the launcher composed it."""

    num: int
    overrides: list[str]
    job_dir: str  # absolute
    cwd: str  # the launcher's working directory (relative paths in the config are from there)
    sweep_config: Any  # DictConfig: the job's composed config, hydra node included
    task_function: Callable[[Any], Any]
    hydra_context: Any
    singleton_state: Any


@dataclass
class JobOutcome:
    """How a job ended, as plain data: ``status`` is ``finished``, ``failed`` or
    ``interrupted``."""

    num: int
    status: str
    wall_s: float
    error: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    node: str = ""
    pid: int = 0
    job_return: Any = None  # Hydra's JobReturn, its return value made plain


class JobExit(RuntimeError):
    """The job's task called ``sys.exit`` (a user error it already reported), or Ray made it
    exit (``stopped_by``: Ray's message, such as "The process receives a SIGTERM.")."""

    def __init__(self, code: object, stopped_by: str | None = None) -> None:
        super().__init__(f"the job exited with status {code}")
        self.code = code
        self.stopped_by = stopped_by


def was_interrupted(value: object) -> bool:
    """Whether a job's task ended because it was stopped from outside (Ctrl-C, Ray's cancel or
    shutdown), not by a fault of its own."""
    if isinstance(value, JobExit):
        return value.code == INTERRUPTED_EXIT or value.stopped_by is not None
    return (
        isinstance(value, KeyboardInterrupt)
        or getattr(value, "ray_terminate_msg", None) is not None
    )


def last_error_line(log: Path, fallback: str = "") -> str:
    """The last line of the job's output that starts with ``error:``, else its last non-empty
    line that is not a progress bar, else ``fallback``."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 65536))
            lines = f.read().decode("utf-8", errors="replace").replace("\r", "\n").splitlines()
    except OSError:
        return fallback
    lines = [line.strip() for line in lines if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    if errors:
        return errors[-1]
    return fallback or (lines[-1] if lines else "")


def _plain_metrics(value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        return {}
    out = {}
    for key, number in value.items():
        try:
            out[str(key)] = float(number)
        except (TypeError, ValueError):
            continue
    return out


def exits_as_errors(task: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``task`` with ``sys.exit`` turned into :class:`JobExit` (Hydra's ``run_job`` would let a
    ``SystemExit`` end the worker); an exit with status 0 is a finished job."""

    def run(cfg: Any) -> Any:
        try:
            return task(cfg)
        except SystemExit as exc:
            if exc.code in (0, None):
                return None
            raise JobExit(exc.code, getattr(exc, "ray_terminate_msg", None)) from None

    return run


def run_sweep_job(spec: JobSpec) -> JobOutcome:
    """Run one job (in a Ray worker process that runs nothing else) and say how it ended."""
    import ray
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.singleton import Singleton
    from hydra.core.utils import JobStatus, run_job, setup_globals

    started = time.time()
    job_dir = Path(spec.job_dir)
    if not Path(spec.cwd).is_dir():
        return JobOutcome(
            spec.num,
            "failed",
            0.0,
            f"the sweep's working directory {spec.cwd} does not exist on node "
            f"{socket.gethostname()}: a cluster sweep needs a folder every node sees",
        )
    os.chdir(spec.cwd)
    job_dir.mkdir(parents=True, exist_ok=True)
    log = job_dir / OUTPUT_LOG
    node = ray.get_runtime_context().get_node_id()
    base = {"num": spec.num, "overrides": spec.overrides, "node": node, "pid": os.getpid()}
    write_record(job_dir, status="running", started=started, **base)
    sys.stdout.flush()
    sys.stderr.flush()
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    setup_globals()
    Singleton.set_state(spec.singleton_state)
    HydraConfig.instance().set_config(spec.sweep_config)
    error, stopped = "", False
    try:
        ret = run_job(
            hydra_context=spec.hydra_context,
            task_function=exits_as_errors(spec.task_function),
            config=spec.sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        failed = ret.status != JobStatus.COMPLETED
        value = ret._return_value
        sys.stdout.flush()
        sys.stderr.flush()  # the job's "error: ..." line is in the log before it is read
        stopped = failed and was_interrupted(value)
        if stopped:
            error = INTERRUPTED_ERROR
            ret._return_value = RuntimeError(error)
        elif failed:
            text = f"{type(value).__name__}: {value}"
            if not isinstance(value, JobExit):
                traceback.print_exception(type(value), value, value.__traceback__)
            error = last_error_line(log, "" if isinstance(value, JobExit) else text) or text
            ret._return_value = RuntimeError(error)
        else:
            ret._return_value = _plain_metrics(value) or None
    except BaseException as exc:  # noqa: BLE001 - Hydra's own set-up failed: report, never hang
        ret, failed, stopped = None, True, was_interrupted(exc)
        if stopped:
            error = INTERRUPTED_ERROR
        else:
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    wall = time.time() - started
    metrics = {} if failed or ret is None else dict(ret._return_value or {})
    status = "interrupted" if stopped else "failed" if failed else "finished"
    write_record(job_dir, status=status, started=started, wall_s=wall, error=error, **base)
    return JobOutcome(spec.num, status, wall, error, metrics, node, os.getpid(), ret)
