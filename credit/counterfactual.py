"""Counterfactual re-simulation: fork recorded episodes with some agents' messages replaced.

A :class:`RecordedEpisode` is what an episode needs to be replayed: its seed, the completion each
agent wrote in each round (read from the environment's turn log) and the returns. A
:class:`Branch` is one counterfactual episode: a recorded episode plus :class:`Intervention` s,
each replacing the *message* of one agent (its ``SAY`` lines; the ``ACTION`` line and any other
text are kept unless ``keep_action=False``) in some or all of its rounds by

- ``"null"``: no message at all;
- ``"default"``: the ``SAY`` lines of a configured default text;
- ``"sample"``: a fresh completion from the agent's policy, asked of the ``generate`` callable.

After the first changed turn, ``mode`` says what every turn that is not itself replaced does:

- ``"regenerate"`` (default): the agent writes anew from its prompt in the branch. A turn whose
  prompt (system prompt and observation) is still exactly the recorded one keeps its recorded
  completion: the policy would face the very same prompt, so its recorded sample is a valid
  draw, and reusing it removes needless noise (common random numbers). This covers the other
  agents in the fork round itself, who move simultaneously with the forked agent, and agents the
  change never reached. The intervened agent's own base completion (whose ACTION line is kept)
  is regenerated the same way.
- ``"keep_messages"``: as ``regenerate``, but a regenerated turn sends its *recorded* SAY lines
  (the router still drops those no longer valid, e.g. to an agent that is no longer a
  neighbour) and only the rest (the ACTION) is new: the change's direct effect, without its
  echo through the others' later messages.
- ``"replay"``: every other turn keeps its recorded completion verbatim. Cheapest (no
  generation), but an agent acting on a message it no longer got still acts as if it had; since
  scenario rules score actions, not messages, replay with ``keep_action=True`` gives every
  message a zero effect. It is meant for ``keep_action=False``, where the replaced turn's own
  action changes (for example a COMA-style resample of a deciding agent's whole turn).

:meth:`Resimulator.run` advances *all* branches of *all* episodes together, round by round. In
each round it gathers every completion it needs into a list of :class:`GenerationRequest` s and
makes **one** ``generate`` call, so an LLM backend can serve a whole round in one batch.
Requests with the same agent, system prompt, observation and info are merged into one request
with ``n`` samples (the K resamples of one turn share their prompt entirely, and branches that
have not diverged yet share every prompt), so a backend sees identical prompts and can reuse
their prefix cache.

A branch costs nothing until its completions first differ from the recorded ones: until then it
follows the recorded path without stepping any environment. At the first difference it restores
the snapshot taken at that round when the episode was replayed from its seed
(:meth:`Resimulator.prepare`), and from there steps its own copy of the environment. A branch
whose completions never differ returns the recorded returns exactly.

An agent the environment calls idle (``env.is_idle(agent)``: it can neither talk nor act this
round) is never prompted, as in the rollout: it keeps its recorded completion, or writes
``ACTION: wait`` past the end of the recording, and interventions on it change nothing.

The environment is anything with the methods below (``TextScenarioEnv`` is one); it is copied
with ``copy.deepcopy`` (or ``env_factory``) to give every live branch its own. This module
imports nothing from ``marl.scenarios`` or ``marl.agents``.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from marl.protocols.markup import IDLE_REPLY, parse_completion

__all__ = [
    "REPLACEMENTS",
    "Branch",
    "BranchOutcome",
    "ForkableEnv",
    "Generate",
    "GenerationRequest",
    "Intervention",
    "RecordedEpisode",
    "Resimulator",
    "RoundPoint",
    "SimStats",
    "has_message",
    "splice_message",
    "split_message",
]

REPLACEMENTS = ("null", "default", "sample")
MODES = ("regenerate", "keep_messages", "replay")
MAX_ROUNDS = 10_000  # a branch longer than this is a runaway environment


class ForkableEnv(Protocol):
    """The environment interface the engine needs (``TextScenarioEnv`` implements it).

    ``system_prompt(agent)`` is optional; without it requests carry an empty system prompt.
    """

    possible_agents: list[str]
    agents: list[str]

    def reset(
        self, seed: int | None = None, options: dict | None = None
    ) -> tuple[dict[str, str], dict[str, dict]]:
        """Start the episode seeded ``seed``."""
        ...

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Play one round with every live agent's completion."""
        ...

    def snapshot(self) -> Any:
        """The whole episode state, random generators included."""
        ...

    def restore(self, snapshot: Any) -> None:
        """Return to a snapshot (which stays reusable)."""
        ...

    @property
    def returns(self) -> dict[str, float]:
        """Each agent's summed reward so far."""
        ...


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt that needs ``n`` completions.

    kind: ``"resample"`` (a replacement message for an intervened turn) or ``"respond"`` (a
          turn written anew after the fork, in ``regenerate`` or ``keep_messages`` mode).
    info: the environment's info dict for the agent (scripted bots read it; LLMs ignore it).
    """

    kind: str
    agent: str
    system_prompt: str
    observation: str
    info: Mapping[str, Any]
    n: int


Generate = Callable[[Sequence[GenerationRequest]], Sequence[Sequence[str]]]
"""A batched generator: a list of requests -> for each, a list of its ``n`` completion texts.

