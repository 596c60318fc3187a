"""Generation with an adapter per agent: each adapter's prompts share their own prefix, against
only the prefix common to all of a call's prompts.

With ``sharing: lora`` every agent has its own adapter on one base model, and one generate call
serves all the agents that act in a round. Rows under different adapters cannot share keys and
values, and before this change a call shared only the prefix common to all its prompts, which
an agent-specific system prompt cuts short: in ``spotlight-v0`` the acting agents' round-1
prompts have 43 tokens in common, but each agent's prompts over four seeds have 154.
:func:`marl.agents.backends.hf.shared_prefixes` gives each adapter's prompts their own common
prefix, run once per adapter. (`make run`'s ``signal-v1`` is not affected: one agent acts in a
round, so its calls hold one adapter.)

The call is a GRPO rollout's first round (4 seeds x 4 episodes a group, every acting agent,
real prompts), SmolLM2 bf16 with an adapter per agent, 2 threads, 12 new tokens, temperature 1,
for ``--scenarios`` (spotlight-v0: 43 -> 154 shared tokens; public-goods-v0: 151 -> 203).
"Before" is the same backend with every adapter's prefix cut to the call's common one. The
contenders alternate for ``--rounds`` rounds; medians and minima. Writes
``bench/results/adapter_prefix.json``.

    .venv/bin/python bench/adapter_prefix.py [--threads 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, inference_backends, machine, row, timed, write  # noqa: E402

import marl  # noqa: E402
import marl.agents.backends.hf as hf  # noqa: E402
from marl.agents.backends import SamplingConfig  # noqa: E402
from marl.agents.logprobs import MIN_SHARED_PREFIX, common_prefix_length  # noqa: E402
from marl.agents.prompts import prompt_ids  # noqa: E402


def lora_backend(scenario: str) -> tuple[Any, dict[str, str]]:
    """SmolLM2 (bf16) with an adapter per agent of ``scenario``, as ``sharing: lora`` builds
    it, and each agent's adapter name."""
    views, owner = inference_backends(
        {
            "scenario": {"name": scenario},
            "sharing": "lora",
            "model": {"kind": "embedded", "dtype": "bfloat16"},
        }
    )
    base = next(iter(views.values())).base  # each view: the one model under its adapter
    return base, {agent: views[pid].adapter for agent, pid in owner.items()}


def first_round_call(
    scenario: str, tokenizer: Any, adapter_of: dict[str, str], seeds: int, group: int
) -> tuple[list[list[int]], list[str]]:
    """The prompts of a rollout's first round, ``seeds`` x ``group`` episodes (a group repeats
    its seed, as GRPO's does), every agent that acts, and the adapter of each."""
    env = marl.make(scenario)
    prompts, adapters = [], []
    for seed in range(seeds):
        observations, _ = env.reset(seed=seed)
        for agent in env.agents:
            if env.is_idle(agent):
                continue
            ids = prompt_ids(tokenizer, env.system_prompt(agent), observations[agent])
            prompts += [ids] * group
            adapters += [adapter_of[agent]] * group
    return prompts, adapters


def call_wide(texts: Any, adapters: Any) -> list[int]:
    """Before: the prefix common to all of the call's distinct prompts, for each of them."""
    common = common_prefix_length(texts)
    return [common if common >= MIN_SHARED_PREFIX else 0] * len(texts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--scenarios", nargs="+", default=["spotlight-v0", "public-goods-v0"])
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0)
    calls = {}
    for scenario in args.scenarios:
        backend, adapter_of = lora_backend(scenario)
        calls[scenario] = (
            backend,
            *first_round_call(scenario, backend.tokenizer, adapter_of, seeds=4, group=4),
        )
    per_adapter = hf.shared_prefixes

    def generate(
        backend: Any, prompts: list[list[int]], adapters: list[str], before: bool
    ) -> float:
        hf.shared_prefixes = call_wide if before else per_adapter
        try:
            return timed(lambda: backend.generate(prompts, sampling, adapters=adapters, seed=0))
        finally:
            hf.shared_prefixes = per_adapter

    contenders = {}
    for name, (backend, prompts, adapters) in calls.items():
        for side in ("before", "now"):
            contenders[f"{name}/{side}"] = (
                lambda m=backend, p=prompts, a=adapters, b=side == "before": generate(m, p, a, b)
            )
    for run in contenders.values():  # warm-up
        run()
    state = machine()
    measured = alternate(contenders, args.rounds)
    state["load_average_after"] = machine()["load_average"]
    summary = []
    for name, (_, prompts, adapters) in calls.items():
        old, new = measured[f"{name}/before"], measured[f"{name}/now"]
        summary.append(
            row(
                f"generate, {name} round 1 under {len(set(adapters))} adapters: one prefix a call "
                "vs one an adapter",
                f"{old['median']:.2f} vs {new['median']:.2f}",
                "s",
                f"{old['median'] / new['median']:.2f}x; min {old['min']:.2f} vs {new['min']:.2f}; "
                f"{len(prompts)} prompts, {len({tuple(q) for q in prompts})} distinct",
            )
        )
    summary.append(
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"after {state['load_average_after'][0]:.2f}; SmolLM2 bfloat16, {args.threads} threads",
        )
    )
    write("adapter_prefix", {"args": vars(args), "results": measured, "machine": state}, summary)


if __name__ == "__main__":
    main()
