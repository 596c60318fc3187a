"""``marl eval``: play checkpoints, base models and scripted bots against each other.

    marl eval runs/seed0/checkpoints runs/seed1/checkpoints model:smollm2 random rule \\
        --episodes 40 --out runs/eval

Players:

- a checkpoint (a run directory, its ``checkpoints`` directory or one ``step_N`` directory),
  and, when the run trained several policies, ``path#policy``;
- a league snapshot of a run, ``<run>/league/snapshot_<step>.pt`` (its model is the one in
  ``<run>/config.yaml``): ``snapshot_0.pt`` is the run's own initial checkpoint;
- ``model:<preset>``: a ``configs/model`` preset as it is before any training (``model:tiny``,
  ``model:smollm2``), e.g. a run's own initial checkpoint when it had no warm-up;
- a scripted bot of the scenario: ``random``, ``rule`` or ``bot:<name>``.

Any player may be labelled, ``label=player`` (``a=runs/x``, ``b=bot:rule``); the label is its
name in the tables. The same bot or preset given twice without labels is numbered (``rule rule``
plays ``rule-1`` against ``rule-2``); two checkpoints that share a name need labels.

Every pairing plays ``--episodes`` episodes, seeded: episode k uses the k//2-th evaluation
scenario seed with the seats in one order for even k and swapped for odd k, so both players
see the same scenarios from both seats. All pairings' episodes run at once, one batched
generate call per model per round, as training's rollout does
(:func:`marl.runtime.rollout.run_episodes`).

Competitive mode (two agents and ``reward.cooperation < 1``): each cell is the row player's win
rate against the column player, with its 95% Wilson interval and the draws (the zero-sum
contract of :func:`marl.competition.ratings.outcome`), and every game feeds Bradley-Terry ratings on
the Elo scale with bootstrap intervals (:mod:`marl.competition.ratings`). A zero-sum game played
for its payoff, whose rules declare a ``payoff_unit`` (Kuhn Poker: chips, where the stakes
differ from hand to hand and the Nash bot wins chips from the random bot while winning fewer
than half the hands), is read by payoff instead: each cell is the row player's mean payoff
(chips a hand) with its 95% t-interval, then its win rate; the heatmap shows the payoff; and
the players are ranked by mean payoff against the field with bootstrap intervals
(:func:`marl.competition.ratings.payoff_ratings`), the Elo of games won beside it.

Cooperative mode (a fully cooperative scenario, or more than two agents): held-out partners;
each cell is the team's mean return (the agents' mean) when the row player fills the even seats
and the column player the odd ones (swapped every other episode), with a 95% t-interval, and
the success rate with its Wilson interval when the scenario defines success. The diagonal is
self-play.

In a two-agent zero-sum scenario, each player's own payoff (chips a hand in Kuhn Poker, whose
return is twice the chips) is also reported by seat, with 95% t-intervals
(:func:`individual_payoffs`, :func:`seat_payoffs`).

``--exploitability`` (scenarios whose rules declare a game tree: Kuhn Poker) also evaluates
every player exactly: its move probabilities at each information set, scored teacher-forced
for a model, its exploitability and NashConv, and its expected chips against the Nash and
random bots by seat (:mod:`marl.runtime.exploitability`). A scenario with no tree is refused in one
line before any model loads.

Written to ``--out``: ``crossplay.md`` (the matrix and the ratings, the payoffs by seat, the
exact evaluation), ``crossplay.csv`` (one row per ordered pairing), ``crossplay.png`` (a
heatmap) and ``crossplay.json`` (every game; ``ranked_by``, ``payoff_ratings``,
``payoff_by_seat`` and ``exploitability``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from statistics import fmean
from typing import Any

from marl.analysis.stats import mean_interval, wilson
from marl.competition.players import (
    BOT_PREFIX,
    MODEL_PREFIX,
    Player,
    build_backends,
    checkpoint_config,
    parse_players,
)
from marl.competition.ratings import Game, bootstrap_ratings, outcome, payoff_ratings, score_of
from marl.errors import RunError

__all__ = ["crossplay", "individual_payoffs", "main", "seat_payoffs"]

# --------------------------------------------------------------------------- playing


@dataclass
class Episode:
    """One played episode of a pairing: who sat where and what each agent got."""

    row: str
    col: str
    seats: dict[str, str]  # agent -> player name
    returns: dict[str, float]
    success: float | None
    # each agent's own payoff (chips in Kuhn Poker), where it can be read off the returns
    # (:func:`individual_payoffs`); None elsewhere
    payoffs: dict[str, float] | None = None


def individual_payoffs(
    returns: dict[str, float],
    malformed: dict[str, int],
    *,
    cooperation: float,
    malformed_penalty: float,
    zero_sum: bool,
) -> dict[str, float] | None:
    """Each agent's own payoff over the episode (the rules' individual payoff: chips in Kuhn
    Poker), without the cooperation mix or the malformed penalty; None where the returns do not
    determine it.

    The environment pays ``r_i = c * team + (1 - c) * (x_i - mean_{j != i} x_j)`` a round, plus
    the penalty for each malformed reply (``TextScenarioEnv._mix_rewards``). With two agents and
    rules that declare ``zero_sum`` (the individual payoffs of an episode sum to zero, and the
    team payoff is their mean), the team term sums to zero and ``x_j = -x_i``, so
    ``r_i = 2 (1 - c) x_i + penalty * malformed_i``, solved here for ``x_i``. Kuhn Poker's
    default (c = 0, no penalty) gives ``x_i = r_i / 2``: its return is twice the chips."""
    if not zero_sum or len(returns) != 2 or cooperation >= 1.0:
        return None
    return {
        agent: (r - malformed_penalty * malformed.get(agent, 0)) / (2.0 * (1.0 - cooperation))
        for agent, r in returns.items()
    }


def crossplay(
    players: Sequence[Player],
    scenario: str,
    overrides: dict[str, Any] | None = None,
    *,
    episodes: int = 20,
    seed: int = 0,
    sampling: Any = None,
    mode: str = "auto",
    backends: dict[str, Any] | None = None,
) -> tuple[str, list[Episode]]:
    """Play every pairing ``episodes`` times; returns the mode used and the episodes.

    Competitive: unordered pairs of distinct players. Cooperative: every unordered pair and
    every player with itself."""
    from marl.agents.backends import SamplingConfig
    from marl.runtime.rollout import EpisodeSlot, run_episodes
    from marl.scenarios.registry import make

    overrides = dict(overrides or {})
    probe = make(scenario, **overrides)
    agents = list(probe.possible_agents)
    mode = _mode(mode, probe)
    if backends is None:
        backends = build_backends(players)
    by_name = {p.name: p for p in players}
    names = [p.name for p in players]
    pairs = [
        (names[i], names[j])
        for i in range(len(names))
        for j in range(i if mode == "cooperative" else i + 1, len(names))
    ]
    from marl.runtime.seeding import held_out_seeds

    scenario_seeds = held_out_seeds(f"{seed}:crossplay", (episodes + 1) // 2)
    slots, meta = [], []
    for pair_index, (row, col) in enumerate(pairs):
        for k in range(episodes):
            first, second = (row, col) if k % 2 == 0 else (col, row)
            seats = {a: (first if n % 2 == 0 else second) for n, a in enumerate(agents)}
            policies = {a: p for a, p in seats.items() if by_name[p].kind != "bot"}
            bots = {a: by_name[p].bot for a, p in seats.items() if by_name[p].kind == "bot"}
            slots.append(
                EpisodeSlot(
                    env=type(probe)(probe.spec),  # as make() builds it, the YAML read once
                    seed=scenario_seeds[k // 2],
                    group_id=pair_index,
                    episode_id=len(slots),
                    policies=policies,
                    bots=bots,  # type: ignore[arg-type]
                )
            )
            meta.append((row, col, seats))
    if sampling is None:
        sampling = SamplingConfig()  # the sampling group's defaults

    def nobody(agent: str) -> str:
        raise RunError(f"eval: agent {agent!r} has no player (a bug: every seat is assigned)")

    result = run_episodes(
        slots,
        backends,
        nobody,
        sampling,
        seed=seed * 1_000_003 + 424_243,
    )
    spec = probe.spec
    played = [
        Episode(
            row,
            col,
            seats,
            dict(record.returns),
            record.success,
            individual_payoffs(
                record.returns,
                record.malformed,
                cooperation=spec.cooperation,
                malformed_penalty=spec.malformed_penalty,
                zero_sum=probe.rules_cls.info.zero_sum,
            ),
        )
        for (row, col, seats), record in zip(meta, result.episodes)
    ]
    return mode, played


def _mode(mode: str, env: Any) -> str:
    if mode not in ("auto", "competitive", "cooperative"):
        raise RunError(f"eval: --mode {mode!r} is not one of auto, competitive, cooperative")
    agents = len(env.possible_agents)
    if mode == "competitive" and agents != 2:
        raise RunError(f"eval: competitive mode needs two agents, {env.spec.name} has {agents}")
    if mode != "auto":
        return mode
    return "competitive" if agents == 2 and env.spec.cooperation < 1.0 else "cooperative"


# --------------------------------------------------------------------------- tables


def games_of(played: Sequence[Episode]) -> list[Game]:
    """Each competitive episode as a game scored for ``row`` (1 win, 0.5 draw, 0 loss), with
    both players' returns and, where the episode carries them, their own payoffs."""
    games = []
    for ep in played:
        mine = next(a for a, p in ep.seats.items() if p == ep.row)
        theirs = next(a for a, p in ep.seats.items() if p == ep.col)
        own, other = ep.returns[mine], ep.returns[theirs]
        payoffs = None if ep.payoffs is None else (ep.payoffs[mine], ep.payoffs[theirs])
        games.append(Game(ep.row, ep.col, score_of(outcome(own, other)), (own, other), payoffs))
    return games


