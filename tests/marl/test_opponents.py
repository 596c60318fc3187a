"""The league's opponent kinds are one registry (marl.opponents): a kind registered from outside
the package is accepted by ``league.mix`` and drawn by the league; a name taken twice is
refused; an unknown kind's error lists the registered ones; a family member the scenario
cannot play is refused by its key."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from marl.competition.league import LEAGUE_POLICY, League
from marl.config import ConfigError, LeagueConfig, load_config
from marl.opponents import OPPONENTS, Opponent, Pool, known_kinds, register_opponent

AGENTS = ["alice", "bob"]


@pytest.fixture
def oldest() -> Iterator[str]:
    """A kind of the test's own, ``oldest`` (the pool's first snapshot), removed afterwards."""

    @register_opponent("oldest")
    def draw(pool: Pool, rng: random.Random) -> Opponent:
        return Opponent(pool.snapshots[0], snapshot=True)

    try:
        yield "oldest"
    finally:
        del OPPONENTS["oldest"]


def test_a_kind_registered_outside_the_package_is_accepted_and_drawn(
    oldest: str, tmp_path: Path
) -> None:
    config = load_config({"league": {"enabled": True, "mix": {oldest: 3.0, "latest": 1.0}}})
    assert config.league.mix == {oldest: 3.0, "latest": 1.0}
    league = League(config.league, AGENTS, tmp_path / "league", seed=0)
    for step in (0, 5, 10):
        league.add_snapshot(step, {})
    draws = [league.draw(step, 2) for step in range(400)]
    kinds = Counter(d.kind for d in draws)
    assert abs(kinds[oldest] / 400 - 0.75) < 0.1
    for matchup in draws:
        expected = "snapshot_0" if matchup.kind == oldest else "snapshot_10"
        assert (matchup.opponent, matchup.policy, matchup.bot) == (expected, LEAGUE_POLICY, None)
    drawn = next(d for d in draws if d.kind == oldest)
    learner = drawn.learner_seats[0]
    won = SimpleNamespace(group_id=0, returns={a: 1.0 if a == learner else -1.0 for a in AGENTS})
    metrics = league.record(drawn, [won])
    assert metrics[f"league/{oldest}/win_rate"] == 1.0 and metrics[f"league/{oldest}/drawn"] == 1
    assert league.records["snapshot_0"].win == 1
    assert f"league/elo/{oldest}" not in metrics  # not a rated kind: its snapshots are rated


def test_a_name_taken_twice_is_refused(oldest: str) -> None:
    with pytest.raises(ValueError, match="opponent kind 'oldest' is already registered"):
        register_opponent(oldest)(lambda pool, rng: Opponent("self"))
    with pytest.raises(ValueError, match="opponent kind 'pfsp' is already registered"):
        register_opponent("pfsp")(lambda pool, rng: Opponent("self"))


def test_an_unknown_kind_is_refused_listing_the_registered_ones(oldest: str) -> None:
    with pytest.raises(ConfigError) as err:
        LeagueConfig(enabled=True, mix={"best": 1.0})
    assert str(err.value) == (
        "league.mix.best: unknown opponent kind 'best'; known: "
        "bot_<name>, latest, oldest, pfsp, self, uniform"
    )
    assert known_kinds() == ["bot_<name>", "latest", "oldest", "pfsp", "self", "uniform"]
    with pytest.raises(ConfigError, match="league.mix.bot_: unknown opponent kind 'bot_'"):
        LeagueConfig(enabled=True, mix={"bot_": 1.0})  # a family needs its member


def test_a_family_member_the_scenario_cannot_play_is_refused_by_its_key() -> None:
    from marl.loop.train import check_config

    config = {
        "scenario": {"name": "matching-pennies", "overrides": {}},
        "model": {"kind": "tiny"},
        "league": {"enabled": True, "mix": {"bot_rule": 1.0, "bot_nope": 0.5}},
    }
    with pytest.raises(ConfigError) as err:
        check_config(load_config(config))
    assert str(err.value).startswith("league.mix.bot_nope: no scripted bot 'nope' for rules")
    config["league"]["mix"] = {"bot_rule": 1.0, "bot_nope": 0.0}  # weight 0: never drawn
    check_config(load_config(config))
