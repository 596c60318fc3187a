"""Baselines of the zero-sum games: the rule bot against the random bot, per game and seat.

Plays ``--episodes`` episodes per seat (the rule bot as ``player_0``, then as ``player_1``) of
``kuhn-poker-v0``, ``bargain-v0`` and every supported TextArena game (when textarena is
installed), and counts the rule bot's wins, draws and losses by the sign of its return
(``marl.scenarios.zero_sum.outcomes``), with a 95% Wilson interval on its win rate and its mean
return. These are the floors a trained policy should clear (docs/competition.md).

    nice -n 19 .venv/bin/python bench/games_baselines.py             # BENCH_QUICK=1: shorter
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine, quick, row, write  # noqa: E402

import marl  # noqa: E402
from marl.analysis.stats import wilson  # noqa: E402
from marl.scenarios.conformance import play_match  # noqa: E402
from marl.scenarios.textarena_games import SUPPORTED, textarena_missing  # noqa: E402
from marl.scenarios.zero_sum import outcomes  # noqa: E402


def games() -> list[tuple[str, str, dict[str, Any]]]:
    """(label, scenario, overrides) of every game to measure."""
    out = [("kuhn-poker-v0", "kuhn-poker", {}), ("bargain-v0", "bargain", {})]
    if textarena_missing() is None:
        out += [(g, "textarena", {"params": {"env_id": g}}) for g in SUPPORTED]
    return out


def measure(name: str, overrides: dict[str, Any], episodes: int, seat: int) -> dict[str, Any]:
    """The rule bot in ``seat`` against the random bot, ``episodes`` seeds."""
    env = marl.make(name, **overrides)
    agents = env.possible_agents
    bots = {agents[seat]: "rule", agents[1 - seat]: "random"}
    counts = {"win": 0, "draw": 0, "loss": 0}
    returns = []
    for seed in range(episodes):
        result = play_match(env, bots, seed=seed, bot_seed=seed)
        counts[outcomes(result)[agents[seat]]] += 1
        returns.append(result[agents[seat]])
    low, high = wilson(counts["win"], episodes)
    return {
        **counts,
        "win_rate": counts["win"] / episodes,
        "ci": [low, high],
        "mean_return": fmean(returns),
    }


def main() -> None:
    """Measure every game, print a Markdown table, write bench/results/games_baselines.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100 if quick() else 1000)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    lines = [
        "| game | rule bot seat | win / draw / loss | win rate [95% CI] | mean return |",
        "|---|---|---|---|---|",
    ]
    summary = []
    for label, name, overrides in games():
        for seat in (0, 1):
            r = measure(name, overrides, args.episodes, seat)
            results[f"{label}/seat{seat}"] = r
            lines.append(
                f"| {label} | player_{seat} | {r['win']} / {r['draw']} / {r['loss']} | "
                f"{r['win_rate']:.2f} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] | "
                f"{r['mean_return']:+.3f} |"
            )
            summary.append(row(f"{label} rule vs random, seat {seat}", r["win_rate"], "win rate"))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    write(
        "games_baselines",
        {"episodes": args.episodes, "results": results, "machine": machine()},
        summary,
    )


if __name__ == "__main__":
    main()
