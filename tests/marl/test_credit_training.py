"""Counterfactual credit through the real trainer: ``marl train credit=difference`` (and coma,
shapley) runs, TensorBoard gets ``credit/<agent>/mean`` for every agent and the
``credit/influence`` heatmap, and the advantages differ from team credit exactly where they
should.

The scenario is ``unison`` with three agents of which only ``a0``'s text scores
(``scored_agents: [a0]``): under cooperation 1 everybody is paid the team mean ``r_a0 / 3``, so
team credit hands the free riders ``a1`` and ``a2`` the scout's result, while every
counterfactual method must give them exactly 0 (replacing their text changes nothing).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.loop.train import train

pytestmark = pytest.mark.slow

AGENTS = ["a0", "a1", "a2"]
FREE_RIDERS = ["a1", "a2"]
STEPS = 2
GROUP = 4
MAX_NEW_TOKENS = 16
# A character the untrained tiny model (seed 0) writes often enough that a0's scores vary
# within the first groups; the test checks that they do, so it cannot pass vacuously.
TARGET = "E"
SCENARIO = {
    "system_prompt": "",
    "agents": AGENTS,
    "params": {"target": TARGET, "scored_agents": ["a0"]},
}


def credit_config(name: str) -> dict:
    return {
        "scenario": {"name": "unison", "overrides": SCENARIO},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": MAX_NEW_TOKENS},
        "algo": {"lr": 3e-3},
        "credit": {"name": name, "keep_action": False, "samples": 2},
        "train": {"steps": STEPS, "seeds_per_step": 1, "group_size": GROUP},
        "logging": {"progress": False, "transcripts_every": 1},
        "seed": 0,
    }


def events(run_dir: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(run_dir / "tensorboard"))
    accumulator.Reload()
    return accumulator


def series(accumulator: EventAccumulator, tag: str) -> list[float]:
    return [e.value for e in sorted(accumulator.Scalars(tag), key=lambda e: e.step)]


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread: on a busy 2-core machine it is several times faster for a tiny model."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, one_thread: None) -> dict[str, EventAccumulator]:
    """team, coma and shapley, trained in-process from the same seed (same first rollout)."""
    root = tmp_path_factory.mktemp("credit_runs")
    out = {}
    for name in ("team", "coma", "shapley"):
        train(credit_config(name), run_dir=root / name)
        out[name] = events(root / name)
    return out


def assert_logs_credit_and_influence(accumulator: EventAccumulator) -> None:
    scalars = set(accumulator.Tags()["scalars"])
    for agent in AGENTS:
        assert f"credit/{agent}/mean" in scalars, sorted(scalars)
        assert len(series(accumulator, f"credit/{agent}/mean")) == STEPS
    assert "credit/advantage_variance" in scalars
    images = accumulator.Tags()["images"]
    assert "credit/influence" in images, images
    heatmaps = accumulator.Images("credit/influence")
    assert len(heatmaps) == STEPS
    assert heatmaps[0].encoded_image_string.startswith(b"\x89PNG")


def assert_free_riders_get_no_credit(accumulator: EventAccumulator) -> None:
    for agent in FREE_RIDERS:
        assert series(accumulator, f"credit/{agent}/mean") == [0.0] * STEPS, agent


@pytest.mark.subprocess
def test_cli_train_credit_difference(marl_cli, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    completed = marl_cli(
        "train",
        "scenario=unison",
        "model=tiny",
        "credit=difference",
        "credit.keep_action=false",
        "+scenario.overrides.system_prompt=''",
        f"+scenario.overrides.agents=[{','.join(AGENTS)}]",
        f"+scenario.overrides.params={{target:{TARGET},scored_agents:[a0]}}",
        f"train.steps={STEPS}",
        "train.seeds_per_step=1",
        f"train.group_size={GROUP}",
        f"sampling.max_new_tokens={MAX_NEW_TOKENS}",
        "algo.lr=3e-3",
        "logging.progress=false",
        "logging.transcripts_every=1",
        f"hydra.run.dir={run_dir}",
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "name: difference" in (run_dir / "config.yaml").read_text()
    accumulator = events(run_dir)
    assert_logs_credit_and_influence(accumulator)
    assert_free_riders_get_no_credit(accumulator)
    # difference credit of the scout is its whole effect on the team mean: V(z) - V(z_-a0),
    # and with a0's text nulled the team scores 0, so it equals the team reward itself
    assert series(accumulator, "credit/a0/mean") == pytest.approx(
        series(accumulator, "team/reward"), abs=1e-9
    )


@pytest.mark.parametrize("name", ["coma", "shapley"])
def test_counterfactual_credit_logs_and_isolates_free_riders(
    runs: dict[str, EventAccumulator], name: str
) -> None:
    accumulator = runs[name]
    assert_logs_credit_and_influence(accumulator)
    assert_free_riders_get_no_credit(accumulator)
    if name == "shapley":  # efficiency: the scout's value is v(all) - v(none) = team reward
        assert series(accumulator, "credit/a0/mean") == pytest.approx(
            series(accumulator, "team/reward"), abs=1e-9
        )


def test_team_credit_pays_free_riders_the_team_reward(runs: dict[str, EventAccumulator]) -> None:
    team = runs["team"]
    reward = series(team, "team/reward")
    assert any(r > 0 for r in reward), "a0 never wrote the target: the test is vacuous"
    for agent in AGENTS:
        assert series(team, f"credit/{agent}/mean") == pytest.approx(reward, abs=1e-9)
    assert "credit/influence" not in team.Tags()["images"]  # team credit has no influence


@pytest.mark.parametrize("name", ["coma", "shapley"])
def test_advantages_differ_from_team_only_on_free_riders(
    runs: dict[str, EventAccumulator], name: str
) -> None:
    """Same first rollout for every method. Team credit gives all three agents the scout's
    normalised advantage (mean square (G-1)/G each); counterfactual credit keeps a varying
    advantage for the scout and zeroes the free riders', so the mean square over all turns is
    a third (up to the eps in the normalisation)."""
    team = series(runs["team"], "credit/advantage_variance")[0]
    counterfactual = series(runs[name], "credit/advantage_variance")[0]
    assert team == pytest.approx((GROUP - 1) / GROUP, rel=1e-3), "a0's first group did not vary"
    assert counterfactual == pytest.approx(team / 3, rel=1e-3)
