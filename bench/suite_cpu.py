"""What a command costs the machine: wall time, the CPU `time` sees, and the CPU the machine spent.

`/usr/bin/time` adds a child's CPU only when the child's parent waits for it. Ray's raylet
sets SIGCHLD to SIG_IGN (``SigIgn`` in ``/proc/<raylet pid>/status`` has bit 17 set), so the
kernel reaps its worker processes itself and their CPU is added to no one's: ``time`` never
counts a Ray worker, whoever started the raylet. This reads the machine's busy CPU from
``/proc/stat`` before and after as well, so a suite's real CPU use shows (issue 38's goal for
`make test`: at least 180% on 2 cores). Run it on an otherwise idle machine: the machine-wide
figure counts every process.

    .venv/bin/python bench/suite_cpu.py                      # make test in this checkout
    .venv/bin/python bench/suite_cpu.py --cwd /tmp/before    # in another checkout
    .venv/bin/python bench/suite_cpu.py --by-process         # and where the CPU went

``--by-process`` samples ``/proc`` twice a second (bench/process_cpu.py) and splits the machine's
CPU by kind of process: the pytest workers, the marl CLI, Ray's workers (idle, or by the task or
actor they run), Ray's daemons, and what no reading saw (processes shorter than a sample).

Writes ``bench/results/suite_cpu.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import busy_seconds, checkout_name, row, write  # noqa: E402
from process_cpu import ProcessSampler  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("command", nargs="*", default=["make", "test"])
    p.add_argument("--cwd", default=".", help="the checkout to run it in")
    p.add_argument("--name", default="suite_cpu", help="bench/results/<name>.json")
    p.add_argument("--by-process", action="store_true", help="split the CPU by kind of process")
    args = p.parse_args()
    sampler = ProcessSampler().start() if args.by_process else None
    busy, began = busy_seconds(), time.perf_counter()
    proc = subprocess.Popen(args.command, cwd=args.cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    by_kind = sampler.stop() if sampler else {}
    wall = time.perf_counter() - began
    machine_cpu = busy_seconds() - busy
    reaped = usage.ru_utime + usage.ru_stime
    where = checkout_name(Path(args.cwd))
    summary = [
        row("wall", wall, "s", " ".join(args.command)),
        row("CPU of reaped processes (time(1))", reaped, "s", f"{100 * reaped / wall:.0f}%"),
        row("CPU of the whole machine", machine_cpu, "s", f"{100 * machine_cpu / wall:.0f}%"),
        row("exit status", os.waitstatus_to_exitcode(status), "", where),
    ]
    if sampler:
        by_kind["unseen (shorter than a sample)"] = max(0.0, machine_cpu - sum(by_kind.values()))
        for kind, cpu in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            if cpu < 0.05:
                continue
            started = sampler.processes.get(kind, 0)
            summary.append(row(f"CPU: {kind}", cpu, "s", f"{started} processes started"))
    write(
        args.name,
        {
            "args": {**vars(args), "cwd": where},
            "wall_s": wall,
            "reaped_cpu_s": reaped,
            "machine_cpu_s": machine_cpu,
            **(
                {"cpu_by_kind_s": by_kind, "processes_by_kind": dict(sampler.processes)}
                if sampler
                else {}
            ),
        },
        summary,
    )


if __name__ == "__main__":
    main()
