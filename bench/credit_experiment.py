"""Does counterfactual credit make learning faster when the team reward hides who contributed?

The testbed is ``unison`` with N agents under cooperation 1: every agent is told to write the
character 'a', an agent's individual score is the share of 'a' in its text, and every agent is
paid the TEAM MEAN of the scores. A shared tiny character-level policy plays all agents. Two
settings:

- ``hidden``: every agent's text scores; the team mean hides whose text was good.
- ``free_riders``: only ``a0``'s text scores (``scored_agents: [a0]``); the others free-ride.

Each credit method (``team`` = plain GRPO, ``difference``, ``coma``, ``shapley``) trains from the
same initial weights and seeds, with ``credit.keep_action=false`` (a counterfactual replaces the
whole completion, so an agent's contribution becomes visible). Measured per run, from the run's
own TensorBoard events: the scored agents' mean score per step, the steps until its 3-step
moving average reaches the setting's target (``--target``), the final score (mean of the last
3 steps), the paired gain over ``team`` at the same seed, the mean score over the run, and
``credit/advantage_variance``.

Advantage quality is measured apart from training, on identical rollouts for every method
(paired): at the initial policy and at the policy of the ``team`` run of the first seed, play
``--probe-groups`` GRPO groups, compute each method's advantages, and compare agent i's advantage
with agent i's OWN contribution (its individual score, centred in its group): correlation rho,
signal variance Var(A) rho^2, noise variance Var(A) (1 - rho^2), SNR rho^2 / (1 - rho^2), and
the advantage variance left on free riders' turns (pure noise: their text changes nothing).

Run (each about 9 minutes on the loaded 2-core machine)::

    .venv/bin/python bench/credit_experiment.py                         # the hidden setting
    .venv/bin/python bench/credit_experiment.py --settings free_riders

Each adds its entry to ``bench/results/credit_experiment.json`` (keyed by the settings run) and
prints the tables in ``docs/credit_experiment.md``. ``--quick`` runs a tiny smoke version.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from statistics import fmean
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402  (bench helpers)

METHODS = ("team", "difference", "coma", "shapley")
SETTINGS = {
    "hidden": None,  # every agent scores
    "free_riders": ["a0"],  # only a0's text scores
}
# the default target score per setting (one agent in four carries the signal in free_riders)
TARGETS = {"hidden": 0.2, "free_riders": 0.1}
ROOT = Path(__file__).resolve().parents[1]


def agent_names(n: int) -> list[str]:
    """``a0 .. a{n-1}``."""
    return [f"a{i}" for i in range(n)]


def scenario_overrides(agents: int, scored: Sequence[str] | None) -> dict[str, Any]:
    """unison with ``agents`` agents, an empty system prompt (short char-level prompts) and
    optionally only ``scored`` agents scoring."""
    overrides: dict[str, Any] = {"system_prompt": "", "agents": agent_names(agents)}
    if scored is not None:
        overrides["params"] = {"scored_agents": list(scored)}
    return overrides


def train_config(
    method: str,
    seed: int,
    *,
    agents: int = 4,
    scored: Sequence[str] | None = None,
    steps: int = 20,
    group_size: int = 8,
    max_new_tokens: int = 12,
    lr: float = 3e-3,
    samples: int = 4,
    transcripts_every: int = 0,
) -> dict[str, Any]:
    """The ``marl train`` config (as a dict) of one run; same seed = same initial weights."""
    return {
        "scenario": {"name": "unison", "overrides": scenario_overrides(agents, scored)},
        "model": {"kind": "tiny", "seed": seed},
        "sampling": {"max_new_tokens": max_new_tokens},
        "algo": {"lr": lr},
        "credit": {"name": method, "keep_action": False, "samples": samples},
        "train": {"steps": steps, "seeds_per_step": 1, "group_size": group_size},
        "logging": {"progress": False, "transcripts_every": transcripts_every},
        "seed": seed,
    }


def read_scalars(run_dir: Path) -> dict[str, list[float]]:
    """Every scalar series of a run's TensorBoard events, in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [e.value for e in sorted(events.Scalars(tag), key=lambda e: e.step)]
        for tag in events.Tags()["scalars"]
    }


def target_of(setting: str, args: argparse.Namespace) -> float:
    """The target score of ``setting``: ``--target`` if given, else the setting's default."""
    return TARGETS[setting] if args.target is None else args.target


