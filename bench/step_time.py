"""One training step end to end, with shared prompts on and off (``algo.share_prompts``).

Each run is ``marl train`` (the real driver, through Hydra's composition of ``--config``) for
``--steps`` steps in its own subprocess; the figures are those of its last step (the first pays
for warming up): ``perf/step_time``, ``perf/rollout_time``, ``perf/update_time``, and the run's
peak RSS. The two settings alternate ``--rounds`` times; the table gives the median and the
minimum. ``algo.share_prompts`` switches both sides: the HF backend's shared prefill and the
learner's shared prompt forward.

The default is the ``train`` config on signal-v1 with a small 4-layer model and the character
tokenizer, so it runs in seconds. ``--config demo`` is the job of ``make run`` (SmolLM2-135M,
bf16); measure that on a quiet machine:

    nice -n 19 .venv/bin/python bench/step_time.py            # BENCH_QUICK=1: smaller
    .venv/bin/python bench/step_time.py --config demo --steps 2 warmup.steps=0 \
        train.eval_episodes=0 emergence.influence_every=0
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import STEP_TIMES, machine, quick, row, write  # noqa: E402

TINY = [
    "scenario=signal",
    "model.kind=tiny",
    "model.hidden_size=256",
    "model.num_layers=4",
    "model.intermediate_size=768",
    "sampling.max_new_tokens=12",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.transcripts_every=0",
    "algo.beta=0.04",  # every turn trains: a random tiny model's rewards are often all equal
]


def worker(config: str, overrides: list[str]) -> None:
    """One ``marl train`` run in this process; prints its last step's timings as JSON."""
    from hydra import compose, initialize_config_module

    from marl.cli import register_scenario_options
    from marl.loop.train import train
    from marl.runtime.threads import configure_threads

    register_scenario_options()
    with initialize_config_module("marl.configs", version_base=None):
        cfg = compose(config, overrides=overrides)
    from marl.config import load_config

    configure_threads(load_config(cfg).runtime.threads, stream=None)
    with tempfile.TemporaryDirectory() as run_dir:
        metrics = train(cfg, run_dir=run_dir)
    out = {k: metrics[k] for k in STEP_TIMES if k in metrics}
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="train", help="config name in configs/ (train, demo)")
    p.add_argument(
        "--steps",
        type=int,
        default=1 if quick() else 2,
        help="steps per run; the last one is reported (with 1, it includes warm-up)",
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="more marl train overrides for every run")
    args = p.parse_args()
    if args.worker:
        worker(args.config, args.overrides)
        return
    base = TINY if args.config == "train" else []
    size = ["train.seeds_per_step=1", "train.group_size=4"] if quick() else []
    common = [
        *base,
        *size,
        f"train.steps={args.steps}",
        "train.checkpoint_every=0",
        f"runtime.threads={args.threads}",
        *args.overrides,
    ]
    state = machine()
    runs: dict[str, list[dict[str, float]]] = {"shared": [], "unshared": []}
    for _ in range(args.rounds):
        for name in runs:
            flag = f"algo.share_prompts={'true' if name == 'shared' else 'false'}"
            done = subprocess.run(
                [sys.executable, __file__, "--worker", "--config", args.config, *common, flag],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "OMP_NUM_THREADS": str(args.threads)},
            )
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-4000:])
                sys.exit(f"step_time: the {name} run failed")
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    state["load_average_after"] = machine()["load_average"]
    figures = {
        name: {
            key: {"median": statistics.median(r[key] for r in rs), "min": min(r[key] for r in rs)}
            for key in rs[0]
        }
        for name, rs in runs.items()
    }
    summary = []
    for key in (*STEP_TIMES, "peak_rss_gb"):
        for name in ("unshared", "shared"):
            f = figures[name][key]
            unit = "GB" if key == "peak_rss_gb" else "s"
            summary.append(
                row(
                    f"{key.removeprefix('perf/')}, {name}", f["median"], unit, f"min {f['min']:.3g}"
                )
            )
        if key != "peak_rss_gb":
            ratio = figures["unshared"][key]["median"] / figures["shared"][key]["median"]
            summary.append(row(f"{key.removeprefix('perf/')}: unshared / shared", ratio, "x"))
    summary.append(
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"--config {args.config}, {args.threads} thread(s)",
        )
    )
    name = "step_time" if args.config == "train" else f"step_time_{args.config}"
    write(
        name,
        {
            "args": vars(args),
            "overrides": common,
            "runs": runs,
            "figures": figures,
            "machine": state,
        },
        summary,
    )


if __name__ == "__main__":
    main()
