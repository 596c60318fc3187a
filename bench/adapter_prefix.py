"""Generation with an adapter per agent: each adapter's prompts share their own prefix, against
only the prefix common to all of a call's prompts.

`make run` trains a LoRA adapter per agent (``sharing: lora``), and one generate call serves
both agents of ``signal-v1``. The speaker's and the listener's prompts part after 23 tokens (the
system prompt names the role early), but the prompts of one agent share 97-139 tokens (system
prompt, role, round). Before, a call shared only what all its prompts have in common, which is
less than ``MIN_SHARED_PREFIX`` here, so every distinct prompt was prefilled whole. Now
:func:`marl.agents.backends.hf.shared_prefixes` gives each adapter's prompts their own common
prefix, run once per adapter.

Two calls as `make run` makes them, on real round-1 prompts through the demo's adapters
(SmolLM2 bf16, 2 threads, 12 new tokens, temperature 1): a training rollout (4 seeds x 4
episodes a group x 2 agents: 32 prompts, 8 distinct) and a held-out evaluation (64 seeds x 2
agents: 128 prompts, 80 distinct). "Before" is the same backend with every shared prefix set to
0. The contenders alternate for ``--rounds`` rounds; medians and minima. Writes
``bench/results/adapter_prefix.json``.

    .venv/bin/python bench/adapter_prefix.py [--threads 2] [--rounds 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, machine, row, timed, write  # noqa: E402

import marl  # noqa: E402
import marl.agents.backends.hf as hf  # noqa: E402
from marl.agents.backends import SamplingConfig  # noqa: E402
from marl.agents.prompts import prompt_ids  # noqa: E402

SCENARIO = "signal-v1"


def demo_backend(threads: int) -> tuple[Any, dict[str, str]]:
    """The demo's inference backend (one SmolLM2, an adapter per agent) and each agent's
    adapter name."""
    import torch

    from marl.config import load_config
    from marl.policies import InferencePolicies
    from marl.policy_map import plan_for

    torch.set_num_threads(threads)
    loaded = load_config({"scenario": {"name": SCENARIO},
                          "model": {"kind": "embedded", "dtype": "bfloat16"}, "sharing": "lora"})
    plan = plan_for(loaded)
    views = InferencePolicies(plan, loaded).backends  # policy -> its view of the one model
    base = next(iter(views.values())).base
    return base, {a: views[pid].adapter for pid, spec in plan.policies.items() for a in spec.agents}


def call_prompts(tokenizer: Any, adapter_of: dict[str, str], seeds: range, group: int
                 ) -> tuple[list[list[int]], list[str]]:
    """Round-1 prompts of ``seeds`` x ``group`` episodes (a group repeats its seed, as GRPO's
    does), every agent's, and the adapter of each."""
    env = marl.make(SCENARIO)
    prompts, adapters = [], []
    for seed in seeds:
        observations, _ = env.reset(seed=seed)
        for agent in env.agents:
            ids = prompt_ids(tokenizer, env.system_prompt(agent), observations[agent])
            prompts += [ids] * group
            adapters += [adapter_of[agent]] * group
    return prompts, adapters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    backend, adapter_of = demo_backend(args.threads)
    sampling = SamplingConfig(max_new_tokens=12, temperature=1.0)
    calls = {
        "training rollout (4 seeds x 4 x 2 agents)": call_prompts(
            backend.tokenizer, adapter_of, range(4), 4),
        "held-out evaluation (64 seeds x 2 agents)": call_prompts(
            backend.tokenizer, adapter_of, range(1000, 1064), 1),
    }
    per_adapter = hf.shared_prefixes

    def generate(prompts: list[list[int]], adapters: list[str], before: bool) -> float:
        hf.shared_prefixes = (lambda texts, _: [0] * len(texts)) if before else per_adapter
        try:
            return timed(lambda: backend.generate(prompts, sampling, adapters=adapters, seed=0))
        finally:
            hf.shared_prefixes = per_adapter

    contenders = {}
    for name, (prompts, adapters) in calls.items():
        for side in ("before", "now"):
            contenders[f"{name}/{side}"] = (
                lambda p=prompts, a=adapters, b=side == "before": generate(p, a, b)
            )
    for run in contenders.values():  # warm-up
        run()
    state = machine()
    measured = alternate(contenders, args.rounds)
    state["load_average_after"] = machine()["load_average"]
    summary = []
    for name, (prompts, _) in calls.items():
        old, new = measured[f"{name}/before"], measured[f"{name}/now"]
        summary.append(row(
            f"generate, {name}: one prefix a call vs one an adapter",
            f"{old['median']:.2f} vs {new['median']:.2f}", "s",
            f"{old['median'] / new['median']:.2f}x; min {old['min']:.2f} vs {new['min']:.2f}; "
            f"{len(prompts)} prompts, {len({tuple(q) for q in prompts})} distinct"))
    summary.append(row("load average at start", state["load_average"][0], "",
                       f"after {state['load_average_after'][0]:.2f}; SmolLM2 bfloat16, "
                       f"{args.threads} threads"))
    write("adapter_prefix", {"args": vars(args), "results": measured, "machine": state},
          summary)


if __name__ == "__main__":
    main()
