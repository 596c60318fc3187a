"""``marl report``: compare runs, grouped by the axes that differ (a sweep's swept values).

Seeds are averaged: it prints tables and writes PNG plots of the mean curve with a 95%
confidence interval over seeds.

    marl report runs/sweep/public_goods_cooperation          # every run under the directory
    marl report runs/a runs/b --tag agents/listener/reward    # any scalar tag
    marl report runs/a --tag emergence/speaker/speaker_mi     # emergence/* tags too

Grouping: each run's axes are the hparams it logged (its Hydra overrides,
:mod:`marl.analysis.hparams`; for runs made before that, its ``.hydra/overrides.yaml``). The axes
that differ, the seed left out, name the groups (``scenario.overrides.reward.cooperation=0.5``) when
they split the runs exactly as their resolved configs do; otherwise the config keys that differ name
them.

Tables: the ``--tag`` curve (start, final, CI); the final metrics (team reward, success, held-out
success and reward: mean ± 95% CI over seeds, written to ``finals.csv`` too); and, when the
runs logged emergent-communication metrics (``emergence/*``, docs/emergence.md), the headline
ones (message rate, speaker MI, listener influence, drift) per agent and per edge.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from marl.analysis.stats import mean_ci
from marl.errors import RunError


@dataclass
class Run:
    """One training run: its directory, its group's label and axes, its seed, its curves."""

    path: Path
    label: str
    seed: int
    curves: dict[str, list[tuple[int, float]]]
    axes: dict[str, object] = field(default_factory=dict)


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


IGNORED = {"seed", "resume", "logging.progress"}  # never a group axis


def run_yaml(path: Path) -> object:
    """A run's YAML file (``config.yaml``, ``.hydra/overrides.yaml``) through the one bounded
    reader (:func:`marl.scenarios.reader.read_yaml`: a size limit, no aliases, no deep nesting),
    so a crafted file cannot take the report's memory; a refusal is one line naming the file."""
    from marl.scenarios.problems import ScenarioError
    from marl.scenarios.reader import read_yaml

    try:
        return read_yaml(path)
    except ScenarioError as exc:
        first = str(exc.problems[0]) if exc.problems else "unreadable"
        raise RunError(f"report: {path}: {first.replace(' in a scenario file', '')}") from None


def run_axes(path: Path) -> dict[str, object] | None:
    """The axes a run was launched with: the hparams of its TensorBoard session, else the
    overrides Hydra saved in ``.hydra/overrides.yaml``; None when neither exists."""
    from marl.analysis.hparams import flatten_overrides, read_session

    hparams, _, _ = read_session(path / "tensorboard")
    if hparams:
        return dict(hparams)
    saved = path / ".hydra" / "overrides.yaml"
    if saved.is_file():
        return dict(flatten_overrides(run_yaml(saved) or []))
    return None