def ranking_unit(mode: str, unit: str | None, games: Sequence[Game]) -> str | None:
    """The unit to rank in: the scenario's declared payoff unit (``ScenarioInfo.payoff_unit``:
    a game played for its payoff, such as chips in Kuhn Poker) when the mode is competitive
    and every game carries both players' payoffs (two agents, zero-sum rules); else None (rank
    by games won)."""
    if mode != "competitive" or not unit or not games:
        return None
    return unit if all(g.payoffs is not None for g in games) else None


def competitive_cells(names: Sequence[str], games: Sequence[Game]) -> list[dict[str, Any]]:
    """One row per ordered pairing (row != col): games, wins, draws, losses, win rate with its
    Wilson interval, the score rate ``(wins + draws / 2) / games``, the row player's mean
    return with a 95% t-interval, and, where every game carries payoffs, the row player's mean
    payoff with its 95% t-interval (``mean_payoff``: chips a hand in Kuhn Poker, the measure
    for games with stakes)."""
    rows = []
    for a in names:
        for b in names:
            if a == b:
                continue
            scores = [g.score for g in games if g.a == a and g.b == b]
            scores += [1.0 - g.score for g in games if g.a == b and g.b == a]
            returns = [g.returns[0] for g in games if g.a == a and g.b == b and g.returns]
            returns += [g.returns[1] for g in games if g.a == b and g.b == a and g.returns]
            mean, low, high = mean_interval(returns) if returns else (math.nan, math.nan, math.nan)
            n = len(scores)
            wins, draws = sum(s == 1.0 for s in scores), sum(s == 0.5 for s in scores)
            lo, hi = wilson(wins, n)
            mine = [g for g in games if {g.a, g.b} == {a, b}]
            payoffs = [g.payoffs[0 if g.a == a else 1] for g in mine if g.payoffs is not None]
            payoff = (
                dict(zip(("mean_payoff", "payoff_lo", "payoff_hi"), mean_interval(payoffs)))
                if payoffs and len(payoffs) == len(mine)
                else {}
            )
            rows.append(
                {
                    "row": a,
                    "col": b,
                    "games": n,
                    "wins": wins,
                    "draws": draws,
                    "losses": n - wins - draws,
                    "win_rate": wins / n if n else float("nan"),
                    "win_lo": lo,
                    "win_hi": hi,
                    "score": (wins + 0.5 * draws) / n if n else float("nan"),
                    "mean_return": mean,
                    "return_lo": low,
                    "return_hi": high,
                    **payoff,
                }
            )
    return rows


