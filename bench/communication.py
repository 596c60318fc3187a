"""The 2026-11-25 communication experiment of docs/communication.md (full model per agent, 3
seeds); bench/listening.py is the 5-seed experiment with the exact listening measures.

Runs ``marl train`` on signal (SmolLM2-135M, this CPU) under several conditions and seeds, one
run at a time, reads each run's TensorBoard events back, and writes a table (mean and 95%
interval over seeds, and over pooled episodes), a JSON file and a PNG of the curves.

Conditions (``--conditions``):
  rl                RL alone, from the base model.
  warmup_rl         the listener warm-up of configs/demo_full.yaml (rule bots play, only the
                    listener is imitated: it learns to pick what it hears; the speaker, who
                    knows the answer, is not trained), then RL. Its first iteration's rollout,
                    before any RL update, is "warm-up alone".
  warmup_rl_noedge  the same with the speaker->listener edge cut (``graph.cut``): the
                    control. The speaker still talks and is measured; nothing is delivered.
                    (Until 2026-11-26 this removed the edge, and with it the speaker's talk
                    turns, so its MI was 0 by construction: the results of 2026-11-25 in
                    docs/communication.md were made that way.)
  format_warmup_rl  both agents imitate the format bot (markup, random content), then RL.
  rule_warmup       both agents imitate the rule bots (teaches the answer; a reference, no RL).

    .venv/bin/python bench/communication.py                      # the full experiment
    .venv/bin/python bench/communication.py --seeds 0 --steps 4   # a quick look

Each run is a subprocess (``marl train``), so a run's memory is freed before the next starts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from statistics import fmean

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import read_scalars, run_marl, save_experiment  # noqa: E402  (bench helpers)

from marl.analysis.stats import mean_ci, wilson  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SUCCESS = "team/success"
MI = "emergence/speaker/speaker_mi_content"
INFLUENCE = "emergence/edges/speaker->listener/influence_action"
LISTENER_OK = "agents/listener/parse_failure_rate"
NO_EDGE = "+scenario.overrides={graph: {cut: [[speaker, listener]]}}"


def condition_args(name: str, warmup_steps: int) -> list[str]:
    """The ``marl train`` overrides of a condition (the rest is configs/demo_full.yaml)."""
    warm = [f"warmup.steps={warmup_steps}"]
    return {
        "rl": ["warmup.steps=0"],
        "warmup_rl": warm,
        "warmup_rl_noedge": [*warm, NO_EDGE],
        "format_warmup_rl": [*warm, "warmup.bot=format", "warmup.agents=[]"],
        "rule_warmup": [*warm, "warmup.bot=rule", "warmup.agents=[]"],
    }[name]


def marl_train(run_dir: Path, overrides: list[str], threads: int) -> None:
    """``marl train --config-name demo_full <overrides>`` in a subprocess; exits on failure."""
    run_marl(
        ["train", "--config-name", "demo_full", *overrides], threads, f"marl train in {run_dir}"
    )


def held_out(name: str, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """Success on ``--eval-episodes`` unseen scenarios before RL (after the warm-up, if any:
    a run with ``train.steps=0``) and after it (the run's final checkpoint, resumed with
    nothing left to train). The evaluation's own logs go to ``<run>/eval_*``."""
    run_dir = out / name / f"seed{seed}"
    common = [
        f"seed={seed}",
        f"train.eval_episodes={args.eval_episodes}",
        "logging.progress=false",
        *condition_args(name, args.warmup_steps),
        *args.extra,
    ]
    marl_train(
        run_dir, [*common, "train.steps=0", f"hydra.run.dir={run_dir / 'eval_start'}"], args.threads
    )
    marl_train(
        run_dir,
        [
            *common,
            f"train.steps={args.steps}",
            f"resume={run_dir / 'checkpoints'}",
            f"hydra.run.dir={run_dir / 'eval_end'}",
        ],
        args.threads,
    )
    result = {}
    for label in ("start", "end"):
        curves = read_scalars(run_dir / f"eval_{label}" / "tensorboard")
        result[f"eval_{label}"] = curves.get("eval/success", [float("nan")])[-1]
    if not args.keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # 3.7 GB a run
    print(f"[{name} seed {seed}] held-out success {result}", flush=True)
    return result


