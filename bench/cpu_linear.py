"""float32 linear layers on this CPU: torch's ``F.linear`` (MKL's sgemm) against oneDNN
(:class:`marl.agents.cpu_linear.OneDNNLinear`, what ``model.cpu_linear: auto`` picks for a
float32 model on an x86 CPU).

SmolLM2-135M's layer shapes (576 -> 576, 576 -> 192, 576 -> 1536, 1536 -> 576, and the 49,152-
word output layer) at 16, 64, 512 and 1,800 rows (a decoding step of 16 rows, a 64-row prefill,
the demo's 512-position update microbatch, a 1,800-position packed scoring pass), forward only,
and forward + backward of the input's gradient (a frozen base under LoRA adapters), alternating
the two kernels ``--rounds`` times. A row's rate is the median GFLOP/s over the rounds; the
ratio is oneDNN's rate over MKL's.

    .venv/bin/python bench/cpu_linear.py
    MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python bench/cpu_linear.py \
        --name cpu_linear_avx2        # both libraries held to AVX2 (simulated: say so)

Writes ``bench/results/cpu_linear.json`` (``--name``).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import alternate, row, write  # noqa: E402

SHAPES = {  # (in, out) of SmolLM2-135M's linear layers
    "q/o 576x576": (576, 576),
    "k/v 576x192": (576, 192),
    "gate/up 576x1536": (576, 1536),
    "down 1536x576": (1536, 576),
    "output 576x49152": (576, 49152),
}
ROWS = (16, 64, 512, 1800)


def rate(layer: nn.Module, rows: int, backward: bool, repeats: int) -> float:
    """GFLOP/s of ``repeats`` calls of ``layer`` on ``rows`` rows (forward: 2 * rows * in * out
    flops; with ``backward`` the input's gradient doubles them)."""
    x = torch.randn(rows, layer.in_features, requires_grad=backward)
    grad = torch.randn(rows, layer.out_features)
    flops = 2 * rows * layer.in_features * layer.out_features * (2 if backward else 1)

    def once() -> None:
        out = layer(x)
        if backward:
            out.backward(grad)

    once()
    began = time.perf_counter()
    for _ in range(repeats):
        once()
    return flops * repeats / (time.perf_counter() - began) / 1e9


def main() -> None:
    from marl.agents.cpu_linear import onednn_linear_available, use_onednn_linears

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--name", default="cpu_linear")
    args = p.parse_args()
    if not onednn_linear_available():
        raise SystemExit("this torch has no oneDNN float32 linear kernel")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results, summary = [], []
    for label, (fan_in, fan_out) in SHAPES.items():
        mkl = nn.Linear(fan_in, fan_out, bias=False).requires_grad_(False)
        onednn = nn.Linear(fan_in, fan_out, bias=False).requires_grad_(False)
        onednn.load_state_dict(mkl.state_dict())
        use_onednn_linears(onednn)
        for rows in ROWS:
            for backward in (False, True):
                repeats = max(2, int(2e9 / (2 * rows * fan_in * fan_out)))  # ~2 GFLOP a sample
                measured = alternate(
                    {
                        name: functools.partial(rate, layer, rows, backward, repeats)
                        for name, layer in (("mkl", mkl), ("onednn", onednn))
                    },
                    args.rounds,
                )
                a, b = measured["mkl"]["median"], measured["onednn"]["median"]
                what = f"{label}, {rows} rows, {'forward + input grad' if backward else 'forward'}"
                results.append({"shape": label, "rows": rows, "backward": backward, **measured})
                summary.append(row(what, b / a, "x", f"oneDNN {b:.0f} vs MKL {a:.0f} GFLOP/s"))
    ratios = [r["value"] for r in summary]
    summary.append(row("median over the rows", statistics.median(ratios), "x", "oneDNN / MKL"))
    write(args.name, {"args": vars(args), "results": results}, summary)


if __name__ == "__main__":
    main()
