"""``configs/sweep/``: Hydra multirun presets. The stag-hunt cooperation sweep composes, every
value it sweeps makes a valid scenario, the package ships the folder, and a real multirun
expands to one run per (cooperation, seed) whose rewards follow the coefficient."""

from __future__ import annotations

import os
import re
from importlib.resources import files
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

import marl
from marl.cli import register_scenario_options
from marl.config import load_config
from marl.scenarios.conformance import play_episode

ROOT = Path(__file__).resolve().parents[2]
SWEEP = "+sweep=stag_hunt_cooperation"


def composed(*overrides: str, hydra: bool = False):
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return compose(config_name="train", overrides=list(overrides), return_hydra_config=hydra)


def test_the_stag_hunt_sweep_composes_over_cooperation_and_seeds() -> None:
    cfg = composed(SWEEP, hydra=True)
    assert cfg.scenario.name == "stag-hunt-v0"
    params = dict(cfg.hydra.sweeper.params)
    assert params == {"scenario.overrides.reward.cooperation": "0.0,0.5,1.0", "seed": "0,1,2"}


@pytest.mark.parametrize(("cooperation", "team_return"), [(0.0, 0.0), (0.5, 2.0), (1.0, 4.0)])
def test_each_swept_value_is_a_valid_stag_hunt(cooperation: float, team_return: float) -> None:
    config = load_config(composed(SWEEP, f"scenario.overrides.reward.cooperation={cooperation}"))
    env = marl.make(config.scenario.name, **config.scenario.overrides)
    assert env.spec.cooperation == cooperation
    returns = play_episode(env, "rule", seed=0)  # both hunt the stag: (4, 4)
    assert returns == {"alice": team_return, "bob": team_return}


def test_the_package_ships_the_sweep_folder() -> None:
    text = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+; the project runs on 3.10
    assert '"marl.configs.sweep"' in text, "pyproject.toml: marl.configs.sweep is not a package"
    line = re.search(r'^"\*" = \[(.*)\]$', text, re.MULTILINE)
    assert line, "pyproject.toml: no package-data line for every package"
    patterns = re.findall(r'"([^"]+)"', line.group(1))
    shipped = {p for pattern in patterns for p in (ROOT / "configs" / "sweep").glob(pattern)}
    sweeps = set((ROOT / "configs" / "sweep").glob("*.yaml"))
    assert sweeps and sweeps <= shipped  # setuptools globs package-data from the package dir
    assert (files("marl.configs") / "sweep" / "stag_hunt_cooperation.yaml").is_file()


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_multirun_plays_one_run_per_cooperation_and_seed(marl_cli, tmp_path: Path) -> None:
    done = marl_cli(
        "play",
        "-m",
        SWEEP,
        "agents=scripted",
        "bot=rule",
        f"hydra.sweep.dir={tmp_path}",
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    runs = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert runs == [
        f"{i}_c{c}_s{s}"
        for i, (c, s) in enumerate((c, s) for c in ("0.0", "0.5", "1.0") for s in range(3))
    ]
    returns = [line for line in done.stdout.splitlines() if line.startswith("returns:")]
    assert returns == [
        f"returns: alice={r}, bob={r}" for r in ["+0.000"] * 3 + ["+2.000"] * 3 + ["+4.000"] * 3
    ]


@pytest.mark.parametrize(
    ("option", "name"),
    [
        ("stag-hunt", "stag-hunt-v0"),
        ("stag_hunt", "stag-hunt-v0"),
        ("public-goods", "public-goods-v0"),
    ],
)
def test_a_scenario_with_a_config_file_answers_to_its_unversioned_name(option, name) -> None:
    assert composed(f"scenario={option}").scenario.name == name


SWEEPS = sorted(p.stem for p in (ROOT / "configs" / "sweep").glob("*.yaml"))


def sweep_points(name: str) -> list[list[str]]:
    """Every point of a preset's grid, as the overrides Hydra's basic sweeper gives each job."""
    from itertools import product

    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = dict(composed(f"+sweep={name}", hydra=True).hydra.sweeper.params)
    parser = OverridesParser.create()
    axes = []
    for key, values in params.items():
        (override,) = parser.parse_overrides([f"{key}={values}"])
        axes.append([f"{key}={v}" for v in override.sweep_string_iterator()])
    return [list(point) for point in product(*axes)]


def test_the_ready_sweeps_are_the_ones_documented() -> None:
    assert SWEEPS == sorted(AXES)
    docs = (ROOT / "docs" / "sweeps.md").read_text()
    assert all(f"`{name}`" in docs for name in SWEEPS)


# what each preset moves: the swept config value, read back from the composed config
AXES = {
    "credit": (lambda c: c.credit.name, ["coma", "difference", "shapley", "team"]),
    "public_goods_cooperation": (
        lambda c: c.scenario.overrides["reward"]["cooperation"],
        [0.0, 0.25, 0.5, 0.75, 1.0],
    ),
    "sharing": (lambda c: c.sharing, ["independent", "lora", "shared"]),
    "stag_hunt_cooperation": (
        lambda c: c.scenario.overrides["reward"]["cooperation"],
        [0.0, 0.5, 1.0],
    ),
    "topology": (
        lambda c: c.scenario.overrides["graph"]["topology"],
        ["complete", "line", "ring", "star"],
    ),
}


def check_point(name: str, point: list[str]) -> tuple:
    """Compose one point, validate it as ``marl train`` would before building anything, build
    its scenario; returns what makes the run distinct."""
    from marl.loop.train import check_config

    config = load_config(composed(f"+sweep={name}", *point))
    check_config(config)  # the policy plan and the checks made before anything is built
    env = marl.make(config.scenario.name, **config.scenario.overrides)
    env.reset(seed=config.seed)
    read, _ = AXES[name]
    return (read(config), frozenset(env.graph.edges), config.seed)


@pytest.mark.parametrize("name", SWEEPS)
def test_the_first_point_of_each_sweep_composes_and_validates(name: str) -> None:
    points = sweep_points(name)
    assert len(points) >= 6  # at least two values of the axis x three seeds
    axis_value, _, seed = check_point(name, points[0])
    assert axis_value in AXES[name][1]
    assert seed == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", SWEEPS)
def test_every_point_of_every_sweep_composes_and_validates(name: str) -> None:
    points = sweep_points(name)
    seen = [check_point(name, point) for point in points]
    assert len(set(seen)) == len(points)  # every point is a different run (topology: graph)
    assert sorted({value for value, _, _ in seen}) == AXES[name][1]  # it moves what it says
    assert sorted({seed for _, _, seed in seen}) == [0, 1, 2]
    if name == "topology":  # the graph itself changes with the topology
        assert len({edges for _, edges, _ in seen}) == 4
