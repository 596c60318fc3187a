"""The aten ops one update dispatches, counted on a CPU as a GPU would launch them.

An eager GPU update waits on the host when it dispatches many small ops: each costs the host
10-30 us whatever its size. The count of ops does not depend on the device, nor on the width of
the layers, so it is counted here with a ``TorchDispatchMode`` (every op below autograd, the
backward pass's included) on a model of **SmolLM2-135M's structure**: 30 layers, 9 query heads
on 3 key/value heads, the demo's LoRA adapter (rank 16 on every linear layer), tied embeddings,
but narrow (head size 8, MLP 192, vocabulary 512), so that it runs in seconds.

The work is ``bench/gpu.py``'s update: 32 distinct prompts of 190 tokens (a common 40-token
system prompt, then words), 8 sampled responses each of 40-64 tokens (a GRPO group), 256 turns,
advantages +1, -1, ... (every turn trains), minibatches of 16 turns (the demo's). The update's
microbatching is the code's own:

- this tree: ``algo.microbatch_tokens`` as on the GPU (``null``: sized from free memory; with
  SmolLM2's real shape in bf16, adapters in fp32, on an 80 GB GPU that is 8,192 positions, so
  each 16-turn minibatch of about 1,400 packed positions is one row; ``--budget`` sets it), and
  512 (what ``null`` gives the demo on a 24 GB CPU machine);
- a tree before issue 37 (``microbatch_size``): the H100 review's setting, microbatches of 8
  turns (``--microbatch-size``).

``compute`` counts the ops that launch a kernel on a GPU: every op except views and metadata
(``view``, ``t``, ``transpose``, ``expand``, ``detach``, ...).

    .venv/bin/python bench/update_ops.py                      # this tree
    (cd /tmp/old && .venv/bin/python /path/to/bench/update_ops.py --name update_ops_before)

Writes ``bench/results/update_ops.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import row, write  # noqa: E402

# ops that launch no kernel: views, metadata, aliases
VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "reshape",
        "t",
        "transpose",
        "permute",
        "expand",
        "detach",
        "alias",
        "as_strided",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "split",
        "split_with_sizes",
        "unbind",
        "chunk",
        "narrow",
        "view_as",
        "lift_fresh",
        "_reshape_alias",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "unfold",
        "diagonal",
        "_local_scalar_dense",
        "is_same_size",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "resolve_conj",
        "resolve_neg",
    }
)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def structure_model(seed: int = 0) -> Any:
    """A model of SmolLM2-135M's structure, narrow, with the demo's LoRA adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=72,
        intermediate_size=192,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config).eval()
    return get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS))


def turns(prompts: int = 32, samples: int = 8, seed: int = 0) -> list[Any]:
    """256 turn records of bench/gpu.py's shape (see the module docstring)."""
    from marl.protocols.turn import TurnRecord

    rng = random.Random(seed)
    system = [rng.randrange(1, 512) for _ in range(40)]
    records = []
    for g in range(prompts):
        prompt = system + [rng.randrange(1, 512) for _ in range(150)]
        for j in range(samples):
            response = [rng.randrange(1, 512) for _ in range(rng.randrange(40, 65))]
            turn = TurnRecord(
                "agent",
                "policy",
                g,
                len(records),
                1,
                prompt,
                response,
                [-1.0] * len(response),
                [1] * len(response),
            )
            turn.advantage = 1.0 if j % 2 == 0 else -1.0
            records.append(turn)
    return records


def count(learner: Any, records: list[Any]) -> dict[str, Any]:
    """Ops dispatched by one ``learner.update(records)``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    calls: list[int] = []
    handle = learner.model.register_forward_pre_hook(lambda *_: calls.append(1))
    began = time.perf_counter()
    with Ops() as mode:
        metrics = learner.update(records)
    seconds = time.perf_counter() - began
    handle.remove()
    total = sum(mode.ops.values())
    compute = sum(n for op, n in mode.ops.items() if op not in VIEW_OPS)
    return {
        "ops": total,
        "compute_ops": compute,
        "scalar_reads": mode.ops.get("_local_scalar_dense", 0),
        "forward_calls": len(calls),
        "optimizer_steps": metrics["optimizer_steps"],
        "seconds_counting": seconds,
        "top_ops": dict(mode.ops.most_common(12)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", default="update_ops")
    p.add_argument(
        "--budget",
        type=int,
        nargs="*",
        default=None,
        help="algo.microbatch_tokens values (default: the GPU's null, and 1024)",
    )
    p.add_argument(
        "--microbatch-size",
        type=int,
        default=8,
        help="turns per microbatch in a tree before issue 37 (the H100 review's 8)",
    )
    args = p.parse_args()

    import torch

    from marl.runtime.learner import Learner, LearnerSettings

    torch.set_num_threads(1)
    fields = {f.name for f in dataclasses.fields(LearnerSettings)}
    records = turns()
    runs: dict[str, dict[str, Any]] = {}
    if "microbatch_tokens" in fields:
        from marl.runtime.learner import microbatch_tokens_for

        if args.budget:
            budgets = {f"microbatch_tokens={b}": b for b in args.budget}
        else:
            # what null gives for SmolLM2's real shape in bf16 with 80 GB free (see docstring)
            per_position = 30 * (10 * 576 + 4 * 1536) * 2 + 30 * 4992 * 4 + 3 * 49152 * 4
            on_gpu = microbatch_tokens_for(int(80e9), per_position, "cuda")
            budgets = {
                f"microbatch_tokens=null on an 80 GB GPU ({on_gpu})": on_gpu,
                "microbatch_tokens=512 (the demo on a 24 GB CPU)": 512,
            }
        settings = {k: {"microbatch_tokens": v} for k, v in budgets.items()}
    else:
        settings = {
            f"microbatch_size={args.microbatch_size}": {"microbatch_size": args.microbatch_size}
        }
    for label, extra in settings.items():
        learner = Learner(structure_model(), LearnerSettings(minibatch_size=16, lr=1e-4, **extra))
        runs[label] = count(learner, records)
        r = runs[label]
        print(
            f"{label}: {r['ops']:,} ops ({r['compute_ops']:,} compute), "
            f"{r['forward_calls']} forward calls, {r['scalar_reads']} scalar reads, "
            f"{r['optimizer_steps']:.0f} optimizer steps",
            flush=True,
        )
    summary = [
        row(
            f"ops of a 256-turn update, {label}",
            r["ops"],
            "ops",
            f"{r['compute_ops']:,} launch a kernel; {r['forward_calls']} forward calls; "
            f"{r['scalar_reads']} scalar reads; {r['optimizer_steps']:.0f} optimizer steps",
        )
        for label, r in runs.items()
    ]
    write(
        args.name,
        {
            "runs": runs,
            "turns": len(records),
            "tokens": sum(len(t.prompt_ids) + len(t.response_ids) for t in records),
        },
        summary,
    )


if __name__ == "__main__":
    main()