def _shown(value: object) -> str:
    """An axis value as text: 3 for 3.0 (hparams store numbers as floats), 0.25 as is."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _partition(labels: Sequence[str]) -> set[frozenset[int]]:
    groups: dict[str, set[int]] = defaultdict(set)
    for index, label in enumerate(labels):
        groups[label].add(index)
    return {frozenset(g) for g in groups.values()}


def group_labels(
    configs: Sequence[dict[str, object]], axes: Sequence[dict[str, object] | None]
) -> tuple[list[str], list[dict[str, object]]]:
    """Each run's group label and the axis values behind it.

    The config keys that differ between runs (the seed and :data:`IGNORED` left out) define
    the groups. When every run has its launch axes and the axes that differ split the runs into
    exactly those groups, they name them (``algo=dr_grpo``, not every ``algo.*`` key the group
    changed); otherwise the differing config keys do."""
    keys = sorted(set.intersection(*(set(c) for c in configs)) - IGNORED)
    varying = [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]
    by_config = [{k: c.get(k) for k in varying} for c in configs]
    config_labels = [", ".join(f"{k}={v}" for k, v in a.items()) or "all runs" for a in by_config]
    if any(a is None for a in axes):
        return config_labels, by_config
    names = sorted(set().union(*(set(a) for a in axes)) - IGNORED)  # type: ignore[arg-type]

    def value(run: int, key: str) -> object:
        found = axes[run]  # a key one run did not override has its config value
        return found[key] if key in found else configs[run].get(key, "default")  # type: ignore[operator]

    differ = [k for k in names if len({_shown(value(i, k)) for i in range(len(configs))}) > 1]
    by_axes = [{k: value(i, k) for k in differ} for i in range(len(configs))]
    axis_labels = [
        ", ".join(f"{k}={_shown(v)}" for k, v in a.items()) or "all runs" for a in by_axes
    ]
    if _partition(axis_labels) == _partition(config_labels):
        return axis_labels, by_axes
    return config_labels, by_config


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Read every run's config, axes and scalars, labelled by :func:`group_labels`. The
    ``final/*`` scalars of a run's HParams session are its summary, not curves: left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from marl.analysis.hparams import FINAL_PREFIX

    configs = [_flatten(run_yaml(p / "config.yaml") or {}) for p in paths]
    labels, axes = group_labels(configs, [run_axes(p) for p in paths])
    runs = []
    for path, config, label, values in zip(paths, configs, labels, axes):
        events = EventAccumulator(str(path / "tensorboard"), size_guidance={"scalars": 0})
        events.Reload()
        curves = {
            tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]
            if not tag.startswith(FINAL_PREFIX)
        }
        runs.append(Run(path, label, int(config.get("seed", 0) or 0), curves, values))
    return runs


def _group_order(members: Sequence[Run]) -> tuple:
    """Sort key of a group: its axis values, numbers by value (0.25 before 1), then the label."""
    axes = members[0].axes
    return tuple(
        (0, v, "") if isinstance(v, int | float) and not isinstance(v, bool) else (1, 0, str(v))
        for v in axes.values()
    ) + ((2, 0, members[0].label),)


def groups_of(runs: Sequence[Run]) -> list[tuple[str, list[Run]]]:
    """Runs by group label, in axis order."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.label].append(run)
    return sorted(groups.items(), key=lambda item: _group_order(item[1]))


def summarize(runs: Sequence[Run], tag: str, last: int = 3) -> list[dict[str, object]]:
    """Per group: seeds, mean and CI of the tag's mean over the last ``last`` logged steps."""
    rows = []
    for label, members in groups_of(runs):
        finals = [fmean(v for _, v in r.curves[tag][-last:]) for r in members if r.curves.get(tag)]
        firsts = [r.curves[tag][0][1] for r in members if r.curves.get(tag)]
        mean, half = mean_ci(finals)
        start, _ = mean_ci(firsts)
        rows.append(
            {"group": label, "seeds": len(finals), "start": start, "final": mean, "ci95": half}
        )
    return rows


FINAL_TAGS = ("team/reward", "team/success", "eval/success", "eval/reward")


def final_rows(runs: Sequence[Run], last: int = 3) -> list[dict[str, object]]:
    """Per group: its axes, seeds, and for every :data:`FINAL_TAGS` tag some run logged the
    mean and 95% CI half-width over seeds of the run's final value (the mean of the last
    ``last`` steps; ``eval/*``: the last evaluation), as the run's HParams session logs it."""
    from marl.analysis.summary import final_value

    tags = [t for t in FINAL_TAGS if any(r.curves.get(t) for r in runs)]
    rows = []
    for label, members in groups_of(runs):
        metrics = {}
        for tag in tags:
            finals = [final_value(tag, r.curves[tag], last) for r in members if r.curves.get(tag)]
            mean, half = mean_ci(finals)
            metrics[tag] = {"mean": mean, "ci95": half, "seeds": len(finals)}
        axes = {k: v for k, v in members[0].axes.items()}
        rows.append({"group": label, "axes": axes, "seeds": len(members), "metrics": metrics})
    return rows


