"""The text scenario base class: a ``pettingzoo.ParallelEnv`` whose agents talk over a graph.

An agent's observation is its private information, its inbox and the public state, rendered as
text; its action is its completion text, which the markup parser splits into messages (routed
along the communication graph) and an environment action (handed to the scenario's rules).

The environment can snapshot and restore its whole state, random generators included, so a
counterfactual branch replays exactly.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
from pettingzoo import ParallelEnv

from marl.protocols.graphs import build_graph, depends_on_seed, rewires_at
from marl.protocols.markup import (
    IDLE_REPLY,
    SAY_FORM,
    ParsedCompletion,
    markup_instructions,
    parse_completion,
)
from marl.protocols.messages import Message, Violation, round_tag
from marl.protocols.router import Router
from marl.protocols.tools import tool_instructions
from marl.scenarios.rules import RULES, RoundResult, Rules
from marl.scenarios.spaces import AnyText
from marl.scenarios.spec import ScenarioSpec
from marl.scenarios.statecopy import copy_random, deep_copy

MAX_OBSERVATION_CHARS = 100_000
MAX_ACTION_CHARS = 20_000


@dataclass
class TurnLog:
    """What one agent wrote in one round and what became of it (for transcripts and logs).

    idle:  the agent could neither act nor talk that round (nothing was generated for it).
    notes: what the rules reported after this turn, for the transcript only
           (:attr:`RoundResult.notes`).
    """

    round: int
    agent: str
    completion: str
    action: str | None
    delivered: list[Message]
    violations: list[Violation]
    parse_errors: list[str]
    invalid_action: str | None = None
    idle: bool = False
    notes: list[str] = field(default_factory=list)


@dataclass
class EpisodeState:
    """Everything that changes during an episode; deep-copied by ``snapshot``."""

    seed: int = 0
    round: int = 0
    agents: list[str] = field(default_factory=list)
    rules: Rules | None = None
    channel_rng: random.Random = field(default_factory=random.Random)
    router: Router | None = None
    graph: nx.DiGraph = field(default_factory=nx.DiGraph)
    inbox: dict[str, list[Message]] = field(default_factory=dict)
    outbox: dict[str, list[Message]] = field(default_factory=dict)
    notices: dict[str, list[str]] = field(default_factory=dict)
    returns: dict[str, float] = field(default_factory=dict)
    malformed: dict[str, int] = field(default_factory=dict)
    public_events: list[str] = field(default_factory=list)
    log: list[TurnLog] = field(default_factory=list)
    done: bool = False


def _working_copy(state: EpisodeState) -> EpisodeState:
    """A copy of ``state`` that a step may mutate without touching ``state``.

    Everything a step changes is copied: the rules and the router (deep, with
    :func:`~marl.scenarios.statecopy.deep_copy`, which gives what ``copy.deepcopy`` gives), the
    channel RNG when the channel is noisy (a quiet channel never draws from it), and the
    containers it appends to. What it only replaces (the graph) or never changes after creation
    (messages, turn logs) is shared.
    """
    router = state.router
    work = object.__new__(EpisodeState)
    work.__dict__.update(state.__dict__)  # every field, shared; then the ones a step changes:
    work.rules = deep_copy(state.rules)
    work.router = deep_copy(router)
    if router is not None and router.noise.active:
        work.channel_rng = copy_random(state.channel_rng)
    work.inbox = {a: list(v) for a, v in state.inbox.items()}
    work.outbox = {a: list(v) for a, v in state.outbox.items()}
    work.notices = {a: list(v) for a, v in state.notices.items()}
    work.returns = dict(state.returns)
    work.malformed = dict(state.malformed)
    work.public_events = list(state.public_events)
    work.log = list(state.log)
    return work


class TextScenarioEnv(ParallelEnv):
    """A scenario built from a validated :class:`ScenarioSpec` and its registered rules."""

    metadata = {"render_modes": ["ansi"], "is_parallelizable": True}

    def __init__(self, spec: ScenarioSpec, render_mode: str | None = None) -> None:
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        self.spec = spec
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "name": spec.name}
        self.possible_agents = list(spec.agents)
        self.agents: list[str] = []
        self.rules_cls = RULES[spec.rules]
        self._state = EpisodeState()
        self._next_seed = random.Random().randrange(2**31)
        # the graph of a topology that ignores the seed, built once and frozen (see _graph)
        self._fixed_graph: nx.DiGraph | None = None
        # a quiet channel never draws from its generator: one unseeded generator serves them all
        self._quiet_rng = random.Random(0)

    # --- spaces ------------------------------------------------------------------------------
    @functools.cache  # noqa: B019 - PettingZoo requires the same object back
    def observation_space(self, agent: str) -> AnyText:
        """Observations are text of any characters."""
        return AnyText(MAX_OBSERVATION_CHARS)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> AnyText:
        """Actions are completion text of any characters."""
        return AnyText(MAX_ACTION_CHARS)

    # --- properties --------------------------------------------------------------------------
    @property
    def round(self) -> int:
        """The round about to be played (0-based)."""
        return self._state.round

    @property
    def graph(self) -> nx.DiGraph:
        """The communication graph in force this round."""
        return self._state.graph

    @property
    def rules(self) -> Rules:
        """The rules object of the current episode."""
        assert self._state.rules is not None, "call reset() first"
        return self._state.rules

    @property
    def router(self) -> Router:
        """The router of the current episode, with its running counters."""
        assert self._state.router is not None, "call reset() first"
        return self._state.router

    @property
    def episode_seed(self) -> int:
        """The seed the current episode was reset with."""
        return self._state.seed

    @property
    def log(self) -> list[TurnLog]:
        """Every turn of the episode so far."""
        return self._state.log

    @property
    def returns(self) -> dict[str, float]:
        """Each agent's summed reward so far."""
        return dict(self._state.returns)

    @property
    def malformed(self) -> dict[str, int]:
        """How many malformed completions (or invalid actions) each agent produced."""
        return dict(self._state.malformed)

    # --- PettingZoo API ----------------------------------------------------------------------
    def reset(
        self, seed: int | None = None, options: dict | None = None
    ) -> tuple[dict[str, str], dict[str, dict]]:
        """Start an episode. Without a seed, a fresh one is drawn from the previous episode's."""
        if seed is None:
            seed = self._next_seed
        seed = int(seed)
        self._next_seed = random.Random(f"{seed}:next").randrange(2**31)
        rules = self.rules_cls(
            self.possible_agents, self.spec.params, random.Random(f"{seed}:rules")
        )
        rules.reset()
        noisy = self.spec.noise.active
        self._state = EpisodeState(
            seed=seed,
            agents=list(self.possible_agents),
            rules=rules,
            channel_rng=random.Random(f"{seed}:channel") if noisy else self._quiet_rng,
            router=Router(self.spec.budget, self.spec.noise),
            graph=self._graph(seed, 0),
            inbox={a: [] for a in self.possible_agents},
            outbox={a: [] for a in self.possible_agents},
            notices={a: [] for a in self.possible_agents},
            returns=dict.fromkeys(self.possible_agents, 0.0),
            malformed=dict.fromkeys(self.possible_agents, 0),
        )
        self.agents = list(self.possible_agents)
        contacts = self._contacts()
        return self._observations(contacts), self._infos(contacts)

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[dict[str, str], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict]]:
        """Play one round: route every agent's messages, then apply their actions.

        Transactional: the round is played on a working copy of the episode state, which
        replaces the state only when the whole step succeeded. A step that raises (a bug in a
        scenario's rules, say) leaves the environment exactly as it was, so a retry delivers
        that round's messages once.
        """
        if self._state.done or not self.agents:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if not isinstance(actions, Mapping):
            raise TypeError(f"step() takes a dict of agent -> text, got {type(actions).__name__}")
        before, agents_before = self._state, list(self.agents)
        self._state = _working_copy(before)
        try:
            return self._play_round(actions)
        except BaseException:
            self._state, self.agents = before, agents_before
            raise

    def _play_round(
        self, actions: Mapping[str, Any]
    ) -> tuple[dict[str, str], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict]]:
        """The body of :meth:`step`, free to mutate ``self._state`` (a working copy)."""
        state = self._state
        rules, router, spec = state.rules, state.router, self.spec
        assert rules is not None and router is not None
        rnd = state.round
        agents = self.agents
        parsed = {}
        turn_logs: dict[str, TurnLog] = {}
        new_notices: dict[str, list[str]] = {a: [] for a in self.possible_agents}
        deliveries: list[Message] = []
        needs = {a: rules.needs_action(a, rnd) for a in agents}
        for agent in agents:  # fixed agent order keeps the channel RNG deterministic
            completion = actions.get(agent, "")
            result = self._read_completion(completion, needs[agent])
            parsed[agent] = result
            outgoing = result.messages
            notices = new_notices[agent]
            if outgoing and not rules.can_talk(agent, rnd):
                router.counts["muted"] += len(outgoing)
                notices.append(
                    f"{round_tag(rnd)} Nobody can hear you this round; your message was dropped."
                )
                outgoing = []
            delivered, violations = router.route(
                state.graph, agent, outgoing, rnd, state.channel_rng
            )
            deliveries += delivered
            notices += [v.notice() for v in violations]
            if result.errors:
                notices.append(
                    f"{round_tag(rnd)} Your reply was malformed: {'; '.join(result.errors)}."
                )
            turn_logs[agent] = TurnLog(
                rnd,
                agent,
                completion if isinstance(completion, str) else repr(completion),
                result.action,
                delivered,
                violations,
                list(result.errors),
                idle=not needs[agent] and not self.neighbours(agent),
            )
        for message in deliveries:
            state.outbox[message.sender].append(message)
            for receiver in message.receivers:
                state.inbox[receiver].append(message)

        act = {a: (parsed[a].action if needs[a] else None) for a in agents}
        last_round = rnd + 1 >= spec.rounds
        outcome = rules.step(act, rnd, last_round)
        for agent, notes in outcome.notes.items():
            if agent in turn_logs:
                turn_logs[agent].notes = list(notes)
        for agent, reason in outcome.invalid.items():
            if agent in turn_logs:
                turn_logs[agent].invalid_action = reason
                if act[agent] is None and parsed[agent].errors:
                    continue  # no action because the reply was malformed: already noticed
                new_notices[agent].append(f"{round_tag(rnd)} Your action was not valid: {reason}")
        rewards = self._mix_rewards(outcome)
        for agent in agents:
            if parsed[agent].errors or agent in outcome.invalid:
                state.malformed[agent] += 1
                rewards[agent] += spec.malformed_penalty
            state.returns[agent] += rewards[agent]
            state.notices[agent] += new_notices[agent]
        state.public_events += outcome.public_events
        state.log += [turn_logs[a] for a in agents]

        state.round += 1
        state.done = outcome.done or state.round >= spec.rounds
        if not state.done and rewires_at(spec.graph, state.round):
            state.graph = self._graph(state.seed, state.round)
        contacts = self._contacts()
        observations = self._observations(contacts)
        infos = self._infos(contacts)
        live = list(agents)
        terminations = dict.fromkeys(live, state.done)
        truncations = dict.fromkeys(live, False)
        if state.done:
            self.agents = []
        return observations, {a: rewards[a] for a in live}, terminations, truncations, infos

    def render(self) -> str | None:
        """The transcript of the episode so far (``render_mode='ansi'``)."""
        if self.render_mode != "ansi":
            return None
        from marl.scenarios.transcript import render_transcript

        return render_transcript(self)

    def close(self) -> None:
        """Nothing to release."""

    def state(self) -> str:
        """The public state as text (the global view PettingZoo's ``state()`` asks for)."""
        return self.rules.public_state()

    def _graph(self, seed: int, round: int) -> nx.DiGraph:
        """The communication graph of ``round`` in the episode seeded ``seed``, frozen (it is
        shared by the rounds of an epoch, and by every episode when the topology ignores the
        seed: nobody may change it in place)."""
        if self._fixed_graph is not None:
            return self._fixed_graph
        graph = nx.freeze(build_graph(self.possible_agents, self.spec.graph, seed, round))
        if not depends_on_seed(self.spec.graph):
            self._fixed_graph = graph
        return graph

    # --- snapshots ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """A deep copy of the whole episode state, random generators included.

        A frozen graph (every graph this class builds) cannot change, so it is shared rather
        than copied.
        """
        return {
            "state": self._copy_state(self._state),
            "agents": list(self.agents),
            "next_seed": self._next_seed,
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Return to a snapshot; the snapshot stays reusable."""
        self._state = self._copy_state(snapshot["state"])
        self.agents = list(snapshot["agents"])
        self._next_seed = snapshot["next_seed"]

    @staticmethod
    def _copy_state(state: EpisodeState) -> EpisodeState:
        memo: dict[int, Any] = {}
        if nx.is_frozen(state.graph):
            memo[id(state.graph)] = state.graph
        return deep_copy(state, memo)

    # --- prompts and observations ------------------------------------------------------------
    def neighbours(self, agent: str) -> list[str]:
        """The agents ``agent`` can message this round."""
        graph = self._state.graph
        if agent not in graph or not self.rules.can_talk(agent, self._state.round):
            return []
        return sorted(graph.successors(agent))

    def _read_completion(self, completion: object, needs_action: bool) -> ParsedCompletion:
        """An agent's completion as :meth:`step` reads it: its SAY lines, its ACTION text, and
        the problems."""
        free = self.rules_cls.info.free_text_action
        result = parse_completion(completion, require_action=needs_action and not free)
        if free and result.action is None:
            result.action = result.free_text
        elif needs_action and result.action is None and self.spec.lenient_actions:
            # a weak model's answer in prose still counts; the missing ACTION line stays a
            # malformed reply (penalty and counter), so the format is still learned
            result.action = result.free_text or None
        return result

    def read_action(self, agent: str, completion: object) -> str | None:
        """The action ``agent`` takes with ``completion`` at its turn now, as :meth:`step` reads
        the reply and the rules' parser the ACTION text (:meth:`Rules.parse_action`, named as
        :meth:`Rules.legal_actions` names it); ``None`` for a reply that picks no action. What a
        sampled measure reads a model's reply as, whatever words it answers in."""
        rules = self._state.rules
        assert rules is not None, "read_action needs a reset environment"
        text = self._read_completion(completion, needs_action=True).action
        return rules.parse_action(agent, text) if text else None

    def read_shares(
        self, agent: str, completions: Sequence[object], actions: Iterable[str]
    ) -> tuple[dict[str, float], float]:
        """``completions`` (sampled replies of ``agent`` at its turn now) read by
        :meth:`read_action`: each of ``actions``' share among the replies the parser accepts as
        one of them (uniform when it accepts none), and the fraction it rejects."""
        counts = Counter(self.read_action(agent, c) for c in completions)
        shares = dict.fromkeys(actions, 0.0)
        accepted = sum(counts[a] for a in shares)
        for action in shares:
            shares[action] = counts[action] / accepted if accepted else 1.0 / len(shares)
        return shares, 1.0 - accepted / len(completions) if completions else 1.0

    def system_prompt(self, agent: str) -> str:
        """The system prompt an LLM agent is given: scenario text, role, markup."""
        parts = [self.spec.system_prompt.strip()]
        role = self.spec.roles.get(agent, "")
        if role:
            parts.append(f"Your role ({agent}): {role.strip()}")
        # whether the graph lets the agent talk at all, not this round's contacts (muted rounds
        # would change the prompt, and a system prompt that stays the same across rounds and
        # agents shares its prefill)
        graph = self._state.graph
        can_message = agent in graph and graph.out_degree(agent) > 0
        parts.append(markup_instructions(can_message) if self._state.rules else "")
        parts.append(tool_instructions(self.spec.tools))
        return "\n\n".join(p for p in parts if p)

    def _observation(self, agent: str, public: str, neighbours: list[str]) -> str:
        """``agent``'s observation; ``public`` is the rules' public state and ``neighbours`` the
        agent's contacts this round (both computed once for all agents).

        What every agent sees comes first (the round, the public state, the events) and the
        agent's own part after ``You are <agent>.``: the prompts of a round then share the
        longest prefix, which the backends prefill once for all of them. Within the agent's
        part, whom it can message and what to reply (the same in every episode) come before
        its private information, messages and notices, so an agent's prompts also share its
        instruction and only what differs runs again for each of them."""
        state = self._state
        rules = self.rules
        lines = [] if state.done else [f"Round {state.round + 1} of {self.spec.rounds}."]
        if public:
            lines.append(f"Public state: {public}")
        if state.public_events:
            lines.append("Events:")
            lines += [f"  {event}" for event in state.public_events[-10:]]
        lines.append(f"You are {agent}.")
        if state.done:
            lines.append(f"The episode is over. Your total reward: {state.returns[agent]:.2f}.")
        else:
            lines.append(f"You can message: {', '.join(neighbours) if neighbours else 'nobody'}.")
            lines.append(self._instruction(agent, neighbours))
        private = rules.private_info(agent)
        if private:
            lines.append(f"Private information: {private}")
        if state.inbox[agent]:
            lines.append("Messages you received:")
            lines += [
                f"  {round_tag(m.round)} {m.sender}: {m.text}" for m in state.inbox[agent][-20:]
            ]
        if state.outbox[agent]:
            lines.append("Messages you sent:")
            lines += [
                f"  {round_tag(m.round)} to {', '.join(m.receivers)}: {m.text}"
                for m in state.outbox[agent][-10:]
            ]
        if state.notices[agent]:
            lines.append("Notices:")
            lines += [f"  {n}" for n in state.notices[agent][-5:]]
        return "\n".join(lines)[:MAX_OBSERVATION_CHARS]

    def is_idle(self, agent: str) -> bool:
        """True when ``agent`` can neither act nor talk this round (nothing to generate)."""
        return not self.neighbours(agent) and not self.rules.needs_action(agent, self._state.round)

    def _instruction(self, agent: str, neighbours: list[str]) -> str:
        """The last line of an observation: exactly what the reply should hold."""
        talk = SAY_FORM if neighbours else ""
        if self.rules.needs_action(agent, self._state.round):
            help_text = self.rules.action_help(agent)
            if self.rules_cls.info.free_text_action:
                return f"Your turn. Reply with {help_text}"
            first = f"optionally a line {talk}, then " if talk else ""
            return (
                f"Your turn. Reply with {first}one line: `ACTION:` and then the action, which is "
                f"{help_text}"
            )
        if talk:
            return f"Your turn to talk. Reply with one line: {talk}."
        return f"Nothing to do this round. Reply `{IDLE_REPLY}`."

    def observe(self) -> tuple[dict[str, str], dict[str, dict]]:
        """The live agents' observations and infos of the current round, as :meth:`reset` and
        :meth:`step` return them; nothing changes (read them again after a counterfactual
        edit of the rules, :meth:`Rules.set_private_label`)."""
        contacts = self._contacts()
        return self._observations(contacts), self._infos(contacts)

    def _contacts(self) -> dict[str, list[str]]:
        """Every live agent's :meth:`neighbours`, in live order (observations and infos share
        them)."""
        return {agent: self.neighbours(agent) for agent in self._live()}

    def _observations(self, contacts: dict[str, list[str]] | None = None) -> dict[str, str]:
        if contacts is None:
            contacts = self._contacts()
        public = self.rules.public_state()  # what everybody sees: rendered once per round
        return {
            a: self._observation(a, public, contacts[a])
            for a in self.possible_agents
            if a in contacts
        }

    def _live(self) -> list[str]:
        return self.agents if self.agents else self.possible_agents

    def _infos(self, contacts: dict[str, list[str]] | None = None) -> dict[str, dict]:
        if contacts is None:
            contacts = self._contacts()
        state = self._state
        rules = self.rules
        infos = {}
        for agent, neighbours in contacts.items():
            infos[agent] = {
                "round": state.round,
                "needs_action": (not state.done) and rules.needs_action(agent, state.round),
                "neighbours": neighbours,
                "malformed": state.malformed[agent],
                **rules.agent_info(agent),
            }
            if self.spec.tools and not state.done:
                infos[agent]["tools"] = self._tools(agent)
            choices = self._choices(agent, infos[agent])
            if choices:
                infos[agent]["choices"] = choices
        return infos

    def _choices(self, agent: str, info: Mapping[str, Any]) -> list[str]:
        """The legal texts of a turn that is one action of a finite set and nothing else: the
        agent must act, has nobody to talk to and no tools, and the rules list its legal
        actions (:meth:`Rules.legal_actions`, canonical texts). A policy with ``choice:
        scored`` answers such a turn with one of them (:mod:`marl.agents.generation`); ``[]``
        for every other turn."""
        if not info["needs_action"] or info["neighbours"] or "tools" in info:
            return []
        if self.rules_cls.info.free_text_action:
            return []
        legal = self.rules.legal_actions(agent)
        return list(legal) if legal else []

    def _tools(self, agent: str) -> dict[str, dict[str, Any]]:
        """The agent's tools this round, as plain data: each tool's settings and ``data`` (the
        YAML's ``tables.<agent>`` merged with the rules' ``tool_data``), read by
        :class:`marl.protocols.tools.ToolBox` wherever the agent's reply is generated."""
        dealt = self.rules.tool_data(agent)
        tools = {}
        for name, settings in self.spec.tools.items():
            fixed = dict(settings.get("tables", {}).get(agent, {}) or {})
            own = dealt.get(name)
            data: Any = {**fixed, **own} if isinstance(own, Mapping) else (own or fixed or None)
            tools[name] = {k: v for k, v in settings.items() if k != "tables"} | {"data": data}
        return tools

    def _mix_rewards(self, outcome: RoundResult) -> dict[str, float]:
        """Mix team and individual payoffs through the cooperation coefficient c.

        r_i = c * team + (1 - c) * (x_i - mean_{j != i} x_j): c = 1 is fully cooperative,
        c = 0 is zero-sum (the relative terms sum to zero over agents), between is mixed.
        """
        agents = self.agents
        individual = {a: float(outcome.individual.get(a, 0.0)) for a in agents}
        if outcome.team is not None:
            team = float(outcome.team)
        else:
            team = sum(individual.values()) / max(len(agents), 1)
        c = self.spec.cooperation
        n = len(agents)
        total = sum(individual.values())
        mixed = {}
        for agent in agents:
            relative = individual[agent] - (total - individual[agent]) / (n - 1) if n > 1 else 0.0
            mixed[agent] = c * team + (1 - c) * relative
        return mixed
