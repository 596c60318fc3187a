"""Why the Kuhn Poker runs end card-blind: how far one update at one card moves the other cards.

At each of Kuhn Poker's 12 information sets (a card, J/Q/K, and a betting history) the policy
is one number, the log-odds of the aggressive move over the legal pair,
``l = log pi(aggressive reply) - log pi(pass reply)`` (the replies and prompts the exact table
scores: :func:`marl.runtime.exploitability.info_set_prompts`). A gradient step of size ``lr``
along ``g_a = grad l_a`` changes ``l_b`` by ``lr * g_a . g_b`` to first order, so

    transfer(a -> b) = (g_a . g_b) / (g_a . g_a)

is how much an update that raises the log-odds at ``a`` by one raises it at ``b``. This
benchmark computes the 12 gradients over every trainable weight and reports, per model:

- ``same history, other card``: the mean transfer (and cosine) between the three cards of one
  betting history (J vs Q vs K after the same moves). 1 means an update taught at the jack moves
  the king's move as much: the model cannot learn to treat them differently in that direction.
- ``same card, other history``: the same between histories of one card, for comparison.

The card-reading part of an update is what is left after the common part: with transfer t
between two cards (equal gradient norms), a step along ``g_a - g_b``, which asks the two cards
to move in opposite directions, moves each (1 - t) times as far as a step along its own gradient
alone would. These are plain gradient steps; the runs' AdamW rescales each weight's step, which
this first-order measure leaves out.

``--card-in-head`` adds the untrained model scored with its card restated right before the move,
in two heads instead of ``ACTION:``: ``My card is J.``, a line break and ``ACTION:`` (a variant
built here), and ``My card is J. ACTION:`` on one line, which is the scenario's own
``params.restate_card`` (the note is prompt context; the game still gets ``ACTION: <move>``).
Neither is what the 15 runs of bench/kuhn.py trained on.

    .venv/bin/python bench/kuhn_gradients.py                       # SmolLM2 as downloaded
    .venv/bin/python bench/kuhn_gradients.py --card-in-head --run runs/kuhn5/vs_random/seed2
    .venv/bin/python bench/kuhn_gradients.py --model tiny --out /tmp/kg    # wiring check

Writes ``--out`` (bench/results/kuhn_gradients/): summary.json and table.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from pathlib import Path
from statistics import fmean
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, compose, machine, portable, run_sampling  # noqa: E402  (bench helpers)

from marl.agents.action_scores import reply_ids  # noqa: E402
from marl.agents.logprobs import response_logprobs  # noqa: E402

SCENARIO = "kuhn-poker-v0"
CARDS = ("J", "Q", "K")
HISTORIES = ("", "p", "b", "pb")  # first move, after a check, facing a bet, check then bet
DEFAULT_OUT = ROOT / "bench" / "results" / "kuhn_gradients"


def log_odds_gradients(
    model: Any,
    tokenizer: Any,
    sampling: Any,
    overrides: dict[str, Any],
    card_in_head: str | None = None,
) -> dict[str, torch.Tensor]:
    """Per information set key, the gradient of its aggressive-move log-odds over every weight
    that requires one, flattened to one fp32 vector (n_params,) on the CPU. ``card_in_head``
    (None, or the separator before ``ACTION:``): score each set as if the reply had begun by
    restating the card; " " is the scenario's own ``params.restate_card`` (what a run trains
    with), a line break :func:`restate_card`."""
    from marl.runtime.exploitability import info_set_prompts

    if card_in_head == " ":
        params = {**(overrides.get("params") or {}), "restate_card": True}
        overrides = {**overrides, "params": params}
    sets = info_set_prompts(tokenizer, SCENARIO, overrides, sampling=sampling)
    if card_in_head == "\n":
        sets = restate_card(sets, tokenizer)
    weights = [p for p in model.parameters() if p.requires_grad]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.eval()  # no dropout: the gradient of the scored table
    out: dict[str, torch.Tensor] = {}
    for s in sets:
        replies = [reply_ids(tokenizer, text, tokenizer.eos_token_id) for text in s.replies]
        scored = response_logprobs(
            model,
            [s.prompt_ids] * 2,
            replies,
            temperature=sampling.temperature,
            pad_token_id=pad,
        )
        sums = (scored.sampling * scored.mask).sum(dim=1)  # (2,): log pi(pass), log pi(aggr.)
        grads = torch.autograd.grad(sums[1] - sums[0], weights, allow_unused=True)
        out[s.key] = torch.cat(
            [
                (g if g is not None else torch.zeros_like(w)).detach().float().reshape(-1).cpu()
                for g, w in zip(grads, weights)
            ]
        )  # (n_params,)
    return out


def restate_card(sets: list[Any], tokenizer: Any) -> list[Any]:
    """The sets with each prompt's response head ``ACTION:`` replaced by ``My card is <card>.``,
    a line break and ``ACTION:``: the card on the line before the move (a prompt variant that
    no scenario option gives; ``params.restate_card`` puts it on the ``ACTION:`` line)."""
    from marl.agents.heads import ACTION_HEAD, head_ids

    n = len(head_ids(tokenizer, ACTION_HEAD))
    out = []
    for s in sets:
        if list(s.prompt_ids[-n:]) != head_ids(tokenizer, ACTION_HEAD):
            raise SystemExit("--card-in-head needs the response head (sampling.response_prefix)")
        head = head_ids(tokenizer, f"My card is {s.key[0]}.\n{ACTION_HEAD}")
        out.append(dataclasses.replace(s, prompt_ids=list(s.prompt_ids[:-n]) + head))
    return out


def transfer_summary(grads: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The mean transfer and cosine between cards of one history and between histories of one
    card, with every pair's values."""
    keys = list(grads)
    dots = {(a, b): float(grads[a] @ grads[b]) for a in keys for b in keys}

    def pair(a: str, b: str) -> dict[str, float]:
        return {
            "transfer": dots[a, b] / dots[a, a],
            "cosine": dots[a, b] / (dots[a, a] * dots[b, b]) ** 0.5,
        }

    same_history = {
        f"{a}->{b}": pair(a, b)
        for h in HISTORIES
        for a, b in itertools.permutations([c + h for c in CARDS], 2)
    }
    same_card = {
        f"{a}->{b}": pair(a, b)
        for c in CARDS
        for a, b in itertools.permutations([c + h for h in HISTORIES], 2)
    }

    def means(pairs: dict[str, dict[str, float]]) -> dict[str, float]:
        return {k: fmean(p[k] for p in pairs.values()) for k in ("transfer", "cosine")}

    return {
        "same_history_other_card": {**means(same_history), "pairs": same_history},
        "same_card_other_history": {**means(same_card), "pairs": same_card},
        "gradient_norm": {k: dots[k, k] ** 0.5 for k in keys},
    }


