"""marl.competition.ratings: the win/draw/loss contract, Elo by hand, Bradley-Terry by maximum
likelihood (checked against the likelihood's own gradient and against known strengths),
bootstrap, and the mean payoff against the field by hand."""

from __future__ import annotations

import math
import random

import pytest

from marl.analysis.stats import wilson
from marl.competition.ratings import (
    EloTracker,
    Game,
    bootstrap_ratings,
    expected_score,
    fit_bradley_terry,
    outcome,
    payoff_ratings,
)
from marl.scenarios.zero_sum import outcomes


def test_outcome_contract() -> None:
    assert outcome(2.0, -2.0) == "win"
    assert outcome(0.5, 0.5) == "draw"
    assert outcome(-0.1, 0.0) == "loss"
    # float noise is a draw, the same tolerance as the zero-sum contract's outcomes()
    assert outcome(0.1 + 0.2, 0.3) == "draw"
    assert outcomes({"a": 0.1 + 0.2 - 0.3, "b": 0.3 - 0.2 - 0.1}) == {"a": "draw", "b": "draw"}


def test_elo_by_hand() -> None:
    assert expected_score(1000, 1000) == 0.5
    assert expected_score(1400, 1000) == pytest.approx(1 / (1 + 10 ** (-1)))
    elo = EloTracker(k=32)
    elo.add("anchor", 1000, fixed=True)
    elo.update("p", "anchor", 1.0)  # expected 0.5, scored 1 -> +16
    assert elo.rating("p") == pytest.approx(1016)
    assert elo.rating("anchor") == 1000
    elo.update("p", "q", 0.0)  # q is new at 1000: p expected 1/(1+10^(-16/400))
    e = 1 / (1 + 10 ** (-16 / 400))
    assert elo.rating("p") == pytest.approx(1016 - 32 * e)
    assert elo.rating("q") == pytest.approx(1000 + 32 * e)
    copy = EloTracker()
    copy.load_state_dict(elo.state_dict())
    assert copy.ratings == elo.ratings and copy.fixed == {"anchor"} and copy.k == 32


def _loglik(games: list[Game], ratings: dict[str, float]) -> float:
    total = 0.0
    for g in games:
        p = expected_score(ratings[g.a], ratings[g.b])
        total += g.score * math.log(p) + (1 - g.score) * math.log(1 - p)
    return total


def test_bradley_terry_is_the_maximum_likelihood() -> None:
    games = (
        [Game("a", "b", 1.0)] * 7
        + [Game("a", "b", 0.0)] * 3
        + [Game("b", "c", 1.0)] * 6
        + [Game("b", "c", 0.5)] * 2
        + [Game("c", "b", 1.0)] * 2
        + [Game("c", "a", 1.0)] * 2
        + [Game("a", "c", 1.0)] * 5
    )
    fit = fit_bradley_terry(games, prior=0.0)
    base = _loglik(games, fit)
    for player in fit:  # the likelihood's gradient is 0 at the fit: no nudge improves it
        for delta in (-1.0, 1.0):
            nudged = {**fit, player: fit[player] + delta}
            assert _loglik(games, nudged) <= base + 1e-9
    assert fit["a"] > fit["b"] > fit["c"]
    assert sum(fit.values()) / 3 == pytest.approx(1000)
    # two players: the MLE has the closed form p = wins / games
    pair = fit_bradley_terry([Game("x", "y", 1.0)] * 3 + [Game("x", "y", 0.0)], prior=0.0)
    assert expected_score(pair["x"], pair["y"]) == pytest.approx(0.75, abs=1e-6)


def test_bradley_terry_recovers_known_strengths_in_any_order() -> None:
    truth = {"p0": 1200.0, "p1": 1000.0, "p2": 900.0, "p3": 800.0}
    rng = random.Random(0)
    games = []
    names = list(truth)
    for _ in range(4000):
        a, b = rng.sample(names, 2)
        games.append(Game(a, b, float(rng.random() < expected_score(truth[a], truth[b]))))
    fit = fit_bradley_terry(games, anchor="p1", center=1000.0)
    for p in names:
        assert abs(fit[p] - truth[p]) < 40, (p, fit[p])
    shuffled = games[:]
    rng.shuffle(shuffled)
    again = fit_bradley_terry(shuffled, anchor="p1", center=1000.0)
    assert again == pytest.approx(fit)


def test_prior_keeps_an_unbeaten_player_finite() -> None:
    fit = fit_bradley_terry([Game("a", "b", 1.0)] * 5)
    assert all(math.isfinite(r) for r in fit.values()) and fit["a"] > fit["b"]
    with pytest.raises(ValueError, match="'z' is not a player"):
        fit_bradley_terry([Game("a", "z", 1.0)], players=["a", "b"])


def test_bootstrap_interval_is_seeded_and_covers_the_fit() -> None:
    games = [Game("a", "b", 1.0)] * 12 + [Game("a", "b", 0.0)] * 8 + [Game("b", "c", 1.0)] * 5
    one = bootstrap_ratings(games, samples=100, seed=3)
    two = bootstrap_ratings(games, samples=100, seed=3)
    assert one == two
    for p, r in one.items():
        assert r["lo"] <= r["rating"] <= r["hi"], p
        assert r["se"] > 0
    assert wilson(10, 20) == pytest.approx((0.299, 0.701), abs=1e-3)


def test_payoff_ratings_weigh_each_opponent_equally_and_resample_within_pairings() -> None:
    # a vs b: +1 and +3 chips (a mean of +2); a vs c, four games: -1 each (a mean of -1)
    games = [Game("a", "b", 1.0, payoffs=(1.0, -1.0)), Game("b", "a", 0.0, payoffs=(-3.0, 3.0))]
    games += [Game("c", "a", 1.0, payoffs=(1.0, -1.0))] * 4
    ratings = payoff_ratings(games, ["a", "b", "c", "d"], samples=200, seed=1)
    assert ratings["a"]["rating"] == pytest.approx((2.0 - 1.0) / 2)  # not (1 + 3 - 4) / 6
    assert ratings["b"]["rating"] == pytest.approx(-2.0)
    assert ratings["c"]["rating"] == pytest.approx(1.0)
    assert ratings["c"]["se"] == 0.0  # every a-c game is the same: nothing to resample
    assert ratings["b"]["lo"] == pytest.approx(-3.0) and ratings["b"]["hi"] == pytest.approx(-1.0)
    assert ratings["a"]["lo"] <= ratings["a"]["rating"] <= ratings["a"]["hi"]
    assert math.isnan(ratings["d"]["rating"])  # met no one
    assert payoff_ratings(games, samples=50, seed=2) == payoff_ratings(games, samples=50, seed=2)
    with pytest.raises(ValueError, match="carries no payoffs"):
        payoff_ratings([Game("a", "b", 1.0)])
