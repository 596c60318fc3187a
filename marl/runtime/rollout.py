"""The rollout runner: plays many episodes at once, one batched generate call per round.

Every live agent of every environment that maps to the same policy is prompted together, so a
round of B x G episodes with N agents costs one ``backend.generate`` call per policy. Each
completion becomes a :class:`~marl.protocols.turn.TurnRecord`; when an episode ends, every record
of an agent gets that agent's episode return, and the episode itself becomes an
:class:`~marl.episodes.EpisodeRecord`. The result is plain data: the environments stay in the
process that played them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from marl.agents.backends import PolicyBackend, SamplingConfig
from marl.agents.generation import PromptRequest, Reply, generate_by_policy
from marl.episodes import EpisodeRecord, record_episode
from marl.protocols.markup import IDLE_REPLY
from marl.protocols.turn import TurnRecord
from marl.scenarios.base import TextScenarioEnv


@dataclass
class EpisodeSlot:
    """One environment in a rollout batch, with its place in the GRPO layout. A slot lives in
    the process that plays it; what leaves that process is the episode's record.

    policies: agent -> policy id for this episode only (a league opponent's seat, a cross-play
              pairing); agents not named play ``policy_of(agent)``.
    bots:     agent -> scripted bot name for this episode only: the bot writes the agent's
              replies (no generation, no turn record), with randomness seeded by the episode.
    """

    env: TextScenarioEnv
    seed: int
    group_id: int
    episode_id: int
    policies: dict[str, str] = field(default_factory=dict)
    bots: dict[str, str] = field(default_factory=dict)


@dataclass
class RolloutResult:
    """Everything a batch of episodes produced, as plain data (no environment inside).

    episodes: one :class:`~marl.episodes.EpisodeRecord` per episode, in slot order;
              ``returns`` and ``malformed`` repeat their returns and malformed counts.
    """

    turns: list[TurnRecord] = field(default_factory=list)
    returns: list[dict[str, float]] = field(default_factory=list)  # per episode, per agent
    malformed: list[dict[str, int]] = field(default_factory=list)
    episodes: list[EpisodeRecord] = field(default_factory=list)
    generate_calls: int = 0
    generated_tokens: int = 0

    def add_episode(self, slot: EpisodeSlot) -> None:
        """Record ``slot``'s finished episode."""
        record = record_episode(slot.env, slot.episode_id, slot.group_id)
        self.returns.append(record.returns)
        self.malformed.append(record.malformed)
        self.episodes.append(record)


def _tool_extras(reply: Reply) -> dict[str, float]:
    """A turn's tool use, for the metrics (empty when the agent had no tools)."""
    if not reply.tools:
        return {}
    return {
        "tool_calls": float(reply.tool_calls),
        "tool_errors": float(reply.tool_errors),
        "tool_seconds": float(reply.tool_seconds),
    }


