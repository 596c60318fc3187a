"""What the speakers of the signalling runs say: a message-to-target table and topographic
similarity (issue 40 item 2: "whatever the outcome, report ... what the speakers send").

For each run (``<runs>/<condition>/seed<N>``) and each measured step (its checkpoints), the
speaker is shown ``--scenarios`` held-out scenarios of its own run (its code, its sampling);
for every candidate it could have had as the target it writes ``--samples`` messages. Per run
and step (a message is what the reply sends: its ``SAY:`` lines as the markup parser reads
them):

- the message table (:func:`marl.analysis.topography.message_table`): each target object's most
  frequent message and its share;
- ``named``: the share of messages that name the target in English (its colour and its shape
  word both in the message): the speaker's side of a code that is English naming;
- ``topsim``: topographic similarity (Brighton & Kirby 2006) between the targets' attributes and
  the messages.

Seed-clustered means with 95% t-intervals over the runs. Writes ``<out>/code_table.json`` and
``<out>/code_table.md``.

    .venv/bin/python bench/code_table.py --conditions curriculum \\
        --out bench/results/listening_curriculum
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, portable, run_sampling, saved_config  # noqa: E402  (bench helpers)

ROOT = Path(__file__).resolve().parent.parent


def speaker_samples(
    source: Path | str, config: dict[str, Any], scenarios: int, samples: int, seed: int
) -> tuple[list[tuple[str, str]], list[str]]:
    """``(targets, messages)``: each target as ``(colour, shape)`` and the message the speaker
    of ``source`` (a checkpoint, or ``model:<preset>``: the base model) wrote for it on the
    run's scenario and sampling (``config``, its saved config), ``samples`` per candidate of
    ``scenarios`` held-out scenarios drawn from ``seed``."""
    import copy

    from marl.agents.generation import PromptRequest, reply_sampler
    from marl.competition.role_eval import load_pairs
    from marl.runtime.seeding import held_out_seeds
    from marl.scenarios.registry import make

    scenario, overrides = config["scenario"]["name"], config["scenario"].get("overrides") or {}
    (pair,) = load_pairs([f"run={source}"])
    sample = reply_sampler({"speaker": pair.speaker}, lambda agent: "speaker", run_sampling(config))
    requests, targets = [], []
    for scenario_seed in held_out_seeds(f"{seed}:code_table", scenarios):
        env = make(scenario, **overrides)
        env.reset(seed=scenario_seed)
        speaker = env.possible_agents[0]
        for label in env.rules.alternative_labels(speaker):
            view = copy.deepcopy(env)
            view.rules.set_private_label(speaker, label)
            observations, infos = view.observe()
            requests.append(
                PromptRequest(
                    speaker,
                    view.system_prompt(speaker),
                    observations[speaker],
                    infos[speaker],
                    samples,
                )
            )
            colour, shape = label.split(" ", 1)
            targets.append((colour, shape))
    replies = sample(requests, samples)
    pairs = [(t, sent_text(m)) for t, row in zip(targets, replies) for m in row]
    return [t for t, _ in pairs], [m for _, m in pairs]


def sent_text(reply: str) -> str:
    """What a reply sends: its messages' text as the markup parser reads them (``SAY:`` lines,
    joined by `` | ``), empty when it sends none."""
    from marl.protocols.markup import parse_completion

    parsed = parse_completion(reply, require_action=False)
    return " | ".join(message.text for message in parsed.messages)


def describe(targets: list[tuple[str, str]], messages: list[str]) -> dict[str, Any]:
    """The run's table, naming share and topographic similarity."""
    from marl.analysis.topography import message_table, topographic_similarity
    from marl.episodes import normalise

    named = [
        colour in normalise(m).split() and shape in normalise(m).split()
        for (colour, shape), m in zip(targets, messages)
    ]
    return {
        "samples": len(messages),
        "named": sum(named) / len(named) if named else None,
        "topsim": topographic_similarity(targets, messages),
        "table": message_table([" ".join(t) for t in targets], messages),
        "distinct_messages": len({normalise(m) for m in messages}),
    }


def checkpoints_of(
    run: Path, steps: list[int] | None, base: str | None = None
) -> dict[int, Path | str]:
    """The run's checkpoints by step (all, or the steps asked for that exist). With ``base``
    (``model:<preset>``), a run without a step-0 checkpoint whose warm-up trains no speaker
    gets the base model as its step 0: its speaker before RL."""
    found: dict[int, Path | str] = {}
    for path in sorted((run / "checkpoints").glob("step_*")):
        step = int(path.name.split("_")[1])
        if steps is None or step in steps:
            found[step] = path
    if base and 0 not in found and (steps is None or 0 in steps) and found:
        warmup = saved_config(run).get("warmup") or {}
        if not warmup.get("steps") or "speaker" not in (warmup.get("agents") or []):
            found = {0: base, **found}
    return found