def cooperative_cells(names: Sequence[str], played: Sequence[Episode]) -> list[dict[str, Any]]:
    """One row per ordered pairing (diagonal included, symmetric): the team's mean return with
    a 95% t-interval, and the success rate with its Wilson interval when there is one."""
    rows = []
    for a in names:
        for b in names:
            eps = [e for e in played if {e.row, e.col} == {a, b} and (a != b or e.row == e.col)]
            team = [fmean(e.returns.values()) for e in eps]
            n = len(team)
            mean, low, high = mean_interval(team) if team else (math.nan, math.nan, math.nan)
            row = {
                "row": a,
                "col": b,
                "games": n,
                "team_return": mean,
                "team_lo": low,
                "team_hi": high,
            }
            successes = [e.success for e in eps]
            if n and all(s is not None for s in successes):
                rate = fmean(successes)  # type: ignore[arg-type]
                lo, hi = wilson(rate * n, n)
                row.update({"success": rate, "success_lo": lo, "success_hi": hi})
            rows.append(row)
    return rows


def seat_payoffs(names: Sequence[str], played: Sequence[Episode]) -> list[dict[str, Any]]:
    """One row per ordered pairing (player != opponent) whose episodes carry payoffs
    (:func:`individual_payoffs`): the player's mean payoff a game (chips a hand in Kuhn Poker)
    in each seat, ``seat0`` (the first agent, who acts first in Kuhn Poker) and ``seat1``, with
    its 95% t-interval and the number of games. Each seat's games have distinct scenario
    seeds (the seats swap on the same seed), so they are independent draws."""
    rows = []
    for a in names:
        for b in names:
            eps = [e for e in played if {e.row, e.col} == {a, b} and e.payoffs is not None]
            if a == b or not eps:
                continue
            row: dict[str, Any] = {"player": a, "opponent": b}
            for k in range(2):
                values = []
                for e in eps:
                    agent = list(e.seats)[k]  # the seats in the scenario's agent order
                    if e.seats[agent] == a:
                        values.append(e.payoffs[agent])  # type: ignore[index]
                mean, low, high = mean_interval(values) if values else (math.nan,) * 3
                row.update(
                    {
                        f"seat{k}_games": len(values),
                        f"seat{k}": mean,
                        f"seat{k}_lo": low,
                        f"seat{k}_hi": high,
                    }
                )
            rows.append(row)
    return rows


