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

On a GPU machine (issue 39's "8 demo jobs share one GPU"), the Ray side's jobs each reserve
1/8 of the GPU (``hydra.launcher.jobs_per_gpu``), and a serial sweep of fewer jobs gives the
serial rate; the figure to compare is jobs per hour. SmolLM2's shape with random weights fails
every episode alike, so ``--synthetic-reward`` adds the benches' synthetic reward
(``bench/synthetic_reward.py``) to every job, through a ``sitecustomize`` on ``PYTHONPATH``, and
every step updates as a real run's does:

    source .gpu/setup.sh && python3 bench/sweep_wall.py --rounds 1 --seeds 0 1 2 3 4 5 6 7 \
        --serial-seeds 0 1 --synthetic-reward --out "$OUT" model.kind=hf model.path=/tmp/smol

``--timeout-s`` stops a sweep that runs too long (SIGTERM: the launcher ends every job); its
jobs per hour then count the jobs that finished.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import busy_seconds, marl_command, read_scalars, row, write  # noqa: E402
from synthetic_reward import OVERRIDE, site_dir  # noqa: E402

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


def job_figures(job_dir: Path) -> dict[str, Any]:
    """One job's figures from its TensorBoard events: whether it finished (it wrote its final
    metrics), its steps, its last team reward and its median step and update times (None where
    it logged none). A job that never wrote events has only ``finished: False``."""
    logdir = job_dir / "tensorboard"
    if not logdir.is_dir():
        return {"finished": False}
    curves = read_scalars(logdir)

    def median(tag: str) -> float | None:
        return statistics.median(curves[tag]) if curves.get(tag) else None

    rewards = curves.get("team/reward", [])
    return {
        "finished": "final/team/reward" in curves,
        "steps": len(rewards),
        "final_team_reward": rewards[-1] if rewards else None,
        "step_time_s": median("perf/step_time"),
        "update_time_s": median("perf/update_time"),
    }


def one_sweep(
    side: str, seeds: list[int], extra: list[str], timeout_s: float, env: dict[str, str]
) -> dict[str, Any]:
    """A sweep through one launcher: wall, CPU seconds, load, jobs per hour, each job's
    figures."""
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = Path(tmp) / "sweep"
        launcher = ["launcher=ray"] if side == "ray" else []
        cmd = [
            *marl_command(), "train", "-m", "--config-name", "demo",
            f"seed={','.join(map(str, seeds))}", *SHORT, *extra, *launcher,
            f"hydra.sweep.dir={sweep_dir}",
        ]  # fmt: skip
        load = os.getloadavg()[0]
        cpu0 = busy_seconds()
        began = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            start_new_session=True,
        )  # fmt: skip
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGTERM)  # the launcher ends its jobs and Ray
            try:
                output, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                output, _ = proc.communicate()
        wall = time.perf_counter() - began
        cpu = busy_seconds() - cpu0
        if proc.returncode != 0 and not timed_out:  # recorded (jobs that failed do not count)
            sys.stderr.write(output[-3000:] + f"\nthe {side} sweep exited {proc.returncode}\n")
        jobs = [job_figures(sweep_dir / str(k)) for k in range(len(seeds))]
    finished = sum(job["finished"] for job in jobs)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "timed_out": timed_out,
        "returncode": proc.returncode,
        "jobs": len(seeds),
        "jobs_finished": finished,
        "jobs_per_hour": finished / wall * 3600,
        "final_team_reward": [job.get("final_team_reward") for job in jobs],
        "per_job": jobs,
        "output_tail": output[-2000:],
    }


def alternate_sweeps(
    args: argparse.Namespace, seeds: dict[str, list[int]], extra: list[str], env: dict[str, str]
) -> dict[str, list[dict[str, Any]]]:
    """``args.rounds`` rounds of serial then Ray, each side's sweep printed as it ends."""
    runs: dict[str, list[dict[str, Any]]] = {"serial": [], "ray": []}
    for r in range(args.rounds):
        for side in ("serial", "ray"):
            own = args.ray_override if side == "ray" else []
            done = one_sweep(side, seeds[side], extra + own, args.timeout_s, env)
            runs[side].append(done)
            print(
                f"round {r + 1} {side}: {done['jobs_finished']}/{done['jobs']} jobs in "
                f"{done['wall_s']:.0f} s wall ({done['jobs_per_hour']:.1f} jobs/h), "
                f"{done['cpu_s']:.0f} s CPU, load {done['load_before']:.2f} -> "
                f"{done['load_after']:.2f}" + (" TIMED OUT" if done["timed_out"] else ""),
                flush=True,
            )
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument(
        "--serial-seeds",
        type=int,
        nargs="+",
        default=None,
        help="the serial side's jobs (default: --seeds); compare jobs per hour",
    )
    p.add_argument(
        "--synthetic-reward",
        action="store_true",
        help="add bench/synthetic_reward.py's reward to every job (random weights)",
    )
    p.add_argument("--timeout-s", type=float, default=3600.0, help="stop a sweep after this")
    p.add_argument(
        "--ray-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for the Ray side only (hydra.launcher.*); repeatable",
    )
    p.add_argument("--out", type=Path, default=None, help="also copy the JSON to this folder")
    p.add_argument("--name", default="sweep_wall", help="bench/results/<name>.json")
    p.add_argument("extra", nargs="*", help="more overrides for every run of both sides")
    args = p.parse_args()
    seeds = {"serial": args.serial_seeds or args.seeds, "ray": args.seeds}
    extra = list(args.extra)
    env = dict(os.environ)
    with contextlib.ExitStack() as stack:
        if args.synthetic_reward:  # every job's process registers the reward at its start
            folder = stack.enter_context(site_dir())
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
            extra.append(OVERRIDE)
        runs = alternate_sweeps(args, seeds, extra, env)

    def med(side: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[side])

    summary = []
    for key, unit in (("wall_s", "s"), ("cpu_s", "s"), ("jobs_per_hour", "jobs/h")):
        for side in ("serial", "ray"):
            values = ", ".join(f"{x[key]:.1f}" for x in runs[side])
            summary.append(row(f"{len(seeds[side])}-run sweep, {side}: {key}", med(side, key),
                               unit, values))  # fmt: skip
    if seeds["serial"] == seeds["ray"]:
        summary.append(
            row("sweep wall: ray / serial", med("ray", "wall_s") / med("serial", "wall_s"), "x",
                f"medians of {args.rounds} alternating rounds; goal <= 0.6")
        )  # fmt: skip
    summary.append(
        row("jobs per hour: ray / serial",
            med("ray", "jobs_per_hour") / max(med("serial", "jobs_per_hour"), 1e-9), "x",
            f"medians of {args.rounds} alternating rounds")
    )  # fmt: skip
    data = {"args": vars(args), "overrides": SHORT + extra, "runs": runs}
    path = write(args.name, data, summary)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, args.out / path.name)


if __name__ == "__main__":
    main()