The engine calls it at most once per round of the batched branches.
"""


@dataclass(frozen=True)
class Intervention:
    """Replace ``agent``'s message in ``rounds`` (``None``: every round) by ``replacement``."""

    agent: str
    replacement: str = "null"
    rounds: frozenset[int] | None = None

    def __post_init__(self) -> None:
        if self.replacement not in REPLACEMENTS:
            raise ValueError(
                f"intervention on {self.agent!r}: unknown replacement {self.replacement!r}; "
                f"known: {', '.join(REPLACEMENTS)}"
            )

    def applies(self, agent: str, round: int) -> bool:
        """Whether this intervention replaces ``agent``'s turn in ``round``."""
        return agent == self.agent and (self.rounds is None or round in self.rounds)


@dataclass(frozen=True)
class Branch:
    """One counterfactual episode: episode index (into the list given to ``run``) + changes."""

    episode: int
    interventions: tuple[Intervention, ...] = ()

    def intervention(self, agent: str, round: int) -> Intervention | None:
        """The intervention on ``agent``'s turn in ``round``, if any (the first that applies)."""
        for iv in self.interventions:
            if iv.applies(agent, round):
                return iv
        return None


@dataclass
class RoundPoint:
    """The recorded episode as it stood at the start of one round."""

    snapshot: Any
    agents: list[str]
    observations: dict[str, str]
    infos: dict[str, dict]
    system_prompts: dict[str, str]
    idle: frozenset[str] = frozenset()


@dataclass
class RecordedEpisode:
    """An episode as played: enough to replay it exactly and fork it at any round.

    ``completions[r][agent]`` is what ``agent`` wrote in round ``r``; ``returns`` are the episode
    returns. ``episode_id`` and ``group_id`` tie it to the turn records of the rollout.
    ``points`` are filled by :meth:`Resimulator.prepare` (a replay from ``seed``).
    """

    seed: int
    completions: list[dict[str, str]]
    returns: dict[str, float]
    agents: list[str]
    episode_id: int = 0
    group_id: int = 0
    points: list[RoundPoint] | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Any, episode_id: int = 0, group_id: int = 0) -> RecordedEpisode:
        """Read a finished episode off an environment with ``episode_seed``, ``log`` (turn logs
        with ``round``, ``agent``, ``completion``) and ``returns``; the env is not changed."""
        rounds: list[dict[str, str]] = []
        for turn in env.log:
            while len(rounds) <= turn.round:
                rounds.append({})
            rounds[turn.round][turn.agent] = turn.completion
        return cls(
            seed=int(env.episode_seed),
            completions=rounds,
            returns=dict(env.returns),
            agents=list(env.possible_agents),
            episode_id=episode_id,
            group_id=group_id,
        )

    def turns(self) -> list[tuple[int, str]]:
        """Every recorded turn as ``(round, agent)``, in play order."""
        return [(r, a) for r, comps in enumerate(self.completions) for a in comps]

    def message_turns(self) -> list[tuple[int, str]]:
        """The recorded turns that sent at least one ``SAY`` line."""
        return [(r, a) for r, a in self.turns() if has_message(self.completions[r][a])]


@dataclass
class BranchOutcome:
    """How a branch ended: its returns, whether it left the recorded path, what was written."""

    returns: dict[str, float]
    diverged: bool
    completions: list[dict[str, str]]


@dataclass
class SimStats:
    """Running counters of a :class:`Resimulator` (for ``perf/`` and ``credit/`` logging)."""

    branches: int = 0  # branches run
    diverged: int = 0  # branches that left the recorded path (the others cost no env step)
    env_steps: int = 0  # environment steps taken by branches
    replays: int = 0  # recorded episodes replayed from their seed to take snapshots
    generate_calls: int = 0  # calls to ``generate`` (at most one per round of a batch)
    requests: int = 0  # prompts sent, after merging identical ones
    samples: int = 0  # completions received

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        return dict(self.__dict__)


