"""Environment and protocol overhead: agent-steps per second with scripted agents.

Every built-in scenario is played to the end, episode after episode, by its scripted ``rule``
bot (``random`` where a scenario has none) for every agent: ``reset``, then ``step`` with every
live agent's completion, which parses the markup, routes the messages along the graph
(budgets, noise), applies the actions and renders the next observations. An agent-step is one
agent's completion handled in one round. The bot's own time is included (small: it formats a
line or two). The scenarios take turns, ``--rounds`` times, each for ``--seconds``; the table
gives the minimum and the median rate. Target (issue 10): at least 20,000 agent-steps/s.

``--against DIR`` compares this checkout with another one (a worktree of main, say, with its own
``.venv``): every round runs this file once under each checkout's interpreter, in a fresh
process, alternating (this, other, this, other, ...), so each side measures its own ``marl``.
The table then gives both rates and their ratio (this / other) per scenario and overall.

    nice -n 19 .venv/bin/python bench/env_overhead.py            # BENCH_QUICK=1: shorter
    OMP_NUM_THREADS=1 nice -n 19 taskset -c 1 .venv/bin/python bench/env_overhead.py \
        --against ../main --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
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


def measure(scenarios: list[str], seconds: float) -> dict[str, float]:
    """Agent-steps per second of each scenario, played in turn."""
    return {name: agent_steps_per_second(name, seconds) for name in scenarios}


def child_run(python: str, checkout: Path, scenarios: list[str], seconds: float) -> dict:
    """Run :func:`measure` under ``python`` (``checkout``'s interpreter) in a fresh process."""
    command = [python, str(Path(__file__).resolve()), "--child", "--seconds", str(seconds)]
    out = subprocess.run(
        [*command, "--scenarios", *scenarios],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> None:
    """This checkout against ``args.against``, alternating fresh processes (see the docstring)."""
    here = Path(__file__).resolve().parents[1]
    other = Path(args.against).resolve()
    pythons = {"this": (sys.executable, here), "other": (str(other / ".venv/bin/python"), other)}
    state = machine()
    runs: dict[str, list[dict]] = {"this": [], "other": []}
    for _ in range(args.rounds):
        for side, (python, checkout) in pythons.items():
            runs[side].append(child_run(python, checkout, args.scenarios, args.seconds))
    state["load_average_after"] = machine()["load_average"]
    for side, (_, checkout) in pythons.items():
        where = {Path(r["marl"]).resolve().parents[1] for r in runs[side]}
        assert where == {checkout}, f"{side}: measured the marl of {where}, not {checkout}"
    results: dict[str, dict] = {}
    summary = []
    for name in [*args.scenarios, "median over scenarios"]:
        entry = {}
        for side in runs:
            if name in args.scenarios:
                values = [r["rates"][name] for r in runs[side]]
            else:
                values = [statistics.median(r["rates"].values()) for r in runs[side]]
            entry[side] = {
                "values": values,
                "min": min(values),
                "median": statistics.median(values),
            }
        entry["ratio_median"] = entry["this"]["median"] / entry["other"]["median"]
        entry["ratio_min"] = entry["this"]["min"] / entry["other"]["min"]
        results[name] = entry
        summary.append(
            row(
                f"{name} agent-steps/s, this vs {other.name}",
                entry["this"]["median"],
                "1/s",
                f"{entry['other']['median']:,.0f} there; median ratio {entry['ratio_median']:.2f}x"
                f", min {entry['this']['min']:,.0f} vs {entry['other']['min']:,.0f}"
                f" ({entry['ratio_min']:.2f}x)",
            )
        )
    overall = results["median over scenarios"]["this"]["median"]
    summary[-1]["note"] += (
        f"; target >= {TARGET:,}: {'met' if overall >= TARGET else 'NOT met'}"
        f"; load {state['load_average'][0]:.2f} -> {state['load_average_after'][0]:.2f}"
    )
    write(
        "env_overhead_vs",
        {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "against": str(other),
            "commits": {side: _commit(checkout) for side, (_, checkout) in pythons.items()},
            "results": results,
            "machine": state,
        },
        summary,
    )


def _commit(checkout: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=0.5 if quick() else 2.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scenarios", nargs="+", default=marl.list_scenarios())
    p.add_argument("--against", help="another checkout (with a .venv) to alternate with")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:  # one measurement for --against: print it, write nothing
        rates = measure(args.scenarios, args.seconds)
        print(json.dumps({"marl": marl.__file__, "rates": rates}))
        return
    if args.against:
        compare(args)
        return
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
        summary.append(row(f"{name} agent-steps/s", r["median"], "1/s", f"min {r['min']:,.0f}"))
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
