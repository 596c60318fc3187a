"""``marl report``: groups runs by config, averages seeds with a 95% CI, writes a plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from marl.analysis.report import main
from marl.analysis.stats import mean_ci, t_quantile
from marl.errors import RunError


def fake_run(root: Path, name: str, lr: float, seed: int, rewards: list[float]) -> None:
    run = root / name
    (run / "tensorboard").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "algo": {"lr": lr}}))
    writer = SummaryWriter(str(run / "tensorboard"))
    for step, value in enumerate(rewards, start=1):
        writer.add_scalar("team/reward", value, step)
    writer.close()


def test_mean_ci_matches_the_t_interval() -> None:
    mean, half = mean_ci([1.0, 2.0, 3.0])
    assert mean == 2.0
    # t quantiles are computed now, not read off a 3-decimal table: 4.3027 for 2 df
    assert math.isclose(half, t_quantile(2) / math.sqrt(3), rel_tol=1e-9)
    assert math.isclose(half, 4.303 * 1.0 / math.sqrt(3), abs_tol=5e-4)
    assert math.isnan(mean_ci([5.0])[1])
    assert math.isclose(t_quantile(1000), 1.96, abs_tol=2.5e-3)  # 1.9623: near the normal


def test_report_groups_seeds_and_writes_plot(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fake_run(tmp_path, "a0", 0.1, 0, [0.0, 0.5, 1.0])
    fake_run(tmp_path, "a1", 0.1, 1, [0.0, 0.3, 0.8])
    fake_run(tmp_path, "b0", 0.2, 0, [0.0, 0.1, 0.2])
    assert main([str(tmp_path), "--last", "1"]) == 0
    printed = capsys.readouterr().out
    assert "algo.lr=0.1" in printed and "algo.lr=0.2" in printed
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    rows = {row["group"]: row for row in summary["rows"]}
    assert rows["algo.lr=0.1"]["seeds"] == 2
    assert math.isclose(rows["algo.lr=0.1"]["final"], 0.9, rel_tol=1e-6)  # float32 events
    assert rows["algo.lr=0.2"]["seeds"] == 1
    assert "nan" not in printed  # one seed has no spread to estimate: the cell says so
    one_seed = next(line for line in printed.splitlines() if line.startswith("algo.lr=0.2"))
    assert one_seed.rstrip().endswith("(1 seed)"), one_seed
    two_seeds = next(line for line in printed.splitlines() if line.startswith("algo.lr=0.1"))
    assert "seed)" not in two_seeds and float(two_seeds.split()[-1]) > 0, two_seeds
    assert (tmp_path / "report" / "team_reward.png").stat().st_size > 1000


def test_report_names_missing_directory_and_tag(tmp_path: Path) -> None:
    with pytest.raises(RunError, match="no such directory"):
        main([str(tmp_path / "nope")])
    fake_run(tmp_path, "a0", 0.1, 0, [0.0])
    with pytest.raises(RunError, match="agents/x/reward"):
        main([str(tmp_path), "--tag", "agents/x/reward"])


def test_the_plot_has_whole_step_ticks_and_its_legend_off_the_curves(tmp_path: Path) -> None:
    """Steps are integers: no 1.25, 1.5 ticks; the legend sits beside the axes, so it covers
    no curve, and the saved PNG includes it."""
    from matplotlib.transforms import Bbox

    from marl.analysis.report import draw, find_runs, load_runs

    fake_run(tmp_path, "a0", 0.1, 0, [0.0, 0.5, 1.0])
    fake_run(tmp_path, "a1", 0.1, 1, [0.0, 0.3, 0.8])
    fake_run(tmp_path, "b0", 0.2, 0, [1.0, 0.9, 0.95])
    figure = draw(load_runs(find_runs([tmp_path])), "team/reward")
    axes = figure.axes[0]
    figure.canvas.draw()
    low, high = axes.get_xlim()
    shown = [t for t in axes.get_xticks() if low <= t <= high]
    assert len(shown) >= 2 and all(float(t).is_integer() for t in shown), shown
    legend = axes.get_legend().get_window_extent()
    inside: Bbox = axes.get_window_extent()
    assert not legend.overlaps(inside), (legend, inside)
    assert legend.x0 >= inside.x1  # to the right of the plotting area
    assert main([str(tmp_path)]) == 0
    from PIL import Image

    width, height = Image.open(tmp_path / "report" / "team_reward.png").size
    assert width > height * 1.8  # the legend's room is in the image, not cut off


ALIAS_BOMB = """a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: [*f,*f,*f,*f,*f,*f,*f,*f,*f]
"""


@pytest.mark.parametrize("where", ["config.yaml", ".hydra/overrides.yaml"])
def test_a_crafted_run_yaml_is_refused_in_one_line_not_expanded(
    tmp_path: Path, capsys: pytest.CaptureFixture, where: str
) -> None:
    from marl.cli import main

    run = tmp_path / "runs" / "bomb"
    (run / "tensorboard").mkdir(parents=True)
    (run / ".hydra").mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    (run / where).write_text(ALIAS_BOMB)
    assert main(["report", str(tmp_path / "runs")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(run / where) in err[0]
    assert "anchors (&name) are not allowed" in err[0]
