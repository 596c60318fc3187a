"""``marl report``: compare runs. Groups runs that differ only in their seed, and prints a table
and writes PNG plots of the mean curve with a 95% confidence interval over seeds.

    marl report runs/multirun/2026-11-22_10-00-00            # every run under the directory
    marl report runs/a runs/b --tag agents/listener/reward    # any scalar tag
    marl report runs/a --tag emergence/speaker/speaker_mi     # emergence/* tags too

When the runs logged emergent-communication metrics (``emergence/*``, docs/emergence.md), a
second table gives the headline ones (message rate, speaker MI, listener influence, drift)
per agent and per edge.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, stdev

import yaml

from marl.errors import RunError

# two-sided 95% Student t quantiles for n - 1 degrees of freedom (n = number of seeds)
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def t95(dof: int) -> float:
    """The 97.5% quantile of Student's t with ``dof`` degrees of freedom (1.96 for large dof)."""
    if dof <= 0:
        return float("nan")
    known = [d for d in sorted(_T95) if d <= dof]
    return _T95[known[-1]] if dof <= 30 else 1.96


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% confidence interval (nan with one value)."""
    if not values:
        return float("nan"), float("nan")
    if len(values) == 1:
        return values[0], float("nan")
    return fmean(values), t95(len(values) - 1) * stdev(values) / math.sqrt(len(values))


@dataclass
class Run:
    """One training run: its directory, its config (without the seed) and its scalar curves."""

    path: Path
    label: str
    seed: int
    curves: dict[str, list[tuple[int, float]]]


def find_runs(roots: Sequence[str | Path]) -> list[Path]:
    """Run directories (holding config.yaml and tensorboard/) under ``roots``."""
    found = []
    for root in roots:
        root = Path(root)
        if not root.exists():
            raise RunError(f"report: no such directory {root}")
        for config in sorted(root.rglob("config.yaml")):
            if (config.parent / "tensorboard").is_dir() and config.parent.name != ".hydra":
                found.append(config.parent)
    if not found:
        raise RunError(
            f"report: no runs (config.yaml + tensorboard/) under {', '.join(map(str, roots))}"
        )
    return found


def _flatten(data: object, prefix: str = "") -> dict[str, object]:
    if isinstance(data, dict):
        out: dict[str, object] = {}
        for key, value in data.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: data}


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Read every run's config and scalars; label = the config keys that differ between runs."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    configs = [_flatten(yaml.safe_load((p / "config.yaml").read_text()) or {}) for p in paths]
    ignored = {"seed", "resume", "logging.progress"}
    keys = sorted(set.intersection(*(set(c) for c in configs)) - ignored)
    varying = [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]
    runs = []
    for path, config in zip(paths, configs):
        events = EventAccumulator(str(path / "tensorboard"), size_guidance={"scalars": 0})
        events.Reload()
        curves = {
            tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]
        }
        label = ", ".join(f"{k}={config.get(k)}" for k in varying) or "all runs"
        runs.append(Run(path, label, int(config.get("seed", 0) or 0), curves))
    return runs


def summarize(runs: Sequence[Run], tag: str, last: int = 3) -> list[dict[str, object]]:
    """Per group: seeds, mean and CI of the tag's mean over the last ``last`` logged steps."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.label].append(run)
    rows = []
    for label, members in sorted(groups.items()):
        finals = [fmean(v for _, v in r.curves[tag][-last:]) for r in members if r.curves.get(tag)]
        firsts = [r.curves[tag][0][1] for r in members if r.curves.get(tag)]
        mean, half = mean_ci(finals)
        start, _ = mean_ci(firsts)
        rows.append(
            {"group": label, "seeds": len(finals), "start": start, "final": mean, "ci95": half}
        )
    return rows


EMERGENCE_HEADLINE = (
    "message_rate",
    "speaker_mi",
    "speaker_mi_words",
    "influence_action",
    "influence_return",
    "drift",
)