# --- message splicing -------------------------------------------------------------------------
def split_message(completion: str) -> tuple[list[str], list[str]]:
    """Split a completion into its ``SAY`` lines and every other line (``ACTION``, reasoning)."""
    say, rest = [], []
    for line in completion.splitlines():
        (say if parse_completion(line, require_action=False).messages else rest).append(line)
    return say, rest


def has_message(completion: str) -> bool:
    """Whether a completion sends at least one message."""
    return bool(split_message(completion)[0])


def splice_message(original: str | None, replacement: str, keep_action: bool = True) -> str:
    """``replacement``'s ``SAY`` lines followed by the rest of ``original`` (``keep_action``) or
    of ``replacement``. Without an original (a branch that outlived the recording) the
    replacement is used whole."""
    say, rest = split_message(replacement)
    if keep_action and original is not None:
        rest = split_message(original)[1]
    return "\n".join(say + rest)


# --- the engine -------------------------------------------------------------------------------
@dataclass
class _Turn:
    """One agent's completion in one round of a branch, assembled from up to two parts."""

    intervention: Intervention | None
    base: str | None = None  # what the agent writes: recorded, or generated anew
    message: str | None = None  # the replacement whose SAY lines are sent (interventions)

    def text(self, keep_action: bool) -> str:
        if self.message is None:
            return self.base or ""
        keep = keep_action or self.intervention is None  # keep_messages: SAY lines kept only
        return splice_message(self.base, self.message, keep)


@dataclass
class _Waiter:
    turn: _Turn
    part: str  # "base" or "message"


@dataclass
class _BranchState:
    branch: Branch
    episode: RecordedEpisode
    round: int = 0
    env: Any = None
    diverged: bool = False
    observations: dict[str, str] = field(default_factory=dict)
    infos: dict[str, dict] = field(default_factory=dict)
    system_prompts: dict[str, str] = field(default_factory=dict)
    completions: list[dict[str, str]] = field(default_factory=list)
    pending: dict[str, _Turn] = field(default_factory=dict)
    outcome: BranchOutcome | None = None

    def view(
        self,
    ) -> tuple[list[str], dict[str, str], dict[str, dict], dict[str, str], frozenset[str]]:
        """Live agents, observations, infos, system prompts and idle agents this round."""
        if not self.diverged:
            point = self.episode.points[self.round]  # type: ignore[index]
            return (
                point.agents,
                point.observations,
                point.infos,
                point.system_prompts,
                point.idle,
            )
        agents = list(self.env.agents)
        return agents, self.observations, self.infos, self.system_prompts, _idle(self.env, agents)


def _system_prompt(env: Any, agent: str) -> str:
    fn = getattr(env, "system_prompt", None)
    return fn(agent) if callable(fn) else ""


def _idle(env: Any, agents: Sequence[str]) -> frozenset[str]:
    """Agents that can neither talk nor act this round (``env.is_idle``, when it has one)."""
    fn = getattr(env, "is_idle", None)
    return frozenset(a for a in agents if fn(a)) if callable(fn) else frozenset()