def steps_to_target(series: Sequence[float], target: float, window: int = 3) -> int | None:
    """The first step (1-based) at which the mean of the last ``window`` values reaches
    ``target``; None if it never does."""
    for k in range(len(series)):
        recent = series[max(0, k - window + 1) : k + 1]
        if fmean(recent) >= target:
            return k + 1
    return None


def run_training(
    setting: str, method: str, seed: int, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """Train one (setting, method, seed); summarise its TensorBoard series."""
    from marl.loop.train import train

    scored = SETTINGS[setting]
    config = train_config(
        method,
        seed,
        agents=args.agents,
        scored=scored,
        steps=args.steps,
        group_size=args.group_size,
        max_new_tokens=args.max_new_tokens,
        lr=args.lr,
        samples=args.samples,
    )
    run_dir = work / setting / method / f"seed{seed}"
    began = time.perf_counter()
    train(config, run_dir=run_dir)
    wall = time.perf_counter() - began
    scalars = read_scalars(run_dir)
    n_scored = args.agents if scored is None else len(scored)
    # the team reward is the mean score over ALL agents; report the scored agents' mean score
    score = [r * args.agents / n_scored for r in scalars["team/reward"]]
    tail = score[-3:]
    return {
        "setting": setting,
        "method": method,
        "seed": seed,
        "score": score,
        "target": target_of(setting, args),
        "steps_to_target": steps_to_target(score, target_of(setting, args)),
        "final_score": fmean(tail),
        "advantage_variance": fmean(scalars["credit/advantage_variance"]),
        "step_time": fmean(scalars["perf/step_time"]),
        "wall_time": wall,
        "run_dir": str(run_dir),
    }


# ------------------------------------------------------------------------------ probe


def probe_advantages(
    weights: dict[str, torch.Tensor] | None,
    setting: str,
    args: argparse.Namespace,
    seed: int = 1234,
) -> dict[str, dict[str, float]]:
    """Play ``args.probe_groups`` groups once with a fixed policy; score every method's
    advantages on those same turns against each agent's own contribution."""
    from marl.agents.backends import SamplingConfig, make_backend
    from marl.agents.models import ModelSpec, load_model
    from marl.credit import CreditConfig
    from marl.loop.credit_phase import credit_phase
    from marl.runtime.resimulation import backend_generate, make_engine
    from marl.runtime.rollout import EpisodeSlot, run_episodes
    from marl.scenarios.registry import make

    torch.manual_seed(seed)
    scored = SETTINGS[setting]
    overrides = scenario_overrides(args.agents, scored)
    model, tokenizer = load_model(ModelSpec(kind="tiny", seed=args.seeds[0]))
    if weights is not None:
        model.load_state_dict(weights)
    backend = make_backend("hf", model=model, tokenizer=tokenizer)
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens)
    groups, g = args.probe_groups, args.group_size
    slots = [
        EpisodeSlot(
            env=make("unison", **overrides), seed=seed + b, group_id=b, episode_id=b * g + k
        )
        for b in range(groups)
        for k in range(g)
    ]
    rollout = run_episodes(slots, {"shared": backend}, lambda a: "shared", sampling, seed=seed)
    # each agent's own contribution: its individual score under the scenario's own rule
    own: dict[tuple[int, str], float] = {}
    for slot in slots:
        (log_round,) = {t.round for t in slot.env.log}
        actions = {t.agent: t.action for t in slot.env.log}
        individual = slot.env.rules.step(actions, log_round, True).individual
        for agent, value in individual.items():
            own[(slot.episode_id, agent)] = float(value)
    scored_set = set(agent_names(args.agents) if scored is None else scored)
    generate = backend_generate({"shared": backend}, lambda a: "shared", sampling, seed=seed)

    out: dict[str, dict[str, float]] = {}
    for method in args.methods:
        credit = CreditConfig(name=method, keep_action=False, samples=args.samples)
        engine = make_engine(credit, lambda: make("unison", **overrides), generate)
        credit_phase(credit, rollout, engine, "grpo")
        out[method] = advantage_quality(rollout.turns, own, scored_set)
    out["_rollout"] = {"mean_score": fmean(own[k] for k in own if k[1] in scored_set)}
    return out


