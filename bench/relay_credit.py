"""relay-v0 with SmolLM2: does counterfactual credit beat the team reward on a relay over a line?

Four agents on the line alice - bob - carol - dave each hold one digit of a code; dave must
submit the whole code in the last of four rounds. The team reward is the share of digits dave
gets right, so every agent is paid the same and the team reward hides who relayed. Each credit
method trains one shared SmolLM2-135M policy with the same seeds, after the same format warm-up
(``--warmup-steps``, on relay's ``format`` bot: the piece syntax and a four-digit answer with
random content, so it teaches the protocol and never the relay; 0 = RL from the base model):

  team        plain GRPO on the team reward
  difference  difference rewards: an agent's credit is the team reward minus the team reward
              of the same episode re-simulated with its turns removed, messages and answer
              (``credit.keep_action=false``; credit/estimators.py)
  shapley     Shapley values over the agents' messages (optional: ``--methods``)

Measured per run from its own TensorBoard events: digits delivered per episode (4 x
``team/reward``) at the first iteration and over the last ``--last``, and the first iteration
whose ``--last``-iteration moving average reaches ``--target`` digits (``-`` if never).

    .venv/bin/python bench/relay_credit.py                        # 2 methods x 3 seeds
    .venv/bin/python bench/relay_credit.py --seeds 0 --steps 2    # a quick look
    taskset -c 0 .venv/bin/python bench/relay_credit.py --methods team &        # one core each
    taskset -c 1 .venv/bin/python bench/relay_credit.py --methods difference &
    .venv/bin/python bench/relay_credit.py --table-only           # the table of every finished run

Writes ``bench/results/relay_credit/{summary.json,table.md,curves.png}``. Each run is a
``marl train`` subprocess, one at a time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402  (bench helpers)
    collect_runs,
    finish_run,
    run_marl,
    save_experiment,
)

from marl.analysis.stats import mean_ci  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REWARD = "team/reward"
DIGITS = 4  # relay-v0: one digit per agent


def train_args(method: str, seed: int, args: argparse.Namespace, run_dir: Path) -> list[str]:
    """The ``marl train`` overrides of one run."""
    return [
        "model=smollm2",
        "scenario=relay",
        f"credit={method}",
        # a counterfactual replaces the agent's whole turn, ACTION line included: on the directed
        # line the reporter sends no message, so with the default (messages only) its difference
        # credit is exactly 0 at every step and the one agent that submits the code never learns
        *(["credit.keep_action=false"] if method != "team" else []),
        f"seed={seed}",
        "model.dtype=bfloat16",
        "sampling.max_new_tokens=16",
        "sampling.temperature=0.8",
        "sampling.response_prefix=true",
        f"algo.lr={args.lr}",
        "algo.minibatch_size=32",
        # 8 turns per forward/backward pass: one pass over 32 turns of 300-token prompts held
        # 15 GB and was OOM-killed on this 24 GB machine (same gradient, docs/benchmarks.md)
        "algo.microbatch_tokens=2048",
        f"train.steps={args.steps}",
        f"train.seeds_per_step={args.seeds_per_step}",
        f"train.group_size={args.group_size}",
        "train.checkpoint_every=0",
        "logging.progress=false",
        "logging.transcripts_every=4",
        "emergence.influence_every=0",  # the credit methods are compared, not the listeners
        # digits flow one way, alice -> bob -> carol -> dave: every turn then has one job, so
        # its reply starts with a response head (SAY: for the relays, ACTION: for dave). On the
        # undirected line dave both talks and answers and gets no head; SmolLM2 then never
        # writes an ACTION line (parse failures 1.0 at step 1, docs/communication.md)
        "+scenario.overrides={graph: {directed: true}}",
        f"hydra.run.dir={run_dir}",
        *warmup_args(args),
    ]


def warmup_args(args: argparse.Namespace) -> list[str]:
    """The format warm-up of every agent (none with ``--warmup-steps 0``)."""
    if args.warmup_steps == 0:
        return []
    return [
        f"warmup.steps={args.warmup_steps}",
        "warmup.bot=format",
        "warmup.episodes=2",
        "warmup.lr=5e-5",
    ]


def run(method: str, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One training run; returns its scalar curves and wall time."""
    run_dir = out / method / f"seed{seed}"
    print(f"[{method} seed {seed}]", flush=True)
    overrides = ["train", *train_args(method, seed, args, run_dir)]
    curves = finish_run(run_dir, run_marl(overrides, args.threads, f"run {method} seed {seed}"))
    digits = [DIGITS * v for v in curves.get(REWARD, [])]
    print(
        f"[{method} seed {seed}] {curves['wall_s']:.0f} s; digits per step "
        f"{[round(d, 2) for d in digits]}",
        flush=True,
    )
    return curves