class Resimulator:
    """Runs batches of counterfactual branches of recorded episodes.

    env:            an environment of the scenario the episodes were played in; it is only
                    copied (``copy.deepcopy``), never stepped itself. ``None`` when
                    ``env_factory`` is given.
    generate:       the batched generator (see :data:`Generate`); needed for ``"sample"``
                    replacements and for ``mode="regenerate"``.
    mode:           ``"regenerate"``, ``"keep_messages"`` or ``"replay"`` (module docstring).
    keep_action:    replace only the ``SAY`` lines of an intervened turn and keep the rest of
                    the recorded completion; ``False`` replaces the whole completion (a null
                    turn then has no ``ACTION`` line either).
    default_text:   the text whose ``SAY`` lines a ``"default"`` replacement sends.
    max_concurrent: run at most this many branches at once (bounds memory and batch size).
    env_factory:    builds a fresh environment for a branch instead of copying ``env``.
    """

    def __init__(
        self,
        env: ForkableEnv | None,
        generate: Generate | None = None,
        *,
        mode: str = "regenerate",
        keep_action: bool = True,
        default_text: str = "",
        max_concurrent: int | None = None,
        env_factory: Callable[[], ForkableEnv] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"credit.mode: {mode!r} is not one of {', '.join(MODES)}")
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"credit.max_concurrent: must be >= 1 or null, got {max_concurrent}")
        self.generate = generate
        self.mode = mode
        self.keep_action = keep_action
        self.default_text = default_text
        self.max_concurrent = max_concurrent
        if env is None and env_factory is None:
            raise ValueError("Resimulator needs an environment to copy or an env_factory")
        self._factory = env_factory or (lambda: copy.deepcopy(env))
        self._pool: list[Any] = []
        self.stats = SimStats()

    # --- environments ---------------------------------------------------------------------
    def _acquire(self) -> Any:
        return self._pool.pop() if self._pool else self._factory()

    def _release(self, env: Any) -> None:
        self._pool.append(env)

    def prepare(self, episode: RecordedEpisode) -> None:
        """Replay ``episode`` from its seed, keeping a snapshot and the prompts of every round.

        Idempotent. Raises ValueError when the replay does not reproduce the recording (a
        different scenario, or an environment that is not deterministic given its seed).
        """
        if episode.points is not None:
            return
        where = f"episode {episode.episode_id} (seed {episode.seed})"
        env = self._acquire()
        try:
            observations, infos = env.reset(seed=episode.seed)
            points = []
            for r, completions in enumerate(episode.completions):
                live = list(env.agents)
                if sorted(live) != sorted(completions):
                    raise ValueError(
                        f"{where} does not replay: round {r} has agents {sorted(live)} but the "
                        f"recording has {sorted(completions)}; is the environment the same "
                        "scenario, with the same overrides, as the rollout's?"
                    )
                points.append(
                    RoundPoint(
                        snapshot=env.snapshot(),
                        agents=live,
                        observations={a: observations[a] for a in live},
                        infos={a: dict(infos.get(a, {})) for a in live},
                        system_prompts={a: _system_prompt(env, a) for a in live},
                        idle=_idle(env, live),
                    )
                )
                observations, _, _, _, infos = env.step(dict(completions))
            if env.agents:
                raise ValueError(f"{where} is not finished: credit needs complete episodes")
            for agent, value in episode.returns.items():
                replayed = env.returns.get(agent)
                if replayed is None or not math.isclose(replayed, value, abs_tol=1e-9):
                    raise ValueError(
                        f"{where} does not replay: agent {agent!r} got {replayed} on replay, "
                        f"{value} in the recording; is the environment the same scenario?"
                    )
        finally:
            self._release(env)
        episode.points = points
        self.stats.replays += 1

    # --- running branches -----------------------------------------------------------------
    def run(
        self, episodes: Sequence[RecordedEpisode], branches: Sequence[Branch]
    ) -> list[BranchOutcome]:
        """Play every branch to its end; returns one outcome per branch, in order."""
        for i, branch in enumerate(branches):
            if not 0 <= branch.episode < len(episodes):
                raise IndexError(
                    f"branch {i}: episode index {branch.episode} is out of range "
                    f"(0..{len(episodes) - 1})"
                )
            agents = episodes[branch.episode].agents
            for iv in branch.interventions:
                if iv.agent not in agents:
                    raise ValueError(
                        f"branch {i}: unknown agent {iv.agent!r}; the episode has {agents}"
                    )
        for index in sorted({b.episode for b in branches}):
            self.prepare(episodes[index])
        size = self.max_concurrent or max(len(branches), 1)
        outcomes: list[BranchOutcome] = []
        for start in range(0, len(branches), size):
            chunk = [
                _BranchState(branch=b, episode=episodes[b.episode])
                for b in branches[start : start + size]
            ]
            self._run_chunk(chunk)
            outcomes += [s.outcome for s in chunk]  # type: ignore[misc]
        self.stats.branches += len(branches)
        return outcomes

    def _run_chunk(self, states: list[_BranchState]) -> None:
        for state in states:
            if not state.episode.completions:
                state.outcome = BranchOutcome(dict(state.episode.returns), False, [])
        while live := [s for s in states if s.outcome is None]:
            requests: dict[tuple, tuple[GenerationRequest, list[_Waiter]]] = {}
            for state in live:
                self._plan_round(state, requests)
            if requests:
                self._generate(list(requests.values()))
            for state in live:
                self._advance(state)

    def _plan_round(
        self,
        state: _BranchState,
        requests: dict[tuple, tuple[GenerationRequest, list[_Waiter]]],
    ) -> None:
        """Decide every live agent's completion this round, queueing what must be generated."""
        r = state.round
        if r >= MAX_ROUNDS:
            raise RuntimeError(f"a branch of episode {state.episode.episode_id} ran {r} rounds")
        recorded_round = state.episode.completions[r] if r < len(state.episode.completions) else {}
        point = state.episode.points[r] if r < len(state.episode.points or []) else None
        agents, observations, infos, prompts, idle = state.view()
        state.pending = {}
        for agent in agents:
            recorded = recorded_round.get(agent)
            if agent in idle:  # nothing to say or do (as in the rollout): never generated
                state.pending[agent] = _Turn(None, recorded if recorded is not None else IDLE_REPLY)
                continue
            iv = state.branch.intervention(agent, r)
            turn = state.pending[agent] = _Turn(iv)
            reuse = recorded is not None and (
                not state.diverged
                or self.mode == "replay"
                or (
                    point is not None
                    and point.observations.get(agent) == observations[agent]
                    and point.system_prompts.get(agent) == prompts[agent]
                )
            )
            ask = functools.partial(
                self._queue, requests, agent, prompts[agent], observations[agent], infos
            )
            if iv is None or self.keep_action:  # the base is what the intervened turn keeps
                if reuse:
                    turn.base = recorded
                else:
                    ask("respond", _Waiter(turn, "base"))
                    if iv is None and self.mode == "keep_messages" and recorded is not None:
                        turn.message = recorded  # its recorded SAY lines, a fresh ACTION
            if iv is not None:
                if iv.replacement == "sample":
                    ask("resample", _Waiter(turn, "message"))
                else:
                    turn.message = "" if iv.replacement == "null" else self.default_text

    @staticmethod
    def _queue(
        requests: dict[tuple, tuple[GenerationRequest, list[_Waiter]]],
        agent: str,
        system_prompt: str,
        observation: str,
        infos: dict[str, dict],
        kind: str,
        waiter: _Waiter,
    ) -> None:
        """Queue one completion; identical prompts merge into one request with n samples."""
        info = infos.get(agent, {})
        key = (kind, agent, system_prompt, observation, repr(info))
        if key in requests:
            requests[key][1].append(waiter)
        else:
            request = GenerationRequest(kind, agent, system_prompt, observation, info, 0)
            requests[key] = (request, [waiter])

    def _generate(self, batch: list[tuple[GenerationRequest, list[_Waiter]]]) -> None:
        """One generate call for the whole round; hand the samples to the branches."""
        if self.generate is None:
            kinds = sorted({req.kind for req, _ in batch})
            raise ValueError(
                f"counterfactual branches need new completions ({', '.join(kinds)}) but no "
                "generate callable was given: pass generate=..., or use mode='replay' with "
                "null/default replacements only"
            )
        requests = [
            GenerationRequest(r.kind, r.agent, r.system_prompt, r.observation, r.info, len(w))
            for r, w in batch
        ]
        results = self.generate(requests)
        self.stats.generate_calls += 1
        self.stats.requests += len(requests)
        if len(results) != len(requests):
            raise ValueError(
                f"generate returned {len(results)} results for {len(requests)} requests"
            )
        for request, (_, waiters), texts in zip(requests, batch, results):
            texts = list(texts)
            if len(texts) != request.n:
                raise ValueError(
                    f"generate returned {len(texts)} completions for agent {request.agent!r}, "
                    f"asked for n={request.n}"
                )
            self.stats.samples += len(texts)
            for waiter, text in zip(waiters, texts):
                setattr(waiter.turn, waiter.part, text)

    def _advance(self, state: _BranchState) -> None:
        """Step the branch one round (or just follow the recording while nothing differs)."""
        r = state.round
        completions = {a: t.text(self.keep_action) for a, t in state.pending.items()}
        episode = state.episode
        if not state.diverged:
            if completions == episode.completions[r]:
                state.completions.append(completions)
                state.round += 1
                if state.round == len(episode.completions):
                    state.outcome = BranchOutcome(dict(episode.returns), False, state.completions)
                return
            state.env = self._acquire()
            state.env.restore(episode.points[r].snapshot)  # type: ignore[index]
            state.diverged = True
            self.stats.diverged += 1
        env = state.env
        observations, _, _, _, infos = env.step(completions)
        self.stats.env_steps += 1
        state.completions.append(completions)
        state.round += 1
        if not env.agents:
            state.outcome = BranchOutcome(dict(env.returns), True, state.completions)
            self._release(env)
            state.env = None
            return
        state.observations = dict(observations)
        state.infos = {a: dict(i) for a, i in infos.items()}
        state.system_prompts = {a: _system_prompt(env, a) for a in env.agents}
