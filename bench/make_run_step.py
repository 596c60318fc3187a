"""One step of `make run`'s job in this checkout against another checkout, side by side.

Each side runs ``marl train --config-name demo`` for ``--steps`` steps in a fresh process under
its own ``.venv``, with its own overrides (``--here`` / ``--there``: the two checkouts' configs
may not share keys), alternating (here, there, here, ...) ``--rounds`` times. A run's figure is
the median over its steps after the first (which pays for warming up) of ``perf/step_time``,
``perf/rollout_time`` and ``perf/update_time`` read back from its TensorBoard events, and the
process's peak RSS (``wait4``). The table gives each side's median and minimum over the rounds,
and the ratio there / here. Issue 10's goal: a step of today's job at most a third of the step
of main before the speed work.

    git worktree add /tmp/old <commit> && make -C /tmp/old venv   # the other checkout
    .venv/bin/python bench/make_run_step.py --against /tmp/old

Writes ``bench/results/make_run_step.json`` (``--name``). To time the other checkout's job on
this checkout's code, give ``--here`` that job's settings (docs/benchmarks.md has the command).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import STEP_TIMES, machine, read_scalars, row, write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Today's demo also warms up, evaluates and measures influence; the step alone is timed.
HERE = ["warmup.steps=0", "train.eval_episodes=0", "emergence.influence_every=0"]


def one_run(checkout: Path, overrides: list[str], steps: int, threads: int) -> dict[str, float]:
    """``marl train`` in ``checkout`` for ``steps`` steps; the step figures and peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            str(checkout / ".venv/bin/marl"),
            "train",
            "--config-name",
            "demo",
            f"train.steps={steps}",
            "train.checkpoint_every=0",
            "logging.progress=false",
            f"hydra.run.dir={tmp}",
            *overrides,
        ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        proc = subprocess.Popen(
            cmd, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        output = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        if status != 0:
            sys.stderr.write(output[-3000:])
            raise SystemExit(f"marl train in {checkout} failed (status {status})")
        curves = read_scalars(Path(tmp) / "tensorboard")  # one value per step, in order
        out = {tag: statistics.median(curves[tag][1:]) for tag in STEP_TIMES}  # the first warms up
    out["peak_rss_gb"] = usage.ru_maxrss / 1e6
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--against", required=True, help="the other checkout (with its own .venv)")
    p.add_argument("--steps", type=int, default=3, help="steps per run (the first is not timed)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--here", nargs="*", default=HERE, help="overrides for this checkout")
    p.add_argument("--there", nargs="*", default=[], help="overrides for the other checkout")
    p.add_argument("--name", default="make_run_step", help="bench/results/<name>.json")
    args = p.parse_args()
    other = Path(args.against).resolve()
    state = machine()
    runs: dict[str, list[dict[str, float]]] = {"here": [], "there": []}
    for r in range(args.rounds):
        for side, checkout, overrides in (("here", ROOT, args.here), ("there", other, args.there)):
            runs[side].append(one_run(checkout, overrides, args.steps, args.threads))
            print(f"round {r + 1} {side}: {runs[side][-1]}", flush=True)
    state["load_average_after"] = list(os.getloadavg())

    def med(side: str, key: str) -> float:
        return statistics.median(x[key] for x in runs[side])

    def low(side: str, key: str) -> float:
        return min(x[key] for x in runs[side])

    summary = []
    for key in (*STEP_TIMES, "peak_rss_gb"):
        unit = "GB" if key == "peak_rss_gb" else "s"
        summary += [
            row(f"here: {key}", med("here", key), unit, f"min {low('here', key):.2f}"),
            row(f"there: {key}", med("there", key), unit, f"min {low('there', key):.2f}"),
        ]
    summary += [
        row(
            "step: there / here",
            med("there", "perf/step_time") / med("here", "perf/step_time"),
            "x",
            f"medians of {args.rounds} alternating rounds",
        ),
        row("load average at start", state["load_average"][0], "", f"{args.threads} threads"),
    ]
    write(
        args.name,
        {"args": vars(args), "against": str(other), "runs": runs, "machine": state},
        summary,
    )


if __name__ == "__main__":
    main()
