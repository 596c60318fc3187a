"""The competition experiment of docs/competition.md: self-play against a league on a zero-sum
game, then cross-play of what it learned.

For each seed, one ``marl train`` run with ``league=pool`` (snapshots of the learner, PFSP,
the random and rule bots as opponents) and the chosen advantage estimator; then ONE ``marl
eval`` over the final checkpoints of every seed, the run's own initial checkpoint (its league
snapshot 0: the model before any update, the same for every seed), the random bot and the rule
bot. The table gives each seed's win rate against the random bot, the rule bot and its initial
checkpoint (mean and 95% t-interval over seeds, and the pooled 95% Wilson interval over every
game), the Bradley-Terry Elo of every player with bootstrap intervals, and the learner's
online Elo during training (``league/elo``); the PNG has the Elo curve and the win rates
against the bots during training, and the cross-play heatmap is copied beside it.

    .venv/bin/python bench/competition.py                              # SmolLM2, 3 seeds
    .venv/bin/python bench/competition.py --model tiny --steps 2 --seeds 0 1 \\
        --eval-episodes 4 --out /tmp/competition                       # a wiring check

Each run is a subprocess, one at a time, so a run's memory is freed before the next starts.
The default game is matching-pennies-v0 (YAML, strictly zero-sum); ``--scenario`` takes any
registered two-player zero-sum scenario with a rule bot (``--scenario kuhn_poker``).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import finish_run, run_marl, save_experiment  # noqa: E402  (bench helpers)

from marl.analysis.stats import mean_ci  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OPPONENTS = {
    "random": "the random bot",
    "rule": "the rule bot",
    "initial": "its initial checkpoint",
}
SMOLLM2 = [  # the settings of configs/demo.yaml that fit SmolLM2 on this CPU
    "model.dtype=bfloat16",
    "sampling.temperature=0.8",
    "algo.lr=2.0e-5",
]


def train(seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One self-play run; returns its scalar curves and wall time."""
    run_dir = out / f"seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    overrides = [
        "train",
        f"model={args.model}",
        f"scenario={args.scenario}",
        f"league={args.league}",
        f"algo={args.algo}",
        f"seed={seed}",
        f"train.steps={args.steps}",
        f"train.seeds_per_step={args.seeds_per_step}",
        f"train.group_size={args.group_size}",
        "train.checkpoint_every=0",
        f"sampling.max_new_tokens={args.max_new_tokens}",
        "sampling.response_prefix=true",
        "logging.progress=false",
        f"hydra.run.dir={run_dir}",
        *(SMOLLM2 if args.model == "smollm2" else []),
        *args.extra,
    ]
    curves = finish_run(
        run_dir, run_marl(overrides, args.threads, f"run seed {seed}", run_dir / "train.log")
    )
    elo = curves.get("league/elo", [])
    print(f"[seed {seed}] {curves['wall_s']:.0f} s; league Elo {[round(v) for v in elo]}")
    return curves


def crossplay(args: argparse.Namespace, out: Path) -> dict:
    """``marl eval`` over every seed's final checkpoint, the initial one and the bots."""
    players = [f"seed{s}={out / f'seed{s}'}" for s in args.seeds]
    initial = out / f"seed{args.seeds[0]}" / "league" / "snapshot_0.pt"
    players += [f"initial={initial}", "random", "rule"]
    eval_dir = out / "eval"
    eval_dir.mkdir(parents=True, exist_ok=True)
    run_marl(
        [
            "eval",
            *players,
            "--episodes",
            str(args.eval_episodes),
            "--seed",
            "0",
            "--bootstrap",
            str(args.bootstrap),
            "--out",
            str(eval_dir),
        ],
        args.threads,
        "marl eval",
        eval_dir / "eval.log",
    )
    return json.loads((eval_dir / "crossplay.json").read_text())


def summarise(results: dict, crossplay_data: dict, seeds: list[int]) -> dict:
    """Win rates of each seed against each reference opponent, over seeds and pooled."""
    from marl.analysis.stats import wilson

    cells = {(c["row"], c["col"]): c for c in crossplay_data["cells"]}
    table: dict = {"win_rate": {}, "ratings": crossplay_data["ratings"], "training": {}}
    for opponent in OPPONENTS:
        rows = [cells[(f"seed{s}", opponent)] for s in seeds]
        rates = [r["win_rate"] for r in rows]
        wins = sum(r["wins"] for r in rows)
        draws = sum(r["draws"] for r in rows)
        games = sum(r["games"] for r in rows)
        mean, half = mean_ci(rates)
        returns = [r["mean_return"] for r in rows]
        gain, gain_half = mean_ci(returns)
        table.setdefault("mean_return", {})[opponent] = {
            "per_seed": returns,
            "mean": gain,
            "ci": gain_half,
        }
        table["win_rate"][opponent] = {
            "per_seed": rates,
            "mean": mean,
            "ci": half,
            "pooled": wins / games,
            "pooled_wilson": wilson(wins, games),
            "draws": draws,
            "games": games,
        }
    for seed, curves in zip(seeds, results):
        elo = curves.get("league/elo", [])
        table["training"][f"seed{seed}"] = {
            "elo_start": elo[0] if elo else None,
            "elo_end": elo[-1] if elo else None,
            "wall_s": curves["wall_s"],
        }
    ends = [v["elo_end"] for v in table["training"].values() if v["elo_end"] is not None]
    if ends:
        table["elo_end"] = mean_ci(ends)
    return table


