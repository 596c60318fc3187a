"""Ratings from game results: win/draw/loss, Wilson intervals, Elo (online) and Bradley-Terry.

One small module for the rating math that the league's Elo curve (:mod:`marl.competition.league`)
and ``marl eval`` (:mod:`marl.competition.crossplay`) both use.

- **Outcome of a two-player episode** (:func:`outcome`, defined once in
  :mod:`marl.scenarios.zero_sum`): an agent *wins* when its return is greater than its
  opponent's, *draws* when they are equal (within ``1e-9``: returns are sums of floats), and
  *loses* otherwise. Nothing is asked of the scenario beyond its per-agent returns. A game's
  *score* is 1, 0.5 or 0.
- **Wilson interval** of a rate: :func:`marl.analysis.stats.wilson`, with the other intervals.
- **Elo** (Elo 1978): the expected score of A against B is
  ``E_A = 1 / (1 + 10 ** ((R_B - R_A) / 400))``; after a game with score ``S_A`` an online
  update moves ``R_A += K (S_A - E_A)`` (:class:`EloTracker`).
- **Bradley-Terry by maximum likelihood** (Bradley & Terry 1952; the MM algorithm of Hunter 2004,
  "MM algorithms for generalized Bradley-Terry models"): player i has strength ``g_i`` and wins
  against j with probability ``g_i / (g_i + g_j)``; a draw counts as half a win for each side.
  The minorize-maximize iteration ``g_i <- W_i / sum_j n_ij / (g_i + g_j)`` (``W_i`` the wins
  of i, ``n_ij`` the games between i and j) converges to the maximum-likelihood strengths.
  A weak prior of ``prior`` virtual draws of every player against a fixed player of strength 1
  keeps the estimate finite for a player who never won or never lost (as BayesElo does). On the
  Elo scale ``R_i = 400 log10(g_i)``, shifted so that the ratings average ``center`` (or the
  ``anchor`` player sits at ``center``). This is the order-free counterpart of Elo: the same
  results in any order give the same ratings.
- **Uncertainty** (:func:`bootstrap_ratings`): the games are resampled with replacement and the
  ratings refitted; the spread of the refits gives a standard error and a 95% percentile
  interval per player (Efron & Tibshirani 1993).
- **Mean payoff against the field** (:func:`payoff_ratings`), for games played for a payoff
  whose stakes differ from game to game (chips in Kuhn Poker, where a player can win fewer
  than half its hands and still win chips): player i's rating is the mean, over the opponents
  it met, of its mean payoff a game against each, ``r_i = mean_j mean_games(x_i)``. It is the
  row mean of the empirical payoff table of empirical game-theoretic analysis (Wellman 2006,
  "Methods for empirical game-theoretic analysis"); like every such average it depends on who
  is in the field (Balduzzi et al. 2018, "Re-evaluating evaluation"). Between two players it
  is the head-to-head mean payoff. Its uncertainty is a stratified bootstrap: each pairing's
  games are resampled with replacement, ``r`` recomputed, and the spread gives a standard error
  and a 95% percentile interval.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean, pstdev
from typing import Any

from marl.scenarios.zero_sum import outcome

__all__ = [
    "Game",
    "EloTracker",
    "bootstrap_ratings",
    "expected_score",
    "fit_bradley_terry",
    "outcome",
    "payoff_ratings",
    "score_of",
]

SCORE = {"win": 1.0, "draw": 0.5, "loss": 0.0}


def score_of(result: str) -> float:
    """1 for a win, 0.5 for a draw, 0 for a loss."""
    return SCORE[result]


def expected_score(rating_a: float, rating_b: float) -> float:
    """Elo's expected score of A against B: ``1 / (1 + 10 ** ((R_B - R_A) / 400))``."""
    return 1.0 / (1.0 + 10.0 ** ((rating_b - rating_a) / 400.0))


@dataclass(frozen=True)
class Game:
    """One game between players ``a`` and ``b``; ``score`` is a's (1 win, 0.5 draw, 0 loss),
    ``returns`` what a and b got, when known (a win/loss record hides a margin: in Kuhn Poker a
    bluff that wins 1 and a call that loses 2 are one win and one loss), and ``payoffs`` their
    own payoffs in the game's unit (chips), where the returns determine them."""

    a: str
    b: str
    score: float
    returns: tuple[float, float] | None = None
    payoffs: tuple[float, float] | None = None


