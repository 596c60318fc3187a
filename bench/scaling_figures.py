"""The figures of docs/scaling.md: GPUs, memory per GPU and weight-sync traffic of a run, computed
from the model's size, the number of agents and the sharing mode.

Nothing here is measured: every figure follows from the assumptions in :class:`Assumptions`
(printed with the tables) and the model shape. Run it to regenerate the tables of the doc, or with
other numbers:

    .venv/bin/python bench/scaling_figures.py                       # 8 agents, 7B, 8x80 GB nodes
    .venv/bin/python bench/scaling_figures.py --agents 4 --model smollm2-135m --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass, field

GB = 1e9


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, enough of it to count parameters and LoRA sizes."""

    name: str
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    kv_heads_ratio: float = 1.0  # kv width / hidden (grouped-query attention < 1)
    tied_embeddings: bool = False

    @property
    def params(self) -> float:
        """Parameters: attention (q, o full; k, v by the GQA ratio), gated MLP, embeddings."""
        d, i = self.hidden, self.intermediate
        attn = 2 * d * d + 2 * d * d * self.kv_heads_ratio
        mlp = 3 * d * i
        embed = self.vocab * d * (1 if self.tied_embeddings else 2)
        return self.layers * (attn + mlp + 2 * d) + embed

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection a LoRA adapter can target."""
        d, i, kv = self.hidden, self.intermediate, int(self.hidden * self.kv_heads_ratio)
        return {
            "q_proj": (d, d),
            "k_proj": (d, kv),
            "v_proj": (d, kv),
            "o_proj": (d, d),
            "gate_proj": (d, i),
            "up_proj": (d, i),
            "down_proj": (i, d),
        }

    def lora_params(self, rank: int, targets: list[str]) -> float:
        """A LoRA adapter's parameters: r x (in + out) per targeted projection per layer."""
        shapes = self.linear_shapes()
        return self.layers * sum(rank * sum(shapes[t]) for t in targets)


MODELS = {
    # Llama-2-7B: 6.7B parameters
    "7b": ModelShape("llama-7b", hidden=4096, layers=32, intermediate=11008, vocab=32000),
    # SmolLM2-135M-Instruct, the embedded model: 134.5M parameters (GQA 3 of 9 heads, tied)
    "smollm2-135m": ModelShape(
        "smollm2-135m",
        hidden=576,
        layers=30,
        intermediate=1536,
        vocab=49152,
        kv_heads_ratio=1 / 3,
        tied_embeddings=True,
    ),
}


@dataclass(frozen=True)
class Assumptions:
    """What the figures take for granted; change them with the command-line flags."""

    gpu_memory_gb: float = 80.0  # an A100/H100 80 GB
    gpus_per_node: int = 8
    weight_bytes: int = 2  # bf16 weights, for training and for inference
    # AdamW as marl's learner runs it with model.dtype=bfloat16: bf16 weights + bf16 grads +
    # two bf16 moments = 2 + 2 + 4 bytes/param. Mixed precision with fp32 master weights and
    # fp32 moments would be 2 + 2 + 4 + 8 = 16 bytes/param (use --optimizer-bytes 12).
    optimizer_bytes: float = 4.0  # per trainable parameter, beyond weights and grads
    kl_reference: bool = False  # algo.beta > 0 keeps a frozen copy (a LoRA policy needs none)
    activation_gb: float = 12.0  # per learner: a minibatch of 16 x 1k tokens, checkpointed
    kv_cache_gb: float = 20.0  # per inference engine, for a rollout batch's KV cache
    lora_rank: int = 16
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"]
    )
    rollout_workers: int = 8  # inference engines that receive every sync
    link_gb_s: dict[str, float] = field(
        default_factory=lambda: {
            "NVLink (same node)": 300.0,
            "InfiniBand 400 Gb/s": 50.0,
            "Ethernet 100 Gb/s": 12.5,
            "Ray object store (TCP, per stream)": 2.0,
        }
    )


def learner_memory_gb(model: ModelShape, lora: bool, a: Assumptions) -> float:
    """Memory of one policy's learner: weights, grads and optimizer of what trains, the frozen
    base of a LoRA policy, a KL reference if any, activations."""
    p = model.params
    if lora:
        trainable = model.lora_params(a.lora_rank, a.lora_targets)
        base = p * a.weight_bytes  # frozen, no grads, no optimizer; it is also the KL reference
        total = base + trainable * (a.weight_bytes * 2 + a.optimizer_bytes)
    else:
        total = p * (a.weight_bytes * 2 + a.optimizer_bytes)
        if a.kl_reference:
            total += p * a.weight_bytes
    return total / GB + a.activation_gb


