"""The league's opponent kinds: one registry, whose names are the keys of ``league.mix``.

Each training step the league draws one kind (weighted by ``league.mix``), and the kind's
draw says who plays the seats that the learner does not (:meth:`marl.competition.league.League.
draw` turns that into the rollout's ``Matchup``). A draw is a function of plain data, the
:class:`Pool` (the snapshots' names and the learner's scores against them) and the step's
``random.Random``, so a resumed run draws the same. Register a kind with
:func:`register_opponent`; a name already taken is refused, and an unknown ``league.mix`` key
is refused when the config loads, with the registered kinds listed::

    @register_opponent("oldest")
    def oldest(pool: Pool, rng: random.Random) -> Opponent:
        return Opponent(pool.snapshots[0], snapshot=True)

A *family* (``family=True``) is written ``<name>_<member>``: ``bot_random`` is the ``bot``
family with the member ``random``, handed to the draw as ``pool.member``.

Built in:

- ``self``: the learner on both seats, both trained (plain self-play, as in SPIRAL);
- ``latest``: the newest snapshot;
- ``uniform``: a snapshot drawn uniformly from the pool;
- ``pfsp``: prioritised fictitious self-play (Vinyals et al. 2019, "Grandmaster level in
  StarCraft II using multi-agent reinforcement learning", the "hard" weighting): snapshot k is
  drawn with weight ``(1 - p_k)^p`` (``p`` = ``league.pfsp_power``), where ``p_k`` is the
  learner's Laplace-smoothed score against it, so opponents it cannot yet beat come more often;
- ``bot_<name>``: a scripted bot of the scenario (``bot_random``, ``bot_rule``).

The registry sits beside the config, in the driver's lowest room, because ``LeagueConfig``
checks ``league.mix`` against it when it loads; it imports no tensor library.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from marl.protocols.registry import Registry, UnknownNameError

if TYPE_CHECKING:
    from marl.config import LeagueConfig

__all__ = [
    "OPPONENTS",
    "Opponent",
    "OpponentKind",
    "Pool",
    "known_kinds",
    "register_opponent",
    "resolve_kind",
]


@dataclass(frozen=True)
class Pool:
    """What a kind's draw sees: plain data from the league at the step it is drawn.

    kind:      the ``league.mix`` key drawn (``pfsp``, ``bot_rule``).
    member:    a family's member (``rule`` in ``bot_rule``); None for a plain kind.
    snapshots: the names of the snapshots in the pool, oldest first (the learner is
               snapshotted at step 0, before the first draw, so it is never empty then).
    scores:    the learner's Laplace-smoothed score against each snapshot,
               ``(wins + draws / 2 + 1) / (games + 2)`` (0.5 before any game).
    config:    the league's settings (``pfsp_power`` and any a kind of yours reads).
    """

    kind: str
    member: str | None
    snapshots: tuple[str, ...]
    scores: Mapping[str, float]
    config: LeagueConfig


@dataclass(frozen=True)
class Opponent:
    """Who a draw put on the opponent's seats.

    name:     its name in the records and ratings (``snapshot_<step>``, ``bot_rule``, ``self``).
    snapshot: ``name`` is a snapshot of the pool: the league's frozen policy plays it, loaded
              with that snapshot's weights.
    bot:      the scripted bot of the scenario that plays it.

    Neither a snapshot nor a bot: the learner itself (a mirror match; both seats train, and no
    rating moves).
    """

    name: str
    snapshot: bool = False
    bot: str | None = None

    def __post_init__(self) -> None:
        if self.snapshot and self.bot is not None:
            raise ValueError(f"opponent {self.name!r}: a snapshot or a bot, not both")


Draw = Callable[[Pool, random.Random], Opponent]
"""An opponent kind: ``(pool, rng) -> Opponent``; draw any randomness from ``rng``."""

Check = Callable[[str | None, str], None]
"""A kind's check before the run starts: ``(member, rules name) -> None``; raises ValueError
with a message when the scenario cannot play it (a bot its rules do not have)."""


@dataclass(frozen=True)
class OpponentKind:
    """A registered opponent kind.

    draw:   picks the opponent (:data:`Draw`).
    family: the kind is written ``<name>_<member>`` (``bot_random``).
    rated:  the kind is one opponent rated under the kind's own name (a bot):
            ``league/elo/<kind>`` is logged.
    check:  refuses, before the run starts, a member the scenario cannot play (:data:`Check`).
    """

    draw: Draw
    family: bool = False
    rated: bool = False
    check: Check | None = None


OPPONENTS: Registry[str, OpponentKind] = Registry("opponent kind")


def register_opponent(
    name: str, *, family: bool = False, rated: bool = False, check: Check | None = None
) -> Callable[[Draw], Draw]:
    """Register a draw as the opponent kind ``name`` (a ``league.mix`` key); a name already
    taken raises ValueError. ``family``, ``rated``, ``check``: see :class:`OpponentKind`."""
    if "_" in name and family:
        raise ValueError(f"opponent family {name!r}: a family's name holds no '_'")

    def decorator(draw: Draw) -> Draw:
        OPPONENTS.add(name, OpponentKind(draw, family=family, rated=rated, check=check))
        return draw

    return decorator


def known_kinds() -> list[str]:
    """The ``league.mix`` keys accepted, as written (a family as ``<name>_<member>``), sorted."""
    return sorted(f"{n}_<name>" if OPPONENTS[n].family else n for n in OPPONENTS)


def resolve_kind(kind: str, key: str | None = None) -> tuple[OpponentKind, str | None]:
    """The registered kind that the ``league.mix`` key ``kind`` names, and its family member
    (None for a plain kind). An unknown key raises :class:`UnknownNameError` listing
    :func:`known_kinds`, prefixed by ``key``."""
    entry = OPPONENTS.get(kind) if isinstance(kind, str) else None
    if entry is not None and not entry.family:
        return entry, None
    if isinstance(kind, str):
        family, _, member = kind.partition("_")
        entry = OPPONENTS.get(family)
        if entry is not None and entry.family and member:
            return entry, member
    text = f"unknown opponent kind {kind!r}; known: {', '.join(known_kinds())}"
    raise UnknownNameError(f"{key}: {text}" if key else text)


# --------------------------------------------------------------------------- the built-in kinds


@register_opponent("self")
def _self(pool: Pool, rng: random.Random) -> Opponent:
    return Opponent("self")


@register_opponent("latest")
def _latest(pool: Pool, rng: random.Random) -> Opponent:
    return Opponent(pool.snapshots[-1], snapshot=True)


@register_opponent("uniform")
def _uniform(pool: Pool, rng: random.Random) -> Opponent:
    return Opponent(pool.snapshots[rng.randrange(len(pool.snapshots))], snapshot=True)


@register_opponent("pfsp")
def _pfsp(pool: Pool, rng: random.Random) -> Opponent:
    weights = [(1.0 - pool.scores[name]) ** pool.config.pfsp_power for name in pool.snapshots]
    if sum(weights) <= 0:
        weights = [1.0] * len(weights)
    return Opponent(rng.choices(pool.snapshots, weights=weights)[0], snapshot=True)


def _check_bot(member: str | None, rules: str) -> None:
    from marl.scenarios.bots import get_bot
    from marl.scenarios.problems import ScenarioError

    try:
        get_bot(rules, str(member))
    except ScenarioError as exc:
        raise ValueError(exc.problems[0].message) from None


@register_opponent("bot", family=True, rated=True, check=_check_bot)
def _bot(pool: Pool, rng: random.Random) -> Opponent:
    return Opponent(pool.kind, bot=pool.member)
