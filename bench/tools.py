"""The tools experiment of docs/tools.md: does SmolLM2 call tools, and does RL raise success?

Runs ``marl train`` on ledger-v0 (a clerk and an auditor must report price x quantity; the
numbers sit in their private lookup tables and the product wants the calculator) under a few
conditions and seeds, one run at a time, reads each run's TensorBoard events back, and writes a
table (mean and 95% t-interval over seeds), a JSON file and a PNG of the curves.

Conditions (``--conditions``):
  rl          RL alone, from the base model: how often does it call a tool on its own?
  warmup_rl   both agents first imitate the ledger rule bot (which calls lookup and the
              calculator; the tool output in its replies is masked out of the imitation), then RL.

Measured per run: tool calls per turn and tool errors per turn (``agents/<id>/tool_calls``,
``tool_errors``), training-rollout success per iteration (``team/success``: the exact total), and
held-out success on ``--eval-episodes`` unseen episodes before RL and after it.

    .venv/bin/python bench/tools.py                                  # 2 conditions x 3 seeds
    .venv/bin/python bench/tools.py --model tiny --seeds 0 --steps 2 --warmup-steps 1 \\
        --eval-episodes 4                                            # end-to-end check, ~1 min
    .venv/bin/python bench/tools.py --table-only                     # the table of finished runs

``summary.json`` records this script's own arguments (``args``) and, under ``runs``, the
``marl train`` command of each run it tabulates, read back from the run's ``.hydra`` directory:
with ``--table-only`` the two differ (the runs may have used other ``--steps``).

Replies start without a response head (``sampling.response_prefix=false``): a ``SAY:`` head
would make the clerk write its message before it could look the price up. Each run is a
subprocess (``marl train``), so a run's memory is freed before the next starts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import fmean

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402  (bench helpers)
    collect_runs,
    finish_run,
    run_commands,
    run_marl,
    save_experiment,
)

from marl.analysis.stats import mean_ci  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SUCCESS = "team/success"
AGENTS = ("clerk", "auditor")


def condition_args(name: str, warmup_steps: int) -> list[str]:
    """The ``marl train`` overrides of a condition (the rest is configs/demo_full.yaml + ledger)."""
    return {
        "rl": ["warmup.steps=0"],
        "warmup_rl": [f"warmup.steps={warmup_steps}", "warmup.bot=rule", "warmup.agents=[]"],
    }[name]


def base_args(args: argparse.Namespace) -> list[str]:
    """Overrides every run shares: the scenario, the sampling a tool call needs, the model."""
    out = [
        "scenario=ledger",
        "sampling.response_prefix=false",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "train.checkpoint_every=0",
        f"train.eval_episodes={args.eval_episodes}",
        "logging.progress=false",
    ]
    if args.model == "tiny":  # the end-to-end check: a random tiny model, nothing to learn
        out += ["model=tiny", "model.dtype=float32", "train.seeds_per_step=1"]
    return out


def run(name: str, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One ``marl train`` run; returns its scalar curves and wall time."""
    run_dir = out / name / f"seed{seed}"
    overrides = [
        "train",
        "--config-name",
        "demo_full",
        f"seed={seed}",
        f"train.steps={args.steps}",
        f"hydra.run.dir={run_dir}",
        *base_args(args),
        *condition_args(name, args.warmup_steps),
        *args.extra,
    ]
    print(f"[{name} seed {seed}]", flush=True)
    curves = finish_run(run_dir, run_marl(overrides, args.threads, f"run {name} seed {seed}"))
    print(
        f"[{name} seed {seed}] {curves['wall_s']:.0f} s; success per step "
        f"{[round(v, 2) for v in curves.get(SUCCESS, [])]}; tool calls per turn "
        f"{[round(v, 2) for v in _calls(curves)]}",
        flush=True,
    )
    return curves


def _calls(curves: dict, key: str = "tool_calls") -> list[float]:
    """Tool calls (or errors) per turn at each step, averaged over the agents."""
    series = [curves[f"agents/{a}/{key}"] for a in AGENTS if f"agents/{a}/{key}" in curves]
    if not series:
        return []
    return [fmean(values) for values in zip(*series)]


def summarise(results: dict, last: int) -> dict:
    """Start and end of each condition's curves, and held-out success, over seeds."""
    table = {}
    for name, runs in results.items():
        row: dict = {"seeds": len(runs), "wall_s": fmean(r["wall_s"] for r in runs)}
        for label, pick in (("start", lambda c: c[:1]), ("end", lambda c: c[-last:])):
            for key, values in (
                ("success", [r.get(SUCCESS, []) for r in runs]),
                ("tool_calls", [_calls(r) for r in runs]),
                ("tool_errors", [_calls(r, "tool_errors") for r in runs]),
            ):
                per_seed = [fmean(pick(v)) for v in values if v]
                if per_seed:
                    row[f"{key}_{label}"], row[f"{key}_{label}_ci"] = mean_ci(per_seed)
        evals = [r.get("eval/success", []) for r in runs]
        for label, index in (("eval_start", 0), ("eval_end", -1)):
            values = [e[index] for e in evals if e]
            if values:
                row[label], row[f"{label}_ci"] = mean_ci(values)
        table[name] = row
    return table


def markdown(table: dict) -> str:
    """The result table in Markdown."""

    def cell(row: dict, key: str) -> str:
        if key not in row:
            return "-"
        return f"{row[key]:.2f} ± {row.get(key + '_ci', 0.0):.2f}"

    lines = [
        "| condition | seeds | tool calls/turn first step | last | tool errors/turn last | "
        "success first step | last | held-out before RL | after RL | s/run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in table.items():
        lines.append(
            f"| {name} | {row['seeds']} | {cell(row, 'tool_calls_start')} | "
            f"{cell(row, 'tool_calls_end')} | {cell(row, 'tool_errors_end')} | "
            f"{cell(row, 'success_start')} | {cell(row, 'success_end')} | "
            f"{cell(row, 'eval_start')} | {cell(row, 'eval_end')} | {row['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Tool calls per turn and training-rollout success per iteration (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (title, get) in zip(
        axes, (("tool calls per turn", _calls), ("training success", lambda r: r.get(SUCCESS, [])))
    ):
        for name, runs in results.items():
            curves = [get(r) for r in runs if get(r)]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            ax.plot(range(1, length + 1), [fmean(c[i] for c in curves) for i in range(length)],
                    label=name)  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("RL iteration")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    """Run the experiment and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conditions", nargs="+", default=["rl", "warmup_rl"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup-steps", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--last", type=int, default=3, help="steps averaged for the end value")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--eval-episodes", type=int, default=64, help="held-out episodes")
    parser.add_argument("--out", default=str(ROOT / "bench/results/tools"))
    parser.add_argument(
        "--table-only", action="store_true", help="summarise the finished runs under --out"
    )
    parser.add_argument("extra", nargs="*", help="more marl train overrides for every run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = collect_runs(
        out, args.conditions, args.seeds, lambda c, seed: run(c, seed, args, out), args.table_only
    )
    table = summarise(results, args.last)
    runs = run_commands(out, args.conditions, args.seeds)  # the runs' own commands, not ours
    save_experiment(out, args, table, markdown(table), lambda path: plot(results, path), runs)


if __name__ == "__main__":
    main()
