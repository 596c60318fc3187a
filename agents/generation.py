"""Group prompts by policy, then generate: the one batched-generation step of the platform.

The rollout (one call per policy per round) and the counterfactual re-simulation (one call per
policy per round of its batched branches) both hand a list of :class:`PromptRequest` s to
:func:`generate_by_policy`. Each request is tokenized with its policy's tokenizer (chat template,
untrusted text escaped: :mod:`marl.agents.prompts`), optionally ends with its turn's response
head (:mod:`marl.agents.heads`), and is repeated ``n`` times; then every policy's rows go to its
backend in ONE ``generate`` call, policies in sorted order, each call with the same ``seed``.

Policies that are views of one shared base backend (a LoRA adapter per agent, or a frozen
copy, on one base model: a backend with ``base`` and ``adapter`` attributes, such as
:class:`marl.policies.AdapterBackend`) generate together: their rows go to the base in ONE call,
each row naming its policy's adapter. N agents with an adapter each then cost one call per
round, not N, and every agent's turns share the batch.
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
) -> tuple[list[list[Reply]], int]:
    """Every request's ``n`` replies (in request order), and the number of generate calls made.

    ``policy_of(agent)`` names the policy an agent uses and ``backends[policy]`` generates for
    it. Rows of one policy keep the requests' order; ``sampling.n`` is ignored (each request
    says its own ``n``, as repeated rows). Views of one base backend share one call (module
    docstring), so the count is the number of distinct generating backends.
    """
    out: list[list[Reply]] = [[] for _ in requests]
    by_policy: dict[str, list[int]] = {}
    for k, request in enumerate(requests):
        by_policy.setdefault(policy_of(request.agent), []).append(k)
    one = replace(sampling, n=1)
    # policies in sorted order; views of one base backend join the call of the first of them
    calls: dict[int, tuple[PolicyBackend, list[str]]] = {}
    for policy in sorted(by_policy):
        backend, _ = _target(backends[policy])
        calls.setdefault(id(backend), (backend, []))[1].append(policy)
    for backend, policies in calls.values():
        rows: list[list[int]] = []
        adapters: list[str | None] = []
        owners: list[tuple[int, str]] = []
        heads: dict[int, str] = {}
        for policy in policies:
            tokenizer = backends[policy].tokenizer
            _, adapter = _target(backends[policy])
            for k in by_policy[policy]:
                request = requests[k]
                ids = prompt_ids(
                    tokenizer, request.system_prompt, request.observation, max_prompt_tokens
                )
                if response_prefix:
                    heads[k] = response_head(request.info)
                    ids = ids + head_ids(tokenizer, heads[k])
                rows += [ids] * request.n
                adapters += [adapter] * request.n
                owners += [(k, policy)] * request.n
        if len(policies) == 1:  # a policy of its own: its backend, as it routes its rows
            generations = backends[policies[0]].generate(rows, one, seed=seed)
        else:
            generations = backend.generate(rows, one, adapters=adapters, seed=seed)
        for (k, policy), ids, options in zip(owners, rows, generations):
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
    return out, len(calls)


def _target(backend: PolicyBackend) -> tuple[PolicyBackend, str | None]:
    """The backend that really generates for ``backend``, and the adapter its rows use: a view
    of a shared base (``base`` and ``adapter`` attributes) names its base; any other backend is
    its own target (adapter ``None``: its rows as it routes them)."""
    base = getattr(backend, "base", None)
    if base is not None and hasattr(backend, "adapter"):
        return base, backend.adapter  # type: ignore[attr-defined]
    return backend, None