def seat_markdown(rows: Sequence[dict[str, Any]], agents: Sequence[str]) -> str:
    """:func:`seat_payoffs` as a Markdown table."""
    lines = [
        "The player's own payoff a game by seat (the rules' payoff without the cooperation "
        "term or penalties: chips a hand in Kuhn Poker), mean with its 95% t-interval, games "
        "in parentheses.",
        "",
        f"| player | opponent | as {agents[0]} (seat 0) | as {agents[1]} (seat 1) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        cells = [
            f"{r[f'seat{k}']:+.3f} [{r[f'seat{k}_lo']:+.3f}, {r[f'seat{k}_hi']:+.3f}] "
            f"({r[f'seat{k}_games']})"
            for k in range(2)
        ]
        lines.append(f"| {r['player']} | {r['opponent']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(
    mode: str,
    names: Sequence[str],
    cells: Sequence[dict[str, Any]],
    ratings: dict[str, dict[str, float]] | None,
    episodes: int,
    *,
    unit: str | None = None,
    payoff: dict[str, dict[str, float]] | None = None,
) -> str:
    """The matrix (and the ratings) as Markdown. ``unit`` (a game played for its payoff, see
    :func:`ranking_unit`): the cells and the ranking are the mean payoff in that unit
    (``payoff``: :func:`marl.competition.ratings.payoff_ratings`), the win rate and the
    Bradley-Terry Elo of games won beside them."""
    index = {(c["row"], c["col"]): c for c in cells}
    lines = []
    if mode == "competitive" and unit:
        lines.append(
            f"Mean payoff of the row player against the column player, in {unit} per game, "
            f"with its 95% t-interval, {episodes} episodes per pairing (seats alternate); then "
            "the row player's win rate with its 95% Wilson interval, draws in parentheses. The "
            "stakes differ from game to game, so the payoff, not the win rate, says who is ahead."
        )
    elif mode == "competitive":
        lines.append(
            f"Win rate of the row player against the column player, {episodes} episodes per "
            "pairing (seats alternate), 95% Wilson interval; draws in parentheses; then the "
            "row player's mean return with its 95% t-interval."
        )
    else:
        lines.append(
            f"Team return (mean of the agents' returns) of the row and column players as "
            f"partners, {episodes} episodes per pairing, 95% t-interval; the diagonal is "
            "self-play, the rest cross-play with held-out partners."
        )
    lines += ["", "| row \\ col | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for a in names:
        row = []
        for b in names:
            c = index.get((a, b))
            if c is None:
                row.append("-")
            elif mode == "competitive":
                wins = f"{c['win_rate']:.2f} [{c['win_lo']:.2f}, {c['win_hi']:.2f}]"
                wins += f" ({c['draws']} d)"
                if unit:
                    row.append(
                        f"{c['mean_payoff']:+.3f} [{c['payoff_lo']:+.3f}, {c['payoff_hi']:+.3f}]"
                        f" {unit}, wins {wins}"
                    )
                else:
                    row.append(
                        f"{wins}, return {c['mean_return']:+.2f} "
                        f"[{c['return_lo']:+.2f}, {c['return_hi']:+.2f}]"
                    )
            else:
                text = f"{c['team_return']:+.2f} [{c['team_lo']:+.2f}, {c['team_hi']:+.2f}]"
                if "success" in c:
                    text += f", success {c['success']:.2f}"
                row.append(text)
        lines.append(f"| {a} | " + " | ".join(row) + " |")
    if ratings and unit and payoff:
        lines += [
            "",
            f"Ranked by mean payoff against the field ({unit} per game: the mean, over the "
            "player's opponents here, of its mean payoff against each), with bootstrap standard "
            "errors and 95% intervals (each pairing's games resampled); beside it the "
            "Bradley-Terry Elo of games won, which ignores the stakes:",
            "",
            f"| player | {unit} per game vs the field | se | 95% interval | Elo (games won) |",
            "|---|---|---|---|---|",
        ]
        for name in sorted(payoff, key=lambda p: -payoff[p]["rating"]):
            r = payoff[name]
            lines.append(
                f"| {name} | {r['rating']:+.3f} | {r['se']:.3f} | "
                f"[{r['lo']:+.3f}, {r['hi']:+.3f}] | {ratings[name]['rating']:.0f} |"
            )
    elif ratings:
        lines += [
            "",
            "Bradley-Terry ratings on the Elo scale (maximum likelihood over every game, draws "
            "as half a win), with bootstrap standard errors and 95% intervals:",
            "",
            "| player | Elo | se | 95% interval |",
            "|---|---|---|---|",
        ]
        for name in sorted(ratings, key=lambda p: -ratings[p]["rating"]):
            r = ratings[name]
            lines.append(
                f"| {name} | {r['rating']:.0f} | {r['se']:.0f} | [{r['lo']:.0f}, {r['hi']:.0f}] |"
            )
    return "\n".join(lines)


def heatmap(
    path: Path,
    mode: str,
    names: Sequence[str],
    cells: Sequence[dict[str, Any]],
    unit: str | None = None,
) -> Path:
    """A PNG heatmap of the matrix: the mean payoff in ``unit`` (a game played for its payoff),
    the win rate (another competitive game) or the team return."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    payoff = mode == "competitive" and unit is not None
    key = "mean_payoff" if payoff else "win_rate" if mode == "competitive" else "team_return"
    index = {(c["row"], c["col"]): c for c in cells}
    matrix = [
        [index[(a, b)][key] if (a, b) in index else float("nan") for b in names] for a in names
    ]
    size = 2.0 + 0.9 * len(names)
    figure, axes = plt.subplots(figsize=(size + 1.0, size))
    if payoff:
        top = max((abs(v) for row in matrix for v in row if not math.isnan(v)), default=0.0)
        top = top or 1.0  # symmetric around 0: red loses, blue wins
        image = axes.imshow(matrix, cmap="RdBu", vmin=-top, vmax=top)
        title = f"mean payoff of row vs column ({unit} per game)"
    elif mode == "competitive":
        image = axes.imshow(matrix, cmap="RdBu", vmin=0.0, vmax=1.0)
        title = "win rate of row vs column"
    else:
        image = axes.imshow(matrix, cmap="viridis")
        title = "team return"
    axes.set_xticks(range(len(names)), names, rotation=45, ha="right")
    axes.set_yticks(range(len(names)), names)
    axes.set_xlabel("column player")
    axes.set_ylabel("row player")
    axes.set_title(title)
    shown = "{:+.2f}" if payoff else "{:.2f}"
    for i, row in enumerate(matrix):
        for j, value in enumerate(row):
            if not math.isnan(value):
                axes.text(j, i, shown.format(value), ha="center", va="center", fontsize=8)
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def write_results(
    out: Path,
    mode: str,
    players: Sequence[Player],
    played: Sequence[Episode],
    episodes: int,
    *,
    bootstrap: int = 200,
    seed: int = 0,
    exploitability: dict[str, dict[str, Any]] | None = None,
    payoff_unit: str | None = None,
) -> dict[str, Any]:
    """Write crossplay.{md,csv,png,json} under ``out``; returns the JSON payload.

    Where the episodes carry individual payoffs (two-agent zero-sum scenarios), the Markdown
    and the JSON (``payoff_by_seat``) hold each player's payoff by seat (:func:`seat_payoffs`).
    ``payoff_unit``: the scenario's ``ScenarioInfo.payoff_unit`` (a game played for its
    payoff); where :func:`ranking_unit` keeps it, the matrix, the heatmap and the ranking are
    the mean payoff (``payoff_ratings`` in the JSON, ``ranked_by: "payoff"``), with the win
    rate and the Bradley-Terry Elo of games won (``ratings``) beside them.
    ``exploitability``: :func:`marl.runtime.exploitability.exploitability_report`'s result, added to
    the Markdown and to the JSON (``exploitability``)."""
    out.mkdir(parents=True, exist_ok=True)
    names = [p.name for p in players]
    ratings = payoff = unit = None
    if mode == "competitive":
        games = games_of(played)
        cells = competitive_cells(names, games)
        anchor = next((p.name for p in players if p.kind == "bot" and p.bot == "random"), None)
        ratings = bootstrap_ratings(games, names, samples=bootstrap, seed=seed, anchor=anchor)
        unit = ranking_unit(mode, payoff_unit, games)
        if unit:
            payoff = payoff_ratings(games, names, samples=bootstrap, seed=seed)
    else:
        cells = cooperative_cells(names, played)
    text = markdown(mode, names, cells, ratings, episodes, unit=unit, payoff=payoff)
    by_seat = seat_payoffs(names, played) if mode == "competitive" else []
    if by_seat:
        text += "\n\n" + seat_markdown(by_seat, list(played[0].seats))
    if exploitability is not None:
        from marl.runtime.exploitability import markdown as exploitability_markdown

        text += "\n\n" + exploitability_markdown(exploitability)
    (out / "crossplay.md").write_text(text + "\n")
    with open(out / "crossplay.csv", "w", newline="") as f:
        columns = list(dict.fromkeys(k for c in cells for k in c))
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(cells)
    heatmap(out / "crossplay.png", mode, names, cells, unit)
    payload = {
        "mode": mode,
        "episodes_per_pairing": episodes,
        "players": [{**asdict(p), "path": _shown(p.path)} for p in players],
        "cells": cells,
        "ranked_by": None if mode != "competitive" else "payoff" if unit else "elo",
        "payoff_unit": unit,
        "payoff_ratings": payoff,
        "ratings": ratings,
        "payoff_by_seat": by_seat,
        "exploitability": exploitability,
        "episodes": [asdict(e) for e in played],
    }
    (out / "crossplay.json").write_text(json.dumps(payload, indent=2) + "\n")
    return payload


# --------------------------------------------------------------------------- CLI


def main(args: Sequence[str]) -> int:
    """``marl eval``'s entry point (argument parsing, loading, playing, writing)."""
    parser = argparse.ArgumentParser(
        prog="marl eval",
        description="Play checkpoints, model presets and bots against each other (cross-play); "
        "write the matrix with 95% intervals (Markdown, CSV, PNG) and Elo ratings; a game "
        "played for chips (Kuhn Poker) is tabled and ranked by mean payoff, the win rate beside "
        "it.",
    )
    parser.add_argument(
        "players",
        nargs="+",
        help="checkpoint paths ([name=]path[#policy]), league snapshots "
        "(<run>/league/snapshot_<step>.pt), model:<preset>, or bots (random, rule, bot:<name>)",
    )
    parser.add_argument(
        "--scenario", help="scenario name or YAML (default: the first checkpoint's)"
    )
    parser.add_argument(
        "--rules-module",
        metavar="MODULE",
        help="a Python module of yours to import before the scenario is read (its rules, bots "
        "register on import), as scenario.rules_module does in training. Importing runs it: "
        "name only modules you trust. A rules_module that a checkpoint's config names is never "
        "imported; name it here",
    )
    parser.add_argument("--episodes", type=int, default=20, help="episodes per pairing")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/eval", help="output directory")
    parser.add_argument("--mode", default="auto", help="auto, competitive or cooperative")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples")
    parser.add_argument(
        "--exploitability",
        action="store_true",
        help="also evaluate each player exactly on the scenario's game tree (Kuhn Poker): its "
        "move probabilities at every information set, exploitability (NashConv / 2), NashConv "
        "and expected chips against the Nash and random bots by seat; scenarios whose rules "
        "declare no tree are refused",
    )
    parser.add_argument(
        "--listening",
        action="store_true",
        help="cooperative speaker/listener scenarios (signal): each player is a run's pair "
        "(its first two agents' policies, LoRA adapters included) or model:<preset>; play every "
        "speaker with every listener (a success matrix with 95%% Wilson intervals) and measure "
        "each pair exactly: CIC, influence, success, null message, message swap "
        "(docs/emergence.md)",
    )
    parser.add_argument(
        "--counterfactuals", type=int, default=8, help="--listening: speaker replies per scenario"
    )
    parser.add_argument(
        "--listening-episodes",
        type=int,
        default=32,
        help="--listening: held-out scenarios of the exact measures",
    )
    parser.add_argument(
        "--replies",
        type=int,
        default=0,
        help="--exploitability and --listening: read each model's move or answer distribution "
        "by the scenario's parser from this many sampled replies (every reply it accepts "
        "counts; the malformed share / off-set is what it rejects) instead of scoring the "
        "common spellings exactly (0, the default)",
    )
    ns = parser.parse_args(args)
    if ns.episodes < 1:
        raise RunError(f"eval: --episodes must be >= 1, got {ns.episodes}")
    if ns.replies < 0:
        raise RunError(f"eval: --replies must be >= 0, got {ns.replies}")
    if ns.listening:
        return _listening_main(ns)

    from marl.scenarios.registry import make

    run = _first_run_config(ns.players, ns.rules_module)
    scenario, overrides = _scenario(run, ns)
    probe = make(scenario, **overrides)
    rules = probe.spec.rules
    if ns.exploitability:
        from marl.runtime.exploitability import tree_of

        tree_of(scenario, overrides)  # refused here, before any model loads
    players = parse_players(ns.players, rules)
    sampling = _sampling(run, ns)
    backends = build_backends(players)
    mode, played = crossplay(
        players,
        scenario,
        overrides,
        episodes=ns.episodes,
        seed=ns.seed,
        sampling=sampling,
        mode=ns.mode,
        backends=backends,
    )
    report = None
    if ns.exploitability:
        from marl.runtime.exploitability import exploitability_report

        report = exploitability_report(
            players,
            backends,
            scenario,
            overrides,
            sampling=sampling,
            replies=ns.replies,
        )
    out = Path(ns.out)
    write_results(
        out,
        mode,
        players,
        played,
        ns.episodes,
        bootstrap=ns.bootstrap,
        seed=ns.seed,
        exploitability=report,
        payoff_unit=probe.rules_cls.info.payoff_unit,
    )
    print((out / "crossplay.md").read_text())
    print(f"wrote {out / 'crossplay.md'}, crossplay.csv, crossplay.png, crossplay.json")
    return 0


