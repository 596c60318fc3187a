"""A 4-run sweep on this machine: Hydra's basic launcher (one run after another) against the Ray
launcher (``launcher=ray``: each run reserves one CPU, so on 2 cores two run side by side).

Both sides run the same ``marl train -m --config-name demo seed=0,1,2,3`` with the same shortening
overrides (runs of a minute or two each: the tiny model is too short to pay for Ray's start-up),
alternating (serial, Ray, serial, Ray, ...) ``--rounds`` times. The serial side runs as a user's
sweep does: each run takes the machine's cores (torch threads = cores); a Ray job runs the one
CPU it reserved. A side's figures: wall seconds of the whole command, the machine's CPU seconds
meanwhile (/proc/stat: Ray's processes are not the launcher's children), the load average
before and after, and each job's final team reward (so a faster sweep is seen to train the same
runs). The summary gives each side's median
wall and the ratio Ray / serial (issue 39's goal: at most 0.6).

    .venv/bin/python bench/sweep_wall.py --rounds 2

Writes ``bench/results/sweep_wall.json`` (``--name``). A round takes many minutes: nothing else
should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import busy_seconds, read_scalars, row, write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# a demo run cut to a minute or two: fewer RL steps, a smaller held-out evaluation
SHORT = [
    "train.steps=6",
    "train.eval_episodes=16",
    "train.checkpoint_every=0",
    "emergence.listening_episodes=4",
    "logging.transcripts_every=0",
    "logging.progress=false",
]


def one_sweep(side: str, seeds: list[int], extra: list[str]) -> dict[str, Any]:
    """The 4-run sweep through one launcher: wall, CPU seconds, load, each run's last reward."""
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp) / "sweep"
        launcher = ["launcher=ray"] if side == "ray" else []
        cmd = [
            str(ROOT / ".venv/bin/marl"), "train", "-m", "--config-name", "demo",
            f"seed={','.join(map(str, seeds))}", *SHORT, *extra, *launcher,
            f"hydra.sweep.dir={sweep_dir}",
        ]  # fmt: skip
        load = os.getloadavg()[0]
        cpu0 = busy_seconds()
        began = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        output = proc.stdout.read() if proc.stdout else ""
        proc.wait()
        wall = time.perf_counter() - began
        cpu = busy_seconds() - cpu0
        if proc.returncode != 0:
            sys.stderr.write(output[-3000:])
            raise SystemExit(f"the {side} sweep failed (status {proc.returncode})")
        rewards = []
        for k in range(len(seeds)):
            curves = read_scalars(sweep_dir / str(k) / "tensorboard")
            rewards.append(curves["team/reward"][-1])
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "final_team_reward": rewards,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--name", default="sweep_wall", help="bench/results/<name>.json")
    p.add_argument("extra", nargs="*", help="more overrides for every run of both sides")
    args = p.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"serial": [], "ray": []}
    for r in range(args.rounds):
        for side in ("serial", "ray"):
            done = one_sweep(side, args.seeds, args.extra)
            runs[side].append(done)
            print(
                f"round {r + 1} {side}: {done['wall_s']:.0f} s wall, {done['cpu_s']:.0f} s CPU, "
                f"load {done['load_before']:.2f} -> {done['load_after']:.2f}",
                flush=True,
            )

    def med(side: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[side])

    summary = []
    for key, unit in (("wall_s", "s"), ("cpu_s", "s")):
        for side in ("serial", "ray"):
            values = ", ".join(f"{x[key]:.0f}" for x in runs[side])
            summary.append(row(f"{len(args.seeds)}-run sweep, {side}: {key}", med(side, key),
                               unit, values))  # fmt: skip
    summary.append(
        row("sweep wall: ray / serial", med("ray", "wall_s") / med("serial", "wall_s"), "x",
            f"medians of {args.rounds} alternating rounds; goal <= 0.6")
    )  # fmt: skip
    write(args.name, {"args": vars(args), "overrides": SHORT, "runs": runs}, summary)


if __name__ == "__main__":
    main()
