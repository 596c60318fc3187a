"""What one more prefill forward costs, in positions: the measured value of
``marl.agents.kv_cache.BUCKET_OVERHEAD``.

The HF backend prefills a call's distinct prompts in length buckets
(:func:`marl.agents.kv_cache.prefill_buckets`): after the round's shared prefix, each bucket is
one forward over its rows' own tokens, padded to the bucket's longest. A bucket is worth
opening when the padding it saves costs more than a forward's fixed cost (Python, about 30
layers of small kernels, reading the weights once). The dynamic programme charges that fixed
cost as ``BUCKET_OVERHEAD`` positions, an estimate until this benchmark.

Here SmolLM2-135M prefills, on a cache of a shared ``--prefix`` (190 tokens, about a
majority-vote round's), buckets of ``rows x span`` own tokens, as the backend does. The cost
is not linear: a small forward is bound by reading the weights (about 35 ms whatever it
computes), a large one by arithmetic. What the bucketing trades is one more small forward
against padding in a large one, so the overhead is read as the smallest forward (1 row of 2
tokens, less those 2 positions) over the cost of a position in the largest buckets (the slope
between the two largest spans of the most rows). A least-squares fit over all shapes,
``seconds = fixed + per_row x rows + per_position x rows x span``, is given beside it; it
weighs the large shapes most and puts the fixed cost lower. The shapes take turns for
``--rounds`` rounds; medians. Writes ``bench/results/prefill_overhead.json``.

    .venv/bin/python bench/prefill_overhead.py [--threads 2] [--rounds 3]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, machine, model_parser, row, timed, write  # noqa: E402

from marl.agents.kv_cache import BUCKET_OVERHEAD  # noqa: E402
from marl.agents.logprobs import cache_keyword, cache_rows, output_cache  # noqa: E402


def fit_costs(shapes: list[tuple[int, int]], seconds: list[float]) -> tuple[float, ...]:
    """Least squares ``seconds = fixed + per_row x rows + per_position x rows x span`` over
    ``shapes`` ``(rows, span)``; returns ``(fixed, per_row, per_position)``."""
    import torch

    design = torch.tensor([[1.0, r, r * s] for r, s in shapes], dtype=torch.float64)  # (N, 3)
    target = torch.tensor(seconds, dtype=torch.float64)[:, None]  # (N, 1)
    solution = torch.linalg.lstsq(design, target).solution  # (3, 1)
    return tuple(solution.squeeze(1).tolist())


def main() -> None:
    p = model_parser(__doc__.splitlines()[0])
    p.add_argument("--prefix", type=int, default=190)
    p.add_argument("--rows", nargs="+", type=int, default=[1, 4, 16])
    p.add_argument("--spans", nargs="+", type=int, default=[2, 8, 32, 128])
    args = p.parse_args()
    import torch

    from marl.agents.models import ModelSpec, load_model

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(ModelSpec(kind=args.model, dtype=args.dtype))
    model.eval()
    generator = torch.Generator().manual_seed(0)
    vocab = len(tokenizer)
    prefix_ids = torch.randint(100, vocab - 100, (1, args.prefix), generator=generator)
    with torch.inference_mode():
        head = output_cache(model(input_ids=prefix_ids, use_cache=True, logits_to_keep=1))

    def bucket(rows: int, span: int) -> float:
        """Seconds of one bucket forward: ``rows`` rows of ``span`` own tokens on the prefix."""
        ids = torch.randint(100, vocab - 100, (rows, span), generator=generator)
        mask = torch.ones(rows, args.prefix + span, dtype=torch.long)
        positions = args.prefix + torch.arange(span).expand(rows, span)

        def forward() -> None:
            with torch.inference_mode():
                cache = cache_rows(head, torch.zeros(rows, dtype=torch.long))  # as the backend
                model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    logits_to_keep=1,
                    **{cache_keyword(model): cache},
                )

        return timed(forward)

    shapes = [(r, s) for r in args.rows for s in args.spans]
    for r, s in shapes:  # warm-up: first calls allocate
        bucket(r, s)
    state = machine()
    measured = alternate(
        {f"{r}x{s}": (lambda r=r, s=s: bucket(r, s)) for r, s in shapes}, args.rounds
    )
    state["load_average_after"] = machine()["load_average"]
    fixed, per_row, per_position = fit_costs(
        shapes, [measured[f"{r}x{s}"]["median"] for r, s in shapes]
    )
    most, (shorter, longest) = max(args.rows), sorted(args.spans)[-2:]
    slope = (measured[f"{most}x{longest}"]["median"] - measured[f"{most}x{shorter}"]["median"]) / (
        most * (longest - shorter)
    )  # seconds per position in the largest buckets
    least, shortest = min(args.rows), min(args.spans)
    smallest = measured[f"{least}x{shortest}"]["median"]
    overhead = smallest / slope - least * shortest
    summary = [
        row(
            f"bucket forward, {r} rows x {s} own tokens",
            measured[f"{r}x{s}"]["median"] * 1e3,
            "ms",
            f"min {measured[f'{r}x{s}']['min'] * 1e3:.1f}",
        )
        for r, s in shapes
    ]
    summary.append(
        row(
            "overhead of a forward, in positions",
            overhead,
            "positions",
            f"the {least}x{shortest} forward {smallest * 1e3:.1f} ms over "
            f"{slope * 1e3:.3f} ms a position ({most} rows, spans {shorter}->"
            f"{longest}); kv_cache.BUCKET_OVERHEAD = {BUCKET_OVERHEAD}",
        )
    )
    summary.append(
        row(
            "least squares: fixed cost of a forward",
            fixed * 1e3,
            "ms",
            f"= {fixed / per_position:.1f} positions; per row {per_row * 1e3:.2f} ms, "
            f"per position {per_position * 1e3:.3f} ms (prefix {args.prefix})",
        )
    )
    summary.append(
        row(
            "load average at start",
            state["load_average"][0],
            "",
            f"after {state['load_average_after'][0]:.2f}; {args.model} {args.dtype}, "
            f"{args.threads} threads",
        )
    )
    costs = {
        "overhead_positions": overhead,
        "position_s": slope,
        "fit_fixed_s": fixed,
        "fit_per_row_s": per_row,
        "fit_per_position_s": per_position,
    }
    write(
        "prefill_overhead",
        {"args": vars(args), "results": measured, **costs, "machine": state},
        summary,
    )


if __name__ == "__main__":
    main()