@dataclass
class EloTracker:
    """Online Elo ratings (Elo 1978), updated game by game.

    k:       the update step (points per unit of surprise).
    initial: the rating a new player starts with.
    fixed:   players whose rating never moves (an anchor, such as the random bot, keeps the
             scale from drifting; frozen snapshots keep the rating they were given).
    """

    k: float = 16.0
    initial: float = 1000.0
    ratings: dict[str, float] = field(default_factory=dict)
    fixed: set[str] = field(default_factory=set)

    def rating(self, player: str) -> float:
        """``player``'s rating (``initial`` for one never seen)."""
        return self.ratings.get(player, self.initial)

    def add(self, player: str, rating: float | None = None, fixed: bool = False) -> None:
        """Enter ``player`` with ``rating`` (default: ``initial``); ``fixed`` pins it."""
        self.ratings[player] = self.initial if rating is None else float(rating)
        if fixed:
            self.fixed.add(player)

    def update(self, a: str, b: str, score_a: float) -> None:
        """One game: a scored ``score_a`` against b. Both move by ``K (S - E)`` unless fixed."""
        ra, rb = self.rating(a), self.rating(b)
        expected = expected_score(ra, rb)
        if a not in self.fixed:
            self.ratings[a] = ra + self.k * (score_a - expected)
        else:
            self.ratings.setdefault(a, ra)
        if b not in self.fixed:
            self.ratings[b] = rb + self.k * ((1.0 - score_a) - (1.0 - expected))
        else:
            self.ratings.setdefault(b, rb)

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {
            "k": self.k,
            "initial": self.initial,
            "ratings": dict(self.ratings),
            "fixed": sorted(self.fixed),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s result."""
        self.k = float(state["k"])
        self.initial = float(state["initial"])
        self.ratings = {str(p): float(r) for p, r in state["ratings"].items()}
        self.fixed = set(state["fixed"])


def fit_bradley_terry(
    games: Sequence[Game],
    players: Sequence[str] | None = None,
    *,
    prior: float = 1.0,
    center: float = 1000.0,
    anchor: str | None = None,
    iterations: int = 2000,
    tol: float = 1e-10,
) -> dict[str, float]:
    """Maximum-likelihood Bradley-Terry ratings on the Elo scale (MM algorithm, Hunter 2004).

    ``players`` fixes the order and may include players without games (they get the prior's
    rating); by default the players of ``games`` in order of appearance. ``prior`` virtual draws
    per player against a fixed strength-1 player keep every rating finite (``prior=0``: plain
    MLE, which diverges for a player who won or lost every game). Ratings average ``center``,
    or ``anchor`` is put at ``center``.
    """
    names = list(players) if players is not None else _players(games)
    index = {p: i for i, p in enumerate(names)}
    n = len(names)
    if n == 0:
        return {}
    wins = [prior * 0.5] * n  # W_i: the virtual draws give half a win each
    pairs: dict[tuple[int, int], float] = {}  # n_ij, i < j
    for game in games:
        if game.a not in index or game.b not in index:
            unknown = game.a if game.a not in index else game.b
            raise ValueError(f"game between {game.a!r} and {game.b!r}: {unknown!r} is not a player")
        if not 0.0 <= game.score <= 1.0:
            raise ValueError(f"game {game.a!r} vs {game.b!r}: score {game.score} not in [0, 1]")
        i, j = index[game.a], index[game.b]
        if i == j:
            continue  # a player against itself says nothing about its strength
        wins[i] += game.score
        wins[j] += 1.0 - game.score
        key = (min(i, j), max(i, j))
        pairs[key] = pairs.get(key, 0.0) + 1.0
    strength = [1.0] * n
    for _ in range(iterations):
        denominators = [prior / (s + 1.0) for s in strength]  # the virtual games against g = 1
        for (i, j), count in pairs.items():
            share = count / (strength[i] + strength[j])
            denominators[i] += share
            denominators[j] += share
        new = [
            (w / d if d > 0 else strength[i]) for i, (w, d) in enumerate(zip(wins, denominators))
        ]
        new = [max(s, 1e-12) for s in new]
        change = max(abs(math.log(a) - math.log(b)) for a, b in zip(new, strength))
        strength = new
        if change < tol:
            break
    elo = [400.0 * math.log10(s) for s in strength]
    shift = center - (elo[index[anchor]] if anchor is not None else fmean(elo))
    return {p: elo[i] + shift for p, i in index.items()}


def bootstrap_ratings(
    games: Sequence[Game],
    players: Sequence[str] | None = None,
    *,
    samples: int = 200,
    seed: int = 0,
    **fit: Any,
) -> dict[str, dict[str, float]]:
    """Bradley-Terry ratings with bootstrap uncertainty: per player ``rating`` (the fit on all
    games), ``se`` (standard deviation of the refits) and ``lo``/``hi`` (2.5th and 97.5th
    percentiles of ``samples`` refits on games resampled with replacement, seeded)."""
    names = list(players) if players is not None else _players(games)
    point = fit_bradley_terry(games, names, **fit)
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {p: [] for p in names}
    if games:
        for _ in range(samples):
            resampled = [games[rng.randrange(len(games))] for _ in games]
            refit = fit_bradley_terry(resampled, names, **fit)
            for p in names:
                draws[p].append(refit[p])
    return _bootstrap_summary(point, draws, names)


def payoff_ratings(
    games: Sequence[Game],
    players: Sequence[str] | None = None,
    *,
    samples: int = 200,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Mean payoff against the field, with a stratified bootstrap (see the module docstring):
    per player ``rating`` (the mean, over the opponents it met, of its mean payoff a game
    against each), ``se`` and ``lo``/``hi`` (standard deviation and 2.5th/97.5th percentiles of
    ``samples`` recomputations on each pairing's games resampled with replacement, seeded).
    Every game must carry ``payoffs``; a player who met no one gets NaN."""
    names = list(players) if players is not None else _players(games)
    pairings: dict[frozenset[str], list[Game]] = {}
    for game in games:
        if game.payoffs is None:
            raise ValueError(f"game {game.a!r} vs {game.b!r} carries no payoffs")
        if game.a != game.b:
            pairings.setdefault(frozenset((game.a, game.b)), []).append(game)
    point = _field_means(pairings.values(), names)
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {p: [] for p in names}
    for _ in range(samples if pairings else 0):
        resampled = [[g[rng.randrange(len(g))] for _ in g] for g in pairings.values()]
        for p, value in _field_means(resampled, names).items():
            if not math.isnan(value):
                draws[p].append(value)
    return _bootstrap_summary(point, draws, names)


def _bootstrap_summary(
    point: Mapping[str, float], draws: Mapping[str, list[float]], names: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Per player: the point estimate, and the standard deviation and 2.5th/97.5th percentiles
    of its bootstrap draws (the point alone when there are none)."""
    out = {}
    for p in names:
        values = sorted(draws[p]) or [point[p]]
        out[p] = {
            "rating": point[p],
            "se": pstdev(values) if len(values) > 1 else 0.0,
            "lo": _percentile(values, 0.025),
            "hi": _percentile(values, 0.975),
        }
    return out


def _field_means(pairings: Iterable[Sequence[Game]], names: Sequence[str]) -> dict[str, float]:
    """Each player's mean, over its pairings, of its mean payoff a game in that pairing."""
    per_opponent: dict[str, list[float]] = {p: [] for p in names}
    for pairing in pairings:
        totals: dict[str, float] = {}
        for g in pairing:
            pa, pb = g.payoffs  # type: ignore[misc]
            totals[g.a] = totals.get(g.a, 0.0) + pa
            totals[g.b] = totals.get(g.b, 0.0) + pb
        for p, total in totals.items():
            if p in per_opponent:
                per_opponent[p].append(total / len(pairing))
    return {p: fmean(v) if v else math.nan for p, v in per_opponent.items()}


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of sorted values."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def _players(games: Sequence[Game]) -> list[str]:
    seen: dict[str, None] = {}
    for game in games:
        seen.setdefault(game.a)
        seen.setdefault(game.b)
    return list(seen)