def spread(half: float, seeds: int, sign: str = "± ") -> str:
    """A table cell for a 95% CI half-width over ``seeds`` runs: ``± 0.123``, or ``(1 seed)``
    where one seed leaves no spread to estimate (never ``± nan``)."""
    if seeds < 2 or math.isnan(half):
        return f"({seeds} seed{'' if seeds == 1 else 's'})"
    return f"{sign}{half:.3f}"


def _print_finals(rows: Sequence[dict[str, object]], last: int) -> None:
    width = max(len(str(r["group"])) for r in rows)
    tags = list(rows[0]["metrics"])  # type: ignore[arg-type]
    print(f"\nfinal metrics (mean ± 95% CI over seeds; last {last} steps, eval/*: last evaluation)")
    print(f"{'group':{width}s}  seeds  " + "  ".join(f"{t:17s}" for t in tags))
    for row in rows:
        cells = []
        for tag in tags:
            m = row["metrics"][tag]  # type: ignore[index]
            cells.append(f"{m['mean']:+.3f} {spread(m['ci95'], m['seeds'])}" if m["seeds"] else "-")
        print(
            f"{row['group']:{width}s}  {row['seeds']:5d}  " + "  ".join(f"{c:17s}" for c in cells)
        )


def _write_finals_csv(rows: Sequence[dict[str, object]], path: Path) -> Path:
    import csv

    axes = list(rows[0]["axes"])  # type: ignore[arg-type]
    tags = list(rows[0]["metrics"])  # type: ignore[arg-type]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            ["group", *axes, "seeds", *(f"{t}{s}" for t in tags for s in ("", "_ci95"))]
        )
        for row in rows:
            values = [row["axes"].get(a) for a in axes]  # type: ignore[union-attr]
            metrics = row["metrics"]
            cells = [x for t in tags for x in (metrics[t]["mean"], metrics[t]["ci95"])]  # type: ignore[index]
            writer.writerow([row["group"], *values, row["seeds"], *cells])
    return path


EMERGENCE_HEADLINE = (
    "message_rate",
    "speaker_mi",
    "speaker_mi_content",
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
            f"{row['start']:+.3f}   {row['final']:+.3f}   {spread(row['ci95'], row['seeds'], '')}"
        )


def draw(runs: Sequence[Run], tag: str) -> Any:
    """The figure of :func:`plot`: the mean curve per group with a 95% CI band over seeds.

    Steps are whole numbers, so the x axis has whole-number ticks only; the legend sits to the
    right of the axes, never on a curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(9, 4))
    for label, members in groups_of([r for r in runs if r.curves.get(tag)]):
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
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("step")
    axes.set_ylabel(tag)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    figure.tight_layout()
    return figure


def plot(runs: Sequence[Run], tag: str, out: Path) -> Path:
    """Mean curve per group with a 95% CI band over seeds (:func:`draw`), saved as a PNG."""
    import matplotlib.pyplot as plt

    figure = draw(runs, tag)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=120, bbox_inches="tight")  # the legend beside the axes included
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
            f"{row['final']:+.3f}   {spread(row['ci95'], row['seeds'], '')}"
        )
    out = Path(ns.out) if ns.out else Path(ns.dirs[0]) / "report"
    finals = final_rows(runs, ns.last)
    if finals and finals[0]["metrics"]:
        _print_finals(finals, ns.last)
    emergence = emergence_rows(runs, ns.last)
    if emergence:
        _print_emergence(emergence, ns.last)
    png = plot(runs, ns.tag, out / (re.sub(r"[^A-Za-z0-9_.-]+", "_", ns.tag) + ".png"))
    axes = list(runs[0].axes)
    summary = {"tag": ns.tag, "axes": axes, "rows": rows, "finals": finals, "emergence": emergence}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"plot: {png}\nsummary: {out / 'summary.json'}")
    if finals and finals[0]["metrics"]:
        print(f"final metrics: {_write_finals_csv(finals, out / 'finals.csv')}")
    return 0