def steps_to_target(digits: list[float], target: float, window: int) -> int | None:
    """The first iteration (1-based) whose trailing ``window``-iteration mean reaches
    ``target``; None if none does."""
    for i in range(window, len(digits) + 1):
        if fmean(digits[i - window : i]) >= target:
            return i
    return None


def summarise(results: dict, args: argparse.Namespace) -> dict:
    """Start, end and steps-to-target per method, over seeds."""
    table = {}
    for method, runs in results.items():
        curves = [[DIGITS * v for v in r.get(REWARD, [])] for r in runs]
        curves = [c for c in curves if c]
        if not curves:
            continue
        start = [c[0] for c in curves]
        end = [fmean(c[-args.last :]) for c in curves]
        hits = [steps_to_target(c, args.target, args.last) for c in curves]
        table[method] = {
            "seeds": len(curves),
            "digits_start": mean_ci(start),
            "digits_end": mean_ci(end),
            "digits_end_per_seed": end,
            "steps_to_target_per_seed": hits,
            "reached": sum(h is not None for h in hits),
            "wall_s": fmean(r["wall_s"] for r in runs),
        }
    return table


def markdown(table: dict, args: argparse.Namespace) -> str:
    """The result table in Markdown."""
    lines = [
        f"| credit | seeds | digits first iteration | digits last {args.last} | per seed (end) | "
        f"iterations to {args.target:g} digits | s/run |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, row in table.items():
        (s, sh), (e, eh) = row["digits_start"], row["digits_end"]
        hits = ", ".join("-" if h is None else str(h) for h in row["steps_to_target_per_seed"])
        ends = ", ".join(f"{v:.2f}" for v in row["digits_end_per_seed"])
        lines.append(
            f"| {method} | {row['seeds']} | {s:.2f} ± {sh:.2f} | {e:.2f} ± {eh:.2f} | {ends} | "
            f"{hits} | {row['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Digits delivered per iteration, mean over seeds with a 95% t-band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for method, runs in results.items():
        curves = [[DIGITS * v for v in r.get(REWARD, [])] for r in runs if r.get(REWARD)]
        if not curves:
            continue
        length = min(len(c) for c in curves)
        stats = [mean_ci([c[i] for c in curves]) for i in range(length)]
        steps = range(1, length + 1)
        ax.plot(steps, [m for m, _ in stats], label=method)
        ax.fill_between(steps, [m - h for m, h in stats], [m + h for m, h in stats], alpha=0.15)
    ax.axhline(DIGITS / 10, color="grey", linestyle=":", label="random digits")
    ax.set_xlabel("RL iteration")
    ax.set_ylabel("digits delivered (of 4)")
    ax.set_title("relay-v0, SmolLM2-135M")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    """Run the experiment and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["team", "difference"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seeds-per-step", type=int, default=1)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--last", type=int, default=3, help="iterations averaged for the end")
    parser.add_argument("--target", type=float, default=2.0, help="digits delivered")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup-steps", type=int, default=6, help="format warm-up; 0 = none")
    parser.add_argument("--out", default=str(ROOT / "bench/results/relay_credit"))
    parser.add_argument(
        "--table-only", action="store_true", help="summarise the finished runs under --out"
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = collect_runs(
        out, args.methods, args.seeds, lambda m, seed: run(m, seed, args, out), args.table_only
    )
    (out / "curves.json").write_text(json.dumps(results))
    table = summarise(results, args)
    save_experiment(out, args, table, markdown(table, args), lambda path: plot(results, path))


if __name__ == "__main__":
    main()