def advantage_quality(
    turns: Sequence[Any], own: dict[tuple[int, str], float], scored: set[str]
) -> dict[str, float]:
    """How much of each turn's advantage is explained by the agent's own contribution.

    The contribution ``x`` (the agent's own score) is standardised within its (group, agent)
    column, as the GRPO advantage ``A`` is; a column where ``x`` does not vary, and every free
    rider's turn (``x`` is 0 by construction), has ``z = 0``. ``rho = sum(A z) / sqrt(sum(A^2)
    sum(z^2))`` over all turns: 1 means the advantage is exactly the agent's own contribution.
    """
    columns: dict[tuple[int, str], list[float]] = {}
    for t in turns:
        columns.setdefault((t.group_id, t.agent), []).append(own[(t.episode_id, t.agent)])
    stats = {}
    for key, values in columns.items():
        mean = fmean(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))
        stats[key] = (mean, std)
    adv, z = [], []
    for t in turns:
        mean, std = stats[(t.group_id, t.agent)]
        x = own[(t.episode_id, t.agent)]
        adv.append(float(t.advantage))
        z.append((x - mean) / std if std > 1e-12 and t.agent in scored else 0.0)
    sum_aa = sum(a * a for a in adv)
    sum_zz = sum(v * v for v in z)
    rho = (
        sum(a * v for a, v in zip(adv, z)) / math.sqrt(sum_aa * sum_zz) if sum_aa * sum_zz else 0.0
    )
    var_a = sum_aa / len(adv)  # advantages are centred within every column
    free = [a for a, t in zip(adv, turns) if t.agent not in scored]
    return {
        "rho": rho,
        "advantage_variance": var_a,
        "signal_variance": var_a * rho**2,
        "noise_variance": var_a * (1 - rho**2),
        "snr": rho**2 / (1 - rho**2) if rho**2 < 1 - 1e-9 else math.inf,
        "free_rider_variance": fmean(a * a for a in free) if free else 0.0,
    }


# ------------------------------------------------------------------------------ report


