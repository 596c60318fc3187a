"""Shared prompts, measured: generation and the update with ``share_prompts`` on and off.

A rollout of ``signal-v1`` (``--seeds`` scenario seeds x ``--group`` episodes, the GRPO layout:
the episodes of a group start from the same seed, so an agent's first prompt repeats across the
group) gives real turns with real prompts. Then, alternating the two settings ``--rounds``
times, on the same turns:

- **generate**: one batched ``HFBackend.generate`` over every turn's prompt (as a rollout round
  asks for them), ``max_new_tokens`` tokens each;
- **update**: the learner's loss and backward pass over every turn as one minibatch (no
  optimizer step, so each round sees the same weights).

Also reported: the prompt tokens each setting sends through the model, and the learner's
gradient difference between the two (float rounding). A third comparison times the shared
update's length buckets (prompts of 4 lengths, 150 to 1,200 tokens, each shown to 4 turns):
buckets that pad at most 1/8 of their tokens, against one bucket padded to the longest. A fourth
times the update on prompts that are all distinct but share a system prompt (the listener of
``--distinct`` signal-v1 seeds): the common prefix run once, against no prefix sharing.

The default model is a small Llama with the character tokenizer (``--model tiny``: hidden 256,
4 layers, so prompts are long and the share of prompt compute is like a real model's);
``--model embedded`` runs SmolLM2-135M (measure that on a quiet machine).

    nice -n 19 .venv/bin/python bench/shared_prompts.py      # BENCH_QUICK=1: smaller
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, machine, quick, row, timed, write  # noqa: E402

import marl  # noqa: E402
from marl.agents.backends import SamplingConfig  # noqa: E402
from marl.agents.backends.hf import HFBackend  # noqa: E402
from marl.agents.logprobs import MIN_SHARED_PREFIX, response_logprobs  # noqa: E402
from marl.agents.models import ModelSpec, load_model  # noqa: E402
from marl.agents.prompts import prompt_ids  # noqa: E402
from marl.runtime.learner import Learner, LearnerSettings  # noqa: E402
from marl.runtime.rollout import EpisodeSlot, run_episodes  # noqa: E402
from marl.runtime.workers import step_seeds  # noqa: E402


def _spec(kind: str, dtype: str) -> ModelSpec:
    if kind == "tiny":
        return ModelSpec(
            kind="tiny",
            dtype=dtype,
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            intermediate_size=768,
            seed=0,
        )
    return ModelSpec(kind="embedded", dtype=dtype)


def rollout_turns(backend: HFBackend, seeds: int, group: int, tokens: int) -> list[Any]:
    """One iteration's turns of signal-v1 (every turn with a response)."""
    slots = []
    for s, seed in enumerate(step_seeds(0, 0, seeds)):
        for g in range(group):
            slots.append(EpisodeSlot(marl.make("signal-v1"), seed, s, s * group + g))
    result = run_episodes(
        slots,
        {"shared": backend},
        lambda a: "shared",
        SamplingConfig(max_new_tokens=tokens, temperature=1.0),
        seed=0,
    )
    turns = [t for t in result.turns if t.response_ids]
    for i, t in enumerate(turns):  # every turn trains
        t.advantage = 1.0 if i % 2 else -1.0
    return turns


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("tiny", "embedded"), default="tiny")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--seeds", type=int, default=1 if quick() else 4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--distinct",
        type=int,
        default=8 if quick() else 16,
        help="distinct prompts with one system prompt (the prefix comparison)",
    )
    args = p.parse_args()
    import torch

    spec = _spec(args.model, args.dtype)
    model, tokenizer = load_model(spec)
    backends = {
        "shared": HFBackend(model, tokenizer, share_prompts=True),
        "unshared": HFBackend(model, tokenizer, share_prompts=False),
    }
    turns = rollout_turns(backends["shared"], args.seeds, args.group, args.max_new_tokens)
    prompts = [t.prompt_ids for t in turns]
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0)
    learners = {
        name: Learner(
            model, LearnerSettings(share_prompts=name == "shared", minibatch_size=len(turns))
        )
        for name in backends
    }

    def generate(name: str) -> float:
        return timed(lambda: backends[name].generate(prompts, sampling, seed=1))

    def update(name: str) -> float:
        learner = learners[name]

        def step() -> None:
            model.zero_grad(set_to_none=True)
            loss, _ = learner.loss(turns)
            loss.backward()

        return timed(step)

    rng = random.Random(0)
    lengths = [100, 200, 400, 800] if quick() else [150, 300, 600, 1200]
    mixed_prompts, mixed_responses = [], []
    for n in lengths:
        base = [rng.randrange(5, 90) for _ in range(n)]
        for _ in range(2 if quick() else 4):
            mixed_prompts.append(base)
            mixed_responses.append([rng.randrange(5, 90) for _ in range(args.max_new_tokens)])

    def buckets(max_padding: float) -> float:
        def step() -> None:
            model.zero_grad(set_to_none=True)
            out = response_logprobs(
                model, mixed_prompts, mixed_responses, share_prompts=True, max_padding=max_padding
            )
            (out.sampling * out.mask).sum().backward()

        return timed(step)

    listener_prompts, listener_responses = [], []
    for seed in range(args.distinct):
        env = marl.make("signal-v1")
        observations, _ = env.reset(seed=seed)
        listener_prompts.append(
            prompt_ids(
                tokenizer,
                env.system_prompt("listener"),
                observations["listener"] + f" (game {seed})",
            )
        )
        listener_responses.append([rng.randrange(5, 90) for _ in range(args.max_new_tokens)])
    assert len({tuple(x) for x in listener_prompts}) == args.distinct  # all distinct

    def prefix(min_prefix: int) -> float:
        def step() -> None:
            model.zero_grad(set_to_none=True)
            out = response_logprobs(
                model,
                listener_prompts,
                listener_responses,
                share_prompts=True,
                min_prefix=min_prefix,
            )
            (out.sampling * out.mask).sum().backward()

        return timed(step)

    state = machine()
    gen = alternate({n: (lambda n=n: generate(n)) for n in backends}, args.rounds)
    upd = alternate({n: (lambda n=n: update(n)) for n in backends}, args.rounds)
    bkt = alternate(
        {"buckets": lambda: buckets(0.125), "one bucket": lambda: buckets(1.0)}, args.rounds
    )
    pfx = alternate(
        {"prefix once": lambda: prefix(MIN_SHARED_PREFIX), "no prefix sharing": lambda: prefix(0)},
        args.rounds,
    )
    state["load_average_after"] = machine()["load_average"]

    grads = {}
    for name, learner in learners.items():
        model.zero_grad(set_to_none=True)
        learner.loss(turns)[0].backward()
        grads[name] = [q.grad.detach().clone() for q in model.parameters()]
    num = sum(float((a - b).float().pow(2).sum()) for a, b in zip(*grads.values()))
    den = sum(float(b.float().pow(2).sum()) for b in grads["unshared"])
    relative = math.sqrt(num / den)

    distinct = {tuple(x) for x in prompts}
    prompt_tokens = {"unshared": sum(map(len, prompts)), "shared": sum(len(x) for x in distinct)}
    response_tokens = sum(len(t.response_ids) for t in turns)
    summary = []
    for label, r in (("generate", gen), ("update", upd)):
        ratio = r["unshared"]["median"] / r["shared"]["median"]
        for name in ("unshared", "shared"):
            summary.append(
                row(f"{label}, {name}", r[name]["median"], "s", f"min {r[name]['min']:.3g}")
            )
        summary.append(row(f"{label}: unshared / shared", ratio, "x", "median over rounds"))
    for name in ("one bucket", "buckets"):
        summary.append(
            row(
                f"update, prompts of {len(lengths)} lengths, {name}",
                bkt[name]["median"],
                "s",
                f"min {bkt[name]['min']:.3g}",
            )
        )
    summary.append(
        row(
            "length buckets: one / buckets",
            bkt["one bucket"]["median"] / bkt["buckets"]["median"],
            "x",
            f"prompt lengths {lengths}",
        )
    )
    for name in ("no prefix sharing", "prefix once"):
        summary.append(
            row(
                f"update, {args.distinct} distinct prompts, {name}",
                pfx[name]["median"],
                "s",
                f"min {pfx[name]['min']:.3g}",
            )
        )
    summary.append(
        row(
            "common prefix: none / once",
            pfx["no prefix sharing"]["median"] / pfx["prefix once"]["median"],
            "x",
            "signal-v1 listener prompts, one system prompt",
        )
    )
    summary += [
        row(
            "turns / distinct prompts",
            f"{len(turns)} / {len(distinct)}",
            "",
            f"prompt tokens {prompt_tokens['unshared']} -> {prompt_tokens['shared']}; "
            f"response tokens {response_tokens}",
        ),
        row("update gradient, shared vs unshared", relative, "relative", args.dtype),
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"{state['cores_available']} cores, {torch.get_num_threads()} torch threads",
        ),
    ]
    write(
        "shared_prompts",
        {
            "args": vars(args),
            "model": copy.copy(spec.__dict__),
            "generate": gen,
            "update": upd,
            "length_buckets": {"prompt_lengths": lengths, **bkt},
            "common_prefix": {"distinct_prompts": args.distinct, **pfx},
            "turns": len(turns),
            "distinct_prompts": len(distinct),
            "prompt_tokens": prompt_tokens,
            "response_tokens": response_tokens,
            "gradient_relative_difference": relative,
            "machine": state,
        },
        summary,
    )


if __name__ == "__main__":
    main()
