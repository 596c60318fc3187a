"""Helpers the benchmarks share: timing, the machine's state, the JSON results and the table.

Every benchmark writes ``bench/results/<name>.json`` with a ``summary`` list of rows
(``figure``, ``value``, ``unit``, ``note``), which ``bench/run_all.py`` (``make bench``) gathers
into one table, plus the load average before and after the run: this 2-core machine is often
shared, so a figure means little without it. Every result JSON records :func:`machine` under
``machine``: the CPU (model, family, AVX512-BF16, AMX), the ISA variables set (a figure measured
under them is simulated), the load and the GPU; its ``line`` heads every printed table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent


def portable(value: Any) -> Any:
    """A path inside the checkout as a path relative to it (results name no machine's
    directories); anything else unchanged."""
    if isinstance(value, (str, Path)) and os.path.isabs(value):
        path = Path(value).resolve()
        if path.is_relative_to(ROOT):
            return str(path.relative_to(ROOT))
    return value


def checkout_name(checkout: Path) -> str:
    """How a result names a checkout: relative to this one when inside it, else by its commit
    (``checkout at <sha>``), since another folder names only this machine."""
    checkout = checkout.resolve()
    if checkout.is_relative_to(ROOT):
        return str(portable(checkout))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True
    ).stdout.strip()
    return f"checkout at {commit or '(not a git checkout)'}"


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: user, nice, system,
    irq, softirq, steal; guest time is inside user already). Taken before and after a command,
    it counts every process, also those a command never reaps (Ray's workers)."""
    with open("/proc/stat", encoding="ascii") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (sum(fields[:3]) + sum(fields[5:8])) / os.sysconf("SC_CLK_TCK")


def quick() -> bool:
    """``BENCH_QUICK=1``: smaller runs, for a fast look (the figures are noisier)."""
    return os.environ.get("BENCH_QUICK", "") not in ("", "0")


# The environment variables that make torch, oneDNN or MKL dispatch below what the CPU has: a
# figure measured under any of them stands for a simulated CPU, not this one.
ISA_VARIABLES = (
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",  # oneDNN's older name for ONEDNN_MAX_CPU_ISA
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_DEBUG_CPU_TYPE",
)


