"""One decoding step of the HF backend: as it is, against how it decoded before.

Before: transformers' ``sdpa`` attention (on a batch with no padding it passes ``enable_gqa`` to
a kernel that is slow in bfloat16 on this CPU) and transformers' sampling (``torch.multinomial``,
an exponential variate per vocabulary entry). Now: :mod:`marl.agents.attention` folds the query
heads on every decoding step, the backend's last logits processor draws the token by inverting
the cumulative distribution, and each step's keys and values go into room preallocated in the
cache (:mod:`marl.agents.kv_cache`). "Before" is rebuilt in this process: the model is set back
to ``sdpa``, generation back to ``do_sample=True`` and the cache to ``torch.cat``; the processor
then hands transformers a distribution with one token left, so the same tokens come out and
the cost is the old one. "cat" is today's backend with only the cache put back to
transformers' ``torch.cat`` per step.

Batches of 2 and 16 rows of about 300 prompt tokens (SmolLM2's vocabulary, random ids), with
equal lengths (no padding: the ``enable_gqa`` path) and with lengths 250-350 (padded). A step's
time is ``(generate of 49 tokens - generate of 1 token) / 48``. The contenders alternate;
``--rounds`` rounds; median and minimum. Writes ``bench/results/decode_step.json``.

    .venv/bin/python bench/decode_step.py [--model tiny] [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, machine, model_parser, row, timed, write  # noqa: E402

from marl.agents.attention import MARL_ATTENTION  # noqa: E402
from marl.agents.backends import SamplingConfig  # noqa: E402
from marl.agents.backends.hf import HFBackend  # noqa: E402


class CatCacheBackend(HFBackend):
    """The backend as it is, but decoding appends to the cache with ``torch.cat`` (transformers'
    ``DynamicLayer``) instead of writing into preallocated room: isolates that one change."""

    def _prefill(self, *args: Any, **kwargs: Any) -> Any:
        from transformers.cache_utils import DynamicLayer

        cache = super()._prefill(*args, **kwargs)
        for i, layer in enumerate(cache.layers):
            plain = DynamicLayer()
            plain.lazy_initialization(layer.keys, layer.values)
            plain.keys, plain.values = layer.keys.contiguous(), layer.values.contiguous()
            cache.layers[i] = plain
        return cache


class BeforeBackend(CatCacheBackend):
    """The backend with transformers' own sampling step after our processors and its cache (as
    before)."""

    def _generation_config(self, sampling: SamplingConfig) -> Any:
        config = super()._generation_config(sampling)
        config.do_sample = sampling.temperature > 0
        config.temperature, config.top_p, config.top_k = 1.0, 1.0, 0
        return config


def step_seconds(backend: HFBackend, prompts: list[list[int]], attention: str) -> float:
    """Seconds per decoding step of one batch, with ``attention`` set on the model."""
    backend.model.set_attn_implementation(attention)
    one = SamplingConfig(max_new_tokens=1, temperature=1.0)
    many = SamplingConfig(max_new_tokens=49, temperature=1.0)
    # stop tokens would end rows early; random ids rarely hit one, and both sides see the same
    return (
        timed(lambda: backend.generate(prompts, many, seed=0))
        - timed(lambda: backend.generate(prompts, one, seed=0))
    ) / 48


def main() -> None:
    p = model_parser(__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+", type=int, default=[2, 16])
    args = p.parse_args()
    import torch

    from marl.agents.models import ModelSpec, load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(ModelSpec(kind=args.model, dtype=args.dtype))
    now = HFBackend(model, tokenizer)
    before = BeforeBackend(model, tokenizer)  # the same model object: only the config differs
    cat_cache = CatCacheBackend(model, tokenizer)
    rng = random.Random(0)
    vocab = len(tokenizer)
    batches = {}
    for rows in args.rows:
        batches[f"{rows} rows, equal lengths"] = [
            [rng.randrange(100, vocab - 100) for _ in range(300)] for _ in range(rows)
        ]
        batches[f"{rows} rows, padded"] = [
            [rng.randrange(100, vocab - 100) for _ in range(rng.randrange(250, 351))]
            for _ in range(rows)
        ]
    state = machine()
    contenders = {}
    for name, prompts in batches.items():
        contenders[f"{name}/before"] = lambda p=prompts: step_seconds(before, p, "sdpa")
        contenders[f"{name}/now"] = lambda p=prompts: step_seconds(now, p, MARL_ATTENTION)
        contenders[f"{name}/cat"] = lambda p=prompts: step_seconds(cat_cache, p, MARL_ATTENTION)
    measured = alternate(contenders, args.rounds)
    state["load_average_after"] = machine()["load_average"]
    summary = []
    for name in batches:
        for other, label in (("before", "before vs now"), ("cat", "cache by torch.cat vs now")):
            old, new = measured[f"{name}/{other}"], measured[f"{name}/now"]
            summary.append(
                row(
                    f"decoding step, {name}: {label}",
                    f"{old['median'] * 1e3:.1f} vs {new['median'] * 1e3:.1f}",
                    "ms",
                    f"{old['median'] / new['median']:.2f}x; min {old['min'] * 1e3:.1f} vs "
                    f"{new['min'] * 1e3:.1f}",
                )
            )
    summary.append(
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"after {state['load_average_after'][0]:.2f}; {args.model} "
            f"{args.dtype}, {args.threads} threads",
        )
    )
    write("decode_step", {"args": vars(args), "results": measured, "machine": state}, summary)


if __name__ == "__main__":
    main()