def _listening_main(ns: argparse.Namespace) -> int:
    """``marl eval --listening``: :mod:`marl.competition.role_eval`'s cross-play and exact
    measures."""
    from marl.competition.role_eval import load_pairs, pair_listening, role_crossplay, write_tables

    if ns.exploitability:
        raise RunError("eval: --listening and --exploitability are separate evaluations")
    if ns.listening_episodes < 1 or ns.counterfactuals < 1:
        raise RunError("eval: --listening-episodes and --counterfactuals must be >= 1")
    run = _first_run_config(ns.players, ns.rules_module)
    scenario, overrides = _scenario(run, ns)
    pairs = load_pairs(ns.players, rules_module=ns.rules_module)
    sampling = _sampling(run, ns)
    cells = role_crossplay(
        pairs,
        scenario,
        overrides,
        episodes=ns.episodes,
        seed=ns.seed,
        sampling=sampling,
    )
    listening = pair_listening(
        pairs,
        scenario,
        overrides,
        episodes=ns.listening_episodes,
        counterfactuals=ns.counterfactuals,
        seed=ns.seed,
        sampling=sampling,
        progress=True,
        replies=ns.replies,
    )
    out = Path(ns.out)
    written = write_tables(out, cells, listening)
    for path in written:
        if path.suffix == ".md":
            print(path.read_text())
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _sampling(run: dict[str, Any], ns: argparse.Namespace) -> Any:
    """The first checkpoint's sampling settings (its ``sampling`` group read through
    :func:`marl.config.load_config`, so with the schema's defaults and checks), with
    ``--max-new-tokens`` and ``--temperature`` overriding them; a ``SamplingConfig``."""

    from marl.config import load_config

    s = run.get("sampling") or {}
    if not isinstance(s, dict):
        raise RunError(f"eval: the first checkpoint's config.sampling is not a mapping: {s!r:.80}")
    kinds = {"max_new_tokens": int, "temperature": (int, float), "top_p": (int, float)}
    for key, kind in kinds.items():
        value = s.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            flag = f"; set it with --{key.replace('_', '-')}" if key != "top_p" else ""
            raise RunError(
                f"eval: the first checkpoint's config.sampling.{key} is {value!r:.80}, not a "
                f"number{flag}"
            )
    flags: dict[str, Any] = {}
    if ns.max_new_tokens:
        flags["max_new_tokens"] = ns.max_new_tokens
    if ns.temperature is not None:
        flags["temperature"] = ns.temperature
    try:  # a ConfigError is a ValueError; replace() runs the checks again
        return replace(load_config({"sampling": s}).sampling, **flags)
    except ValueError as exc:
        raise RunError(f"eval: {exc} (the first checkpoint's config, or the flag)") from None


