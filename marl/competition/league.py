"""Self-play against a league: opponents drawn from a pool of the learner's past snapshots and
from scripted bots; win/draw/loss per opponent kind and the learner's Elo over time.

The league is the driver's bookkeeping; the rollout only sees a :class:`Matchup` (plain data):
in GRPO group ``b`` the learner plays seat ``learner_seats[b]`` and the opponent every other
seat, as a frozen policy (:data:`LEAGUE_POLICY`, loaded with a snapshot's weights before the
rollout) or a scripted bot. Which opponent a step gets is the drawn kind's business: the kinds
(``self``, ``latest``, ``uniform``, ``pfsp``, ``bot_<name>`` and any registered with
:func:`marl.opponents.register_opponent`) live in one registry, :mod:`marl.opponents`, and
``league.mix`` weighs them.

A snapshot is a frozen copy of the learner's weights, taken at step 0 and every
``league.snapshot_every`` steps and written to ``<run>/league/snapshot_<step>.pt``; the pool
holds the newest ``league.pool_size`` (the initial one stays while ``keep_initial``). Frozen
opponents never train: their policy is not trainable, so it has no learner and no optimizer,
and its turns never reach a learner.

Outcomes follow the zero-sum contract of :func:`marl.competition.ratings.outcome`: the learner wins
an episode when its return is greater than its opponent's. Elo
(:class:`marl.competition.ratings.EloTracker`): the learner starts at 1000, each snapshot enters at
the learner's rating when it was taken and stays there, ``bot_random`` is fixed at 1000 (the
anchor), other bots start at 1000 and move.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from marl.competition.ratings import SCORE, EloTracker, outcome
from marl.config import Config, ConfigError, LeagueConfig
from marl.opponents import Pool, resolve_kind
from marl.runtime.policy_map import PolicyPlan, PolicySpec

__all__ = [
    "LEAGUE_POLICY",
    "LEARNER",
    "League",
    "Matchup",
    "Snapshot",
    "check_league",
    "league_plan",
]

LEAGUE_POLICY = "league"  # the frozen policy id that plays snapshot opponents
LEARNER = "learner"  # the learner's name in the Elo table
ANCHOR = "bot_random"
RESULTS = ("win", "draw", "loss")


@dataclass
class Matchup:
    """Who plays whom in one step's rollout: plain data for the rollout workers.

    kind:          the opponent kind drawn (a ``league.mix`` key: ``latest``, ``bot_rule``).
    opponent:      the opponent's name in the ratings (``self``, ``snapshot_<step>``,
                   ``bot_<name>``).
    learner_seats: the learner's agent in each GRPO group (index = group id).
    policy:        the frozen policy that plays the opponent's seats (a snapshot), else None.
    bot:           the scripted bot that plays them, else None.
    """

    kind: str
    opponent: str
    learner_seats: list[str]
    policy: str | None = None
    bot: str | None = None

    @property
    def mirror(self) -> bool:
        """The learner plays every seat (neither a frozen policy nor a bot opposes it)."""
        return self.policy is None and self.bot is None

    def overrides(self, group: int, agents: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        """``(policies, bots)`` of group ``group``'s episodes (see ``EpisodeSlot``)."""
        learner = self.learner_seats[group]
        others = [a for a in agents if a != learner]
        if self.bot is not None:
            return {}, {a: self.bot for a in others}
        if self.policy is not None:
            return {a: self.policy for a in others}, {}
        return {}, {}


@dataclass
class Snapshot:
    """A frozen copy of the learner in the pool."""

    name: str
    step: int
    path: str
    rating: float


