"""`make run`'s whole job, wall time and peak memory, in this checkout against another one.

Each side runs ``marl train --config-name demo`` (the job ``make run`` runs once the model is
cached) in a fresh process under its own ``.venv``, alternating (here, there, here, ...)
``--rounds`` times, with the same overrides on both sides (``--dtype float32`` by default: the
CPU without bf16 that issue 38 measured). A run's figures: wall seconds from process start to
exit, peak RSS (``wait4``), its phases summed from its TensorBoard events (``perf/*_time``: the
rollout, update, held-out evaluation and listening measures), and its printed result lines
(held-out success and McNemar's test), so that a faster job is seen to show the same result.
The table gives each side's median, and the ratio here / there (issue 38's goal: at most 0.55).

    git worktree add /tmp/before <commit> && make -C /tmp/before venv   # the other checkout
    .venv/bin/python bench/make_run_wall.py --against /tmp/before --rounds 2

Writes ``bench/results/make_run_wall.json`` (``--name``). One run takes minutes: nothing else
should run on the machine meanwhile (the load is recorded before and after each run).
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

from common import checkout_name, read_scalars, row, write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("rollout", "update", "eval", "listening", "influence")
RESULT_LINES = ("held-out success", "listening (held-out", "success:", "interventions")


def one_run(checkout: Path, overrides: list[str], threads: int) -> dict[str, Any]:
    """``marl train --config-name demo`` in ``checkout``: wall, peak RSS, phases, result."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(checkout / ".venv/bin/marl"), "train", "--config-name", "demo",
            "logging.progress=false", f"hydra.run.dir={tmp}", *overrides,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        load = os.getloadavg()[0]
        began = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        output = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - began
        if status != 0:
            sys.stderr.write(output[-3000:])
            raise SystemExit(f"marl train in {checkout} failed (status {status})")
        curves = read_scalars(Path(tmp) / "tensorboard")
    phases = {
        name: sum(curves[f"perf/{name}_time"]) for name in PHASES if f"perf/{name}_time" in curves
    }
    result = [line for line in output.splitlines() if line.startswith(RESULT_LINES)]
    return {
        "wall_s": wall,
        "peak_rss_gb": usage.ru_maxrss / 1e6,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "phases_s": phases,
        "result": result,
        "load_before": load,
        "load_after": os.getloadavg()[0],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--against", required=True, help="the other checkout (with its own .venv)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", help="model.dtype on both sides")
    p.add_argument("--name", default="make_run_wall", help="bench/results/<name>.json")
    args = p.parse_args()
    other = Path(args.against).resolve()
    overrides = [f"model.dtype={args.dtype}"]
    runs: dict[str, list[dict[str, Any]]] = {"here": [], "there": []}
    for r in range(args.rounds):
        for side, checkout in (("here", ROOT), ("there", other)):
            runs[side].append(one_run(checkout, overrides, args.threads))
            done = runs[side][-1]
            print(f"round {r + 1} {side}: {done['wall_s']:.0f} s, {done['peak_rss_gb']:.2f} GB")
            print("  " + "\n  ".join(done["result"][:2]), flush=True)

    def med(side: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[side])

    summary = []
    for key, unit in (("wall_s", "s"), ("peak_rss_gb", "GB"), ("cpu_s", "s")):
        for side in ("here", "there"):
            values = ", ".join(f"{x[key]:.1f}" for x in runs[side])
            summary.append(row(f"{side}: {key}", med(side, key), unit, values))
    for name in PHASES:
        for side in ("here", "there"):
            values = [x["phases_s"].get(name, 0.0) for x in runs[side]]
            summary.append(row(f"{side}: {name} (summed)", statistics.median(values), "s"))
    summary.append(
        row("wall: here / there", med("here", "wall_s") / med("there", "wall_s"), "x",
            f"medians of {args.rounds} alternating rounds; goal <= 0.55")
    )  # fmt: skip
    against = checkout_name(other)
    write(
        args.name,
        {"args": {**vars(args), "against": against}, "against": against, "runs": runs},
        summary,
    )


if __name__ == "__main__":
    main()