def load(spec: str, model_name: str) -> tuple[Any, Any, Any, dict[str, Any]]:
    """``(model, tokenizer, sampling, scenario overrides)`` for a run directory (its final
    checkpoint, its sampling settings) or, for ``base``, the model before any training with
    configs/kuhn.yaml's settings."""
    import yaml

    from marl.competition.players import build_backends, parse_players

    if spec == "base":
        config = compose([f"model={model_name}"], config_name="kuhn")
        player = f"model:{model_name}"
    else:
        config = yaml.safe_load((Path(spec) / "config.yaml").read_text())
        player = f"learner={spec}"
    players = parse_players([player, "random"])  # the parser wants two players
    backend = build_backends(players)[players[0].name]
    overrides = config["scenario"].get("overrides") or {}
    return backend.model, backend.tokenizer, run_sampling(config), overrides


def label(spec: str, model_name: str, restated: str | None) -> str:
    """A row's name: the untrained model (and whether its card is restated), or the run's
    directory relative to the checkout when it lies inside."""
    if spec == "base":
        where = {None: "", "\n": ", card restated on the line before ACTION:"}
        return f"{model_name}, untrained" + where.get(restated, ", card restated before ACTION:")
    return str(portable(str(Path(spec).resolve())))


def markdown(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "How far an update at one Kuhn Poker information set moves the others (first order): "
        "transfer(a -> b) = g_a.g_b / g_a.g_a, g = the gradient of the aggressive move's "
        "log-odds over every weight. 1 = the update moves b as much as a; the card-reading "
        "part of an update between two cards scales with 1 - transfer.",
        "",
        "| model | same history, other card: transfer | cosine | same card, other history: "
        "transfer | cosine |",
        "|---|---|---|---|---|",
    ]
    for name, r in results.items():
        a, b = r["same_history_other_card"], r["same_card_other_history"]
        lines.append(
            f"| {name} | {a['transfer']:.4f} | {a['cosine']:.4f} | {b['transfer']:.4f} | "
            f"{b['cosine']:.4f} |"
        )
    lines += ["", "Per history (cosine between the cards' gradients, mean of the 3 pairs):", ""]
    lines += ["| model | " + " | ".join(h or "(first move)" for h in HISTORIES) + " |"]
    lines += ["|---|" + "---|" * len(HISTORIES)]
    for name, r in results.items():
        pairs = r["same_history_other_card"]["pairs"]
        cells = []
        for h in HISTORIES:
            mine = [p["cosine"] for k, p in pairs.items() if k.split("->")[0][1:] == h]
            cells.append(f"{fmean(mine):.4f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    parser.add_argument("--run", action="append", default=[], help="a run directory (repeat)")
    parser.add_argument("--no-base", action="store_true", help="skip the untrained model")
    parser.add_argument(
        "--card-in-head",
        action="store_true",
        help="also score the untrained model with the card restated right before the move",
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    specs: list[tuple[str, str | None]] = [("base", None)] if not args.no_base else []
    specs += [("base", "\n"), ("base", " ")] if args.card_in_head else []
    specs += [(run, None) for run in args.run]
    if not specs:
        parser.error("nothing to measure: drop --no-base, or give --run or --card-in-head")
    results: dict[str, dict[str, Any]] = {}
    for spec, restated in specs:
        name = label(spec, args.model, restated)
        print(f"  {name}: 12 gradients", flush=True)
        model, tokenizer, sampling, overrides = load(spec, args.model)
        grads = log_odds_gradients(model, tokenizer, sampling, overrides, restated)
        results[name] = transfer_summary(grads)
        del model, grads
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"model": args.model, "machine": machine(), "results": results}
    (out / "summary.json").write_text(json.dumps(payload, indent=1) + "\n")
    text = markdown(results)
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"wrote {out / 'summary.json'}, {out / 'table.md'}")


if __name__ == "__main__":
    main()