def markdown(table: dict, args: argparse.Namespace) -> str:
    """The result tables in Markdown."""
    lines = [
        f"{args.model} self-play on {args.scenario}, league={args.league}, algo={args.algo}, "
        f"{args.steps} steps x {args.seeds_per_step * args.group_size} episodes, seeds "
        f"{', '.join(map(str, args.seeds))}; `marl eval`: {args.eval_episodes} episodes per "
        "pairing, seats alternating.",
        "",
        "| against | win rate per seed | mean ± 95% t (seeds) | pooled [95% Wilson] | draws "
        "| mean return per seed | mean ± 95% t |",
        "|---|---|---|---|---|---|---|",
    ]
    for opponent, label in OPPONENTS.items():
        r, g = table["win_rate"][opponent], table["mean_return"][opponent]
        lo, hi = r["pooled_wilson"]
        per_seed = ", ".join(f"{v:.2f}" for v in r["per_seed"])
        gains = ", ".join(f"{v:+.2f}" for v in g["per_seed"])
        lines.append(
            f"| {label} | {per_seed} | {r['mean']:.2f} ± {r['ci']:.2f} | "
            f"{r['pooled']:.2f} [{lo:.2f}, {hi:.2f}] ({r['games']} games) | {r['draws']} | "
            f"{gains} | {g['mean']:+.2f} ± {g['ci']:.2f} |"
        )
    lines += [
        "",
        "| player | Elo (Bradley-Terry, cross-play) | 95% bootstrap interval |",
        "|---|---|---|",
    ]
    ratings = table["ratings"]
    for name in sorted(ratings, key=lambda p: -ratings[p]["rating"]):
        r = ratings[name]
        lines.append(f"| {name} | {r['rating']:.0f} | [{r['lo']:.0f}, {r['hi']:.0f}] |")
    lines += [
        "",
        "| run | league Elo after step 1 | league Elo at the end | s/run |",
        "|---|---|---|---|",
    ]
    for run, r in table["training"].items():
        start = "-" if r["elo_start"] is None else f"{r['elo_start']:.0f}"
        end = "-" if r["elo_end"] is None else f"{r['elo_end']:.0f}"
        lines.append(f"| {run} | {start} | {end} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    """The learner's league Elo per step, and its win rate against each bot during training
    (the league's window), mean over seeds with a 95% t-band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = (
        (axes[0], [("league/elo", "league Elo")], "learner's Elo during training"),
        (
            axes[1],
            [
                ("league/bot_random/win_rate", "vs random bot"),
                ("league/bot_rule/win_rate", "vs rule bot"),
                ("league/latest/win_rate", "vs latest snapshot"),
            ],
            "win rate during training (last 64 games per kind)",
        ),
    )
    for ax, tags, title in panels:
        for tag, label in tags:
            curves = [_played(r, tag) for r in results if r.get(tag)]
            if not curves:
                continue
            length = min(len(c) for c in curves)
            steps, means, low, high = [], [], [], []
            for i in range(length):
                values = [c[i] for c in curves if c[i] == c[i]]  # NaN: no game yet
                if not values:
                    continue
                mean, half = mean_ci(values)
                bounds = (0.0, 1.0) if tag != "league/elo" else (-math.inf, math.inf)
                steps.append(i + 1)
                means.append(mean)
                low.append(max(bounds[0], mean - half))
                high.append(min(bounds[1], mean + half))
            ax.plot(steps, means, label=label)
            ax.fill_between(steps, low, high, alpha=0.15)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _played(curves: dict, tag: str) -> list[float]:
    """A win-rate curve with NaN where no game against that kind had been played yet."""
    values = list(curves[tag])
    if not tag.endswith("/win_rate"):
        return values
    games = curves.get(tag.replace("/win_rate", "/games"), [1.0] * len(values))
    return [v if n > 0 else float("nan") for v, n in zip(values, games)]


def main() -> None:
    """Run the experiment and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a configs/model preset")
    parser.add_argument("--scenario", default="matching_pennies")
    parser.add_argument("--league", default="pool", help="a configs/league preset")
    parser.add_argument("--algo", default="rae", help="a configs/algo preset")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seeds-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--eval-episodes", type=int, default=40, help="per pairing")
    parser.add_argument("--bootstrap", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(ROOT / "bench/results/competition"))
    parser.add_argument("--keep-snapshots", action="store_true")
    parser.add_argument(
        "--eval-only", action="store_true", help="re-run marl eval on the runs under --out"
    )
    parser.add_argument("extra", nargs="*", help="more marl train overrides for every run")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.eval_only:
        results = json.loads((out / "curves.json").read_text())
    else:
        results = []
        for seed in args.seeds:
            results.append(train(seed, args, out))
            (out / "curves.json").write_text(json.dumps(results))
    data = crossplay(args, out)
    shutil.copy(out / "eval" / "crossplay.png", out / "crossplay.png")
    shutil.copy(out / "eval" / "crossplay.md", out / "crossplay.md")
    if not args.keep_snapshots:  # one model copy each; snapshot 0 was needed by marl eval
        for seed in args.seeds:
            for file in (out / f"seed{seed}" / "league").glob("snapshot_*.pt"):
                if file.name != "snapshot_0.pt":
                    file.unlink()
    table = summarise(results, data, args.seeds)
    text = markdown(table, args)
    save_experiment(out, args, table, text, lambda path: plot(results, path))
    print(f"cross-play matrix: {out / 'crossplay.md'}, {out / 'crossplay.png'}")


if __name__ == "__main__":
    main()
