"""What a fresh Python process pays to import what the platform's processes import (issue 38).

Every Ray actor and sweep job of the suite is a fresh worker process that imports torch,
transformers and marl before it does anything: the suite's by-process reading
(``bench/results/suite_cpu_icelake_base.json``) counts 62 such workers. This times each import
in fresh interpreters, ``--rounds`` times in alternating order, and reports the median CPU
(user + sys of the child) and wall of each, and what each adds to the import it builds on
(:data:`BUILDS_ON`: transformers' Llama on top of torch, peft on top of that).

    .venv/bin/python bench/import_cost.py                 # bench/results/import_cost.json
    .venv/bin/python bench/import_cost.py --rounds 1 --only interpreter torch

Run it on an otherwise idle machine: CPU seconds move less than wall under load, but they move.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import row, write  # noqa: E402

# name -> the statement a fresh interpreter runs
IMPORTS: dict[str, str] = {
    "interpreter": "pass",
    "ray": "import ray",
    "torch": "import torch",
    "transformers Llama": "import torch; from transformers import LlamaForCausalLM",
    "peft": "import torch; from transformers import LlamaForCausalLM; import peft",
    "marl Ray actors": "import marl.runtime.ray_runtime",
    "marl sweep job": "import marl.sweep.job",
}
# an import -> the one its statement starts with: the difference is what it adds
BUILDS_ON = {"torch": "interpreter", "transformers Llama": "torch", "peft": "transformers Llama"}


def cost(statement: str) -> tuple[float, float]:
    """``(cpu_s, wall_s)`` of a fresh interpreter that runs ``statement`` and exits."""
    began = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", statement], env={**os.environ})
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"import_cost: `{statement}` failed")
    return usage.ru_utime + usage.ru_stime, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=IMPORTS, help="these imports only")
    parser.add_argument("--name", default="import_cost", help="bench/results/<name>.json")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    names = args.only or list(IMPORTS)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        order = names if round_ % 2 == 0 else names[::-1]  # alternating: no order favoured
        for name in order:
            samples[name].append(cost(IMPORTS[name]))
    medians = {
        name: {
            "cpu_s": statistics.median(c for c, _ in values),
            "wall_s": statistics.median(w for _, w in values),
            "rounds": [{"cpu_s": c, "wall_s": w} for c, w in values],
        }
        for name, values in samples.items()
    }
    summary = []
    for name in names:
        cpu, base = medians[name]["cpu_s"], BUILDS_ON.get(name)
        more = f"; +{cpu - medians[base]['cpu_s']:.2f} on {base}" if base in medians else ""
        summary.append(row(f"import: {name}", round(cpu, 3), "CPU-s", f"`{IMPORTS[name]}`{more}"))
    write(args.name, {"args": vars(args), "imports": IMPORTS, "medians": medians}, summary)


if __name__ == "__main__":
    main()
