"""The rollout runner: plays many episodes at once, one batched generate call per round.

Every live agent of every environment that maps to the same policy is prompted together, so a
round of B x G episodes with N agents costs one ``backend.generate`` call per policy. Each
completion becomes a :class:`~marl.agents.turn.TurnRecord`; when an episode ends, every record
of an agent gets that agent's episode return.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from marl.agents.backends import PolicyBackend, SamplingConfig
from marl.agents.heads import head_ids, response_head
from marl.agents.prompts import prompt_ids
from marl.agents.turn import TurnRecord
from marl.scenarios.base import TextScenarioEnv

IDLE_REPLY = "ACTION: wait"


@dataclass
class EpisodeSlot:
    """One environment in a rollout batch, with its place in the GRPO layout."""

    env: TextScenarioEnv
    seed: int
    group_id: int
    episode_id: int


@dataclass
class RolloutResult:
    """Everything a batch of episodes produced."""

    turns: list[TurnRecord] = field(default_factory=list)
    returns: list[dict[str, float]] = field(default_factory=list)  # per episode, per agent
    malformed: list[dict[str, int]] = field(default_factory=list)
    slots: list[EpisodeSlot] = field(default_factory=list)
    generate_calls: int = 0
    generated_tokens: int = 0


def run_episodes(
    slots: Sequence[EpisodeSlot],
    backends: Mapping[str, PolicyBackend],
    policy_of: Callable[[str], str],
    sampling: SamplingConfig,
    seed: int = 0,
    max_prompt_tokens: int | None = None,
    response_prefix: bool = False,
) -> RolloutResult:
    """Play every slot's episode to the end and return the turn records.

    ``policy_of(agent)`` names the policy an agent uses; ``backends[policy]`` generates for it.
    ``seed`` seeds generation, round by round, so a rollout is reproducible. With
    ``response_prefix`` each reply starts with the head its turn needs (:mod:`marl.agents.heads`):
    the head's tokens end the prompt, and the environment gets ``head + generated text``.
    """
    result = RolloutResult(slots=list(slots))
    observations, infos = [], []
    for slot in slots:
        obs, info = slot.env.reset(seed=slot.seed)
        observations.append(obs)
        infos.append(info)
    pending: list[list[TurnRecord]] = [[] for _ in slots]
    round_index = 0
    while any(slot.env.agents for slot in slots):
        requests: dict[str, list[tuple[int, str, list[int]]]] = {}
        heads: dict[tuple[int, str], str] = {}
        completions: dict[int, dict[str, str]] = {i: {} for i in range(len(slots))}
        for i, slot in enumerate(slots):
            for agent in slot.env.agents:
                if slot.env.is_idle(agent):  # nothing to say or do: no generation, no record
                    completions[i][agent] = IDLE_REPLY
                    continue
                policy = policy_of(agent)
                tokenizer = backends[policy].tokenizer
                ids = prompt_ids(
                    tokenizer,
                    slot.env.system_prompt(agent),
                    observations[i][agent],
                    max_prompt_tokens,
                )
                if response_prefix:
                    head = heads[(i, agent)] = response_head(infos[i].get(agent))
                    ids = ids + head_ids(tokenizer, head)
                requests.setdefault(policy, []).append((i, agent, ids))
        for policy, batch in sorted(requests.items()):
            generations = backends[policy].generate(
                [ids for _, _, ids in batch], sampling, seed=seed * 100_003 + round_index
            )
            result.generate_calls += 1
            for (i, agent, ids), options in zip(batch, generations):
                gen = options[0]
                text = heads.get((i, agent), "") + gen.text
                completions[i][agent] = text
                result.generated_tokens += len(gen.response_ids)
                slot = slots[i]
                pending[i].append(
                    TurnRecord(
                        agent=agent,
                        policy_id=policy,
                        env_seed=slot.seed,
                        group_id=slot.group_id,
                        episode_id=slot.episode_id,
                        round=slot.env.round,
                        prompt_ids=list(ids),
                        response_ids=list(gen.response_ids),
                        logprobs=list(gen.logprobs),
                        mask=[1] * len(gen.response_ids),
                        text=text,
                    )
                )
        for i, slot in enumerate(slots):
            if not slot.env.agents:
                continue
            observations[i], _, _, _, infos[i] = slot.env.step(completions[i])
        round_index += 1
    for i, slot in enumerate(slots):
        returns = slot.env.returns
        parse_failed = {
            (t.round, t.agent) for t in slot.env.log if t.parse_errors or t.invalid_action
        }
        for turn in pending[i]:
            turn.reward = returns[turn.agent]
            turn.parse_ok = (turn.round, turn.agent) not in parse_failed
        result.turns += pending[i]
        result.returns.append(returns)
        result.malformed.append(slot.env.malformed)
    return result