def summarise(per_run: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """Seed-clustered ``named`` and ``topsim`` at ``step`` (runs without a value left out)."""
    from marl.analysis.stats import seed_clustered

    out: dict[str, Any] = {"step": step}
    for key in ("named", "topsim"):
        values = [r["steps"][str(step)][key] for r in per_run if str(step) in r["steps"]]
        values = [v for v in values if v is not None]
        out[f"{key}_per_seed"] = values
        if not values:
            out[key] = None
            continue
        mean, low, high = seed_clustered([[v] for v in values])
        finite = low == low  # one run: no interval (NaN)
        out[key] = {"mean": mean, "low": low if finite else None, "high": high if finite else None}
    return out


# each measure's range: its t-interval is clipped to it (a share in [0, 1], a correlation in
# [-1, 1])
RANGES = {"named": (0.0, 1.0), "topsim": (-1.0, 1.0)}


def markdown(result: dict[str, Any]) -> str:
    def fmt(s: dict[str, Any] | None, key: str) -> str:
        if not s:
            return "-"
        if s.get("low") is None:
            return f"{s['mean']:.2f}"
        lo, hi = RANGES[key]
        return f"{s['mean']:.2f} [{max(lo, s['low']):.2f}, {min(hi, s['high']):.2f}]"

    lines = [
        "What the speakers say (bench/code_table.py): per run, "
        f"{result['args']['scenarios']} held-out scenarios x every candidate as the target x "
        f"{result['args']['samples']} messages; seed-clustered means, 95% t-intervals over runs, "
        "clipped to each measure's range (the share naming the target in [0, 1], topographic "
        "similarity in [-1, 1]).",
        "",
        "| condition | step | runs | names the target in English | topographic similarity |",
        "|---|---|---|---|---|",
    ]
    for condition, summaries in result["summary"].items():
        for s in summaries:
            runs = len(s["named_per_seed"])
            lines.append(
                f"| {condition} | {s['step']} | {runs} | {fmt(s['named'], 'named')} | "
                f"{fmt(s['topsim'], 'topsim')} |"
            )
    for run in result["runs"]:
        last = max(run["steps"], key=int)
        lines += [
            "",
            f"{run['condition']} seed {run['seed']}, step {last}: each target's most frequent "
            "message (its share; distinct messages)",
            "",
            "| target | message | share | distinct |",
            "|---|---|---|---|",
        ]
        for row in run["steps"][last]["table"]:
            message = row["top"].replace("|", "\\|") or "(nothing)"
            lines.append(
                f"| {row['meaning']} | {message} | {row['top_share']:.2f} | {row['distinct']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conditions", nargs="+", default=["curriculum"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", nargs="+", type=int, default=None, help="default: all")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "signal5"))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "code_table"))
    parser.add_argument("--scenarios", type=int, default=16)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--base",
        metavar="PRESET",
        help="the base model (a configs/model preset) as step 0 of runs that saved no step-0 "
        "checkpoint and whose warm-up trains no speaker: the speaker before RL",
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    runs, summary = [], {}
    for condition in args.conditions:
        mine = []
        for seed in args.seeds:
            run = Path(args.runs) / condition / f"seed{seed}"
            base = f"model:{args.base}" if args.base else None
            found = checkpoints_of(run, args.steps, base)
            if not found:
                print(f"  {condition} seed {seed}: no checkpoint, left out", flush=True)
                continue
            entry: dict[str, Any] = {"condition": condition, "seed": seed, "steps": {}}
            config = saved_config(run)
            for step, source in found.items():
                print(f"  {condition} seed {seed} step {step} ({source})", flush=True)
                targets, messages = speaker_samples(
                    source, config, args.scenarios, args.samples, seed
                )
                entry["steps"][str(step)] = describe(targets, messages)
                entry.setdefault("sources", {})[str(step)] = portable(source)
            mine.append(entry)
        runs += mine
        steps = sorted({int(s) for r in mine for s in r["steps"]})
        summary[condition] = [summarise(mine, step) for step in steps]
    arguments = {k: portable(v) for k, v in vars(args).items()}
    result = {"args": arguments, "summary": summary, "runs": runs, "machine": machine()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "code_table.json").write_text(json.dumps(result, indent=1, default=str))
    text = markdown(result)
    (out / "code_table.md").write_text(text + "\n")
    print(text)
    print(f"wrote {out / 'code_table.json'}, {out / 'code_table.md'}")


if __name__ == "__main__":
    main()
