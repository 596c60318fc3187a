"""What does counterfactual credit cost? Wall time of a training iteration with counterfactual
re-simulation relative to one without (``credit=team``), side by side in one run.

Every variant trains the same tiny character-level policy through the real trainer
(``marl.loop.train.train``) with the same seeds; the iteration time is the trainer's own
``perf/step_time`` (rollout + credit + update + sync + metrics), read back from TensorBoard. The
credit phase's share is ``step - rollout - update - sync``. To even out a loaded machine, the
variants run interleaved (round-robin, ``--reps`` rounds), the first step of every run is
dropped as warm-up, and medians are reported.

Variants (``credit.keep_action=false``: a counterfactual replaces the whole completion):
``team`` (no counterfactuals); ``difference`` (N null branches per episode); ``coma`` with K in
``--ks`` (N*K resampled branches: fresh generations); ``shapley`` (2^N coalitions, exact for
N <= 5). Scenarios: ``unison`` (1 round, 4 agents: a branch only re-scores) and
``spotlight-v0`` (2 rounds, 3 advisers + a decider: a branch whose round-1 messages change
re-prompts the decider).

Run::

    .venv/bin/python bench/credit_cost.py

prints the table and writes ``bench/results/credit_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402  (bench helpers)
from credit_experiment import read_scalars  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS: dict[str, dict[str, Any]] = {
    "unison": {"system_prompt": "", "agents": ["a0", "a1", "a2", "a3"]},
    "spotlight-v0": {},
}


def variants(ks: Sequence[int]) -> list[tuple[str, dict[str, Any]]]:
    """(label, credit config) of every variant, ``team`` first."""
    out: list[tuple[str, dict[str, Any]]] = [("team", {"name": "team"})]
    out.append(("difference", {"name": "difference", "keep_action": False}))
    for k in ks:
        out.append((f"coma K={k}", {"name": "coma", "keep_action": False, "samples": k}))
    out.append(("shapley", {"name": "shapley", "keep_action": False}))
    return out


def cost_config(scenario: str, credit: dict[str, Any], args: argparse.Namespace) -> dict:
    """One tiny training run of ``args.steps`` iterations."""
    return {
        "scenario": {"name": scenario, "overrides": SCENARIOS[scenario]},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": args.max_new_tokens},
        "algo": {"lr": 3e-3},
        "credit": credit,
        "train": {"steps": args.steps, "seeds_per_step": 1, "group_size": args.group_size},
        "logging": {"progress": False, "transcripts_every": 0},
        "seed": 0,
    }


def measure(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Run every (scenario, variant) ``args.reps`` times, interleaved; one row per pair."""
    from marl.loop.train import train

    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    for rep in range(args.reps):
        for scenario in args.scenarios:
            for label, credit in variants(args.ks):
                run_dir = work / f"{scenario}-{label.replace(' ', '').replace('=', '')}-{rep}"
                train(cost_config(scenario, credit, args), run_dir=run_dir)
                scalars = read_scalars(run_dir)
                into = samples.setdefault((scenario, label), {})
                for tag in ("perf/step_time", "perf/rollout_time", "perf/update_time"):
                    into.setdefault(tag, []).extend(scalars[tag][1:])  # drop the warm-up step
                into.setdefault("perf/sync_time", []).extend(
                    scalars.get("perf/sync_time", [0.0] * args.steps)[1:]
                )
                for tag in ("credit/sim/branches", "credit/sim/samples", "credit/sim/env_steps"):
                    into.setdefault(tag, []).extend(scalars.get(tag, [0.0] * args.steps)[1:])
                print(
                    f"rep {rep} {scenario:12s} {label:10s} "
                    f"{statistics.median(scalars['perf/step_time'][1:]):.2f} s/step",
                    file=sys.stderr,
                    flush=True,
                )
    rows = []
    for scenario in args.scenarios:
        base = statistics.median(samples[(scenario, "team")]["perf/step_time"])
        for label, _ in variants(args.ks):
            s = samples[(scenario, label)]
            med = {tag: statistics.median(values) for tag, values in s.items()}
            credit_time = [
                step - roll - upd - sync
                for step, roll, upd, sync in zip(
                    s["perf/step_time"],
                    s["perf/rollout_time"],
                    s["perf/update_time"],
                    s["perf/sync_time"],
                )
            ]
            rows.append(
                {
                    "scenario": scenario,
                    "variant": label,
                    "iterations": len(s["perf/step_time"]),
                    "step_time": med["perf/step_time"],
                    "rollout_time": med["perf/rollout_time"],
                    "update_time": med["perf/update_time"],
                    "credit_time": statistics.median(credit_time),
                    "ratio": med["perf/step_time"] / base,
                    "branches": med["credit/sim/branches"],
                    "resampled": med["credit/sim/samples"],
                    "env_steps": med["credit/sim/env_steps"],
                }
            )
    return rows


def table(rows: list[dict[str, Any]], episodes: int) -> str:
    """The cost comparison as a markdown table."""
    team = {r["scenario"]: r["step_time"] for r in rows if r["variant"] == "team"}
    lines = [
        f"| scenario | credit | branches / iter ({episodes} episodes) | generated samples | "
        "env steps | step (s) | rollout (s) | credit (s) | update (s) | step / team step "
        "| credit / team step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {r['variant']} | {r['branches']:.0f} | {r['resampled']:.0f} | "
            f"{r['env_steps']:.0f} | {r['step_time']:.2f} | {r['rollout_time']:.2f} | "
            f"{r['credit_time']:.2f} | {r['update_time']:.2f} | {r['ratio']:.2f} | "
            f"{r['credit_time'] / team[r['scenario']]:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=list(SCENARIOS))
    p.add_argument("--ks", nargs="+", type=int, default=[1, 2, 4], help="K values for coma")
    p.add_argument("--steps", type=int, default=4, help="iterations per run (first dropped)")
    p.add_argument("--reps", type=int, default=2, help="interleaved rounds over the variants")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest here)")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/credit_cost.json")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps: need at least 2 (the first iteration is warm-up)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the table, write the JSON."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="credit_cost_") as work:
        rows = measure(args, Path(work))
    md = table(rows, args.group_size)
    print(md)
    total = time.perf_counter() - began
    print(f"\ntotal wall time {total:.0f} s", file=sys.stderr)
    result = {
        "command": (
            "bench/credit_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)
        ).strip(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {**machine(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "total_wall_time_s": total,
        "rows": rows,
        "table": md,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
