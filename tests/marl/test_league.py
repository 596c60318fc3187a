"""The league: draws follow the mix and are reproducible, PFSP prefers the opponents the learner
loses to, the pool keeps its size, results follow the zero-sum contract; a frozen opponent is
never trained (its weights stay those of its snapshot, and no optimizer holds them); a league
run logs every tag at every step (TensorBoard's own reader) and resumes exactly."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.competition.league import LEAGUE_POLICY, League
from marl.config import ConfigError, LeagueConfig, load_config
from marl.loop.credit_phase import credit_phase
from marl.loop.trackers import _league_matchup
from marl.loop.train import check_config, train
from marl.runtime.local import LocalRuntime

AGENTS = ["alice", "bob"]


def league_config(**overrides: object) -> dict:
    config = {
        "scenario": {"name": "matching-pennies", "overrides": {}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 10},
        "algo": {"lr": 3e-3},
        "train": {"steps": 2, "seeds_per_step": 2, "group_size": 2},
        "logging": {"progress": False, "transcripts_every": 0},
        "league": {"enabled": True, "snapshot_every": 1, "mix": {"latest": 1.0}},
        "seed": 0,
    }
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if field:
            config.setdefault(section, {})[field] = value
        else:
            config[key] = value
    return config


def _league(tmp_path: Path, **settings: object) -> League:
    return League(LeagueConfig(enabled=True, **settings), AGENTS, tmp_path / "league", seed=0)


def _weights(value: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((2,), value)}


def test_draws_follow_the_mix_and_are_reproducible(tmp_path: Path) -> None:
    mix = {"latest": 2.0, "uniform": 1.0, "bot_random": 1.0, "self": 0.0}
    league = _league(tmp_path, mix=mix)
    for step in (0, 5, 10):
        league.add_snapshot(step, _weights(step))
    kinds = Counter(league.draw(step, 2).kind for step in range(4000))
    assert kinds["self"] == 0
    assert abs(kinds["latest"] / 4000 - 0.5) < 0.04
    assert abs(kinds["uniform"] / 4000 - 0.25) < 0.04
    assert abs(kinds["bot_random"] / 4000 - 0.25) < 0.04
    assert league.draw(7, 3) == league.draw(7, 3)
    seats = league.draw(7, 3).learner_seats
    assert seats == ["bob", "alice", "bob"]  # (step + group) % 2
    latest = next(league.draw(s, 2) for s in range(100) if league.draw(s, 2).kind == "latest")
    assert latest.opponent == "snapshot_10" and latest.policy == LEAGUE_POLICY
    bot = next(league.draw(s, 2) for s in range(100) if league.draw(s, 2).kind == "bot_random")
    assert bot.bot == "random" and bot.overrides(0, AGENTS) == ({}, {"bob": "random"})
    assert league.load_weights("snapshot_5")["w"].tolist() == [5.0, 5.0]


def test_pfsp_prefers_the_opponents_the_learner_loses_to(tmp_path: Path) -> None:
    league = _league(tmp_path, mix={"pfsp": 1.0}, pfsp_power=2.0)
    for step in (0, 1):
        league.add_snapshot(step, _weights(step))
    beaten = SimpleNamespace(group_id=0, returns={"alice": 2.0, "bob": -2.0})
    lost = SimpleNamespace(group_id=0, returns={"alice": -2.0, "bob": 2.0})
    seats = ["alice"]
    from marl.competition.league import Matchup

    league.record(Matchup("pfsp", "snapshot_0", seats, policy=LEAGUE_POLICY), [beaten] * 8)
    league.record(Matchup("pfsp", "snapshot_1", seats, policy=LEAGUE_POLICY), [lost] * 8)
    picks = Counter(league.draw(step, 1).opponent for step in range(2000))
    # smoothed scores 0.9 and 0.1 -> weights 0.01 and 0.81
    assert picks["snapshot_1"] / 2000 == pytest.approx(0.81 / 0.82, abs=0.02)


def test_pool_keeps_its_size_and_the_initial_snapshot(tmp_path: Path) -> None:
    league = _league(tmp_path, mix={"uniform": 1.0}, pool_size=3)
    for step in range(6):
        league.add_snapshot(step, _weights(step))
    assert [s.step for s in league.snapshots] == [0, 4, 5]
    other = _league(tmp_path / "b", mix={"uniform": 1.0}, pool_size=3, keep_initial=False)
    for step in range(6):
        other.add_snapshot(step, _weights(step))
    assert [s.step for s in other.snapshots] == [3, 4, 5]


def test_results_follow_the_zero_sum_contract_and_move_the_elo(tmp_path: Path) -> None:
    from marl.competition.league import Matchup

    league = _league(tmp_path, mix={"bot_rule": 1.0, "self": 1.0}, elo_k=32)
    episodes = [
        SimpleNamespace(group_id=0, returns={"alice": 1.0, "bob": -1.0}),  # learner alice wins
        SimpleNamespace(group_id=1, returns={"alice": 1.0, "bob": -1.0}),  # learner bob loses
        SimpleNamespace(group_id=1, returns={"alice": 0.0, "bob": 0.0}),  # draw
    ]
    metrics = league.record(Matchup("bot_rule", "bot_rule", ["alice", "bob"], bot="rule"), episodes)
    assert metrics["league/bot_rule/win_rate"] == pytest.approx(1 / 3)
    assert metrics["league/bot_rule/loss_rate"] == pytest.approx(1 / 3)
    assert metrics["league/bot_rule/draw_rate"] == pytest.approx(1 / 3)
    assert metrics["league/bot_rule/games"] == 3.0 and metrics["league/bot_rule/drawn"] == 1.0
    # every kind is logged, zeros included
    assert metrics["league/self/win_rate"] == 0.0 and metrics["league/self/games"] == 0.0
    # win then loss then draw at K=32 from 1000 vs 1000 (the bot moves too)
    a, b = 1000.0, 1000.0
    for score in (1.0, 0.0, 0.5):
        e = 1 / (1 + 10 ** ((b - a) / 400))
        a, b = a + 32 * (score - e), b - 32 * (score - e)
    assert metrics["league/elo"] == pytest.approx(a)
    assert metrics["league/elo/bot_rule"] == pytest.approx(b)
    restored = _league(tmp_path, mix={"bot_rule": 1.0, "self": 1.0}, elo_k=32)
    restored.load_state_dict(league.state_dict())
    assert restored.metrics() == league.metrics()


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"scenario.name": "relay"}, "league.enabled"),
        ({"sharing": "independent"}, "league.enabled"),
        ({"sharing": "lora"}, "league.enabled"),
        ({"credit": {"name": "difference"}}, "credit.name"),
        ({"league": {"enabled": True, "mix": {"bot_nope": 1.0}}}, "league.mix.bot_nope"),
        ({"league": {"enabled": True, "mix": {"best": 1.0}}}, "league.mix.best"),
        ({"league": {"enabled": True, "mix": {"latest": 0.0}}}, "league.mix"),
        ({"emergence": {"influence_every": 5}}, "emergence.influence_every"),
    ],
)
def test_impossible_leagues_are_refused_by_key(overrides: dict, key: str) -> None:
    config = league_config()
    for k, v in overrides.items():
        if k == "scenario.name":
            config["scenario"]["name"] = v
        else:
            config[k] = v
    with pytest.raises(ConfigError) as err:
        check_config(load_config(config))
    assert str(err.value).startswith(key), str(err.value)


def test_off_by_default() -> None:
    config = load_config({"model": {"kind": "tiny"}})
    assert config.league.enabled is False
    plan = check_config(config)
    assert plan is not None and LEAGUE_POLICY not in plan.policies


@pytest.mark.slow
def test_frozen_opponent_is_never_trained(tmp_path: Path) -> None:
    config = load_config(league_config())
    plan = check_config(config)
    assert plan is not None and not plan.policies[LEAGUE_POLICY].trainable
    runtime = LocalRuntime(config, plan)
    assert set(runtime.learners) == {"shared"}  # the opponent has no learner
    league = League(config.league, AGENTS, tmp_path / "league", seed=0)
    opponent = runtime.worker.policies.backends[LEAGUE_POLICY].model
    learner = runtime.learners["shared"]
    optimized = {id(p) for group in learner.learner.optimizer.param_groups for p in group["params"]}
    assert not any(id(p) in optimized for p in opponent.parameters())
    assert not any(p is q for p in opponent.parameters() for q in learner.model.parameters())
    initial = {k: v.clone() for k, v in learner.model.state_dict().items()}
    for step in range(2):
        matchup = _league_matchup(league, runtime, "shared", step, 2)
        assert matchup.opponent == f"snapshot_{step}"
        held = {k: v.clone() for k, v in opponent.state_dict().items()}
        snapshot = league.load_weights(matchup.opponent)
        assert all(torch.equal(held[k], snapshot[k]) for k in snapshot)
        rollout = runtime.rollout(step, matchup)
        policies = Counter(t.policy_id for t in rollout.turns)
        assert policies["shared"] > 0 and policies[LEAGUE_POLICY] > 0
        for turn in rollout.turns:  # the learner plays its seat of each group, the league the other
            learner_seat = matchup.learner_seats[turn.group_id]
            assert (turn.policy_id == "shared") == (turn.agent == learner_seat)
            if turn.round == 0:
                assert turn.extras["reward_to_go"] == turn.reward
        credit_phase(
            config.credit, rollout, None, "rae", baselines=_rae(), game="g", trainable=["shared"]
        )
        assert all(t.advantage != 0.0 for t in rollout.turns if t.policy_id == "shared")
        assert all(t.advantage == 0.0 for t in rollout.turns if t.policy_id == LEAGUE_POLICY)
        metrics = runtime.update(rollout.turns)
        assert metrics["shared"]["trained_turns"] == policies["shared"]
        after = opponent.state_dict()
        assert all(torch.equal(held[k], after[k]) for k in held), "the opponent changed"
    changed = [k for k, v in learner.model.state_dict().items() if not torch.equal(v, initial[k])]
    assert changed, "the learner did not train"


def _rae():  # noqa: ANN202
    """Baselines far from any return, so every learner turn has an advantage to train on."""
    from marl.credit.advantages import RoleBaselines

    baselines = RoleBaselines(0.9)
    baselines.baselines = {"g:alice": 50.0, "g:bob": -50.0}
    return baselines


LEAGUE_TAGS = ("win_rate", "draw_rate", "loss_rate", "games", "drawn")


@pytest.mark.slow
def test_league_run_logs_every_tag_every_step(tmp_path: Path) -> None:
    mix = {"latest": 1.0, "pfsp": 1.0, "bot_random": 1.0, "bot_rule": 1.0, "self": 1.0}
    config = league_config(
        **{"train.steps": 5, "algo": {"lr": 3e-3, "advantage": "marshal"}, "seed": 3}
    )
    config["league"]["mix"] = mix
    metrics = train(config, run_dir=tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for kind in mix:
        for tag in LEAGUE_TAGS:
            name = f"league/{kind}/{tag}"
            assert name in scalars, name
            assert [e.step for e in events.Scalars(name)] == [1, 2, 3, 4, 5], name
    for tag in ("league/elo", "league/pool_size", "league/elo/bot_rule"):
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3, 4, 5], tag
    drawn = [sum(events.Scalars(f"league/{k}/drawn")[s].value for k in mix) for s in range(5)]
    assert drawn == [1.0] * 5  # one opponent kind per step
    games = sum(metrics[f"league/{k}/games"] for k in mix)
    assert games == 5 * 2 * 2  # every episode scored once (windows hold 64)
    assert metrics["league/pool_size"] == 5.0
    assert math.isfinite(metrics["league/elo"])
    assert len(list((tmp_path / "league").glob("snapshot_*.pt"))) == 5


@pytest.mark.slow
def test_league_resume_continues_exactly(tmp_path: Path) -> None:
    def config(steps: int, **extra: object) -> dict:
        c = league_config(**{"train.steps": steps, "algo": {"lr": 3e-3, "advantage": "rae"}})
        c["league"]["mix"] = {"latest": 1.0, "uniform": 1.0, "bot_rule": 1.0}
        c.update(extra)
        return c

    def comparable(m: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in m.items() if not k.startswith("perf/")}

    straight = train(config(4), run_dir=tmp_path / "straight")
    train(config(2), run_dir=tmp_path / "first")
    resumed = train(
        config(4, resume=str(tmp_path / "first" / "checkpoints")), run_dir=tmp_path / "resumed"
    )
    assert comparable(straight) == comparable(resumed)
    assert "credit/baseline/alice" in straight


@pytest.mark.slow
@pytest.mark.ray
def test_league_on_ray_matches_one_process(tmp_path: Path, shared_ray: None) -> None:
    """A real local Ray session (this process's shared one): the snapshot opponent reaches the
    rollout workers through the object store, the bot plays inside them, and the run equals the
    one-process run."""
    ray_settings = {
        "enabled": True,
        "num_cpus": 2,
        "num_rollout_workers": 1,  # one batch per round, as in one process: the same samples
        "worker_num_cpus": 0.5,
        "learner_num_cpus": 0.5,
    }

    def config(**extra: object) -> dict:
        c = league_config(**{"train.steps": 3, "runtime": {"threads": 1}})
        c["league"]["mix"] = {"latest": 1.0, "bot_rule": 1.0}
        c.update(extra)
        return c

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the actors (Ray sets OMP_NUM_THREADS=1): same arithmetic
    try:
        local = train(config(), run_dir=tmp_path / "local")
        distributed = train(config(ray=ray_settings), run_dir=tmp_path / "ray")
    finally:
        torch.set_num_threads(threads)
    comparable = [
        k for k in local if k.startswith(("league/", "team/", "agents/", "policies/shared/loss"))
    ]
    assert comparable and {k: local[k] for k in comparable} == pytest.approx(
        {k: distributed[k] for k in comparable}, abs=1e-5
    )
    assert distributed["league/latest/games"] + distributed["league/bot_rule/games"] == 12


def test_presets_compose_through_hydra() -> None:
    from hydra import compose, initialize_config_module

    from marl.cli import register_scenario_options

    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        pool = load_config(
            compose("train", ["scenario=matching_pennies", "league=pool", "algo=rae"])
        )
        selfplay = load_config(compose("train", ["league=selfplay", "algo=marshal"]))
        default = load_config(compose("train", []))
    assert pool.league.enabled and pool.league.mix["bot_rule"] > 0 and pool.league.pool_size == 8
    assert pool.algo.advantage == "rae" and pool.algo.baseline_decay == 0.95
    assert selfplay.league.mix == {"self": 1.0} and selfplay.algo.advantage == "marshal"
    assert not default.league.enabled and default.algo.advantage == "grpo"
    assert check_config(pool) is not None  # the pool fits matching pennies
