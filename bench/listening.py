"""The signalling experiment of issue 26, measured the literature's way: 5 seeds per condition,
exact listening measures before and after RL, interventions, and speaker x listener cross-play.

Conditions (each ``marl train`` on SmolLM2-135M with one LoRA adapter per agent, this CPU):

  warmup_rl  configs/demo.yaml as ``make run`` trains it: the listener imitates the rule bot
             (answer the candidate you hear), then 20 RL updates. signal-v1.
  rl         the same without the warm-up: RL alone from the base model.
  cut        warmup_rl with the speaker -> listener edge cut (``graph.cut``): the speaker still
             talks, and is measured, but nothing is delivered. The control.
  code       configs/code.yaml: signal-code-v0, where the listener sees the candidates only as
             attribute indices under a mapping drawn from the run seed; a format-only warm-up
             of the listener, then 40 RL updates. Copying cannot succeed; chance is 0.25.
  number     configs/code.yaml's recipe on signal-v0: names visible, answers by number. Tells
             "cannot answer by number" from "no convention formed" in ``code``.
  curriculum configs/code_curriculum.yaml: ``code`` with 2 candidates for the first 15 of its
             40 updates, and an entropy bonus (0.01) on the listener.
  curriculum_entropy  the same with the listener's entropy bonus at 0.1.
  code_v1    ``code``'s recipe on signal-code-v1: the listener may answer with the target's
             code as its list shows it ("colour 3, shape 1"), a form it can copy.
  code_v1_hot  ``code_v1`` with the listener sampling at temperature 1.5 (the speaker stays at
             the run's 0.8): a listener that keeps exploring its answers.
  code_v1_scored  ``code_v1`` with a listener that chooses among its legal answers by their
             scores (``policies.listener.choice: scored``) and an entropy bonus of 0.1;
             ``code_v1_scored_cut`` is its cut control.

For each run, the held-out success (64 scenarios, ``eval/success`` before the first update and
after the last) is read from its TensorBoard events, and its checkpoints are measured exactly
with :func:`marl.competition.role_eval.pair_listening` (CIC, influence, success, null
message, message swap: docs/emergence.md) on ``--listening-episodes`` held-out scenarios:
before RL (the step-0 checkpoint after the warm-up, or the base model for ``rl``, measured
once), after it, and for the code conditions also half-way; ``cut`` after RL only.
Each measurement is cached next to its checkpoint (``listening_<step>.json``).
``--replies N`` reads each of the listener's distributions by the scenario's parser from N of its
sampled replies instead of scoring a list of spellings exactly, so every reply the parser accepts
counts and the off-set is what it rejects (:mod:`marl.analysis.listening`; cached as
``listening_<step>_replies<N>.json``): the reading for listeners that answer in their own words.
Headline numbers are seed-clustered: the mean of per-seed values with a t-interval over seeds
(:func:`marl.analysis.stats.seed_clustered`); before/after differences are paired by seed.

Cross-play: the five pairs of ``--crossplay-condition`` (``warmup_rl``) and the base model,
every speaker with every listener, ``--crossplay-episodes`` (24) held-out scenarios per cell
(:func:`marl.competition.role_eval.role_crossplay`), and the self-play gap over the trained pairs
(:func:`marl.competition.role_eval.self_play_gap`: about 0 when the runs share one language).

A condition's missing runs are one sweep on the Ray launcher (``marl train -m ... launcher=ray``,
docs/sweeps.md): each run reserves ``--threads`` CPUs (1), as many at once as the cores hold
(``--parallel`` caps it).

    .venv/bin/python bench/listening.py                  # train what is missing, then measure
    .venv/bin/python bench/listening.py --conditions warmup_rl --seeds 0   # one run

Writes bench/results/listening/: summary.json, table.md, curves.png, crossplay_roles.*.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402  (bench helpers)
    machine,
    paired,
    portable,
    read_scalars,
    run_command,
    run_sampling,
    run_sweep,
    saved_config,
)

from marl.analysis.listening import (  # noqa: E402
    LISTENING_METRICS,
    OFF_SET_LIMIT,
    measure_range,
)
from marl.analysis.stats import seed_clustered  # noqa: E402
from marl.competition.role_eval import json_safe  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CUT = "+scenario.overrides={graph: {cut: [[speaker, listener]]}}"
SCORED = [
    "--config-name",
    "code",
    "scenario=signal_code",
    "+policies.listener.choice=scored",
    "+policies.listener.entropy=0.1",
]
CONDITIONS: dict[str, tuple[list[str], int]] = {
    "warmup_rl": (["--config-name", "demo"], 20),
    "rl": (["--config-name", "demo", "warmup.steps=0"], 20),
    "cut": (["--config-name", "demo", CUT], 20),
    "code": (["--config-name", "code"], 40),
    # issue 40, 2a: the code recipe on signal-v0 (answer by number, names visible), which
    # separates the number lookup from the convention (pre-registered in communication.md)
    "number": (["--config-name", "code", "scenario=signal_v0"], 40),
    # issue 40, 2b: the code condition with a curriculum (2 candidates for 15 updates, then 4)
    # and an entropy bonus on the listener (configs/code_curriculum.yaml; pre-registered)
    "curriculum": (["--config-name", "code_curriculum"], 40),
    # its follow-up: the same with a 10x entropy bonus (registered after curriculum's listeners
    # were seen collapsing in training, before any of its measurements)
    "curriculum_entropy": (
        ["--config-name", "code_curriculum", "policies.listener.entropy=0.1"],
        40,
    ),
    # the code recipe on signal-code-v1, where the listener may answer with the target's code
    # as listed, a form it can copy (pre-registered)
    "code_v1": (["--config-name", "code", "scenario=signal_code"], 40),
    # its follow-up: the listener samples at 1.5, the speaker at 0.8 (registered after seeing
    # code_v1's first training curves, before any of its measurements)
    "code_v1_hot": (
        ["--config-name", "code", "scenario=signal_code", "+policies.listener.temperature=1.5"],
        40,
    ),
    # the listener chooses among its legal answers by their scores, with an entropy bonus it
    # cannot follow into rejected prose (pre-registered 2026-12-07), and its cut control
    "code_v1_scored": (SCORED, 40),
    "code_v1_scored_cut": ([*SCORED, CUT], 40),
}
# the conditions on a learned code: measured half-way too
CODED = (
    "code",
    "curriculum",
    "curriculum_entropy",
    "code_v1",
    "code_v1_hot",
    "code_v1_scored",
    "code_v1_scored_cut",
)
# the exact listening measures tabulated (all of LISTENING_METRICS but swap_success)
METRICS = tuple(m for m in LISTENING_METRICS if m != "swap_success")


def run_dir(args: argparse.Namespace, condition: str, seed: int) -> Path:
    return Path(args.runs) / condition / f"seed{seed}"


def train_missing(args: argparse.Namespace, condition: str, seeds: list[int]) -> None:
    """Train the condition's runs that have no final checkpoint, as one sweep on the Ray
    launcher (``--parallel`` at once, ``--threads`` CPUs each)."""
    overrides, steps = CONDITIONS[condition]
    final = f"checkpoints/step_{steps:06d}/state.pt"
    missing = [seed for seed in seeds if not (run_dir(args, condition, seed) / final).is_file()]
    if not missing:
        return
    run_sweep(
        [
            *overrides,
            "logging.progress=false",
            "emergence.counterfactuals=0",  # measured here, on the checkpoints
            "train.checkpoint_every=10",
        ],
        Path(args.runs) / condition,
        missing,
        args.threads,
        args.parallel,
        condition,
    )


def measure(args: argparse.Namespace, condition: str, seed: int) -> dict[str, Any]:
    """The run's held-out success and exact listening measures at its measured steps."""
    from marl.competition.role_eval import load_pairs, pair_listening
    from marl.config import load_config
    from marl.runtime.policy_map import plan_for
    from marl.scenarios.registry import make

    _, steps = CONDITIONS[condition]
    where = run_dir(args, condition, seed)
    scalars = read_scalars(where / "tensorboard")
    success = scalars.get("eval/success", [])
    config = json.loads(json.dumps(saved_config(where)))
    sampling = run_sampling(config)
    scenario = config["scenario"]["name"]
    overrides = config["scenario"].get("overrides") or {}
    # the listener is scored at the temperature its policy sampled at (its own, if it has one)
    plan = plan_for(load_config(config))
    listener = list(make(scenario, **overrides).possible_agents)[1]
    listener_sampling = replace(sampling, temperature=plan.temperatures[plan.policy_of(listener)])
    halfway = [0, steps // 2, steps]
    points = [steps] if condition == "cut" else halfway if condition in CODED else [0, steps]
    measured: dict[str, Any] = {}
    for step in points:
        checkpoint = where / "checkpoints" / f"step_{step:06d}"
        # no step-0 checkpoint (no warm-up): RL starts from the base model, measured for this
        # run on its own scenarios (never one measurement copied to every seed)
        base = not checkpoint.is_dir()
        reading = f"_replies{args.replies}" if args.replies else ""
        cache = where / f"listening_{'base_' if base else ''}{step}{reading}.json"
        if cache.is_file():
            measured[str(step)] = json.loads(cache.read_text())
            continue
        spec = f"s{seed}=model:smollm2" if base else f"s{seed}={checkpoint}"
        pairs = load_pairs([spec])
        # the base model in the seat of a listener that chooses by score is measured choosing
        pairs[0].listener_scored = plan.policies[plan.policy_of(listener)].scored
        result = pair_listening(
            pairs,
            scenario,
            overrides,
            episodes=args.listening_episodes,
            counterfactuals=args.counterfactuals,
            seed=eval_seed(args.eval_seed, seed),
            sampling=sampling,
            listener_sampling=listener_sampling,
            replies=args.replies,
        )[f"s{seed}"]
        result["checkpoint"] = spec.split("=", 1)[1]
        cache.write_text(json.dumps(json_safe(result)))
        measured[str(step)] = result
    return {
        "condition": condition,
        "seed": seed,
        "command": run_command(where),
        "heldout_success": {"before": success[0], "after": success[-1]} if success else None,
        "speaker_mi": _last(scalars, "emergence/speaker/speaker_mi"),
        # what the docs quote beside the table: messages the cut edge dropped per episode at the
        # end (the cut control's speaker still talks), and the swap's success per measured step
        "comm_cut_dropped": _last(scalars, "comm/cut_dropped"),
        "swap_success": {
            step: (v["summary"].get("swap_success") or {}).get("mean")
            for step, v in measured.items()
        },
        "listening": {
            step: {m: (v["summary"].get(m) or {}).get("mean") for m in METRICS}
            for step, v in measured.items()
        },
    }


def eval_seed(base: int, run_seed: int) -> int:
    """The listening measurement's seed for the run of ``run_seed``: each run draws its own
    held-out scenarios (:func:`marl.runtime.seeding.held_out_seeds`), so the seeds' values are
    independent draws and their interval is one over seeds x scenarios."""
    return base * 1_000_003 + run_seed


def _last(scalars: dict[str, list[float]], tag: str) -> float | None:
    values = scalars.get(tag)
    return values[-1] if values else None


def clustered(
    values: list[float | None], bounds: tuple[float, float] = (0.0, 1.0)
) -> dict[str, float] | None:
    """Seed-clustered mean and 95% interval (one value per seed), the interval clipped to the
    measure's range ``bounds`` (a probability's by default)."""
    kept = [v for v in values if v is not None]
    if not kept:
        return None
    mean, low, high = seed_clustered([[v] for v in kept])
    if not math.isnan(low):
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return {"mean": mean, "low": low, "high": high, "seeds": len(kept)}


# Every condition's held-out scenarios have 4 candidates, so no CIC passes log2(4) = 2 bits.
BITS_CEILING = 2.0


def crossplay_gap(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The self-play gap over the trained pairs of the cross-play (None with fewer than two)."""
    from marl.competition.role_eval import self_play_gap

    trained = list(dict.fromkeys(c["speaker"] for c in cells if c["speaker"] != "base"))
    return self_play_gap(cells, trained) if len(trained) >= 2 else None


def crossplay_text(cells: list[dict[str, Any]], gap: dict[str, Any] | None, roles: str) -> str:
    """The cross-play section of table.md: its heading, the matrix, and the self-play gap."""
    condition = cells[0].get("condition", "warmup_rl")
    text = f"\n\nCross-play ({condition} pairs and the base model):\n\n" + roles
    if gap is not None:
        per_run = ", ".join(f"{g:+.2f}" for g in gap["per_run"])
        interval = "" if gap["low"] != gap["low"] else f" [{gap['low']:+.2f}, {gap['high']:+.2f}]"
        text += (
            f"\nSelf-play gap (each trained pair with itself minus with the other runs' "
            f"partners; t-interval over runs): {gap['mean']:+.2f}{interval}; per run {per_run}.\n"
        )
    return text


def aggregate(runs: list[dict[str, Any]], condition: str) -> dict[str, Any]:
    mine = [r for r in runs if r["condition"] == condition]
    if not mine:
        return {}
    _, steps = CONDITIONS[condition]
    out: dict[str, Any] = {"seeds": [r["seed"] for r in mine]}
    before = [(r["heldout_success"] or {}).get("before") for r in mine]
    after = [(r["heldout_success"] or {}).get("after") for r in mine]
    out["heldout_success"] = {
        "before": clustered(before),
        "after": clustered(after),
        "change": paired(before, after, least=2),
    }
    out["speaker_mi"] = clustered([r["speaker_mi"] for r in mine], (0.0, math.inf))
    for step in sorted({s for r in mine for s in r["listening"]}, key=int):
        out[f"listening_{step}"] = {
            m: clustered(
                [(r["listening"].get(step) or {}).get(m) for r in mine],
                measure_range(m, BITS_CEILING),
            )
            for m in METRICS
        }
    first, last = "0", str(steps)
    out["cic_change"] = paired(
        [(r["listening"].get(first) or {}).get("cic") for r in mine],
        [(r["listening"].get(last) or {}).get("cic") for r in mine],
        least=2,
    )
    return out


def _fmt(x: dict[str, float] | None, digits: int = 2) -> str:
    if not x:
        return "-"
    if math.isnan(x["low"]):
        return f"{x['mean']:.{digits}f}"
    return f"{x['mean']:.{digits}f} [{x['low']:.{digits}f}, {x['high']:.{digits}f}]"


def _reading(args: argparse.Namespace) -> str:
    """How the table's listener distributions were read (summaries written before
    ``--replies`` existed have none: exact)."""
    replies = getattr(args, "replies", 0)
    if replies:
        return (
            f"Each listener distribution is read by the scenario's parser from {replies} replies "
            "sampled from the listener (every reply the parser accepts counts); the off-set is the "
            f"fraction it rejects, flagged `!` above {OFF_SET_LIMIT}. A CIC read from samples is "
            "biased upwards, the more the fewer replies the parser accepts: about "
            "(A - 1)(M - 1) / (2 N ln 2) bits for A actions, M distinct messages and N accepted "
            "replies in a scenario (Miller 1955)."
        )
    return (
        "Each listener distribution is scored exactly over the accepted spellings (over its "
        "canonical answers, the set it draws from, for a listener that chooses by score: "
        "`code_v1_scored*`, whose off-set is 0). An off-set "
        f"above {OFF_SET_LIMIT} (the listener mostly writes none of the scored texts) is flagged "
        "`!`: its normalised measures then describe replies it rarely writes."
    )


def markdown(table: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"Seed-clustered means with 95% t-intervals over seeds. Held-out success: "
        f"{64} scenarios per run; listening measures: {args.listening_episodes} held-out "
        f"scenarios, K = {args.counterfactuals} speaker replies each.",
        "",
        "Intervals are clipped to each measure's range (success in [0, 1], CIC in [0, 2] bits: "
        "log2 of the 4 candidates). Each run "
        "is measured on its own held-out scenarios. " + _reading(args),
        "",
        "| condition | seeds | held-out success before -> after | change (paired) | "
        "CIC before -> after (bits) | CIC given target after | influence after | "
        "swap followed after | null-message success after | off-set after | "
        "speaker MI after (bits) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for condition in CONDITIONS:
        a = table.get(condition)
        if not a:
            continue
        _, steps = CONDITIONS[condition]
        s = a["heldout_success"]
        before, after = a.get("listening_0", {}), a.get(f"listening_{steps}", {})
        off = after.get("off_set")
        flag = " !" if off and off["mean"] > OFF_SET_LIMIT else ""
        lines.append(
            f"| {condition} | {len(a['seeds'])} | {_fmt(s['before'])} -> {_fmt(s['after'])} | "
            f"{_fmt(s['change'])} | {_fmt(before.get('cic'))} -> {_fmt(after.get('cic'))} | "
            f"{_fmt(after.get('cic_given_target'))} | {_fmt(after.get('influence'))} | "
            f"{_fmt(after.get('swap_follow'))} | {_fmt(after.get('null_success'))} | "
            f"{_fmt(off)}{flag} | {_fmt(a['speaker_mi'])} |"
        )
    return "\n".join(lines)


def plot(path: Path, runs: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for i, condition in enumerate(CONDITIONS):
        colour = f"C{i % 10}"  # matplotlib's default cycle
        mine = [r for r in runs if r["condition"] == condition]
        for r in mine:
            steps = sorted(r["listening"], key=int)
            xs = [int(s) for s in steps]
            axes[0].plot(xs, [r["listening"][s]["success"] for s in steps], color=colour, alpha=0.5)
            axes[1].plot(xs, [r["listening"][s]["cic"] for s in steps], color=colour, alpha=0.5)
        axes[0].plot([], [], color=colour, label=condition)
    axes[0].axhline(0.25, color="grey", linestyle=":", label="chance")
    axes[0].set(xlabel="RL updates", ylabel="exact success (held-out)", ylim=(0, 1.02))
    axes[1].set(xlabel="RL updates", ylabel="CIC (bits)", ylim=(0, 2.05))
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def crossplay(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """The cross-play cells of ``--crossplay-condition``'s final checkpoints and the base model
    (each cell records the condition), reused from ``out`` when it holds exactly these."""
    from marl.competition.role_eval import load_pairs, role_crossplay, write_tables

    condition = args.crossplay_condition
    _, steps = CONDITIONS[condition]
    final = {
        s: run_dir(args, condition, s) / "checkpoints" / f"step_{steps:06d}" for s in args.seeds
    }
    specs = [f"seed{s}={path}" for s, path in final.items() if path.is_dir()]
    if not specs:
        return []
    names = [spec.split("=", 1)[0] for spec in specs] + ["base"]
    cached = _cached_cells(out / "crossplay_roles.csv", names, args.crossplay_episodes, condition)
    if cached:
        print(f"  cross-play: reusing {out / 'crossplay_roles.csv'}", flush=True)
        return cached
    print(f"  cross-play of {condition}: {len(names)} x {len(names)} pairings", flush=True)
    config = saved_config(run_dir(args, condition, args.seeds[0]))
    pairs = load_pairs([*specs, "base=model:smollm2"])
    cells = role_crossplay(
        pairs,
        config["scenario"]["name"],
        config["scenario"].get("overrides") or {},
        episodes=args.crossplay_episodes,
        seed=args.eval_seed,
        sampling=run_sampling(config),
    )
    cells = [{"condition": condition, **cell} for cell in cells]
    write_tables(out, cells, {})
    return cells


def _cached_cells(
    path: Path, names: list[str], episodes: int, condition: str
) -> list[dict[str, Any]]:
    """The cells of an earlier cross-play of exactly these pairs, episodes and condition, else
    [] (a table written before cells recorded their condition was of ``warmup_rl``)."""
    import csv

    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    wanted = {(s, x) for s in names for x in names}
    if {(r["speaker"], r["listener"]) for r in rows} != wanted or any(
        int(r["episodes"]) != episodes or r.get("condition", "warmup_rl") != condition for r in rows
    ):
        return []
    numbers = ("success", "success_lo", "success_hi")
    return [
        {**r, "episodes": int(r["episodes"]), **{k: float(r[k]) for k in numbers}} for r in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=CONDITIONS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--runs", default=str(ROOT / "runs" / "signal5"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "listening"))
    parser.add_argument("--threads", type=int, default=1, help="CPUs (torch threads) per run")
    parser.add_argument(
        "--parallel", type=int, default=None, help="runs at once (default: as the cores hold)"
    )
    parser.add_argument("--measure-threads", type=int, default=2, help="torch threads measuring")
    parser.add_argument("--listening-episodes", type=int, default=16)
    parser.add_argument("--counterfactuals", type=int, default=8)
    parser.add_argument(
        "--replies",
        type=int,
        default=0,
        help="0: score each listener distribution exactly over the accepted spellings; N: read "
        "it by the scenario's parser from N sampled replies (every accepted reply counts)",
    )
    parser.add_argument("--crossplay-episodes", type=int, default=24)
    parser.add_argument(
        "--crossplay-condition",
        default="warmup_rl",
        choices=CONDITIONS,
        help="whose final pairs play every speaker with every listener (with the base model)",
    )
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--no-train", action="store_true", help="measure the runs there only")
    parser.add_argument("--no-crossplay", action="store_true")
    parser.add_argument(
        "--from-summary",
        metavar="JSON",
        help="tabulate the runs recorded in this summary.json again (no training, no measuring; "
        "the cross-play is kept as it was) and write the table beside it",
    )
    args = parser.parse_args()
    if args.from_summary:
        retabulate(Path(args.from_summary))
        return
    import torch

    torch.set_num_threads(args.measure_threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for condition in args.conditions:
        if not args.no_train:
            train_missing(args, condition, args.seeds)
        for seed in args.seeds:
            if not (run_dir(args, condition, seed) / "tensorboard").is_dir():
                print(f"  {condition} seed {seed}: no run, left out", flush=True)
                continue
            print(f"  measuring {condition} seed {seed}", flush=True)
            runs.append(measure(args, condition, seed))
    table = {c: aggregate(runs, c) for c in args.conditions}
    cells = [] if args.no_crossplay else crossplay(args, out)
    text = markdown(table, args)
    gap = crossplay_gap(cells)
    if cells:
        text += crossplay_text(cells, gap, (out / "crossplay_roles.md").read_text())
    payload = {
        "args": {k: portable(v) for k, v in vars(args).items()},
        "runs": runs,
        "table": table,
        "crossplay": cells,
        "crossplay_gap": gap,
        "machine": machine(),
    }
    (out / "summary.json").write_text(json.dumps(json_safe(payload), indent=1))
    (out / "table.md").write_text(text + "\n")
    plot(out / "curves.png", runs)
    print(text)
    print(f"wrote {out / 'summary.json'}, {out / 'table.md'}, {out / 'curves.png'}")


def retabulate(summary: Path) -> None:
    """``--from-summary``: the table of the runs a summary.json recorded, aggregated and
    clipped by this version (their per-run measurements unchanged), written beside it."""
    payload = json.loads(summary.read_text())
    runs = payload["runs"]
    recorded = argparse.Namespace(**payload["args"])
    conditions = list(dict.fromkeys(r["condition"] for r in runs))
    table = {c: aggregate(runs, c) for c in conditions}
    text = markdown(table, recorded)
    roles = summary.parent / "crossplay_roles.md"
    if payload.get("crossplay") and roles.is_file():
        cells = payload["crossplay"]
        payload["crossplay_gap"] = crossplay_gap(cells)
        text += crossplay_text(cells, payload["crossplay_gap"], roles.read_text())
    payload["table"] = table
    payload["retabulated"] = {"by": "bench/listening.py --from-summary", "machine": machine()}
    summary.write_text(json.dumps(json_safe(payload), indent=1))
    (summary.parent / "table.md").write_text(text + "\n")
    print(text)
    print(f"wrote {summary}, {summary.parent / 'table.md'}")


if __name__ == "__main__":
    main()
