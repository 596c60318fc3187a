"""Where a command's CPU goes, by kind of process: a sampler of ``/proc`` for bench/suite_cpu.py.

Every ``interval`` seconds it reads each process's user + system time (``/proc/<pid>/stat``) and
its command line, and adds the growth since the last reading to the process's kind (the pytest
workers, the marl CLI, Ray's workers by what they run, Ray's own daemons, ...). A process that
starts and ends between two readings is never seen: its CPU is the machine's busy time that no
kind accounts for, which the caller reports as ``unseen``.
"""

from __future__ import annotations

import os
import re
import threading
from collections import defaultdict
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

Kinds = tuple[tuple[str, re.Pattern[str]], ...]

# (kind, pattern on the command line, NULs as spaces); the first match names the process. Ray's
# binaries are matched by their own path at the start (a worker's arguments name the raylet's
# socket); a Ray worker renames itself ray::IDLE, then ray::<Actor or task> when it takes one.
KINDS: Kinds = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("ray daemon: gcs_server", r"^\S*gcs_server\b"),
        ("ray daemon: raylet", r"^\S*/raylet\s"),
        ("ray daemon: agents and monitors", r"^ray::(DashboardAgent|RuntimeEnvAgent)|"
         r"dashboard/(agent|dashboard)\.py|runtime_env/agent|log_monitor\.py|"
         r"autoscaler/_private/monitor\.py"),
        ("ray worker: idle or starting", r"^ray::IDLE|default_worker\.py"),
        ("ray worker: task or actor", r"^ray::"),
        ("the tests' marl CLI (forked from the preloaded server)", r"multiprocessing\.forkserver"),
        ("pytest, xdist worker", r"pytest|sys\.stdin\.readline"),
        ("marl CLI (a fresh interpreter)", r"/marl\s|-m marl\.cli\b"),
        ("python, other", r"python"),
    )
)  # fmt: skip


def kind_of(cmdline: str, kinds: Kinds = KINDS) -> str:
    """The kind of a process from its command line (NUL-separated as in /proc, or spaced)."""
    text = cmdline.replace("\0", " ").strip()
    for kind, pattern in kinds:
        if pattern.search(text):
            return kind
    return "other: " + (Path(text.split(" ", 1)[0]).name or "kernel or unnamed")


def _read(pid: str) -> tuple[float, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
    except OSError:  # the process ended between listing and reading
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK, cmdline  # utime, stime (fields 14, 15)


class ProcessSampler:
    """Samples every process's CPU in a thread of its own until :meth:`stop`."""

    def __init__(self, interval: float = 0.5, kinds: Kinds = KINDS) -> None:
        self.interval = interval
        self.kinds = kinds
        self.by_kind: dict[str, float] = defaultdict(float)
        self.processes: dict[str, int] = defaultdict(int)  # distinct pids seen, by kind
        self._last: dict[str, tuple[float, str]] = {}  # pid -> (cpu, kind)
        self._stop = threading.Event()
        self._me = str(os.getpid())
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ProcessSampler:
        self._sample(first=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        """Stops sampling after a last reading; the CPU seconds by kind."""
        self._stop.set()
        self._thread.join()
        self._sample()
        return dict(self.by_kind)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self, first: bool = False) -> None:
        seen: dict[str, tuple[float, str]] = {}
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == self._me:
                continue
            read = _read(pid)
            if read is None:
                continue
            cpu, cmdline = read
            before = self._last.get(pid)
            # a Ray worker renames itself when it takes a task: keep the kind it has now
            kind = kind_of(cmdline, self.kinds)
            if before is None:
                # existing before the command: only its growth counts; new: all of its CPU
                grown = 0.0 if first else cpu
                self.processes[kind] += not first
            else:
                grown = max(0.0, cpu - before[0])
            self.by_kind[kind] += grown
            seen[pid] = (cpu, kind)
        self._last = seen
