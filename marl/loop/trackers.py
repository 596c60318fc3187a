"""The trackers of ``marl train``, registered in one list, and the one checkpoint builder.

:data:`TRACKERS` is the call order of every hook (:mod:`marl.loop.tracking`):

- :class:`Emergence`: the ``emergence/*`` tags of each step's episodes, before the update;
- :class:`Baselines`: the role baselines of a role estimator (``algo.advantage=rae``), which
  the credit phase reads and a checkpoint keeps (``advantage``);
- :class:`LeagueTracker`: the league's opponent of each step (:meth:`LeagueTracker.draw`, in
  the rollout phase), its results (``league/*``) and its pool (``league``);
- :class:`HeldOut`: the held-out evaluation and the exact listening measures on the same
  scenarios, before the first update, every ``train.eval_every`` updates and after the last;
- :class:`Exploitability`: the exact exploitability of a game with a tree, at every step;
- :class:`Checkpoints`: ``train.checkpoint_every`` and the last step; last in the list, so it
  saves what every other tracker holds once the step is done.

A new measure is one :class:`~marl.loop.tracking.Tracker` subclass and ``register(Its)``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from marl.analysis.evaluation import due, evaluation_metrics
from marl.credit.advantages import RoleBaselines, advantage_scope
from marl.loop.tracking import Run, Tracker
from marl.runtime.checkpoint import save_checkpoint
from marl.runtime.rollout import RolloutResult
from marl.runtime.seeding import rng_states

__all__ = [
    "TRACKERS",
    "Baselines",
    "Checkpoints",
    "Emergence",
    "Exploitability",
    "HeldOut",
    "LeagueTracker",
    "build_trackers",
    "checkpoint_state",
    "register",
    "save_state",
]


class Emergence(Tracker):
    """The emergence metrics (:mod:`marl.analysis.emergence`) of each step's episodes; influence
    re-simulates them with the policies that played them, so before the update."""

    name = "emergence"
    key = "emergence"

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker

    @classmethod
    def build(cls, run: Run) -> Emergence:
        """The tracker of :func:`marl.analysis.emergence.tracker_for`."""
        from marl.analysis.emergence import tracker_for

        return cls(tracker_for(run.config, run.runtime.influence))

    def on_rollout(self, run: Run, step: int, rollout: RolloutResult) -> dict[str, float]:
        """The ``emergence/*`` tags of the step's episodes."""
        return self.tracker.step([e.emergence for e in rollout.episodes], step)

    def state_dict(self) -> Any:
        """The vocabulary and the last influence values."""
        return self.tracker.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict`."""
        self.tracker.load_state_dict(state)


class Baselines(Tracker):
    """The role baselines of a role estimator (``algo.advantage=rae``); none for the others."""

    name = "baselines"
    key = "advantage"

    def __init__(self, baselines: RoleBaselines) -> None:
        self.baselines = baselines

    @classmethod
    def build(cls, run: Run) -> Baselines | None:
        """Baselines for a role estimator; None for the others."""
        if advantage_scope(run.config.algo.advantage) != "role":
            return None
        return cls(RoleBaselines(run.config.algo.baseline_decay))

    def state_dict(self) -> Any:
        """Each role's running baseline."""
        return self.baselines.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict`."""
        self.baselines.load_state_dict(state)


class LeagueTracker(Tracker):
    """The run's :class:`~marl.competition.league.League` (``league.enabled``): the opponent of
    each step and the learner's results against it."""

    name = "league"
    key = "league"

    def __init__(self, league: Any) -> None:
        self.league = league
        self.matchup: Any = None

    @classmethod
    def build(cls, run: Run) -> LeagueTracker | None:
        """The league of ``league.enabled`` (None without one), its pool in ``<run>/league``."""
        if not run.config.league.enabled or run.plan is None:
            return None
        from marl.competition.league import League

        agents = list(run.plan.agent_policy)
        return cls(League(run.config.league, agents, run.run_dir / "league", seed=run.config.seed))

    def draw(self, run: Run, step: int) -> Any:
        """The step's matchup (:func:`_league_matchup`), kept for :meth:`on_update`."""
        assert run.plan is not None
        learner, groups = run.plan.trainable[0], run.config.train.seeds_per_step
        self.matchup = _league_matchup(self.league, run.runtime, learner, step, groups)
        return self.matchup

    def on_update(self, run: Run, updates_done: int, rollout: RolloutResult) -> dict[str, float]:
        """The learner's results against the step's opponent (``league/*``)."""
        if self.matchup is None:
            return {}
        return self.league.record(self.matchup, rollout.episodes)

    def state_dict(self) -> Any:
        """The pool, the scores and the draws' state."""
        return self.league.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict`."""
        self.league.load_state_dict(state)


def _league_matchup(league: Any, runtime: Any, learner: str, step: int, groups: int) -> Any:
    """Snapshot the learner when due, draw the step's opponent and load its weights into the
    league's frozen policy (skipped when the workers already hold that snapshot)."""
    from marl.competition.league import LEAGUE_POLICY
    from marl.runtime.policies import WeightPayload

    if league.due(step):
        league.add_snapshot(step, runtime.policy_weights(learner).state)
    matchup = league.draw(step, groups)
    if matchup.policy is not None and league.loaded != matchup.opponent:
        weights = league.load_weights(matchup.opponent)
        runtime.load_frozen(WeightPayload(LEAGUE_POLICY, "full", weights, version=step))
        league.loaded = matchup.opponent
    return matchup


class HeldOut(Tracker):
    """The held-out evaluation (``train.eval_episodes``) and the exact listening measures on
    the same scenarios (:mod:`marl.analysis.listening_log`), logged at the updates done:
    before the first update, every ``train.eval_every`` and after the last."""

    name = "held_out"

    def __init__(self) -> None:
        self.listen: Any = None

    def on_start(self, run: Run) -> None:
        """Measure the policies the run starts from."""
        self._measure(run, run.start)

    def on_logged(self, run: Run, updates_done: int) -> None:
        """Measure when an evaluation is due."""
        t = run.config.train
        if due(updates_done, t.steps, t.eval_every):
            self._measure(run, updates_done)

    def _measure(self, run: Run, updates_done: int) -> None:
        if self.listen is None:  # after the warm-up: it may build an environment
            from marl.analysis.listening_log import listening_tracker

            self.listen = listening_tracker(run.config, run.plan, run.runtime)
        if run.config.train.eval_episodes:
            _evaluate(run, updates_done)
        metrics = self.listen(updates_done)
        if metrics:
            run.log(metrics, updates_done)


def _evaluate(run: Run, updates_done: int) -> None:
    """The held-out evaluation, logged at ``updates_done``: its metrics, each scenario's outcome
    by scenario seed (text ``eval/successes``) and the paired comparison with the run's first
    evaluation (``eval/paired/*``, McNemar)."""
    from marl.analysis.evaluation import evaluation_successes

    began = time.perf_counter()
    rollout = run.runtime.evaluate(run.config.train.eval_episodes, updates_done)
    metrics = evaluation_metrics(rollout)
    metrics["perf/eval_time"] = time.perf_counter() - began
    successes = evaluation_successes(rollout)
    if successes is not None:
        outcomes = {str(seed): int(ok) for seed, ok in successes.items()}
        run.logger.text("eval/successes", json.dumps(outcomes), updates_done)
    metrics.update(run.summary.add_evaluation(updates_done, successes))
    run.log(metrics, updates_done)


class Exploitability(Tracker):
    """The exact exploitability of the learner in a game with a tree
    (:mod:`marl.competition.exploitability_log`): scored before the first update of this
    process, then logged at every step (scored when due)."""

    name = "exploitability"

    def __init__(self) -> None:
        self.tracker: Any = None
        self.built = False

    def on_start(self, run: Run) -> None:
        """Score the policy the run starts from."""
        self._tracker(run)
        if self.tracker is not None:  # before the first update of this run
            run.log(self.tracker.step(run.start, force=True), run.start)

    def on_update(self, run: Run, updates_done: int, rollout: RolloutResult) -> dict[str, float]:
        """The tags after the update: scored now when due, else the last values again."""
        tracker = self._tracker(run)
        return tracker.step(updates_done) if tracker is not None else {}

    def _tracker(self, run: Run) -> Any:
        if not self.built:  # once, after the warm-up (on_start, unless the run continues)
            from marl.competition.exploitability_log import tracker_for

            self.tracker, self.built = tracker_for(run.config, run.plan, run.runtime), True
        return self.tracker


class Checkpoints(Tracker):
    """A checkpoint every ``train.checkpoint_every`` updates and after the last step."""

    name = "checkpoints"

    def on_logged(self, run: Run, updates_done: int) -> None:
        """Save the checkpoint when due."""
        t = run.config.train
        last = updates_done == t.steps
        if last or (t.checkpoint_every and updates_done % t.checkpoint_every == 0):
            save_state(run, updates_done)


TRACKERS: list[type[Tracker]] = [
    Emergence,
    Baselines,
    LeagueTracker,
    HeldOut,
    Exploitability,
    Checkpoints,
]


def register(tracker: type[Tracker]) -> type[Tracker]:
    """Add ``tracker`` to :data:`TRACKERS`, before :class:`Checkpoints` (so a checkpoint holds
    its state after the step); a name already registered is refused, with the names listed."""
    names = [t.name for t in TRACKERS]
    if not tracker.name or tracker.name in names:
        raise ValueError(
            f"tracker name {tracker.name!r} is empty or taken; registered: {', '.join(names)}"
        )
    at = TRACKERS.index(Checkpoints) if Checkpoints in TRACKERS else len(TRACKERS)
    TRACKERS.insert(at, tracker)
    return tracker


def tracker_fields() -> tuple[str, ...]:
    """The checkpoint fields of the registered trackers (:attr:`Tracker.key`), for the
    checkpoint checker to accept beside its own (``load_checkpoint(extra_fields=...)``)."""
    return tuple(t.key for t in TRACKERS if t.key)


def build_trackers(run: Run, resume: dict[str, Any] | None) -> list[Tracker]:
    """The run's trackers, in :data:`TRACKERS` order, each restored from ``resume`` (a
    checkpoint state) where it holds the tracker's field; also kept as ``run.trackers``."""
    built = (cls.build(run) for cls in TRACKERS)
    run.trackers = [t for t in built if t is not None]
    for tracker in run.trackers:
        if resume is not None and tracker.key and resume.get(tracker.key) is not None:
            tracker.load_state_dict(resume[tracker.key])
    return run.trackers


def checkpoint_state(run: Run, step: int) -> dict[str, Any]:
    """The one checkpoint state, the same fields at every step (the warmed-up step 0 too):
    policies, RNG states, step, config, and each tracker's state under its key (the emergence
    tracker's always; the role baselines' and the league's when the run has them)."""
    policies = run.runtime.state()
    _refuse_nonfinite(policies, step)
    state = {
        "policies": policies,
        "rng": rng_states(),
        "step": step,
        "config": asdict(run.config),
    }
    for tracker in run.trackers:
        if tracker.key:
            state[tracker.key] = tracker.state_dict()
    return state


def save_state(run: Run, step: int) -> None:
    """Save :func:`checkpoint_state` as the run's checkpoint of ``step``."""
    save_checkpoint(run.run_dir, step, checkpoint_state(run, step))


def _refuse_nonfinite(policies: dict[str, dict[str, Any]], step: int) -> None:
    """A checkpoint never holds a NaN or inf: weights, masters and optimizer state are checked
    before anything is written, so ``latest`` stays on the last good checkpoint."""
    from marl.errors import RunError
    from marl.runtime.learner import nonfinite_tensors

    for pid, state in policies.items():
        bad = nonfinite_tensors(state)
        if bad:
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise RunError(
                f"refusing to checkpoint step {step}: policy {pid!r} has non-finite values in "
                f"{shown}; the previous checkpoint is kept"
            )
