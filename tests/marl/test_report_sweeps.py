"""``marl report`` on real sweeps: run directories made by ``marl train -m`` with scripted agents
(no model) are grouped by the swept axes, in axis order, with mean ± 95% CI of the final
metrics per group, and those agree with what each run logged to its HParams session."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from marl.analysis.hparams import read_session
from marl.analysis.report import group_labels
from marl.analysis.stats import mean_ci

AXIS = "scenario.overrides.reward.cooperation"


def run_marl(marl_cli, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    done = marl_cli(*args, cwd=cwd, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def scripted_multirun(marl_cli, root: Path, *overrides: str) -> Path:
    run_marl(
        marl_cli,
        "train",
        "-m",
        "agents=scripted",
        "train.steps=3",
        "logging.progress=false",
        "emergence.influence_every=0",
        *overrides,
        f"hydra.sweep.dir={root}",
        cwd=root.parent,
    )
    return root


@pytest.fixture(scope="module")
def cooperation_sweep(marl_cli, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The public-goods cooperation preset, cut to 3 values x 2 seeds, played by random bots."""
    root = tmp_path_factory.mktemp("sweeps") / "public_goods"
    return scripted_multirun(
        marl_cli,
        root,
        "+sweep=public_goods_cooperation",
        "bot=random",
        f"{AXIS}=1.0,0.0,0.5",
        "seed=0,1",
    )


@pytest.mark.slow
@pytest.mark.subprocess
def test_report_groups_a_cooperation_sweep_by_its_axis(marl_cli, cooperation_sweep: Path) -> None:
    runs = sorted(p for p in cooperation_sweep.iterdir() if (p / "config.yaml").is_file())
    assert len(runs) == 6
    done = run_marl(
        marl_cli, "report", str(cooperation_sweep), "--last", "2", cwd=cooperation_sweep
    )
    summary = json.loads((cooperation_sweep / "report" / "summary.json").read_text())
    assert summary["axes"] == [AXIS]
    groups = [row["group"] for row in summary["finals"]]
    assert groups == [f"{AXIS}=0", f"{AXIS}=0.5", f"{AXIS}=1"]  # by value, not as launched
    assert [row["seeds"] for row in summary["finals"]] == [2, 2, 2]
    assert f"{AXIS}=0.5" in done.stdout and "final metrics" in done.stdout
    # each group holds the runs whose HParams session (read back with TensorBoard's reader)
    # has that cooperation value, one per seed
    for row in summary["finals"]:
        value = row["axes"][AXIS]
        members = [p for p in runs if read_session(p / "tensorboard")[0][AXIS] == value]
        assert len(members) == 2
        sessions = [read_session(p / "tensorboard") for p in members]
        assert all(status == "success" for _, _, status in sessions)
        assert {h["seed"] for h, _, _ in sessions} == {0.0, 1.0}
        final_3 = [f["final/team/reward"] for _, f, _ in sessions]
        mean_3, _ = mean_ci(final_3)
        got = row["metrics"]["team/reward"]
        assert got["seeds"] == 2
        if value == 0.0:  # zero-sum: the team reward is 0 whatever is played
            assert abs(got["mean"]) < 1e-6 and abs(mean_3) < 1e-6
        else:
            assert got["mean"] > 0.5 and mean_3 > 0.5
        assert math.isfinite(got["ci95"])
    with (cooperation_sweep / "report" / "finals.csv").open() as handle:
        table = list(csv.DictReader(handle))
    assert [r[AXIS] for r in table] == ["0.0", "0.5", "1.0"]
    assert {"team/reward", "team/reward_ci95", "seeds"} <= set(table[0])


@pytest.mark.slow
@pytest.mark.subprocess
def test_report_agrees_with_the_hparams_session_when_averaging_the_same_steps(
    marl_cli,
    cooperation_sweep: Path,
) -> None:
    run_marl(
        marl_cli,
        "report",
        str(cooperation_sweep),
        "--last",
        "3",
        "--out",
        "r3",
        cwd=cooperation_sweep,
    )
    summary = json.loads((cooperation_sweep / "r3" / "summary.json").read_text())
    for row in summary["finals"]:
        value = row["axes"][AXIS]
        finals = [
            read_session(p / "tensorboard")[1]["final/team/reward"]
            for p in cooperation_sweep.iterdir()
            if (p / "tensorboard").is_dir() and read_session(p / "tensorboard")[0][AXIS] == value
        ]
        mean, half = mean_ci(finals)
        got = row["metrics"]["team/reward"]
        # the same values: report averages the float32 curve, the session stored the float64 mean
        assert got["mean"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
        assert got["ci95"] == pytest.approx(half, rel=1e-5, abs=1e-6)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_group_axis_names_the_group_not_every_key_it_changed(marl_cli, tmp_path: Path) -> None:
    root = scripted_multirun(
        marl_cli,
        tmp_path / "algos",
        "scenario=stag-hunt",
        "algo=grpo,dr_grpo",
        "seed=0,1",
        "train.steps=2",
    )
    done = run_marl(marl_cli, "report", str(root), cwd=tmp_path)
    summary = json.loads((root / "report" / "summary.json").read_text())
    assert summary["axes"] == ["algo"]
    assert [(r["group"], r["seeds"]) for r in summary["finals"]] == [
        ("algo=dr_grpo", 2),
        ("algo=grpo", 2),
    ]
    assert "algo.advantage" not in done.stdout  # what the config diff alone would print


def test_config_keys_name_the_groups_when_the_axes_do_not_split_the_runs_alike() -> None:
    configs = [
        {"seed": 0, "algo.lr": 0.1},
        {"seed": 1, "algo.lr": 0.1},
        {"seed": 0, "algo.lr": 0.2},
    ]
    # the axes explain the configs: they name the groups
    labels, axes = group_labels(
        configs, [{"algo.lr": 0.1, "seed": 0}, {"algo.lr": 0.1, "seed": 1}, {"algo.lr": 0.2}]
    )
    assert labels == ["algo.lr=0.1", "algo.lr=0.1", "algo.lr=0.2"]
    # a run launched with no axis on record: the config diff
    labels, _ = group_labels(configs, [{"algo.lr": 0.1}, None, {"algo.lr": 0.2}])
    assert labels == ["algo.lr=0.1", "algo.lr=0.1", "algo.lr=0.2"]
    # axes that split otherwise (two spellings of one scenario): the config diff, which is right
    same = [{"seed": 0, "scenario.name": "x"}] * 2
    labels, _ = group_labels(same, [{"scenario": "a"}, {"scenario": "b"}])
    assert labels == ["all runs", "all runs"]
    # an axis one run did not override takes that run's config value
    labels, axes = group_labels(
        configs[:1] + configs[2:], [{"seed": 0}, {"algo.lr": 0.2, "seed": 0}]
    )
    assert labels == ["algo.lr=0.1", "algo.lr=0.2"]
