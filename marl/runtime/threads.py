"""How many CPU threads torch uses in this process, and a warning when the machine is busy.

``runtime.threads`` (:class:`marl.config.RuntimeSettings`) sets ``torch.set_num_threads`` when a
``marl train`` or ``marl play`` process starts. Its default is the cores this process may run
on (``os.sched_getaffinity``, so a ``taskset`` or container CPU limit counts), or
``OMP_NUM_THREADS`` when that is set. At start, a load average above that core count means
other processes already want the cores: one line warns that the run will be slow and its
timings noisy. Measured here (docs/benchmarks.md): two torch threads on a busy 2-core machine
ran 4 to 6 times slower than one.

Ray actors (``ray.enabled=true``) each set their own: :func:`actor_threads` gives a rollout
worker or a learner ``runtime.threads``, but never more than the CPUs it reserved
(``ray.worker_num_cpus``, ``ray.learner_num_cpus``; at least 1). The actor gets the same count in
``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` through its ``runtime_env`` (:func:`thread_env`), so
OpenMP and MKL start with it, and calls ``torch.set_num_threads`` before it builds a model. The
actors on a node then ask for at most the CPUs Ray hands out there: the learners and the rollout
never fight over cores.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

__all__ = [
    "THREAD_ENV_VARS",
    "actor_threads",
    "available_cores",
    "configure_threads",
    "default_threads",
    "oversubscription_warning",
    "thread_env",
]

# what OpenMP and MKL read at start-up (torch's intra-op pool follows OMP_NUM_THREADS)
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


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


def actor_threads(threads: int | None, num_cpus: float) -> int:
    """Torch threads for a Ray actor that reserved ``num_cpus`` CPUs: ``threads``
    (``runtime.threads``; ``None`` = as many as it reserved), capped at the whole CPUs it
    reserved, and at least 1 (a fractional or zero reservation runs one thread)."""
    reserved = max(1, int(num_cpus))
    return reserved if threads is None else max(1, min(int(threads), reserved))


def thread_env(count: int) -> dict[str, str]:
    """The environment variables that make OpenMP and MKL start with ``count`` threads."""
    return dict.fromkeys(THREAD_ENV_VARS, str(count))