def summarise(runs: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """One row per (setting, method): means over seeds."""
    rows = []
    keys = sorted({(r["setting"], r["method"]) for r in runs}, key=_order)
    for setting, method in keys:
        mine = [r for r in runs if r["setting"] == setting and r["method"] == method]
        reached = [r["steps_to_target"] for r in mine]
        # a run that never reached the target counts as steps + 1 (a lower bound)
        filled = [s if s is not None else steps + 1 for s in reached]
        finals = [r["final_score"] for r in mine]
        team = {
            r["seed"]: r["final_score"]
            for r in runs
            if r["setting"] == setting and r["method"] == "team"
        }
        # paired by seed: same initial weights, same first rollout
        deltas = [r["final_score"] - team[r["seed"]] for r in mine if r["seed"] in team]
        rows.append(
            {
                "setting": setting,
                "method": method,
                "seeds": len(mine),
                "target": mine[0]["target"],
                "steps_to_target": reached,
                "mean_steps_to_target": fmean(filled),
                "reached": sum(s is not None for s in reached),
                "final_score_mean": fmean(finals),
                "final_score_std": _std(finals),
                "final_vs_team": deltas,
                "final_vs_team_mean": fmean(deltas) if deltas else None,
                "final_vs_team_std": _std(deltas),
                "mean_score": fmean(fmean(r["score"]) for r in mine),
                "advantage_variance": fmean(r["advantage_variance"] for r in mine),
                "step_time": fmean(r["step_time"] for r in mine),
            }
        )
    return rows


def _order(key: tuple[str, str]) -> tuple[int, int]:
    setting, method = key
    return (list(SETTINGS).index(setting), list(METHODS).index(method))


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = fmean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def training_table(rows: list[dict[str, Any]], steps: int) -> str:
    """The training comparison as a markdown table."""
    lines = [
        f"| setting (target) | credit | steps to target (per seed; - = not in {steps}) | mean "
        "| final score (mean ± sd) | final - team, paired (mean ± sd) | mean score over the run "
        "| adv. variance | s/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per_seed = ", ".join("-" if s is None else str(s) for s in r["steps_to_target"])
        mean = f"{r['mean_steps_to_target']:.1f}" + ("" if r["reached"] == r["seeds"] else "+")
        delta = (
            "-"
            if r["method"] == "team" or r["final_vs_team_mean"] is None
            else f"{r['final_vs_team_mean']:+.3f} ± {r['final_vs_team_std']:.3f}"
        )
        lines.append(
            f"| {r['setting']} ({r['target']}) | {r['method']} | {per_seed} | {mean} | "
            f"{r['final_score_mean']:.3f} ± {r['final_score_std']:.3f} | {delta} | "
            f"{r['mean_score']:.3f} | {r['advantage_variance']:.3f} | {r['step_time']:.2f} |"
        )
    return "\n".join(lines)


def probe_table(probes: dict[str, dict[str, dict[str, dict[str, float]]]]) -> str:
    """The advantage-quality comparison as a markdown table."""
    lines = [
        "| setting | policy | credit | rho(A, own) | Var(A) | signal var | noise var | SNR "
        "| free-rider var |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for setting, by_policy in probes.items():
        for policy, by_method in by_policy.items():
            for method, q in by_method.items():
                if method.startswith("_"):
                    continue
                snr = ">1000" if q["snr"] > 1000 else f"{q['snr']:.2f}"
                free = f"{q['free_rider_variance']:.3f}" if setting != "hidden" else "n/a"
                lines.append(
                    f"| {setting} | {policy} | {method} | {q['rho']:.3f} | "
                    f"{q['advantage_variance']:.3f} | {q['signal_variance']:.3f} | "
                    f"{q['noise_variance']:.3f} | {snr} | {free} |"
                )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--settings", nargs="+", default=["hidden"], choices=list(SETTINGS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--agents", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--samples", type=int, default=2, help="K for coma")
    p.add_argument(
        "--target",
        type=float,
        default=None,
        help="target mean score of the scored agents (default: 0.2 hidden, 0.1 free_riders)",
    )
    p.add_argument("--probe-groups", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest here)")
    p.add_argument("--jobs", type=int, default=2, help="training runs in parallel processes")
    p.add_argument("--workdir", type=Path, default=None, help="run dirs (default: a temp dir)")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/credit_experiment.json")
    p.add_argument("--quick", action="store_true", help="smoke test: 1 seed, 3 steps")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds, args.steps, args.probe_groups = args.seeds[:1], 3, 2
    if args.agents < 2:
        p.error("--agents: need at least 2 agents for credit to matter")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run every (setting, method, seed), probe advantage quality, print and save."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    began = time.perf_counter()
    work_ctx = (
        tempfile.TemporaryDirectory(prefix="credit_experiment_") if not args.workdir else None
    )
    work = Path(work_ctx.name) if work_ctx else args.workdir
    runs: list[dict[str, Any]] = []
    probes: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    jobs = [
        (setting, method, seed)
        for setting in args.settings
        for seed in args.seeds
        for method in args.methods
    ]
    try:
        if args.jobs > 1:
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(
                args.jobs,
                mp_context=context,
                initializer=torch.set_num_threads,
                initargs=(args.threads,),
            ) as pool:
                futures = [pool.submit(run_training, *job, args, work) for job in jobs]
                for future in as_completed(futures):
                    _report(future.result())
                runs = [f.result() for f in futures]
        else:
            for job in jobs:
                runs.append(_report(run_training(*job, args, work)))
        for setting in args.settings:
            probes[setting] = {"initial": probe_advantages(None, setting, args)}
            team_runs = [r for r in runs if r["setting"] == setting and r["method"] == "team"]
            if team_runs:
                from marl.runtime.checkpoint import load_checkpoint

                state = load_checkpoint(Path(team_runs[0]["run_dir"]) / "checkpoints")
                weights = state["policies"]["shared"]["weights"]
                probes[setting]["trained (team run)"] = probe_advantages(weights, setting, args)
    finally:
        if work_ctx is not None:
            work_ctx.cleanup()
    rows = summarise(runs, args.steps)
    train_md = training_table(rows, args.steps)
    probe_md = probe_table(probes)
    print(train_md)
    print()
    print(probe_md)
    total = time.perf_counter() - began
    print(f"\ntotal wall time {total:.0f} s", file=sys.stderr)
    command = "bench/credit_experiment.py " + " ".join(sys.argv[1:] if argv is None else argv)
    entry = {
        "command": command.strip(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {**machine(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "total_wall_time_s": total,
        "summary": rows,
        "probes": probes,
        "runs": [{k: v for k, v in r.items() if k != "run_dir"} for r in runs],
        "tables": {"training": train_md, "advantages": probe_md},
    }
    # one entry per setting list, so `--settings free_riders` adds to the default run's file
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result.setdefault("experiments", {})["+".join(args.settings)] = _finite(entry)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _report(run: dict[str, Any]) -> dict[str, Any]:
    print(
        f"{run['setting']:12s} {run['method']:10s} seed {run['seed']}: final "
        f"{run['final_score']:.3f} target@{run['steps_to_target']} ({run['wall_time']:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return run


def _finite(value: Any) -> Any:
    """``value`` with infinities as the string "inf" (strict JSON has no Infinity)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return value


if __name__ == "__main__":
    raise SystemExit(main())
