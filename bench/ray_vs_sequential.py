"""One training iteration with two independent policies: through Ray versus a plain sequential loop.

The run: scenario ``signal`` (two agents, speaker and listener), ``sharing=independent`` (a full
policy per agent), ``--seeds`` x ``--group`` episodes per iteration, GRPO with team credit and
``beta=0.04`` (so every turn trains). An iteration is rollout -> credit -> update -> sync, as
``marl train`` runs it.

- **sequential**: ``ray.enabled=false``. One process; one batched generate call per policy per
  round; the two learners update one after the other, each training the rollout model in place
  (no sync). Measured with torch on 1 thread and on 2 threads (the machine's cores).
- **ray**: ``ray.enabled=true``. One rollout worker actor and one learner actor per policy, each
  on one thread (Ray sets ``OMP_NUM_THREADS=1`` for them), the two updates submitted together
  and gathered with one ``ray.get``; after the update each learner publishes its weights to the
  object store and the worker loads them (the sync). Ray's start-up (cluster, actors, model
  loading in each actor) is reported apart: a run pays it once.

Each variant runs ``--warmup`` untimed iterations, then ``--iterations`` timed ones; the table
gives the mean per phase and the ratio sequential / ray (above 1: Ray is faster). The model is
SmolLM2-135M-Instruct from the cache when it is there (``marl fetch-model``), else the tiny model.
The JSON (``bench/results/ray_vs_sequential.json``) records the load average: this machine may be
shared with other jobs, so compare runs with that in mind.

    .venv/bin/python bench/ray_vs_sequential.py [--model tiny] [--iterations 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402  (bench helpers)

RESULTS = Path(__file__).resolve().parent / "results" / "ray_vs_sequential.json"
PHASES = ("rollout", "credit", "update", "sync", "iteration")


def run_config(args: argparse.Namespace, ray_enabled: bool) -> dict[str, Any]:
    """The ``marl train`` config of the benchmark run."""
    from marl.agents.models import embedded_model_dir, is_complete

    # bfloat16: half the memory of float32 (two learners, their optimizers and KL references
    # and a rollout worker must fit beside whatever else shares the machine)
    model = {"kind": "tiny", "dtype": args.dtype}
    if args.model == "embedded" or (args.model == "auto" and is_complete(embedded_model_dir())):
        model = {"kind": "embedded", "dtype": args.dtype}
    return {
        "scenario": {"name": "signal", "overrides": {}},
        "model": model,
        "sampling": {"max_new_tokens": args.max_new_tokens},
        # beta > 0 (TRL's GRPO default): every turn trains, even when a group's rewards tie
        "algo": {"lr": 1e-5, "minibatch_size": args.minibatch, "beta": 0.04},
        "train": {"steps": 1, "seeds_per_step": args.seeds, "group_size": args.group},
        "logging": {"progress": False, "tensorboard": False},
        "sharing": "independent",
        "ray": {
            "enabled": ray_enabled,
            # logical CPUs: 2 learners + 1 worker ask for 1 each; the machine has 2 cores
            "num_cpus": max(os.cpu_count() or 1, 4),
            "num_rollout_workers": 1,
            "worker_num_cpus": 1.0,
            "learner_num_cpus": 1.0,
        },
        "seed": 0,
    }


def iterate(runtime: Any, config: Any, step: int) -> dict[str, float]:
    """One iteration, timed phase by phase."""
    from marl.loop.credit_phase import credit_phase

    times: dict[str, float] = {}
    began = time.perf_counter()
    rollout = runtime.rollout(step)
    times["rollout"] = time.perf_counter() - began
    mark = time.perf_counter()
    credit_phase(config.credit, rollout, None, config.algo.advantage)
    times["credit"] = time.perf_counter() - mark
    mark = time.perf_counter()
    updates = runtime.update(rollout.turns)
    times["update"] = time.perf_counter() - mark
    mark = time.perf_counter()
    runtime.sync()
    times["sync"] = time.perf_counter() - mark
    times["iteration"] = time.perf_counter() - began
    times["trained_turns"] = sum(m["trained_turns"] for m in updates.values())
    times["generated_tokens"] = rollout.generated_tokens
    times.update({f"update_{p}": m["update_time"] for p, m in updates.items()})
    return times


def measure(args: argparse.Namespace, ray_enabled: bool, threads: int | None) -> dict[str, Any]:
    """Start the runtime, run the warm-up and the timed iterations, close it."""
    import torch

    from marl.config import load_config
    from marl.loop.train import check_config
    from marl.runtime.local import make_runtime

    if threads is not None:
        torch.set_num_threads(threads)
    config = load_config(run_config(args, ray_enabled))
    plan = check_config(config)
    load_before = os.getloadavg()
    began = time.perf_counter()
    runtime = make_runtime(config, plan)
    startup = time.perf_counter() - began
    try:
        runs = [iterate(runtime, config, step) for step in range(args.warmup + args.iterations)]
        placement = runtime.placement()
        sync_bytes = 0
        if ray_enabled:
            sync_bytes = sum(
                runtime.call_learner(pid, "weights_nbytes") for pid in runtime.learners
            )
    finally:
        runtime.close()
    timed = runs[args.warmup :]
    return {
        "ray": ray_enabled,
        "torch_threads": threads if not ray_enabled else 1,
        "model": config.model.kind,
        "startup_s": startup,
        "mean_s": {p: statistics.fmean(r[p] for r in timed) for p in PHASES},
        "per_policy_update_s": {
            k: statistics.fmean(r[k] for r in timed) for k in timed[0] if k.startswith("update_")
        },
        "iterations": timed,
        "sync_bytes_per_worker": sync_bytes,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "placement": placement,
    }


def table(results: dict[str, dict[str, Any]]) -> str:
    """Phases as rows, variants as columns, then the ratio sequential / ray per sequential one."""
    names = list(results)
    seq = [n for n in names if not results[n]["ray"]] if "ray" in results else []
    ratios = [f"{n}/ray" for n in seq]
    width = max(len(n) for n in names + ratios) + 2
    lines = [f"{'phase':<11}" + "".join(f"{n:>{width}}" for n in names + ratios)]
    for phase in PHASES:
        ray_s = results["ray"]["mean_s"][phase] if seq else 1.0
        cells = [f"{results[n]['mean_s'][phase]:.2f} s" for n in names]
        cells += [f"{results[s]['mean_s'][phase] / max(ray_s, 1e-9):.2f}x" for s in seq]
        lines.append(f"{phase:<11}" + "".join(f"{c:>{width}}" for c in cells))
    cells = [f"{results[n]['startup_s']:.2f} s" for n in names]
    lines.append(f"{'start-up':<11}" + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(lines)


VARIANTS = {
    "sequential-1t": {"ray": False, "threads": 1},
    "sequential-2t": {"ray": False, "threads": 2},
    "ray": {"ray": True, "threads": None},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("auto", "tiny", "embedded"), default="auto")
    parser.add_argument("--seeds", type=int, default=2, help="scenario seeds per iteration")
    parser.add_argument("--group", type=int, default=4, help="episodes per seed (GRPO group)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    parser.add_argument(
        "--minibatch", type=int, default=4, help="turns per optimizer step (algo.minibatch_size)"
    )
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:  # one variant in this process; the result as JSON on the last stdout line
        variant = VARIANTS[args.worker]
        result = measure(args, ray_enabled=variant["ray"], threads=variant["threads"])
        print(json.dumps(result, default=str))
        return

    # Each variant in its own process, one after the other: memory (two full models and their
    # optimizers) is returned between them, and no thread setting leaks from one to the next.
    results: dict[str, dict[str, Any]] = {}
    for name in args.variants.split(","):
        began = time.perf_counter()
        command = [sys.executable, __file__, "--worker", name]
        flags = (
            "model",
            "seeds",
            "group",
            "max_new_tokens",
            "dtype",
            "minibatch",
            "warmup",
            "iterations",
        )
        for flag in flags:
            command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"variant {name} failed:\n{done.stderr[-3000:]}")
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"[{name}: {time.perf_counter() - began:.0f} s]", file=sys.stderr, flush=True)
    print(table(results))
    for name, result in results.items():
        per = ", ".join(f"{k[7:]} {v:.2f}s" for k, v in result["per_policy_update_s"].items())
        print(f"{name}: per-policy update {per}")
    if "ray" in results:
        sync_mb = results["ray"]["sync_bytes_per_worker"] / 1e6
        print(f"sync traffic per worker per iteration: {sync_mb:.1f} MB")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": {
            **machine(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