def check_league(config: Config, plan: PolicyPlan | None, agents: list[str]) -> None:
    """Refuse a league the run cannot play, naming the key: two agents, ``agents=llm``, one
    trainable full-model policy playing both seats, team credit, bots the scenario has."""
    league = config.league
    if not league.enabled:
        return
    if config.agents != "llm" or plan is None:
        raise ConfigError("league.enabled: the league trains LLM agents; set agents=llm")
    if len(agents) != 2:
        raise ConfigError(
            f"league.enabled: the league plays two-player games; {config.scenario.name} has "
            f"{len(agents)} agents ({', '.join(agents)})"
        )
    trainable = plan.trainable
    if len(trainable) != 1 or set(plan.policies[trainable[0]].agents) != set(agents):
        raise ConfigError(
            "league.enabled: the league needs one trainable policy that plays every seat "
            f"(sharing=shared); this run trains {trainable or 'none'} with the map "
            f"{plan.agent_policy}"
        )
    if plan.policies[trainable[0]].lora is not None:
        raise ConfigError(
            f"policies.{trainable[0]}.lora: league snapshots are full-model copies; a LoRA "
            "learner is not supported yet (use full fine-tuning)"
        )
    if LEAGUE_POLICY in plan.policies:
        raise ConfigError(
            f"policies.{LEAGUE_POLICY}: the id is the league's own frozen opponent; rename it"
        )
    from marl.credit import is_counterfactual

    if is_counterfactual(config.credit.name):
        raise ConfigError(
            f"credit.name: {config.credit.name!r} re-simulates with the run's policy map, which "
            "does not know the league's opponents; use credit=team with the league"
        )
    if config.emergence.influence_every:
        raise ConfigError(
            "emergence.influence_every: influence re-simulates with the run's policy map, which "
            "does not know the league's opponents; leave it unset (off under the league) or 0"
        )
    checked = [(k, *resolve_kind(k)) for k, w in league.mix.items() if w > 0]
    if any(entry.check is not None for _, entry, _ in checked):
        from marl.scenarios.registry import make

        rules = make(config.scenario.name, **config.scenario.overrides).spec.rules
        for kind, entry, member in checked:
            if entry.check is None:
                continue
            try:
                entry.check(member, rules)
            except ValueError as exc:
                raise ConfigError(f"league.mix.{kind}: {exc}") from None


def league_plan(plan: PolicyPlan) -> PolicyPlan:
    """``plan`` plus the league's frozen opponent policy (the learner's model, never trained,
    mapped to no agent: episodes put it on a seat through their slot overrides)."""
    learner = plan.policies[plan.trainable[0]]
    opponent = PolicySpec(
        id=LEAGUE_POLICY,
        model=learner.model,
        lora=None,
        trainable=False,
        num_gpus=None,
        lr=learner.lr,
        beta=learner.beta,
        agents=(),
        entropy=learner.entropy,
        temperature=learner.temperature,
    )
    return replace(plan, policies={**plan.policies, LEAGUE_POLICY: opponent})


@dataclass
class _Record:
    """Results against one opponent (the learner's view)."""

    win: int = 0
    draw: int = 0
    loss: int = 0

    @property
    def games(self) -> int:
        return self.win + self.draw + self.loss

    def smoothed_score(self) -> float:
        """``(wins + draws / 2 + 1) / (games + 2)``: Laplace-smoothed."""
        return (self.win + 0.5 * self.draw + 1.0) / (self.games + 2.0)


