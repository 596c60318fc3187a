"""Environment and protocol overhead: agent-steps per second with scripted agents.

Every built-in scenario is played to the end, episode after episode, by its scripted ``rule``
bot (``random`` where a scenario has none) for every agent: ``reset``, then ``step`` with every
live agent's completion, which parses the markup, routes the messages along the graph
(budgets, noise), applies the actions and renders the next observations. An agent-step is one
agent's completion handled in one round. The bot's own time is included (small: it formats a
line or two). The scenarios take turns, ``--rounds`` times, each for ``--seconds``; the table
gives the minimum and the median rate. Target (issue 10): at least 20,000 agent-steps/s.

    nice -n 19 .venv/bin/python bench/env_overhead.py            # BENCH_QUICK=1: shorter
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, machine, quick, row, write  # noqa: E402

import marl  # noqa: E402
from marl.scenarios.bots import bot_names, get_bot  # noqa: E402

TARGET = 20_000


def agent_steps_per_second(name: str, seconds: float, seed: int = 0) -> float:
    """Play ``name`` with scripted bots for about ``seconds``; agent-steps per second."""
    env = marl.make(name)
    bot = get_bot(env.spec.rules, "rule" if "rule" in bot_names(env.spec.rules) else "random")
    rng = random.Random(seed)
    steps, episode = 0, 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        observations, infos = env.reset(seed=seed + episode)
        episode += 1
        while env.agents:
            actions = {a: bot(a, observations[a], infos[a], rng) for a in env.agents}
            steps += len(actions)
            observations, _, _, _, infos = env.step(actions)
    return steps / (time.perf_counter() - began)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=0.5 if quick() else 2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scenarios", nargs="+", default=marl.list_scenarios())
    args = p.parse_args()
    state = machine()
    results = alternate(
        {
            name: (lambda name=name: agent_steps_per_second(name, args.seconds))
            for name in args.scenarios
        },
        args.rounds,
    )
    state["load_average_after"] = machine()["load_average"]
    summary = []
    for name, r in results.items():
        summary.append(
            row(f"{name} agent-steps/s", r["median"], "1/s", f"min {r['min']:,.0f}")
        )
    medians = [r["median"] for r in results.values()]
    overall = statistics.median(medians)
    summary.append(
        row(
            "median over scenarios",
            overall,
            "1/s",
            f"target >= {TARGET:,}: {'met' if overall >= TARGET else 'NOT met'}; "
            f"load {state['load_average'][0]:.2f}",
        )
    )
    write(
        "env_overhead",
        {"seconds": args.seconds, "rounds": args.rounds, "results": results, "machine": state},
        summary,
    )


if __name__ == "__main__":
    main()
