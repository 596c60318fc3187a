"""Group prompts by policy, then generate: the one batched-generation step of the platform.

The rollout (one call per policy per round) and the counterfactual re-simulation (one call per
policy per round of its batched branches) both hand a list of :class:`PromptRequest` s to
:func:`generate_by_policy`. Each request is tokenized with its policy's tokenizer (chat template,
untrusted text escaped: :mod:`marl.agents.prompts`), optionally ends with its turn's response
head (:mod:`marl.agents.heads`), and is repeated ``n`` times; then every policy's rows go to its
backend in ONE ``generate`` call, policies in sorted order, each call with the same ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from marl.agents.backends import PolicyBackend, SamplingConfig
from marl.agents.heads import head_ids, response_head
from marl.agents.prompts import prompt_ids

__all__ = ["PromptRequest", "Reply", "generate_by_policy"]


@dataclass(frozen=True)
class PromptRequest:
    """One agent's prompt that needs ``n`` completions.

    info: the environment's info dict for the agent; it picks the response head when heads are
          on (``response_prefix``) and is otherwise unused.
    """

    agent: str
    system_prompt: str
    observation: str
    info: Mapping[str, Any] | None = None
    n: int = 1


@dataclass
class Reply:
    """One sampled completion of a request.

    text:         what the environment gets: the response head (if any) + the generated text.
    prompt_ids:   the prompt as generated from, head tokens included (what the learner scores).
    response_ids: the generated tokens only; ``logprobs`` has one entry per token.
    """

    policy_id: str
    prompt_ids: list[int]
    text: str
    response_ids: list[int]
    logprobs: list[float]


def generate_by_policy(
    backends: Mapping[str, PolicyBackend],
    policy_of: Callable[[str], str],
    requests: Sequence[PromptRequest],
    sampling: SamplingConfig,
    seed: int,
    *,
    max_prompt_tokens: int | None = None,
    response_prefix: bool = False,
    policies: Sequence[str | None] | None = None,
) -> tuple[list[list[Reply]], int]:
    """Every request's ``n`` replies (in request order), and the number of generate calls made.

    ``policy_of(agent)`` names the policy an agent uses and ``backends[policy]`` generates for
    it; ``policies[k]``, when given and not None, names request k's policy instead (the same
    agent may play different policies in different episodes: a league opponent, cross-play).
    Rows of one policy keep the requests' order; ``sampling.n`` is ignored (each request says
    its own ``n``, as repeated rows).
    """
    out: list[list[Reply]] = [[] for _ in requests]
    by_policy: dict[str, list[int]] = {}
    if policies is not None and len(policies) != len(requests):
        raise ValueError(f"policies ({len(policies)}) must match requests ({len(requests)})")
    for k, request in enumerate(requests):
        chosen = policies[k] if policies is not None else None
        by_policy.setdefault(chosen or policy_of(request.agent), []).append(k)
    one = replace(sampling, n=1)
    calls = 0
    for policy, indices in sorted(by_policy.items()):
        tokenizer = backends[policy].tokenizer
        rows: list[list[int]] = []
        owners: list[int] = []
        heads: dict[int, str] = {}
        for k in indices:
            request = requests[k]
            ids = prompt_ids(
                tokenizer, request.system_prompt, request.observation, max_prompt_tokens
            )
            if response_prefix:
                heads[k] = response_head(request.info)
                ids = ids + head_ids(tokenizer, heads[k])
            rows += [ids] * request.n
            owners += [k] * request.n
        generations = backends[policy].generate(rows, one, seed=seed)
        calls += 1
        for k, ids, options in zip(owners, rows, generations):
            gen = options[0]
            out[k].append(
                Reply(
                    policy_id=policy,
                    prompt_ids=list(ids),
                    text=heads.get(k, "") + gen.text,
                    response_ids=list(gen.response_ids),
                    logprobs=list(gen.logprobs),
                )
            )
    return out, calls
