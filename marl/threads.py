"""How many CPU threads torch uses in this process, and a warning when the machine is busy.

``runtime.threads`` (:class:`marl.config.RuntimeSettings`) sets ``torch.set_num_threads`` when a
``marl train`` or ``marl play`` process starts. Its default is the cores this process may run
on (``os.sched_getaffinity``, so a ``taskset`` or container CPU limit counts), or
``OMP_NUM_THREADS`` when that is set. At start, a load average above that core count means
other processes already want the cores: one line warns that the run will be slow and its
timings noisy. Measured here (docs/benchmarks.md): two torch threads on a busy 2-core machine
ran 4 to 6 times slower than one.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

__all__ = [
    "available_cores",
    "configure_threads",
    "default_threads",
    "oversubscription_warning",
]


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask; ``os.cpu_count`` elsewhere)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when it holds a positive whole number, else :func:`available_cores`."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return available_cores()


def oversubscription_warning(load: float, cores: int, threads: int) -> str | None:
    """The one-line warning when the 1-minute load average ``load`` is above ``cores``."""
    if load <= cores:
        return None
    return (
        f"marl: warning: load average {load:.1f} is above the {cores} core(s) this process may "
        f"use; the machine looks oversubscribed, so this run ({threads} torch thread(s)) will "
        "be slow and its timings noisy (runtime.threads=1 is often faster on a busy machine)"
    )


def configure_threads(threads: int | None, stream: TextIO | None = sys.stderr) -> int:
    """Set torch's thread count (``None`` = :func:`default_threads`) and, when the machine
    looks oversubscribed, write one warning line to ``stream`` (``None`` = no warning).
    Returns the thread count set."""
    import torch

    count = default_threads() if threads is None else int(threads)
    if count < 1:
        raise ValueError(f"runtime.threads: must be >= 1, got {count}")
    torch.set_num_threads(count)
    if stream is not None and hasattr(os, "getloadavg"):
        message = oversubscription_warning(os.getloadavg()[0], available_cores(), count)
        if message:
            print(message, file=stream)
    return count
