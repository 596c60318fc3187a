"""The episode record: what a finished episode hands to every later phase, as plain data.

Environments never leave the process that steps them. When an episode ends, the rollout worker
reads off it everything the later phases need into an :class:`EpisodeRecord`, which pickles
cheaply (over Ray it is what travels back to the driver):

- credit: the :class:`~marl.credit.RecordedEpisode` (seed, completions, returns) that
  counterfactual re-simulation replays, in the worker that holds the environments;
- metrics: returns, malformed counts, the router's per-edge and per-kind counters;
- outcomes: the scenario's success and its shaping schedule, and the turn log (plain
  :class:`~marl.scenarios.base.TurnLog` s) that shaping scores;
- emergence: an :class:`~marl.emergence.EmergenceEpisode` (talk turns, edges, deliveries);
- logging: the rendered transcript.

Every later phase is then a function of these records, testable without an environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marl.credit import RecordedEpisode
from marl.emergence import EmergenceEpisode, emergence_episode
from marl.protocols.graphs import edge_list
from marl.scenarios.base import TextScenarioEnv, TurnLog
from marl.scenarios.shaping import ShapingTerm
from marl.scenarios.transcript import render_transcript

__all__ = ["EpisodeRecord", "record_episode"]


@dataclass
class EpisodeRecord:
    """One finished episode of a rollout, with its place in the GRPO layout.

    edge_counts:    messages delivered along each directed edge ``(u, v)``.
    edges:          the communication graph's edges at the end of the episode (each gets a
                    ``comm/edges`` metric, 0 when nothing was delivered along it).
    message_counts: the router's counters by kind (delivered, truncated, dropped, ...).
    success:        the scenario's own success measure (``Rules.success``), or None.
    shaping:        the reward-shaping schedule the scenario declares (may be empty).
    log:            the environment's turn log, one entry per agent per round.
    """

    episode_id: int
    group_id: int
    seed: int
    agents: list[str]
    returns: dict[str, float]
    malformed: dict[str, int]
    edge_counts: dict[tuple[str, str], int]
    edges: tuple[tuple[str, str], ...]
    message_counts: dict[str, int]
    success: float | None
    shaping: tuple[ShapingTerm, ...]
    log: list[TurnLog]
    transcript: str
    recorded: RecordedEpisode
    emergence: EmergenceEpisode


def record_episode(env: TextScenarioEnv, episode_id: int, group_id: int) -> EpisodeRecord:
    """Read a finished episode off its environment (the env is not changed)."""
    recorded = RecordedEpisode.from_env(env, episode_id=episode_id, group_id=group_id)
    success: Any = env.rules.success()
    return EpisodeRecord(
        episode_id=episode_id,
        group_id=group_id,
        seed=int(env.episode_seed),
        agents=list(env.possible_agents),
        returns=env.returns,
        malformed=env.malformed,
        edge_counts=dict(env.router.edge_counts),
        edges=tuple((str(u), str(v)) for u, v in edge_list(env.graph)),
        message_counts=dict(env.router.counts),
        success=None if success is None else float(success),
        shaping=tuple(env.spec.shaping),
        log=list(env.log),
        transcript=render_transcript(env),
        recorded=recorded,
        emergence=emergence_episode(env, recorded),
    )