def run(name: str, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One ``marl train`` run; returns its scalar curves."""
    run_dir = out / name / f"seed{seed}"
    steps = 1 if name == "rule_warmup" else args.steps
    overrides = [
        "train",
        "--config-name",
        "demo_full",
        f"seed={seed}",
        f"train.steps={steps}",
        "train.checkpoint_every=0",
        "logging.progress=false",
        f"hydra.run.dir={run_dir}",
        *condition_args(name, args.warmup_steps),
        *args.extra,
    ]
    print(f"[{name} seed {seed}]", flush=True)
    wall = run_marl(overrides, args.threads, f"run {name} seed {seed}")
    curves = read_scalars(run_dir / "tensorboard")
    curves["wall_s"] = wall
    if args.eval_episodes:
        curves.update(held_out(name, seed, args, out))
    print(
        f"[{name} seed {seed}] {curves['wall_s']:.0f} s; success per step "
        f"{[round(v, 2) for v in curves.get(SUCCESS, [])]}",
        flush=True,
    )
    return curves


def summarise(results: dict, episodes_per_step: int, last: int, eval_episodes: int = 64) -> dict:
    """Start and end of each condition's curves, over seeds."""
    table = {}
    for name, runs in results.items():
        row: dict = {}
        for label, pick in (("start", lambda c: c[:1]), ("end", lambda c: c[-last:])):
            per_seed = [fmean(pick(r[SUCCESS])) for r in runs if r.get(SUCCESS)]
            if not per_seed:
                continue
            mean, half = mean_ci(per_seed)
            n = episodes_per_step * len(pick(runs[0][SUCCESS])) * len(per_seed)
            row[f"success_{label}"] = mean
            row[f"success_{label}_ci"] = half
            row[f"success_{label}_wilson"] = wilson(mean * n, n)
            for tag, key in ((MI, "mi"), (INFLUENCE, "influence"), (LISTENER_OK, "listener_pf")):
                vals = [fmean(pick(r[tag])) for r in runs if r.get(tag)]
                if vals:
                    row[f"{key}_{label}"], row[f"{key}_{label}_ci"] = mean_ci(vals)
        for label in ("start", "end"):
            values = [r[f"eval_{label}"] for r in runs if f"eval_{label}" in r]
            if values:
                row[f"eval_{label}"], row[f"eval_{label}_ci"] = mean_ci(values)
                n = eval_episodes * len(values)
                row[f"eval_{label}_wilson"] = wilson(fmean(values) * n, n)
        row["seeds"] = len(runs)
        row["wall_s"] = fmean(r["wall_s"] for r in runs)
        table[name] = row
    return table


def markdown(table: dict) -> str:
    """The result table in Markdown."""

    def cell(row: dict, key: str) -> str:
        if key not in row:
            return "-"
        return f"{row[key]:.2f} ± {row.get(key + '_ci', 0.0):.2f}"

    def pooled(row: dict, key: str) -> str:
        if key not in row:
            return "-"
        lo, hi = row[key]
        return f"[{lo:.2f}, {hi:.2f}]"

    lines = [
        "| condition | seeds | held-out success before RL | held-out success after RL | "
        "after, pooled 95% | training success first step | training success last 3 | "
        "speaker MI end (bits) | influence end | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['seeds']} | {cell(row, 'eval_start')} | {cell(row, 'eval_end')} | "
            f"{pooled(row, 'eval_end_wilson')} | {cell(row, 'success_start')} | "
            f"{cell(row, 'success_end')} | {cell(row, 'mi_end')} | "
            f"{cell(row, 'influence_end')} | {row['wall_s']:.0f} |"
        )
    return "\n".join(lines)


COLOURS = {
    "warmup_rl": "tab:blue",
    "warmup_rl_noedge": "tab:orange",
    "rl": "tab:green",
    "format_warmup_rl": "tab:red",
    "rule_warmup": "tab:purple",
}


def plot(results: dict, path: Path) -> None:
    """Training-rollout success, speaker MI and listener influence per iteration (mean over
    seeds, 95% t-band), and held-out success before and after RL (mean, 95% t-interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    panels = (
        (SUCCESS, "training-rollout success", (0.0, 1.0)),
        (MI, "speaker MI, words (bits)", None),
        (INFLUENCE, "listener influence", None),
    )
    for ax, (tag, title, limits) in zip(axes, panels):
        for name, runs in results.items():
            curves = [r[tag] for r in runs if r.get(tag)]
            if not curves or len(curves[0]) < 2:
                continue
            length = min(len(c) for c in curves)
            steps = list(range(1, length + 1))
            stats = [mean_ci([c[i] for c in curves]) for i in range(length)]
            low = [m - h for m, h in stats]
            high = [m + h for m, h in stats]
            if limits is not None:
                low = [max(limits[0], v) for v in low]
                high = [min(limits[1], v) for v in high]
            colour = COLOURS.get(name)
            ax.plot(steps, [m for m, _ in stats], label=name, color=colour)
            ax.fill_between(steps, low, high, alpha=0.15, color=colour)
        if tag == SUCCESS:
            ax.axhline(0.25, color="grey", linestyle=":", label="chance")
        ax.set_title(title)
        ax.set_xlabel("RL iteration")
        ax.legend(fontsize=8)
    ax = axes[3]
    for k, (name, runs) in enumerate(results.items()):
        points = []
        for label in ("eval_start", "eval_end"):
            values = [r[label] for r in runs if label in r]
            points.append(mean_ci(values) if values else None)
        if None in points:
            continue
        xs = [0 + 0.06 * k, 1 + 0.06 * k]
        ax.errorbar(
            xs,
            [m for m, _ in points],
            yerr=[h for _, h in points],
            marker="o",
            capsize=4,
            label=name,
            color=COLOURS.get(name),
        )
    ax.axhline(0.25, color="grey", linestyle=":")
    ax.set_xticks([0, 1], ["before RL", "after RL"])
    ax.set_ylim(0, 1.05)
    ax.set_title("held-out success (64 unseen scenarios)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    """Run the experiment and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conditions", nargs="+", default=["warmup_rl", "rl", "warmup_rl_noedge"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=8)
    parser.add_argument("--last", type=int, default=3, help="steps averaged for the end value")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench/results/communication"))
    parser.add_argument("--eval-episodes", type=int, default=64, help="held-out scenarios")
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument(
        "--eval-only", action="store_true", help="evaluate the runs already under --out"
    )
    parser.add_argument("extra", nargs="*", help="more marl train overrides for every run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {name: [] for name in args.conditions}
    if args.eval_only:
        saved = json.loads((out / "curves.json").read_text())
        for name in args.conditions:
            results[name] = saved.get(name, [])
            for seed, curves in zip(args.seeds, results[name]):
                ckpt = out / name / f"seed{seed}" / "checkpoints"
                if "eval_end" not in curves and ckpt.exists():
                    curves.update(held_out(name, seed, args, out))
                    (out / "curves.json").write_text(json.dumps({**saved, **results}))
    for seed in [] if args.eval_only else args.seeds:  # seed-major: a partial experiment
        for name in args.conditions:  # still covers every condition
            results[name].append(run(name, seed, args, out))
            (out / "curves.json").write_text(json.dumps(results))
    episodes = 16  # configs/demo_full.yaml: seeds_per_step x group_size
    table = summarise(results, episodes, args.last, args.eval_episodes)
    save_experiment(out, args, table, markdown(table), lambda path: plot(results, path))


if __name__ == "__main__":
    main()
