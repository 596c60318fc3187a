"""The episode record: what a finished episode hands to every later phase, as plain data.

Environments never leave the process that steps them. When an episode ends, the rollout worker
reads off it everything the later phases need into an :class:`EpisodeRecord`, which pickles
cheaply (over Ray it is what travels back to the driver):

- credit: the :class:`~marl.credit.RecordedEpisode` (seed, completions, returns) that
  counterfactual re-simulation replays, in the worker that holds the environments;
- metrics: returns, malformed counts, the router's per-edge and per-kind counters;
- outcomes: the scenario's success and its shaping schedule, and the turn log (plain
  :class:`~marl.scenarios.base.TurnLog` s) that shaping scores;
- emergence: an :class:`EmergenceEpisode` (talk turns, edges, deliveries), declared here with
  the :class:`TalkTurn` it holds, so the rollout that writes it and the measures that read it
  (:mod:`marl.analysis.emergence`, the workers' influence re-simulation) both read it from below;
- logging: the rendered transcript.

Every later phase is then a function of these records, testable without an environment.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from marl.credit import RecordedEpisode
from marl.protocols.graphs import build_graph, edge_list
from marl.protocols.markup import parse_completion
from marl.scenarios.base import TextScenarioEnv, TurnLog
from marl.scenarios.shaping import ShapingTerm
from marl.scenarios.transcript import render_transcript

__all__ = [
    "EmergenceEpisode",
    "EpisodeRecord",
    "TalkTurn",
    "as_emergence_episodes",
    "emergence_episode",
    "episode_edges",
    "normalise",
    "record_episode",
    "talk_turns",
]


@dataclass(frozen=True)
class TalkTurn:
    """One round in which ``agent`` could talk, what it sent and what was delivered.

    neighbours: whom it could message this round (its out-edges, cut edges included).
    messages:   every message delivered, as ``(text, receivers)``; empty = nothing arrived.
    label:      the agent's private label (:meth:`Rules.private_label`), or None.
    sent:       every message it sent, as parsed from its reply (before the router's budget,
                noise and cut edges), as ``(text, receivers)`` with the receivers it addressed
                (all its neighbours for a plain ``SAY:``); empty = silence. The message
                statistics read ``messages``, the speaker consistency reads ``sent``.
    """

    episode: int
    round: int
    agent: str
    neighbours: tuple[str, ...]
    messages: tuple[tuple[str, tuple[str, ...]], ...]
    label: str | None = None
    sent: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def texts_to(self, receiver: str | None = None) -> list[str]:
        """The texts delivered this turn (to ``receiver`` only, when given)."""
        return [t for t, to in self.messages if receiver is None or receiver in to]

    def texts_sent(self, receiver: str | None = None) -> list[str]:
        """The texts sent this turn (addressed to ``receiver`` only, when given)."""
        return [t for t, to in self.sent if receiver is None or receiver in to]


def normalise(text: str) -> str:
    """A message as a vocabulary item: lower case, punctuation dropped, single spaces."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _round_graphs(env: Any) -> list[Any]:
    """The communication graph of every round the episode played (rebuilt from its seed)."""
    rounds = max((t.round for t in env.log), default=-1) + 1
    spec = env.spec.graph
    static = getattr(spec, "rewire_every", 0) <= 0
    first = build_graph(env.possible_agents, spec, env.episode_seed, 0)
    return [
        first if static else build_graph(env.possible_agents, spec, env.episode_seed, r)
        for r in range(rounds)
    ]


def talk_turns(env: Any, episode: int = 0) -> list[TalkTurn]:
    """The talk turns of a finished episode, read off its turn log (the env is not changed).

    A turn is a talk turn when the rules let the agent talk that round (``can_talk``, which is
    asked after the episode, so it must depend on the round only, as in every built-in
    scenario) and the graph of that round gives it at least one out-neighbour (a cut edge
    counts: the agent is told it can message along it). What it sent is its reply's SAY lines,
    parsed again from the logged completion as the environment parsed them.
    """
    rules = env.rules
    graphs = _round_graphs(env)
    out = []
    for turn in env.log:
        graph = graphs[turn.round]
        neighbours = tuple(sorted(graph.successors(turn.agent))) if turn.agent in graph else ()
        if not neighbours or not rules.can_talk(turn.agent, turn.round):
            continue
        label = rules.private_label(turn.agent)
        messages = tuple((m.text, tuple(m.receivers)) for m in turn.delivered)
        said = parse_completion(turn.completion, require_action=False).messages
        sent = tuple((m.text, neighbours if m.to is None else m.to) for m in said)
        out.append(TalkTurn(episode, turn.round, turn.agent, neighbours, messages, label, sent))
    return out


def episode_edges(env: Any) -> set[tuple[str, str]]:
    """Every directed edge the episode's graph had in some round."""
    return {e for g in _round_graphs(env) for e in g.edges()}


@dataclass(frozen=True)
class EmergenceEpisode:
    """What the emergence metrics read of one finished episode: plain data, no environment.

    talk:     its talk turns (:func:`talk_turns`, numbered episode 0).
    edges:    every directed edge its graph had in some round, sorted.
    contacts: ``(speaker, listener, round)`` of every delivery, in play order.
    recorded: the episode as counterfactual re-simulation replays it.
    """

    agents: tuple[str, ...]
    talk: tuple[TalkTurn, ...]
    edges: tuple[tuple[str, str], ...]
    contacts: tuple[tuple[str, str, int], ...]
    recorded: RecordedEpisode


def emergence_episode(env: Any, recorded: RecordedEpisode | None = None) -> EmergenceEpisode:
    """Read a finished environment's :class:`EmergenceEpisode` (the env is not changed);
    ``recorded`` is its :class:`RecordedEpisode` when the caller has one already."""
    contacts = tuple(
        (message.sender, v, message.round)
        for turn in env.log
        for message in turn.delivered
        for v in message.receivers
    )
    return EmergenceEpisode(
        agents=tuple(env.possible_agents),
        talk=tuple(talk_turns(env)),
        edges=tuple(sorted(episode_edges(env))),
        contacts=contacts,
        recorded=recorded if recorded is not None else RecordedEpisode.from_env(env),
    )


def as_emergence_episodes(items: Sequence[Any]) -> list[EmergenceEpisode]:
    """Episodes as data: finished environments are read on the spot."""
    return [x if isinstance(x, EmergenceEpisode) else emergence_episode(x) for x in items]


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