def emergence_rows(runs: Sequence[Run], last: int = 3) -> list[dict[str, object]]:
    """:func:`summarize` of every headline ``emergence/<agent or edge>/<metric>`` tag, one row
    per group and tag; tags that are 0 in every run and step (a listener's speaker MI) are
    left out."""
    tags = sorted(
        {
            t
            for r in runs
            for t in r.curves
            if t.startswith("emergence/") and t.rsplit("/", 1)[-1] in EMERGENCE_HEADLINE
        }
    )
    rows = []
    for tag in tags:
        if all(v == 0.0 for r in runs for _, v in r.curves.get(tag, [])):
            continue
        rows += [{"tag": tag, **row} for row in summarize(runs, tag, last)]
    return rows


def _print_emergence(rows: Sequence[dict[str, object]], last: int) -> None:
    width = max(len(str(r["group"])) for r in rows)
    tag_width = max(len(str(r["tag"])) for r in rows)
    print(f"\nemergence (last {last} steps; tags that stayed 0 are left out)")
    print(f"{'tag':{tag_width}s}  {'group':{width}s}  seeds  start    final    ±95% CI")
    for row in rows:
        print(
            f"{row['tag']:{tag_width}s}  {row['group']:{width}s}  {row['seeds']:5d}  "
            f"{row['start']:+.3f}   {row['final']:+.3f}   {row['ci95']:.3f}"
        )


def plot(runs: Sequence[Run], tag: str, out: Path) -> Path:
    """Mean curve per group with a 95% CI band over seeds, saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.curves.get(tag):
            groups[run.label].append(run)
    figure, axes = plt.subplots(figsize=(7, 4))
    for label, members in sorted(groups.items()):
        steps = sorted({s for r in members for s, _ in r.curves[tag]})
        means, lows, highs = [], [], []
        for step in steps:
            values = [v for r in members for s, v in r.curves[tag] if s == step]
            mean, half = mean_ci(values)
            half = 0.0 if math.isnan(half) else half
            means.append(mean)
            lows.append(mean - half)
            highs.append(mean + half)
        axes.plot(steps, means, label=f"{label} (n={len(members)})")
        axes.fill_between(steps, lows, highs, alpha=0.2)
    axes.set_xlabel("step")
    axes.set_ylabel(tag)
    axes.legend(fontsize=7)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120)
    plt.close(figure)
    return out


def main(argv: Sequence[str]) -> int:
    """Entry point of ``marl report``."""
    parser = argparse.ArgumentParser(prog="marl report", description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+", help="run directories or directories holding runs")
    parser.add_argument("--tag", default="team/reward", help="scalar to compare (team/reward)")
    parser.add_argument("--out", default=None, help="where to write plots (default: DIR/report)")
    parser.add_argument("--last", type=int, default=3, help="average the last N steps (3)")
    ns = parser.parse_args(argv)
    runs = load_runs(find_runs(ns.dirs))
    if not any(ns.tag in r.curves for r in runs):
        tags = sorted({t for r in runs for t in r.curves})
        raise RunError(f"report: no run logged --tag {ns.tag!r}; tags: {', '.join(tags[:20])}")
    rows = summarize(runs, ns.tag, ns.last)
    width = max(len(str(r["group"])) for r in rows)
    print(
        f"{'group':{width}s}  seeds  start    final    ±95% CI   ({ns.tag}, last {ns.last} steps)"
    )
    for row in rows:
        print(
            f"{row['group']:{width}s}  {row['seeds']:5d}  {row['start']:+.3f}   "
            f"{row['final']:+.3f}   {row['ci95']:.3f}"
        )
    out = Path(ns.out) if ns.out else Path(ns.dirs[0]) / "report"
    emergence = emergence_rows(runs, ns.last)
    if emergence:
        _print_emergence(emergence, ns.last)
    png = plot(runs, ns.tag, out / (re.sub(r"[^A-Za-z0-9_.-]+", "_", ns.tag) + ".png"))
    summary = {"tag": ns.tag, "rows": rows, "emergence": emergence}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"plot: {png}\nsummary: {out / 'summary.json'}")
    return 0