def run_episodes(
    slots: Sequence[EpisodeSlot],
    backends: Mapping[str, PolicyBackend],
    policy_of: Callable[[str], str],
    sampling: SamplingConfig,
    seed: int = 0,
    *,
    temperatures: Mapping[str, float] | None = None,
    scored: Collection[str] = frozenset(),
) -> RolloutResult:
    """Play every slot's episode to the end and return the turn records and episode records.

    ``policy_of(agent)`` names the policy an agent uses; ``backends[policy]`` generates for it.
    ``seed`` seeds generation, round by round, so a rollout is reproducible. With
    ``sampling.response_prefix`` each reply starts with the head its turn needs
    (:mod:`marl.agents.heads`): the head's tokens end the prompt, and the environment gets
    ``head + generated text``.
    ``temperatures`` gives a policy its own sampling temperature (``policies.<id>.temperature``;
    :func:`marl.agents.generation.generate_by_policy`); ``scored`` names the policies that
    answer finite-choice turns by scoring their legal texts (``policies.<id>.choice: scored``).
    A slot's ``policies`` and ``bots`` override ``policy_of`` for that episode. Every turn record
    gets ``extras["reward_to_go"]``: its agent's rewards from its round to the episode's end.
    """
    from marl.scenarios.bots import get_bot

    result = RolloutResult()
    observations, infos = [], []
    for slot in slots:
        obs, info = slot.env.reset(seed=slot.seed)
        observations.append(obs)
        infos.append(info)
    pending: list[list[TurnRecord]] = [[] for _ in slots]
    rewards: list[list[dict[str, float]]] = [[] for _ in slots]  # per slot, per round
    bots = [
        {a: get_bot(slot.env.spec.rules, name) for a, name in slot.bots.items()} for slot in slots
    ]
    bot_rngs = [random.Random(f"{seed}:{slot.seed}:{slot.episode_id}:bot") for slot in slots]
    round_index = 0
    while any(slot.env.agents for slot in slots):
        requests: list[PromptRequest] = []
        chosen: list[str] = []
        owners: list[tuple[int, str]] = []
        completions: dict[int, dict[str, str]] = {i: {} for i in range(len(slots))}
        for i, slot in enumerate(slots):
            for agent in slot.env.agents:
                if slot.env.is_idle(agent):  # nothing to say or do: no generation, no record
                    completions[i][agent] = IDLE_REPLY
                    continue
                if agent in bots[i]:  # a scripted opponent: no generation, no record
                    completions[i][agent] = bots[i][agent](
                        agent, observations[i][agent], infos[i][agent], bot_rngs[i]
                    )
                    continue
                chosen.append(slot.policies.get(agent) or policy_of(agent))
                requests.append(
                    PromptRequest(
                        agent,
                        slot.env.system_prompt(agent),
                        observations[i][agent],
                        infos[i].get(agent),
                    )
                )
                owners.append((i, agent))
        replies, calls = generate_by_policy(
            backends,
            policy_of,
            requests,
            sampling,
            seed * 100_003 + round_index,
            policies=chosen,
            temperatures=temperatures,
            scored=scored,
        )
        result.generate_calls += calls
        order = sorted(range(len(requests)), key=lambda k: chosen[k])
        for k in order:  # records in the order they were generated: policy by policy
            (i, agent), (reply,) = owners[k], replies[k]
            completions[i][agent] = reply.text
            result.generated_tokens += sum(reply.mask)  # tool output is not generated
            slot = slots[i]
            pending[i].append(
                TurnRecord(
                    agent=agent,
                    policy_id=reply.policy_id,
                    group_id=slot.group_id,
                    episode_id=slot.episode_id,
                    round=slot.env.round,
                    prompt_ids=reply.prompt_ids,
                    response_ids=reply.response_ids,
                    logprobs=reply.logprobs,
                    mask=list(reply.mask),
                    text=reply.text,
                    extras=_tool_extras(reply),
                )
            )
        for i, slot in enumerate(slots):
            if not slot.env.agents:
                continue
            observations[i], step_rewards, _, _, infos[i] = slot.env.step(completions[i])
            rewards[i].append(dict(step_rewards))
        round_index += 1
    for i, slot in enumerate(slots):
        returns = slot.env.returns
        parse_failed = {
            (t.round, t.agent) for t in slot.env.log if t.parse_errors or t.invalid_action
        }
        for turn in pending[i]:
            turn.reward = returns[turn.agent]
            turn.extras["reward_to_go"] = _reward_to_go(rewards[i], turn.round, turn.agent)
            turn.parse_ok = (turn.round, turn.agent) not in parse_failed
        result.turns += pending[i]
        result.add_episode(slot)
    return result


def _reward_to_go(per_round: Sequence[Mapping[str, float]], start: int, agent: str) -> float:
    """``agent``'s rewards from round ``start`` to the end (rounds are played in order, so
    entry k of ``per_round`` is round k of the episode)."""
    return float(sum(r.get(agent, 0.0) for r in per_round[start:]))
