"""The counterfactual credit phase's time with 1, 2 and 4 Ray rollout workers (tiny model).

Counterfactual credit runs where the environments are: each rollout worker re-simulates the
GRPO groups it played, on its own environment copies, with its own copy of the policies for
the generation the branches need (:meth:`marl.runtime.workers.RolloutWorker.credit`). This measures
``runtime.credit(step, rollout)`` (what ``marl train`` times as ``perf/credit_time``) for each
worker count, plus the one-process runtime for reference.

The run: scenario ``signal`` (speaker, then listener), ``credit=coma`` with ``--samples``
resampled speaker messages per episode, after which the listener writes anew (its prompt
changed): every round of the branches is one batched generate call per worker. ``--seeds`` x
``--group`` episodes per step; groups are dealt to the workers in contiguous blocks, so with
``--seeds 4`` four workers get one group each. Every actor runs torch on one thread (Ray sets
``OMP_NUM_THREADS=1``); fractional CPU requests let four workers start on a 2-core machine.

Each worker count runs ``--warmup`` untimed steps, then ``--steps`` timed ones (rollout, then
credit; the weights never change, as credit does not need them to). The JSON
(``bench/results/credit_workers.json``) records the load average before and after: on a machine
shared with other jobs the figures are only comparable with that in mind.

    .venv/bin/python bench/credit_workers.py [--workers 1,2,4] [--steps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402  (bench helpers)

RESULTS = Path(__file__).resolve().parent / "results" / "credit_workers.json"


def run_config(args: argparse.Namespace, workers: int | None) -> dict[str, Any]:
    """The ``marl train`` config of one variant (``workers=None``: one process, no Ray)."""
    return {
        "scenario": {"name": args.scenario, "overrides": {}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": args.max_new_tokens},
        "credit": {"name": "coma", "samples": args.samples},
        "train": {"steps": 1, "seeds_per_step": args.seeds, "group_size": args.group},
        "logging": {"progress": False, "tensorboard": False},
        "ray": {
            "enabled": workers is not None,
            "num_cpus": 8,  # logical: every actor fits; the machine decides how fast they run
            "num_rollout_workers": workers or 1,
            "worker_num_cpus": 0.25,
            "learner_num_cpus": 0.25,
        },
        "seed": 0,
    }


def measure(args: argparse.Namespace, workers: int | None) -> dict[str, Any]:
    """Start the runtime, time the credit phase over the steps, close it."""
    from marl.config import load_config
    from marl.loop.train import check_config
    from marl.runtime.local import make_runtime

    config = load_config(run_config(args, workers))
    plan = check_config(config)
    load_before = os.getloadavg()
    began = time.perf_counter()
    runtime = make_runtime(config, plan)
    startup = time.perf_counter() - began
    rows = []
    try:
        for step in range(args.warmup + args.steps):
            mark = time.perf_counter()
            rollout = runtime.rollout(step)
            rollout_s = time.perf_counter() - mark
            mark = time.perf_counter()
            result = runtime.credit(step, rollout)
            credit_s = time.perf_counter() - mark
            if step >= args.warmup:
                rows.append({"rollout_s": rollout_s, "credit_s": credit_s, **result.stats})
        placement = runtime.placement()
    finally:
        runtime.close()
    return {
        "workers": workers,
        "startup_s": startup,
        "credit_s": statistics.fmean(r["credit_s"] for r in rows),
        "rollout_s": statistics.fmean(r["rollout_s"] for r in rows),
        "steps": rows,
        "credited_episodes": [w.get("credited_episodes") for w in placement["workers"]],
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }


def table(results: list[dict[str, Any]]) -> str:
    """One row per variant: credit and rollout time, credit speed-up over one Ray worker."""
    base = next((r["credit_s"] for r in results if r["workers"] == 1), None)
    lines = [
        "| runtime | credit phase | speed-up | rollout | branches | generate calls | "
        "episodes credited per worker (all steps) | load avg (1 min) before/after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        name = "one process" if r["workers"] is None else f"ray, {r['workers']} worker(s)"
        speed = f"{base / r['credit_s']:.2f}x" if base and r["workers"] is not None else "-"
        stats = r["steps"][-1]
        lines.append(
            f"| {name} | {r['credit_s']:.2f} s | {speed} | {r['rollout_s']:.2f} s | "
            f"{stats.get('branches', 0)} | {stats.get('generate_calls', 0)} | "
            f"{r['credited_episodes']} | {r['load_average_before'][0]:.2f} / "
            f"{r['load_average_after'][0]:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--local", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--scenario", default="signal")
    parser.add_argument("--seeds", type=int, default=4, help="scenario seeds per step")
    parser.add_argument("--group", type=int, default=4, help="episodes per seed (GRPO group)")
    parser.add_argument("--samples", type=int, default=2, help="coma's K resampled messages")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    import ray
    import torch

    torch.set_num_threads(1)  # as in the actors
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    results = []
    try:
        variants: list[int | None] = [None] if args.local else []
        variants += [int(w) for w in args.workers.split(",")]
        for workers in variants:
            results.append(measure(args, workers))
    finally:
        ray.shutdown()
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "machine": {**machine(), "cpus": os.cpu_count()},
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