def _first_run_config(specs: Sequence[str], rules_module: str | None = None) -> dict[str, Any]:
    """The run config of the first spelling that is an existing checkpoint path, as
    :func:`checkpoint_config` makes it safe to use (``rules_module``: the one the command line
    names); a spelling that is a path (it holds a ``/``) but does not exist is refused."""
    from marl.runtime.checkpoint import load_checkpoint

    config = None
    for spec in specs:
        body = spec.rpartition("=")[2]
        if body.startswith((BOT_PREFIX, MODEL_PREFIX)):
            continue
        path = body.partition("#")[0]
        if Path(path).is_file() and path.endswith(".pt"):
            continue
        if Path(path).exists():
            if config is None:
                saved = load_checkpoint(path, command="eval").get("config") or {}
                config = checkpoint_config(saved, path, rules_module)
        elif "/" in path:
            raise RunError(f"eval: checkpoint not found: {path}")
    return config or {}


def _scenario(run: dict[str, Any], ns: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """The scenario ``marl eval`` plays and its overrides: ``--scenario`` (its own file as it
    is), else the first checkpoint's (``run``, made safe by :func:`checkpoint_config`);
    ``--rules-module`` is imported either way."""
    if ns.scenario:
        scenario, overrides = ns.scenario, {}
    else:
        saved = run.get("scenario") or {}
        scenario, overrides = saved.get("name"), dict(saved.get("overrides") or {})
        if scenario is None:
            raise RunError("eval: no --scenario given and no checkpoint to take it from")
    if ns.rules_module is not None:
        overrides["rules_module"] = ns.rules_module
    return scenario, overrides


def _shown(path: str | None) -> str | None:
    """A player's path as written to ``crossplay.json``: relative to the working directory when
    it lies inside it, so that results name no machine's directories."""
    if not path or not os.path.isabs(path):
        return path
    resolved = Path(path).resolve()
    return str(resolved.relative_to(Path.cwd())) if resolved.is_relative_to(Path.cwd()) else path
