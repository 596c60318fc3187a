"""The HF backend's two decoding loops on this machine: transformers' ``generate`` against the
fixed-shape loop of :mod:`marl.agents.decode` (``HFBackend(decode="generate"|"static")``).

Both run after the same prefill, with the same sampling; they give the same tokens
(``tests/agents/test_decode_loop.py``). A call samples ``n`` completions of ``G`` prompts that
share a system prefix of ``--prefix`` tokens, each with 40-80 tokens of its own (random ids),
at temperature 1 with a seed. A step's time is ``(call of T + 1 tokens - call of 1 token) / T``
(the prefill cancels out); tokens/s is rows over that. The model is SmolLM2-135M's shape with
random weights (``--model shape``: random weights decode like the real ones, and the
embedded SmolLM2 need not be fetched), the embedded SmolLM2 itself, or the tiny test model.
The contenders alternate, ``--rounds`` rounds; median and minimum. On CUDA the same script
times ``decode="graph"`` too. Writes ``bench/results/decode_loop.json``.

    .venv/bin/python bench/decode_loop.py [--model shape|embedded|tiny] [--threads 1]
    .venv/bin/python bench/decode_loop.py --dtype bfloat16 --calls 4x4 16x16 64x4  # on CUDA

Measured here (AMD EPYC, 2 cores shared, fp32, one thread, 8 rounds, load 2.4 then 1.1):
79.4 vs 79.3 ms a step at 4 rows, 138.9 vs 141.7 ms at 16 (equal within noise); on the tiny
model, where Python overhead is most of a step, 1.1 vs 0.9 ms at 4 rows and 1.4 vs 1.0 ms at 16.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, machine, row, timed, write  # noqa: E402

from marl.agents.backends import SamplingConfig  # noqa: E402
from marl.agents.backends.hf import HFBackend  # noqa: E402


def smollm2_shape(dtype: Any) -> tuple[Any, Any]:
    """SmolLM2-135M's architecture with random weights (seed 0), and the tiny model's character
    tokenizer (the backend needs only its pad and EOS ids; other ids decode to nothing)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from marl.agents.models import build_char_tokenizer, prepare_tokenizer

    tokenizer = prepare_tokenizer(build_char_tokenizer())
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval(), tokenizer


def step_seconds(backend: HFBackend, prompts: list[list[int]], n: int, tokens: int) -> float:
    """Seconds per decoding step of one call of ``prompts`` x ``n`` rows."""
    many = SamplingConfig(max_new_tokens=tokens + 1, temperature=1.0, n=n)
    one = SamplingConfig(max_new_tokens=1, temperature=1.0, n=n)
    return (
        timed(lambda: backend.generate(prompts, many, seed=0))
        - timed(lambda: backend.generate(prompts, one, seed=0))
    ) / tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("shape", "embedded", "tiny"), default="shape")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=32, help="T: decoding steps timed")
    p.add_argument("--prefix", type=int, default=48, help="shared system-prefix tokens")
    p.add_argument("--calls", nargs="+", default=["1x4", "4x4"], help="G x n per call")
    args = p.parse_args()
    import torch

    from marl.agents.models import ModelSpec, load_model

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    if args.model == "shape":
        model, tokenizer = smollm2_shape(dtype)
    else:
        model, tokenizer = load_model(ModelSpec(kind=args.model, dtype=args.dtype))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    modes = ["generate", "static"] + (["graph"] if device == "cuda" else [])
    backends = {mode: HFBackend(model, tokenizer, device=device, decode=mode) for mode in modes}
    rng = random.Random(0)
    top = min(len(tokenizer), 100) if args.model == "tiny" else 49000
    system = [rng.randrange(5, top) for _ in range(args.prefix)]
    calls = {}
    for spec in args.calls:
        groups, n = (int(x) for x in spec.split("x"))
        prompts = [
            system + [rng.randrange(5, top) for _ in range(rng.randrange(40, 81))]
            for _ in range(groups)
        ]
        calls[f"{groups * n} rows ({groups} prompts x {n})"] = (prompts, n)
    state = machine()
    contenders = {
        f"{name}/{mode}": lambda b=backends[mode], c=call: step_seconds(b, *c, args.tokens)
        for name, call in calls.items()
        for mode in modes
    }
    measured = alternate(contenders, args.rounds)
    state["load_average_after"] = machine()["load_average"]
    summary = []
    for name, (prompts, n) in calls.items():
        rows = len(prompts) * n
        base = measured[f"{name}/generate"]
        for mode in modes[1:]:
            new = measured[f"{name}/{mode}"]
            summary.append(
                row(
                    f"decoding step, {name}: generate vs {mode}",
                    f"{base['median'] * 1e3:.1f} vs {new['median'] * 1e3:.1f}",
                    "ms",
                    f"{base['median'] / new['median']:.2f}x; {rows / base['median']:.0f} vs "
                    f"{rows / new['median']:.0f} tokens/s; min {base['min'] * 1e3:.1f} vs "
                    f"{new['min'] * 1e3:.1f} ms",
                )
            )
    summary.append(
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"after {state['load_average_after'][0]:.2f}; {args.model} {args.dtype} on "
            f"{device}, {args.threads} threads, {args.tokens} steps",
        )
    )
    write("decode_loop", {"args": vars(args), "results": measured, "machine": state}, summary)


if __name__ == "__main__":
    main()