@dataclass
class League:
    """The pool, the draws and the results; owned by the driver, checkpointed as plain data."""

    config: LeagueConfig
    agents: list[str]
    directory: Path
    seed: int = 0
    snapshots: list[Snapshot] = field(default_factory=list)
    records: dict[str, _Record] = field(default_factory=dict)
    windows: dict[str, deque] = field(default_factory=dict)
    elo: EloTracker = field(default_factory=EloTracker)
    loaded: str | None = None  # the snapshot the workers hold now (not checkpointed)

    def __post_init__(self) -> None:
        self.elo.k = self.config.elo_k
        if ANCHOR not in self.elo.ratings:
            self.elo.add(ANCHOR, fixed=True)
        self.elo.ratings.setdefault(LEARNER, self.elo.initial)
        for kind in self.kinds:
            self.windows.setdefault(kind, deque(maxlen=self.config.window))

    @property
    def kinds(self) -> list[str]:
        """The opponent kinds of the mix, in the mix's order (every one is logged)."""
        return list(self.config.mix)

    # --- the pool ----------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Whether the learner is snapshotted before ``step``'s rollout."""
        return step % self.config.snapshot_every == 0

    def add_snapshot(self, step: int, weights: dict[str, Any]) -> Snapshot:
        """Write the learner's weights as the snapshot of ``step`` and put it in the pool."""
        import torch

        name = f"snapshot_{step}"
        if any(s.name == name for s in self.snapshots):
            return next(s for s in self.snapshots if s.name == name)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{name}.pt"
        torch.save(weights, path)
        rating = self.elo.rating(LEARNER)
        snapshot = Snapshot(name, step, str(path.resolve()), rating)
        self.elo.add(name, rating, fixed=True)
        self.snapshots.append(snapshot)
        while len(self.snapshots) > self.config.pool_size:
            drop = 1 if self.config.keep_initial and len(self.snapshots) > 1 else 0
            self.snapshots.pop(drop)
        return snapshot

    def load_weights(self, name: str) -> dict[str, Any]:
        """The weights of snapshot ``name``, read back (tensors only, bounded by the file's
        size: :func:`marl.runtime.checkpoint.load_tensor_file`)."""
        from marl.errors import RunError
        from marl.runtime.checkpoint import load_tensor_file

        snapshot = next((s for s in self.snapshots if s.name == name), None)
        if snapshot is None:
            raise RunError(f"league: no snapshot {name!r} in the pool")
        path = Path(snapshot.path)
        if not path.is_file():
            raise RunError(f"league: the file of {name} is missing: {path}")
        return load_tensor_file(path, "league")

    # --- the draw ----------------------------------------------------------------------------
    def draw(self, step: int, groups: int) -> Matchup:
        """Step ``step``'s opponent and the learner's seat in each of ``groups`` groups: a pure
        function of (seed, step, the pool and the records), so a resumed run draws the same."""
        rng = random.Random(f"{self.seed}:{step}:league")
        kinds = [k for k, w in self.config.mix.items() if w > 0]
        kind = rng.choices(kinds, weights=[self.config.mix[k] for k in kinds])[0]
        seats = [self.agents[(step + g) % len(self.agents)] for g in range(groups)]
        entry, member = resolve_kind(kind)
        names = tuple(s.name for s in self.snapshots)
        scores = {n: self.records.get(n, _Record()).smoothed_score() for n in names}
        drawn = entry.draw(Pool(kind, member, names, scores, self.config), rng)
        policy = LEAGUE_POLICY if drawn.snapshot else None
        return Matchup(kind, drawn.name, seats, policy=policy, bot=drawn.bot)

    # --- the results -------------------------------------------------------------------------
    def record(self, matchup: Matchup, episodes: list[Any]) -> dict[str, float]:
        """Score ``episodes`` (episode records with ``group_id`` and ``returns``) for the
        learner, update the records, windows and Elo; returns the ``league/*`` metrics (every
        kind of the mix every step, zeros included)."""
        for episode in episodes:
            if matchup.mirror:
                me, other = self.agents[0], self.agents[1]  # seat 0's view of the mirror match
            else:
                me = matchup.learner_seats[episode.group_id]
                other = next(a for a in self.agents if a != me)
            result = outcome(episode.returns[me], episode.returns[other])
            self.windows.setdefault(matchup.kind, deque(maxlen=self.config.window)).append(result)
            record = self.records.setdefault(matchup.opponent, _Record())
            setattr(record, result, getattr(record, result) + 1)
            if not matchup.mirror:
                self.elo.update(LEARNER, matchup.opponent, SCORE[result])
        return self.metrics(matchup)

    def metrics(self, matchup: Matchup | None = None) -> dict[str, float]:
        """``league/<kind>/{win,draw,loss}_rate`` over the last ``window`` games against that
        kind (0 before any), ``league/<kind>/games``, ``league/<kind>/drawn`` (1 for this step's
        kind), ``league/elo``, ``league/pool_size`` and ``league/elo/<opponent>`` for bots."""
        out: dict[str, float] = {}
        for kind in self.kinds:
            window = self.windows.get(kind, ())
            n = len(window)
            for result in RESULTS:
                out[f"league/{kind}/{result}_rate"] = (
                    sum(r == result for r in window) / n if n else 0.0
                )
            out[f"league/{kind}/games"] = float(n)
            out[f"league/{kind}/drawn"] = float(matchup is not None and matchup.kind == kind)
        out["league/elo"] = self.elo.rating(LEARNER)
        out["league/pool_size"] = float(len(self.snapshots))
        for kind in self.kinds:
            if resolve_kind(kind)[0].rated:
                out[f"league/elo/{kind}"] = self.elo.rating(kind)
        return out

    # --- checkpoint --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain data: the pool (file paths), the records, the windows and the Elo table."""
        return {
            "snapshots": [vars(s).copy() for s in self.snapshots],
            "records": {k: [r.win, r.draw, r.loss] for k, r in self.records.items()},
            "windows": {k: list(v) for k, v in self.windows.items()},
            "elo": self.elo.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s result."""
        self.snapshots = [Snapshot(**s) for s in state["snapshots"]]
        self.records = {k: _Record(*v) for k, v in state["records"].items()}
        self.windows = {k: deque(v, maxlen=self.config.window) for k, v in state["windows"].items()}
        for kind in self.kinds:
            self.windows.setdefault(kind, deque(maxlen=self.config.window))
        self.elo.load_state_dict(state["elo"])
        self.elo.k = self.config.elo_k
