"""The Kuhn Poker experiments of issues 27 and 40: SmolLM2 trained several ways, and the exact
exploitability of what it learned, 5 seeds per condition.

Conditions (each ``marl train --config-name kuhn``: configs/kuhn.yaml, SmolLM2-135M full
fine-tuning, one policy on both seats, GRPO over groups of 4 hands on one deal with a KL anchor
to the warmed-up model, 256 hands an iteration in one optimizer step, a format-only warm-up
first; since issue 40 the card restated before the move and a malformed reply costing 1.5 chips;
until 2026-12-07 16 hands an iteration, below):

  selfplay        ``league=selfplay``: the learner plays both seats, both trained (SPIRAL's
                  setup).
  selfplay_hands16  the same with 16 hands an update (4 deals of 4 hands), the shipped size
                  until 2026-12-07: the ``selfplay`` of the experiments trained before.
  selfplay_hands64  64 hands an update (16 deals of 4), all in one optimizer step: the signal's
                  noise, not the number of steps; its control is ``selfplay_hands16``.
  selfplay_hands256  256 hands (64 deals of 4), today's default, named; its control is
                  ``selfplay_hands64``.
  selfplay_blind  the same with ``params.restate_card=false``: the card only in the
                  observation, the card-blind control trained in the same experiment.
  vs_nash         ``league=bot_rule``: against the scenario's rule bot, a Nash equilibrium
                  (bluff rate 1/6). The learner plays one seat per group (alternating), only its
                  turns train.
  vs_random       ``league=bot_random``: the same against the uniform random bot.

By default the script runs issue 40's experiment (selfplay and selfplay_blind, seeds 0-4, in
runs/kuhn_card, tabulated in bench/results/kuhn_card/). Issue 27's 15 runs (bench/results/kuhn/)
were trained before the defaults changed; they are reproduced with
``--runs runs/kuhn5 --out bench/results/kuhn --conditions selfplay vs_nash vs_random --
scenario.overrides.params.restate_card=false scenario.overrides.reward.malformed_penalty=-1.0``.
Every experiment registered before 2026-12-07 19:58 UTC trained 16 hands an iteration (the
hands experiment excepted, whose conditions name their sizes): add ``train.seeds_per_step=4
algo.minibatch_size=64`` to its command to reproduce it.

The warm-up (configs/kuhn.yaml ``warmup:``) imitates the ``format`` bot, which for Kuhn Poker
is the random bot: it teaches the reply format (one move word, then the end of the turn) with
uniformly random moves, whatever the card, so it teaches no strategy. It is needed: the base
model named exactly one legal move in 28 of 96 sampled replies and put under 0.001 of its mass
on the exact replies that the table scores (configs/kuhn.yaml has the measurement). Its table
is not uniform (a few hundred random moves, fitted: exploitability 0.34-0.75 by seed), so each
run's start is measured, not assumed.

Every run logs the learner's exact exploitability (``league/exploitability``, chips a hand;
NashConv / 2: 0 at a Nash equilibrium, 11/24 for uniform random play), ``league/nash_conv``,
the table's expected chips against the Nash bot and the random bot (``eval/chips_vs_nash``,
``eval/chips_vs_random``, mean of the two seats) and ``league/malformed_mass``, scored on the
game tree after the warm-up and before the first update (step 0), every ``--every`` updates and
after the last (marl/competition/exploitability_log.py). They are read back from each run's
TensorBoard events (``bench/common.read_scalars``: every tag is logged at every step 0..N, so a
list's index is its step; ``league/exploitability_fresh`` marks the scored steps).

Headline numbers are seed-clustered: the mean of the per-seed values with a 95% t-interval over
seeds (:func:`marl.analysis.stats.seed_clustered`); start -> end changes are paired by seed
(:func:`marl.analysis.stats.mean_interval` over the per-seed differences). The issue's goal, checked
for every condition (it is stated for self-play): the mean exploitability at the end at most half
of the mean at the start, with a paired change whose interval excludes 0.

Only missing runs are trained: a run is done when its final checkpoint is there
(``checkpoints/step_<steps>/state.pt``); a run directory without it (a run that stopped) is
set aside whole (``<condition>.set-aside/``) and trained again. A condition's missing runs are
one sweep on the Ray launcher (``marl train -m ... launcher=ray``, docs/sweeps.md): each run
reserves ``--threads`` CPUs (1), and as many run at once as the cores hold (``--parallel``
caps it). Runs live under ``--runs``/<condition>/seed<k>; each writes ``wall_s.json`` beside its
events (from the launcher's record). ``--steps`` says which checkpoint is final,
also with ``--no-train``.

Sizes (configs/kuhn.yaml): an iteration plays 256 hands (~576 turns in self-play, ~290 learner
turns against a bot) and takes one optimizer step on the full model. Kuhn Poker shows a player
only 12 distinct observations after one system prompt, so generation and the update run each
distinct prompt once (``share_prompts``). The table reports each condition's median
``perf/step_time`` and run time: on a 2-core Zen 5 EPYC, one thread a run and two runs at a
time, a self-play iteration took ~20 s at 256 hands (9.6 s at 64, 7.5 s at 16), and a run ~13
minutes with the warm-up and the 7 exact scorings.

    .venv/bin/python bench/kuhn.py                        # train what is missing, tabulate
    .venv/bin/python bench/kuhn.py --no-train             # tabulate the runs there
    .venv/bin/python bench/kuhn.py --conditions selfplay --seeds 0      # one run
    .venv/bin/python bench/kuhn.py --conditions selfplay --steps 60 --compare-step 30 \
        --runs runs/kuhn_budget --out bench/results/kuhn_budget model.dtype=float32
                                                          # a budget: update 30 of the same runs
    .venv/bin/python bench/kuhn.py --model tiny --steps 2 --seeds 0 --every 1 --threads 1 \\
        --runs /tmp/kuhn_runs --out /tmp/kuhn_out train.seeds_per_step=1 warmup.steps=1
                                                          # a wiring check with the tiny model

Runs that log ``league/exploitability_average`` (since 2026-12-07) also get the average of
their scored tables at the end beside the last iterate (fictitious play's average strategy).

Writes ``--out`` (bench/results/kuhn/): summary.json (per run: command, curves, start/end; per
condition: the seed-clustered numbers and the goal check; per run the final table, cached in
the run as final_table.json), table.md (with what each run learned) and curves.png.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import math
import statistics
import sys
from collections.abc import Callable
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
)

from marl.analysis.stats import seed_clustered  # noqa: E402
from marl.competition.role_eval import json_safe  # noqa: E402
from marl.scenarios.builtin import kuhn_tree  # noqa: E402
from marl.scenarios.builtin.kuhn_tree import INFO_SETS, nash_policy  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _selfplay_hands(hands: int) -> list[str]:
    """Self-play with ``hands`` hands an update (deals of configs/kuhn.yaml's 4 hands) in one
    optimizer step: a minibatch of ``4 * hands`` turns holds every turn (at most 3 a hand), so
    the number and size of the steps stay the same and only the gradient's noise changes."""
    return [
        "league=selfplay",
        f"train.seeds_per_step={hands // 4}",
        f"algo.minibatch_size={4 * hands}",
    ]


CONDITIONS: dict[str, list[str]] = {
    "selfplay": ["league=selfplay"],
    # the card-blind control: self-play as above with the card only in the observation
    "selfplay_blind": ["league=selfplay", "scenario.overrides.params.restate_card=false"],
    "vs_nash": ["league=bot_rule"],
    "vs_random": ["league=bot_random"],
    # against the cycling of naive self-play: the learner plays a pool of its own past
    # snapshots (every 5 updates, the initial one kept; the newest half the time, any uniformly
    # or by PFSP the rest), no bots: averaging over past policies as fictitious play does
    "selfplay_pool": [
        "league=pool",
        "league.snapshot_every=5",
        "league.mix.bot_random=0",
        "league.mix.bot_rule=0",
    ],
    # the hands experiment (docs/competition.md): 16 hands, the size shipped until 2026-12-07;
    # 64, 4x the signal; 256, the default since it met the goal. Each control: the size below
    **{f"selfplay_hands{n}": _selfplay_hands(n) for n in (16, 64, 256)},
}
LABELS = {
    "selfplay": "self-play, card restated (league, GRPO, KL anchor)",
    "selfplay_blind": "self-play, card not restated (the card-blind control)",
    "vs_nash": "against the Nash bot",
    "vs_random": "against the random bot",
    "selfplay_pool": "self-play against a pool of its past snapshots (card restated)",
    "selfplay_hands16": "self-play, 16 hands an update in one optimizer step (card restated)",
    "selfplay_hands64": "self-play, 64 hands an update in one optimizer step (card restated)",
    "selfplay_hands256": "self-play, 256 hands an update in one optimizer step (card restated)",
}
# the average of the scored tables (marl/competition/exploitability_log.py), where logged
AVERAGE = "league/exploitability_average"
# short name -> TensorBoard tag (marl/competition/exploitability_log.py)
METRICS = {
    "exploitability": "league/exploitability",
    "nash_conv": "league/nash_conv",
    "chips_vs_nash": "eval/chips_vs_nash",
    "chips_vs_random": "eval/chips_vs_random",
    "malformed_mass": "league/malformed_mass",
}
# each measure's range: its intervals are clipped to it (chips a hand: unbounded here)
RANGES = {
    "exploitability": (0.0, math.inf),
    "nash_conv": (0.0, math.inf),
    "malformed_mass": (0.0, 1.0),
    "card_spread": (0.0, 1.0),
}
FRESH = "league/exploitability_fresh"
PARSE_FAILURES = "team/parse_failure_rate"  # replies naming no legal move, the bot's included
LAST = 10  # iterations the per-run parse failure rate is averaged over
UNIFORM = 11 / 24  # the uniform random policy's exploitability (NashConv 11/12)
CARD_BLIND_FLOOR = 1 / 3  # no card-blind policy is less exploitable (card_blind_facts)
READS_CARD = 0.25  # a run reads its card: final card spread >= this (pre-registered, issue 40)
# a condition -> its concurrent control
CONTROL = {
    "selfplay": "selfplay_blind",
    "selfplay_pool": "selfplay",
    "selfplay_hands64": "selfplay_hands16",
    "selfplay_hands256": "selfplay_hands64",
}
GRID = 10  # card-blind policies searched on a grid of step 1/GRID per betting history
DEFAULT_RUNS = ROOT / "runs" / "kuhn_card"  # issue 40's experiment (the card restated)
DEFAULT_OUT = ROOT / "bench" / "results" / "kuhn_card"
DEFAULT_CONDITIONS = ["selfplay", "selfplay_blind"]


def run_dir(args: argparse.Namespace, condition: str, seed: int) -> Path:
    return Path(args.runs) / condition / f"seed{seed}"


def finished(args: argparse.Namespace, condition: str, seed: int) -> bool:
    """Whether the run's final checkpoint is there."""
    final = run_dir(args, condition, seed) / "checkpoints" / f"step_{args.steps:06d}"
    return (final / "state.pt").is_file()


def train_missing(args: argparse.Namespace, condition: str, seeds: list[int]) -> None:
    """Train the condition's runs that have no final checkpoint, as one sweep on the Ray
    launcher (``--parallel`` at once, ``--threads`` CPUs each); a stopped run's folder (its
    events would mix with the new run's) is set aside whole and the run trained again."""
    missing = [seed for seed in seeds if not finished(args, condition, seed)]
    if not missing:
        return
    walls = run_sweep(
        [
            "--config-name",
            "kuhn",
            *CONDITIONS[condition],
            f"model={args.model}",
            f"train.steps={args.steps}",
            f"train.exploitability_every={args.every}",
            "logging.progress=false",
            *args.extra,
        ],
        Path(args.runs) / condition,
        missing,
        args.threads,
        args.parallel,
        condition,
    )
    for seed, wall in sorted(walls.items()):
        print(f"  {condition} seed {seed}: {wall:.0f} s", flush=True)


def measure(args: argparse.Namespace, condition: str, seed: int) -> dict[str, Any]:
    """One run's curves at its scored steps, its start and end values, and its timings."""
    import yaml

    where = run_dir(args, condition, seed)
    scalars = read_scalars(where / "tensorboard")
    fresh = scalars.get(FRESH, [])
    if not fresh:
        raise SystemExit(f"{where}: no {FRESH} in its events (was it a Kuhn Poker run?)")
    steps = len(fresh) - 1
    for tag in METRICS.values():
        if len(scalars.get(tag, [])) != steps + 1:
            raise SystemExit(
                f"{where}: {tag} has {len(scalars.get(tag, []))} points for steps 0..{steps}; "
                "events of two runs in one directory? remove it and train again"
            )
    scored = [step for step, flag in enumerate(fresh) if flag > 0.5]
    config = yaml.safe_load((where / "config.yaml").read_text())
    wall = where / "wall_s.json"
    step_times = scalars.get("perf/step_time", [])
    turns = scalars.get("policies/shared/turns", [])
    failures = scalars.get(PARSE_FAILURES, [])[-LAST:]
    average = scalars.get(AVERAGE, [])
    return {
        "condition": condition,
        "seed": seed,
        # runs since the tag exists: the exploitability of the average of the tables scored
        # so far, at the scored steps (fictitious play's average strategy)
        "average": [average[s] for s in scored] if len(average) == steps + 1 else None,
        "command": run_command(where),
        "model": config["model"]["kind"],
        "steps": steps,
        "warmup": {k: config["warmup"][k] for k in ("steps", "bot", "episodes", "lr")},
        "hands_per_step": config["train"]["seeds_per_step"] * config["train"]["group_size"],
        "scored_steps": scored,
        "curves": {name: [scalars[tag][s] for s in scored] for name, tag in METRICS.items()},
        "start": {name: scalars[tag][0] for name, tag in METRICS.items()},
        "end": {name: scalars[tag][-1] for name, tag in METRICS.items()},
        "step_time_median_s": statistics.median(step_times) if step_times else None,
        "learner_turns_per_step": statistics.fmean(turns) if turns else None,
        "parse_failures_last": statistics.fmean(failures) if failures else None,
        "wall_s": json.loads(wall.read_text()) if wall.is_file() else None,
        "final_table": final_table(args, condition, seed),
    }


def final_table(args: argparse.Namespace, condition: str, seed: int) -> dict[str, Any]:
    """What the run learned: its final checkpoint scored as a table of the game (as ``marl eval
    --exploitability`` scores it, with the run's sampling settings). Per information set, the
    probability of the aggressive move (bet, or call) and the malformed mass; with the
    exploitability, which should equal the run's last ``league/exploitability``. Cached in the
    run's ``final_table.json`` (a load of the checkpoint, ~20 s for SmolLM2)."""
    import yaml

    where = run_dir(args, condition, seed)
    cache = where / "final_table.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    from marl.competition.players import build_backends, parse_players
    from marl.runtime.exploitability import exploitability_report

    config = yaml.safe_load((where / "config.yaml").read_text())
    scenario = config["scenario"]["name"]
    overrides = config["scenario"].get("overrides") or {}
    players = parse_players([f"learner={where}", "random"])  # eval's parser wants two players
    report = exploitability_report(
        players, build_backends(players), scenario, overrides, sampling=run_sampling(config)
    )["learner"]
    out = {
        "exploitability": report["exploitability"],
        "aggressive": report["table"],
        "malformed": {key: s["malformed"] for key, s in report["info_sets"].items()},
    }
    cache.write_text(json.dumps(json_safe(out), indent=1) + "\n")
    return out


def clustered(values: list[float], measure: str | None = None) -> dict[str, float] | None:
    """Seed-clustered mean and 95% t-interval (one value per seed; NaN bounds for one seed),
    the interval clipped to the ``measure``'s range in :data:`RANGES` (none: unbounded)."""
    if not values:
        return None
    mean, low, high = seed_clustered([[v] for v in values])
    if not math.isnan(low) and measure in RANGES:
        low, high = max(low, RANGES[measure][0]), min(high, RANGES[measure][1])
    return {"mean": mean, "low": low, "high": high, "seeds": len(values)}


def aggregate(
    runs: list[dict[str, Any]], condition: str, compare_step: int | None = None
) -> dict[str, Any]:
    """A condition's seed-clustered numbers, its goal check and its mean curve; with
    ``compare_step``, also :func:`at_step` (what the updates after that step changed)."""
    mine = [r for r in runs if r["condition"] == condition]
    if not mine:
        return {}
    out: dict[str, Any] = {"seeds": [r["seed"] for r in mine]}
    if compare_step is not None:
        out["at_step"] = at_step(mine, compare_step)
    if all(r.get("average") for r in mine):
        out["average"] = average_of_iterates(mine)
    for name in METRICS:
        start = [r["start"][name] for r in mine]
        end = [r["end"][name] for r in mine]
        out[name] = {
            "start": clustered(start, name),
            "end": clustered(end, name),
            "change": paired(start, end),
        }
    start = [r["start"]["exploitability"] for r in mine]
    end = [r["end"]["exploitability"] for r in mine]
    out["exploitability"]["ratio"] = clustered([e / s for s, e in zip(start, end) if s > 0])
    # end - start / 2 < 0 paired by seed: the end is below half the start
    out["exploitability"]["end_minus_half_start"] = paired([s / 2 for s in start], end)
    out["goal"] = goal_check(start, end)
    spreads = [card_spread(r["final_table"]["aggressive"]) for r in mine]
    out["card_spread"] = clustered(spreads, "card_spread")
    out["reads_card"] = sum(x >= READS_CARD for x in spreads)
    out["curve"] = _mean_curve(mine)
    times = [r["step_time_median_s"] for r in mine if r["step_time_median_s"] is not None]
    walls = [r["wall_s"] for r in mine if r["wall_s"] is not None]
    turns = [r["learner_turns_per_step"] for r in mine if r["learner_turns_per_step"] is not None]
    out["step_time_median_s"] = statistics.median(times) if times else None
    out["wall_s_median"] = statistics.median(walls) if walls else None
    out["learner_turns_per_step"] = statistics.fmean(turns) if turns else None
    return out


def at_step(mine: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """A budget comparison inside each run: the exploitability at update ``step`` (scored in
    the same run, so the same seed, warm-up and first ``step`` updates as a run of ``step``
    updates: the learning rate is constant), its goal check against the start, and the paired
    change from it to the end (what the updates after ``step`` changed). A run not scored at
    ``step`` is a ValueError naming it."""
    values = []
    for r in mine:
        if step not in r["scored_steps"]:
            raise ValueError(
                f"{r['condition']} seed {r['seed']}: not scored at update {step} "
                f"(scored at {r['scored_steps']}); --compare-step must be a multiple of --every"
            )
        values.append(r["curves"]["exploitability"][r["scored_steps"].index(step)])
    end = [r["end"]["exploitability"] for r in mine]
    return {"step": step, **_as_an_end(mine, values), "change_after": paired(values, end)}


def average_of_iterates(mine: list[dict[str, Any]]) -> dict[str, Any]:
    """The average policy at the end (the average of every table the run scored, step 0
    included): its exploitability, the goal checked on it against the start, and the paired
    difference from the last iterate's (average - last)."""
    last = [r["end"]["exploitability"] for r in mine]
    average = [r["average"][-1] for r in mine]
    return {**_as_an_end(mine, average), "minus_last": paired(last, average)}


def _as_an_end(mine: list[dict[str, Any]], values: list[float]) -> dict[str, Any]:
    """Per-seed exploitabilities read as the runs' end: seed-clustered, and the goal checked
    against each run's start."""
    start = [r["start"]["exploitability"] for r in mine]
    return {
        "exploitability": clustered(values, "exploitability"),
        "goal": goal_check(start, values),
    }


def goal_check(start: list[float], end: list[float]) -> dict[str, bool]:
    """Issues 27 and 40's goal on per-seed exploitabilities: the mean end at most half the mean
    start, the paired change's 95% interval below 0, and the end's interval below the card-blind
    floor (one seed: no interval, so the change cannot exclude 0; the end's mean is compared)."""
    change, ended = paired(start, end), clustered(end, "exploitability")
    half = statistics.fmean(end) <= statistics.fmean(start) / 2
    excludes = change is not None and not math.isnan(change["high"]) and change["high"] < 0
    top = ended["mean"] if ended is None or math.isnan(ended["high"]) else ended["high"]
    below_floor = top < CARD_BLIND_FLOOR
    return {
        "end_at_most_half_of_start": half,
        "change_interval_excludes_0": excludes,
        "end_interval_below_card_blind_floor": below_floor,
        "met": half and excludes and below_floor,
    }


def against_control(runs: list[dict[str, Any]], condition: str) -> dict[str, Any] | None:
    """The condition against its concurrent control, paired by seed (condition - control):
    :func:`paired_finals` over the seeds both have, with the control's name."""

    def finals(name: str | None) -> dict[int, tuple[float, float]]:
        return {
            r["seed"]: (r["end"]["exploitability"], card_spread(r["final_table"]["aggressive"]))
            for r in runs
            if r["condition"] == name
        }

    control = CONTROL.get(condition)
    versus = paired_finals(finals(control), finals(condition))
    return None if versus is None else {"control": control, **versus}


def paired_finals(
    base: dict[int, tuple[float, float]], other: dict[int, tuple[float, float]]
) -> dict[str, Any] | None:
    """``other - base`` paired by seed over the seeds both hold, each seed's value its final
    ``(exploitability, card spread)``: the seeds and the two paired differences (None when no
    seed is shared)."""
    seeds = sorted(set(base) & set(other))
    if not seeds:
        return None
    return {
        "seeds": seeds,
        "end_exploitability": paired([base[k][0] for k in seeds], [other[k][0] for k in seeds]),
        "card_spread": paired([base[k][1] for k in seeds], [other[k][1] for k in seeds]),
    }


def _mean_curve(mine: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Exploitability and chips against the Nash bot at the steps every seed scored: the mean
    over seeds with the seed-clustered 95% band."""
    common = sorted(set.intersection(*(set(r["scored_steps"]) for r in mine)))
    curve: dict[str, list[float]] = {"steps": common}
    for name in ("exploitability", "chips_vs_nash"):
        rows = [
            clustered([r["curves"][name][r["scored_steps"].index(step)] for r in mine], name)
            for step in common
        ]
        curve[name] = [x["mean"] for x in rows if x]
        curve[f"{name}_low"] = [x["low"] for x in rows if x]
        curve[f"{name}_high"] = [x["high"] for x in rows if x]
    return curve


def ci(x: dict[str, float] | None, digits: int = 3, sign: bool = False) -> str:
    """``mean [low, high]`` of a :func:`clustered` or :func:`paired` figure (the mean alone for
    one seed; ``-`` for none)."""
    if not x:
        return "-"
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    if math.isnan(x["low"]):
        return f.format(x["mean"])
    return f"{f.format(x['mean'])} [{f.format(x['low'])}, {f.format(x['high'])}]"


def _goal_word(check: dict[str, bool]) -> str:
    return "met" if check["met"] else "not met"


def _beside_the_end(condition: str, a: dict[str, Any]) -> list[str]:
    """The sentences under the table for a condition's average of iterates and its budget
    comparison, where it has them."""
    sentences = []
    if a.get("average"):
        v = a["average"]
        sentences.append(
            f"{condition}, the average of each run's scored tables at the end (a hand played by "
            f"one of them drawn at random): exploitability {ci(v['exploitability'])} (goal "
            f"{_goal_word(v['goal'])}); minus the last iterate's, paired by seed: "
            f"{ci(v['minus_last'], sign=True)}."
        )
    if a.get("at_step"):
        b = a["at_step"]
        sentences.append(
            f"{condition} at update {b['step']} of the same runs: exploitability "
            f"{ci(b['exploitability'])} (goal {_goal_word(b['goal'])} there); the updates after "
            f"it changed it by {ci(b['change_after'], sign=True)} (paired by seed)."
        )
    return [line for sentence in sentences for line in ("", sentence)]


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def markdown(table: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    lines = [
        "Exact exploitability of the learner's policy on Kuhn Poker's game tree, chips a hand "
        f"(NashConv / 2: 0 at a Nash equilibrium, {UNIFORM:.3f} for uniform random play). "
        "Start: after the format warm-up, before the first update; end: after the last. "
        "Seed-clustered means with 95% t-intervals over seeds, clipped to each measure's "
        "range; changes paired by seed. "
        "Goal (issues 27 and 40, for self-play): mean end <= half the mean start, with a "
        "change interval below 0, and (issue 40) the end's interval below the card-blind "
        f"floor {CARD_BLIND_FLOOR:.3f}. Reads its card: final card spread >= {READS_CARD} "
        "(pre-registered in docs/competition.md).",
        "",
        "| condition | seeds | exploitability start -> end | change (paired) | end / start "
        "| goal | reads its card | chips vs Nash start -> end | chips vs random start -> end "
        "| malformed mass start -> end | learner turns / step | step (s) | run (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for condition in CONDITIONS:
        a = table.get(condition)
        if not a:
            continue
        e, n, r, m = (
            a[k] for k in ("exploitability", "chips_vs_nash", "chips_vs_random", "malformed_mass")
        )
        goal = "met" if a["goal"]["met"] else "not met"
        turns = a["learner_turns_per_step"]
        lines.append(
            f"| {condition} | {len(a['seeds'])} | {ci(e['start'])} -> {ci(e['end'])} "
            f"| {ci(e['change'], sign=True)} | {ci(e['ratio'], 2)} | {goal} "
            f"| {a['reads_card']} of {len(a['seeds'])} "
            f"| {ci(n['start'], sign=True)} -> {ci(n['end'], sign=True)} "
            f"| {ci(r['start'], sign=True)} -> {ci(r['end'], sign=True)} "
            f"| {ci(m['start'])} -> {ci(m['end'])} "
            f"| {'-' if turns is None else f'{turns:.1f}'} | {_seconds(a['step_time_median_s'])} "
            f"| {_seconds(a['wall_s_median'])} |"
        )
    for condition in CONDITIONS:
        lines += _beside_the_end(condition, table.get(condition) or {})
    for condition in CONDITIONS:
        c = table.get(f"{condition}_vs_control")
        if c:
            lines += [
                "",
                f"{condition} against its concurrent control {c['control']}, paired by seed "
                f"({len(c['seeds'])} seeds; {condition} - {c['control']}): final exploitability "
                f"{ci(c['end_exploitability'], sign=True)}, final card spread "
                f"{ci(c['card_spread'], 2, sign=True)}.",
            ]
    lines += [
        "",
        "Per run (exploitability start -> end; parse failures: the share of replies in play "
        f"that named no legal move, the bot's included, mean over the last {LAST} iterations; "
        "the command that trained it, with `OMP_NUM_THREADS` = `--threads`):",
        "",
        "| condition | seed | start | end | change | parse failures | command |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s, e = r["start"]["exploitability"], r["end"]["exploitability"]
        failures = r.get("parse_failures_last")
        lines.append(
            f"| {r['condition']} | {r['seed']} | {s:.3f} | {e:.3f} | {e - s:+.3f} "
            f"| {'-' if failures is None else f'{failures:.2f}'} | `{r['command'] or '-'}` |"
        )
    lines += learned_markdown(runs)
    facts = card_blind_facts()
    lines += [
        "",
        "Card-blind policies (one move probability per betting history, whatever the card; "
        "exact, over the 16 pure ones): the best against uniform play wins "
        f"{facts['best_card_blind_vs_uniform']:+.3f} chips a hand (always bet and call: "
        f"{facts['aggressive_vs_uniform']:+.3f}); the best against always bet/call wins "
        f"{facts['best_card_blind_vs_aggressive']:+.3f}, so always bet/call is an equilibrium "
        "among card-blind policies; a best response that reads its card wins "
        f"{facts['aggressive_exploitability']:.3f} against it (its exploitability), and no "
        f"card-blind policy on a grid of step 1/{GRID} is less exploitable (lowest: "
        f"{facts['card_blind_exploitability_floor']:.3f}). As the "
        "second player facing the Nash bot's opening bet, always calling instead of always "
        "folding gains, in chips a hand: "
        + ", ".join(
            f"{card} {gain:+.3f}" for card, gain in facts["call_minus_fold_facing_nash_bet"].items()
        )
        + " (card-blind, calling and folding are worth the same).",
    ]
    return "\n".join(lines)


def card_blind_facts() -> dict[str, Any]:
    """:func:`_card_blind_facts`, worked out once per process (its grid search costs seconds:
    the table and summary.json both show it); each caller gets its own copy."""
    return copy.deepcopy(_card_blind_facts())


@functools.cache
def _card_blind_facts() -> dict[str, Any]:
    """Exact facts about *card-blind* policies (the same move probabilities whatever the card:
    one per betting history, 4 numbers), which explain where a learner that does not condition
    on its card settles. Over the 16 pure card-blind policies: the best one's chips against
    uniform play (always bet and call, +3/8) and against always bet/call (0: no card-blind
    policy gains there, so always bet/call is an equilibrium among card-blind policies), beside
    the best response's gain against always bet/call (its exploitability, 1/3), which needs the
    card (fold the jack to a bet). And, as the second player facing the Nash bot's opening bet,
    what always calling instead of always folding gains with each card, in chips a hand. And
    the lowest exploitability of any card-blind policy on a grid of step 1/``GRID`` over the
    four histories' probabilities (1/3: no card-blind policy there is closer to equilibrium
    than always bet/call)."""
    import itertools

    def chips(p: Any, q: Any) -> float:  # p's chips a hand against q, mean of the two seats
        return sum(kuhn_tree.chips_by_seat(p, q)) / 2

    uniform, aggressive = kuhn_tree.uniform_policy(), kuhn_tree.aggressive_policy()

    def card_blind(probs: tuple[float, ...]) -> Any:  # one probability per betting history
        by_history = dict(zip(kuhn_tree.HISTORIES, probs))
        return kuhn_tree.policy_from(lambda key: by_history[key[1:]])

    histories = len(kuhn_tree.HISTORIES)
    blind = [card_blind(bits) for bits in itertools.product((0.0, 1.0), repeat=histories)]

    nash = nash_policy()

    def call_gain(card: str) -> float:  # second seat facing the Nash bot's opening bet
        def seat1(call: float) -> float:
            table = {key: call if key == card + "b" else 0.5 for key in INFO_SETS}
            return kuhn_tree.chips_by_seat(kuhn_tree.policy_from(table.__getitem__), nash)[1]

        return seat1(1.0) - seat1(0.0)

    steps = [i / GRID for i in range(GRID + 1)]
    grid = itertools.product(steps, repeat=histories)
    floor = min(kuhn_tree.exploitability(card_blind(p)) for p in grid)
    return {
        "card_blind_exploitability_floor": floor,
        "call_minus_fold_facing_nash_bet": {card: call_gain(card) for card in kuhn_tree.CARDS},
        "best_card_blind_vs_uniform": max(chips(p, uniform) for p in blind),
        "aggressive_vs_uniform": chips(aggressive, uniform),
        "best_card_blind_vs_aggressive": max(chips(p, aggressive) for p in blind),
        "aggressive_exploitability": kuhn_tree.exploitability(aggressive),
    }


def learned_markdown(runs: list[dict[str, Any]]) -> list[str]:
    """What each condition learned: the final tables' probability of the aggressive move at
    each information set, every seed, beside the Nash bot's (alpha 1/6) and random play's; one
    column per condition that has runs."""
    nash = nash_policy()
    shown = [c for c in CONDITIONS if any(r["condition"] == c for r in runs)]
    lines = [
        "",
        "What each run learned: the final checkpoint's probability of the aggressive move (bet "
        "at J/Q/K and Jp/Qp/Kp, call at ..b and ..pb; p = check, b = bet) at each information "
        "set, one value per seed (seed order as above), scored as `marl eval --exploitability` "
        "scores it; the Nash bot's for reference (random play: 0.50 everywhere).",
        "",
        "| info set | Nash bot | " + " | ".join(shown) + " |",
        "|---|---|" + "---|" * len(shown),
    ]

    def row(label: str, reference: float, value: Callable[[dict[str, float]], float]) -> str:
        """One table row: the reference value, then each condition's runs, seed by seed."""
        cells = []
        for condition in shown:
            mine = [
                value(r["final_table"]["aggressive"]) for r in runs if r["condition"] == condition
            ]
            cells.append(" ".join(f"{x:.2f}" for x in mine) or "-")
        return f"| {label} | {reference:.2f} | " + " | ".join(cells) + " |"

    for key in INFO_SETS:
        lines.append(row(key, nash[key], lambda table, key=key: table[key]))
    lines.append(row("card spread", card_spread({k: nash[k] for k in INFO_SETS}), card_spread))
    lines += [
        "",
        "Card spread: the largest difference the card makes to the aggressive move's probability "
        "at one betting history (max over histories of max - min over J, Q, K); 0 for a "
        "card-blind policy.",
    ]
    return lines


def card_spread(aggressive: dict[str, float]) -> float:
    """How much a table reads its card: the largest range, over the three cards, of the
    aggressive move's probability at one betting history (0 for a card-blind table)."""
    spreads = []
    for history in kuhn_tree.HISTORIES:
        values = [aggressive[card + history] for card in kuhn_tree.CARDS]
        spreads.append(max(values) - min(values))
    return max(spreads)


def plot(path: Path, table: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for condition, colour in zip(CONDITIONS, ("C0", "C3", "C1", "C2")):
        a = table.get(condition)
        if not a:
            continue
        for r in (r for r in runs if r["condition"] == condition):  # each seed, faint
            axes[0].plot(r["scored_steps"], r["curves"]["exploitability"], color=colour, alpha=0.2)
            axes[1].plot(r["scored_steps"], r["curves"]["chips_vs_nash"], color=colour, alpha=0.2)
        c = a["curve"]
        for ax, name in zip(axes, ("exploitability", "chips_vs_nash")):
            label = f"{LABELS[condition]} ({len(a['seeds'])} seeds)"
            ax.plot(c["steps"], c[name], color=colour, marker="o", ms=3, label=label)
            if len(a["seeds"]) > 1:
                ax.fill_between(
                    c["steps"], c[f"{name}_low"], c[f"{name}_high"], color=colour, alpha=0.15
                )
    axes[0].axhline(UNIFORM, color="grey", linestyle="--", label="uniform random (11/24)")
    axes[0].axhline(0.0, color="black", linewidth=0.8, label="Nash equilibrium (0)")
    axes[0].set(xlabel="RL iterations", ylabel="exploitability (chips a hand)", ylim=(0, None))
    axes[1].axhline(0.0, color="black", linewidth=0.8, label="Nash vs Nash (0)")
    axes[1].set(xlabel="RL iterations", ylabel="expected chips vs the Nash bot (mean of seats)")
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    fig.suptitle("Kuhn Poker: exact exploitability, mean over seeds, 95% seed-clustered band")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conditions", nargs="+", default=DEFAULT_CONDITIONS, choices=CONDITIONS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=30, help="RL iterations per run")
    parser.add_argument("--every", type=int, default=5, help="updates between exact scorings")
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--runs", default=str(DEFAULT_RUNS))
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--threads", type=int, default=1, help="CPUs (torch threads) per run")
    parser.add_argument(
        "--parallel", type=int, default=None, help="runs at once (default: as the cores hold)"
    )
    parser.add_argument(
        "--compare-step",
        type=int,
        default=None,
        help="also tabulate each run's exploitability at this update, paired with its end "
        "(a budget comparison inside the same runs; a multiple of --every)",
    )
    parser.add_argument("--no-train", action="store_true", help="tabulate the runs there only")
    parser.add_argument("extra", nargs="*", help="more marl train overrides for every run")
    args = parser.parse_args()
    if args.steps < 1 or args.every < 1:
        parser.error("--steps and --every must be at least 1")
    if args.compare_step is not None and not 0 < args.compare_step < args.steps:
        parser.error(f"--compare-step {args.compare_step}: must lie strictly between 0 and --steps")
    if args.compare_step is not None and args.compare_step % args.every:
        parser.error(f"--compare-step {args.compare_step}: must be a multiple of --every")
    defaults = Path(args.runs) == DEFAULT_RUNS or Path(args.out) == DEFAULT_OUT
    if (args.model != "smollm2" or args.extra) and defaults:
        parser.error(
            "--model tiny or extra overrides: give --runs and --out too (the defaults hold "
            "the SmolLM2 experiment)"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for condition in args.conditions:
        if not args.no_train:
            train_missing(args, condition, args.seeds)
        for seed in args.seeds:
            if not finished(args, condition, seed):
                print(f"  {condition} seed {seed}: no finished run, left out", flush=True)
                continue
            runs.append(measure(args, condition, seed))
    models = {r["model"] for r in runs}
    if len(models) > 1:
        raise SystemExit(f"{args.runs}: runs of several models ({', '.join(sorted(models))})")
    try:
        table = {c: aggregate(runs, c, args.compare_step) for c in args.conditions}
    except ValueError as error:
        raise SystemExit(f"bench/kuhn.py: {error}") from None
    for condition in args.conditions:
        versus = against_control(runs, condition)
        if versus is not None:
            table[f"{condition}_vs_control"] = versus
    text = markdown(table, runs)
    payload = {
        "args": {k: portable(v) for k, v in vars(args).items()},
        "runs": runs,
        "table": table,
        "card_blind": card_blind_facts(),
        "machine": machine(),
    }
    (out / "summary.json").write_text(json.dumps(json_safe(payload), indent=1) + "\n")
    (out / "table.md").write_text(text + "\n")
    plot(out / "curves.png", table, runs)
    print(text)
    print(f"wrote {out / 'summary.json'}, {out / 'table.md'}, {out / 'curves.png'}")


if __name__ == "__main__":
    main()