def machine() -> dict[str, Any]:
    """What the figures depend on, recorded in every result JSON under ``machine``.

    ``cores_available``, ``load_average`` (1, 5, 15 min), ``torch_threads``, ``python``,
    ``torch``; the CPU: ``cpu`` (its model name, :func:`marl.runtime.machine.cpu_name`),
    ``cpu_family`` and ``cpu_model`` (/proc/cpuinfo's numbers, None where unreadable),
    ``avx512_bf16`` and ``amx`` (whether the CPU has them, torch's checks, as
    :mod:`marl.agents.precision` reads them), ``torch_cpu_capability`` (the kernels torch
    dispatches to: ``AVX512``, ``AVX2``...), ``bf16`` (what ``model.dtype: auto`` decides on it
    and why, :func:`marl.agents.precision.bf16_support`); ``isa_env`` (those of
    :data:`ISA_VARIABLES` set, by name), ``simulated`` (any of them set: the figures stand for
    a CPU restricted to less than this one has); ``gpu`` (the first CUDA device's name, None
    without one); and ``line``, all of it in one line (:func:`machine_line`)."""
    import torch

    from marl.agents.precision import bf16_support
    from marl.runtime.machine import cpu_name, local_gpu_name

    isa_env = {name: os.environ[name] for name in ISA_VARIABLES if os.environ.get(name)}
    bf16 = bf16_support("cpu")
    state: dict[str, Any] = {
        "cores_available": len(os.sched_getaffinity(0)),
        "load_average": list(os.getloadavg()),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "cpu_family": _cpuinfo_number("cpu family"),
        "cpu_model": _cpuinfo_number("model"),
        **_bf16_instructions(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16": {"fast": bf16.fast, "reason": bf16.reason},
        "isa_env": isa_env,
        "simulated": bool(isa_env),
        "gpu": local_gpu_name() or None,
    }
    state["line"] = machine_line(state)
    return state


def machine_line(state: dict[str, Any]) -> str:
    """:func:`machine`'s record in one line, for example ``AMD EPYC (family 25, model 17);
    avx512_bf16 yes, AMX no; ISA variables: none (not simulated); load 0.52 0.61 0.70 on 2
    cores``, with the GPU's name at the end where there is one."""
    family, model = state.get("cpu_family"), state.get("cpu_model")
    numbers = [f"{name} {n}" for name, n in (("family", family), ("model", model)) if n is not None]
    cpu = state.get("cpu", "CPU") + (f" ({', '.join(numbers)})" if numbers else "")

    def yes(flag: str) -> str:
        return "yes" if state.get(flag) else "no"

    isa_env = state.get("isa_env") or {}
    if isa_env:
        isa = " ".join(f"{k}={v}" for k, v in isa_env.items())
        kernels = state.get("torch_cpu_capability")
        isa += f" (simulated{f'; torch kernels {kernels}' if kernels else ''})"
    else:
        isa = "none (not simulated)"
    load = " ".join(f"{x:.2f}" for x in state.get("load_average", []))
    line = (
        f"{cpu}; avx512_bf16 {yes('avx512_bf16')}, AMX {yes('amx')}; ISA variables: {isa}; "
        f"load {load} on {state.get('cores_available')} cores"
    )
    return line + (f"; GPU {state['gpu']}" if state.get("gpu") else "")


def _cpuinfo_number(field: str) -> int | None:
    """The first ``field : <integer>`` line of /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as lines:
            for line in lines:
                key, _, value = line.partition(":")
                if key.strip() == field:
                    return int(value.strip())
    except (OSError, ValueError):
        pass
    return None


def _bf16_instructions() -> dict[str, bool]:
    """Whether the CPU has AVX512-BF16 and AMX: the checks :mod:`marl.agents.precision` asks,
    read without its restriction to torch's dispatch level, so an ISA variable does not hide
    what the CPU has (False where torch lacks the checks)."""
    import torch

    try:
        return {
            "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
            "amx": bool(torch.cpu._is_amx_tile_supported()),
        }
    except AttributeError:  # a torch without the checks
        return {"avx512_bf16": False, "amx": False}


def alternate(contenders: dict[str, Callable[[], float]], rounds: int) -> dict[str, dict[str, Any]]:
    """Run each contender once per round, in turn (A B A B ...), so a change in the machine's
    load hits them alike. Each returns its own measure (seconds, or a rate); returns per
    contender every value, their minimum and median."""
    values: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, run in contenders.items():
            values[name].append(run())
    return {
        name: {"values": v, "min": min(v), "median": statistics.median(v), "max": max(v)}
        for name, v in values.items()
    }


def model_parser(description: str) -> argparse.ArgumentParser:
    """A benchmark's argument parser with what every model benchmark takes: ``--model``
    (embedded: SmolLM2; tiny: the test model), ``--dtype``, ``--threads``, ``--rounds``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", choices=("embedded", "tiny"), default="embedded")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    return p


def inference_backends(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """What ``marl train`` would generate with for ``config`` (a config's overrides, as a
    dict): each policy's rollout backend, by policy id, and each agent's policy id."""
    from marl.config import load_config
    from marl.runtime.policies import InferencePolicies
    from marl.runtime.policy_map import plan_for

    loaded = load_config(config)
    plan = plan_for(loaded)
    owner = {agent: pid for pid, spec in plan.policies.items() for agent in spec.agents}
    return dict(InferencePolicies(plan, loaded).backends), owner


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call of ``fn``."""
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def row(figure: str, value: float | str, unit: str = "", note: str = "") -> dict[str, Any]:
    """One line of the summary table."""
    return {"figure": figure, "value": value, "unit": unit, "note": note}


def write(name: str, data: dict[str, Any], summary: Sequence[dict[str, Any]]) -> Path:
    """Write ``bench/results/<name>.json`` (``data``, ``summary``, and :func:`machine` under
    ``machine`` unless ``data`` has it) and print the machine's line and the summary table."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"bench": name, "quick": quick(), **data, "summary": list(summary)}
    state = payload.setdefault("machine", machine())
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"machine: {state.get('line') or machine()['line']}")
    print(table([{"bench": name, **r} for r in summary]))
    print(f"wrote {path}")
    return path


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of summary rows."""
    columns = ["bench", "figure", "value", "unit", "note"]
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths)) for line in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


# --- learning experiments (communication.py, relay_credit.py) -----------------------------------


# The per-step timings every training run logs (marl/loop/train.py), read by the step benches.
STEP_TIMES = ("perf/step_time", "perf/rollout_time", "perf/update_time")


def read_scalars(logdir: Path) -> dict[str, list[float]]:
    """Every scalar tag of a run as a list ordered by step (TensorBoard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def save_experiment(
    out: Path,
    args: Any,
    table: dict,
    text: str,
    plot: Callable[[Path], None],
    runs: dict[str, str | None] | None = None,
) -> None:
    """Print the Markdown ``text``, the load average and the machine's line, and write
    ``summary.json``, ``table.md`` and ``curves.png`` (drawn by ``plot``) under ``out``.

    ``summary.json`` holds ``args`` (the call that wrote it: with ``--table-only`` the
    tabulating call, whose ``--steps`` and the like need not be the runs'), ``runs`` when given
    (each tabulated run's ``marl train`` command, :func:`run_commands`), ``table``, ``load``
    and ``machine`` (:func:`machine`, of the writing call)."""
    load = os.getloadavg()
    state = machine()
    print(text)
    print(f"load average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print(f"machine: {state['line']}")
    payload: dict[str, Any] = {"args": {k: portable(v) for k, v in vars(args).items()}}
    if runs is not None:
        payload["runs"] = runs
    payload.update({"table": table, "load": load, "machine": state})
    (out / "summary.json").write_text(json.dumps(payload, indent=2))
    (out / "table.md").write_text(text + "\n")
    plot(out / "curves.png")
    print(f"wrote {out / 'summary.json'}, {out / 'table.md'}, {out / 'curves.png'}")


def marl_command() -> list[str]:
    """The ``marl`` command of the Python running this bench: the script beside the interpreter
    (``.venv/bin/marl`` for ``.venv/bin/python``), else ``python -m marl.cli`` (an environment
    where the script is not on disk, such as a GPU machine's editable install)."""
    script = Path(sys.executable).with_name("marl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "marl.cli"]


def run_marl(args: Sequence[str], threads: int, what: str, log: Path | None = None) -> float:
    """``marl <args>`` in a subprocess with ``OMP_NUM_THREADS=threads``, its output kept in
    ``log`` when given; exits with the output's tail and ``what`` when it fails. Returns the
    wall time in seconds."""
    cmd = [*marl_command(), *args]
    print(f"  $ marl {' '.join(args)}", flush=True)
    began = time.time()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-2000:] + proc.stderr[-4000:])
        where = f"; log: {log}" if log is not None else ""
        raise SystemExit(f"{what} failed (rc {proc.returncode}){where}")
    return time.time() - began


def compose(overrides: Sequence[str], config_name: str = "demo") -> dict[str, Any]:
    """``marl train --config-name <config_name> <overrides>``'s config, as a plain dict (no
    ``hydra`` group)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from omegaconf import OmegaConf

    from marl.cli import register_scenario_options

    register_scenario_options()
    with initialize_config_module("marl.configs", version_base=None):
        cfg = hydra_compose(config_name, overrides=list(overrides))
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    out.pop("hydra", None)
    return out  # type: ignore[return-value]


def run_sampling(config: dict[str, Any]) -> Any:
    """The sampling a run trained with (its saved config's ``sampling`` group), as a
    ``SamplingConfig``: the settings every measurement of its checkpoints uses."""
    from marl.agents.backends import SamplingConfig

    s = config["sampling"]
    return SamplingConfig(
        max_new_tokens=s["max_new_tokens"],
        temperature=s["temperature"],
        response_prefix=bool(s.get("response_prefix")),
    )


def saved_config(run_dir: Path) -> dict[str, Any]:
    """The config a run saved (``<run>/config.yaml``), as plain data."""
    import yaml

    return yaml.safe_load((run_dir / "config.yaml").read_text())


def run_command(run_dir: Path) -> str | None:
    """The ``marl train`` command that made the run in ``run_dir``, read back from what Hydra
    wrote there: ``.hydra/hydra.yaml`` (the config name and the ``hydra.*`` overrides, such as
    ``hydra.run.dir``) and ``.hydra/overrides.yaml`` (the task overrides, in the order given).
    A path under the repository is written relative to it. None when the run left no record.
    The thread count (``OMP_NUM_THREADS``) is not a Hydra override and is not in it."""
    import shlex

    import yaml

    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    if not hydra_file.exists():
        return None
    hydra = yaml.safe_load(hydra_file.read_text())["hydra"]
    task = list(hydra["overrides"]["task"])
    own = [o for o in hydra["overrides"]["hydra"] if not o.startswith("hydra.mode=")]
    root = f"{ROOT}/"
    own = [o.replace(f"={root}", "=", 1) if f"={root}" in o else o for o in own]
    sweep = ["-m"] if hydra.get("mode") == "MULTIRUN" else []  # a sweep's job: one-job sweep
    words = ["marl", "train", *sweep, "--config-name", hydra["job"]["config_name"], *task, *own]
    return shlex.join(words)


def run_sweep(
    args: Sequence[str],
    sweep_dir: Path,
    seeds: Sequence[int],
    threads: int,
    parallel: int | None,
    what: str,
) -> dict[int, float]:
    """Train ``marl train -m <args> seed=<seeds>`` through the Ray launcher, each run in
    ``sweep_dir/seed<k>`` with ``threads`` CPUs (and torch threads), at most ``parallel`` at
    once (None: as many as the cores hold). A run folder left by a stopped run is set aside
    whole (``<sweep_dir>.set-aside/``) and trained again, so that no folder mixes two runs'
    events; the caller passes only the seeds whose runs are missing. Writes each run's
    ``wall_s.json`` from the launcher's record; exits with the sweep's failures. Returns
    seed -> wall seconds."""
    cmd = [
        "train", "-m", *args, f"seed={','.join(map(str, seeds))}", "launcher=ray",
        f"hydra.launcher.cpus_per_job={threads}", "hydra.launcher.skip_finished=false",
        f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=seed${seed}",
    ]  # fmt: skip
    if parallel:
        cmd.append(f"hydra.launcher.max_parallel={parallel}")
    print(f"  $ marl {' '.join(cmd)}", flush=True)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([*marl_command(), *cmd], cwd=ROOT, text=True)
    walls = {}
    for seed in seeds:
        run = sweep_dir / f"seed{seed}"
        try:
            record = json.loads((run / "sweep_job.json").read_text())
        except (OSError, ValueError):
            continue
        if record.get("status") == "finished":
            walls[seed] = float(record["wall_s"])
            (run / "wall_s.json").write_text(json.dumps(walls[seed]))
    if proc.returncode != 0:
        raise SystemExit(f"{what}: {proc.returncode} run(s) failed; see the lines above")
    return walls


def run_commands(out: Path, names: Sequence[str], seeds: Sequence[int]) -> dict[str, str | None]:
    """``{"<name>/seed<seed>": command}`` for every finished run under ``out`` (those
    :func:`collect_runs` tabulates), each command read back by :func:`run_command`."""
    return {
        f"{name}/seed{seed}": run_command(out / name / f"seed{seed}")
        for seed in seeds
        for name in names
        if (out / name / f"seed{seed}" / "wall_s.json").exists()
    }


def finish_run(run_dir: Path, wall_s: float) -> dict:
    """Record a finished run's wall time beside its events; returns :func:`load_run`."""
    (run_dir / "wall_s.json").write_text(json.dumps(wall_s))
    return load_run(run_dir)


def load_run(run_dir: Path) -> dict:
    """A finished run's scalar curves (its TensorBoard events) and wall time."""
    curves = read_scalars(run_dir / "tensorboard")
    curves["wall_s"] = json.loads((run_dir / "wall_s.json").read_text())
    return curves


def collect_runs(
    out: Path,
    names: Sequence[str],
    seeds: Sequence[int],
    run: Callable[[str, int], dict],
    table_only: bool = False,
) -> dict[str, list[dict]]:
    """Every run ``out/<name>/seed<seed>``, seed-major (a partial experiment still covers every
    name): ``run(name, seed)`` each, or with ``table_only`` load those that finished (their
    processes may have run in parallel). Names without a run are left out."""
    results: dict[str, list[dict]] = {name: [] for name in names}
    for seed in seeds:
        for name in names:
            run_dir = out / name / f"seed{seed}"
            if not table_only:
                results[name].append(run(name, seed))
            elif (run_dir / "wall_s.json").exists():
                results[name].append(load_run(run_dir))
    return {name: runs for name, runs in results.items() if runs}


def paired(
    before: Sequence[float | None], after: Sequence[float | None], least: int = 1
) -> dict[str, float] | None:
    """The mean of after - before over the seeds that have both, with its paired 95%
    t-interval (:func:`marl.analysis.stats.mean_interval`); None with fewer than ``least``."""
    from marl.analysis.stats import mean_interval

    diffs = [a - b for a, b in zip(after, before) if a is not None and b is not None]
    if not diffs or len(diffs) < least:
        return None
    mean, low, high = mean_interval(diffs)
    return {"mean": mean, "low": low, "high": high, "seeds": len(diffs)}