def plan(model: ModelShape, agents: int, sharing: str, a: Assumptions, layout: str = "all") -> dict:
    """GPUs, memory per GPU and sync traffic of one sharing mode.

    ``layout``: ``all`` = every rollout engine serves every policy (what marl's rollout workers
    do); ``per-policy`` = the engines are split among the policies, each serving one.
    """
    policies = 1 if sharing == "shared" else agents
    lora = sharing == "lora"
    per_learner = learner_memory_gb(model, lora, a)
    # learners: packed several to a GPU when they fit (fractional num_gpus), else sharded
    learners_per_gpu = max(1, math.floor(a.gpu_memory_gb / per_learner))
    gpus_per_learner = math.ceil(per_learner / a.gpu_memory_gb)  # > 1: needs FSDP/ZeRO sharding
    learner_gpus = (
        policies * gpus_per_learner
        if gpus_per_learner > 1
        else math.ceil(policies / learners_per_gpu)
    )
    weights_gb = model.params * a.weight_bytes / GB
    adapter_gb = model.lora_params(a.lora_rank, a.lora_targets) * a.weight_bytes / GB
    per_policy = layout == "per-policy" and policies > 1
    served = 1 if per_policy else policies  # policies one engine holds
    if lora:  # one base + the adapters it serves
        engine_gb = weights_gb + served * adapter_gb + a.kv_cache_gb
        policy_sync_gb = adapter_gb
    else:
        engine_gb = served * weights_gb + a.kv_cache_gb
        policy_sync_gb = weights_gb
    gpus_per_engine = math.ceil(engine_gb / a.gpu_memory_gb)  # > 1: tensor parallel
    engines = max(a.rollout_workers, policies) if per_policy else a.rollout_workers
    inference_gpus = engines * gpus_per_engine
    total = learner_gpus + inference_gpus
    receivers = engines / policies if per_policy else engines  # engines each policy syncs to
    total_sync = policies * receivers * policy_sync_gb
    # the busiest link, with plain unicast transfers (what the Ray object store does): a learner's
    # link sends one copy per receiving engine; an engine's link receives every policy it serves
    busiest = max(receivers, served) * policy_sync_gb
    return {
        "sharing": sharing + (" (engine per policy)" if per_policy else ""),
        "policies": policies,
        "learner_memory_gb": round(per_learner, 1),
        "learners_per_gpu": learners_per_gpu if gpus_per_learner == 1 else f"1/{gpus_per_learner}",
        "learner_gpus": learner_gpus,
        "engines": engines,
        "engine_memory_gb": round(engine_gb, 1),
        "gpus_per_engine": gpus_per_engine,
        "inference_gpus": inference_gpus,
        "total_gpus": total,
        "nodes": math.ceil(total / a.gpus_per_node),
        "sync_gb_per_policy": round(policy_sync_gb, 4),
        "sync_gb_total": round(total_sync, 3),
        "sync_gb_busiest_link": round(busiest, 3),
        "sync_seconds": {link: round(busiest / bw, 2) for link, bw in a.link_gb_s.items()},
    }


def markdown(model: ModelShape, agents: int, rows: list[dict], a: Assumptions) -> str:
    """The tables of docs/scaling.md."""
    out = [
        f"Model {model.name}: {model.params / 1e9:.2f}B parameters; LoRA r={a.lora_rank} on "
        f"{', '.join(a.lora_targets)}: {model.lora_params(a.lora_rank, a.lora_targets) / 1e6:.1f}M "
        f"parameters per adapter. {agents} agents, {a.gpus_per_node} x {a.gpu_memory_gb:g} GB "
        f"GPUs per node, {a.rollout_workers} rollout engines.",
        "",
        "| sharing | policies | memory per learner | learners per GPU | learner GPUs | engines | "
        "memory per engine | GPUs per engine | inference GPUs | total GPUs | nodes |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['sharing']} | {r['policies']} | {r['learner_memory_gb']} GB | "
            f"{r['learners_per_gpu']} | {r['learner_gpus']} | {r['engines']} | "
            f"{r['engine_memory_gb']} GB | {r['gpus_per_engine']} | {r['inference_gpus']} | "
            f"{r['total_gpus']} | {r['nodes']} |"
        )
    links = list(a.link_gb_s)
    out += [
        "",
        "Weight sync per iteration: every policy's new weights to every engine that serves it. "
        "Time = the busiest link's bytes / its bandwidth:",
        "",
        "| sharing | one policy | total moved | busiest link | " + " | ".join(links) + " |",
        "|---|---|---|---|" + "---|" * len(links),
    ]
    for r in rows:
        out.append(
            f"| {r['sharing']} | {_size(r['sync_gb_per_policy'])} | "
            f"{_size(r['sync_gb_total'])} | {_size(r['sync_gb_busiest_link'])} | "
            + " | ".join(f"{r['sync_seconds'][link]:g} s" for link in links)
            + " |"
        )
    return "\n".join(out)


def _size(gb: float) -> str:
    return f"{gb:.1f} GB" if gb >= 1 else f"{gb * 1000:.0f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="7b")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--gpu-memory-gb", type=float, default=80.0)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--optimizer-bytes", type=float, default=4.0)
    parser.add_argument("--rollout-workers", type=int, default=8)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--kl-reference", action="store_true")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    a = Assumptions(
        gpu_memory_gb=args.gpu_memory_gb,
        gpus_per_node=args.gpus_per_node,
        optimizer_bytes=args.optimizer_bytes,
        rollout_workers=args.rollout_workers,
        lora_rank=args.lora_rank,
        kl_reference=args.kl_reference,
    )
    model = MODELS[args.model]
    rows = [
        plan(model, args.agents, "shared", a),
        plan(model, args.agents, "independent", a),
        plan(model, args.agents, "independent", a, layout="per-policy"),
        plan(model, args.agents, "lora", a),
    ]
    print(markdown(model, args.agents, rows, a))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": asdict(model), "assumptions": asdict(a), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
