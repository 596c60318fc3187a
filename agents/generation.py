"""Group prompts by policy, then generate: the one batched-generation step of the platform.

The rollout (one call per policy per round) and the counterfactual re-simulation (one call per
policy per round of its batched branches) both hand a list of :class:`PromptRequest` s to
:func:`generate_by_policy`. Each request is tokenized with its policy's tokenizer by
:func:`marl.agents.prompts.turn_prompt` (chat template, untrusted text escaped, then its turn's
note and response head when heads are on: :mod:`marl.agents.heads`), the builder every measure
calls too, and is repeated ``n`` times; then every policy's rows go to its backend in ONE
``generate`` call, policies in sorted order, each call with the same ``seed``.

Tools (docs/tools.md). A request whose info declares tools (``info["tools"]``) may call them
within its reply: when a completion holds a ``CALL <tool>: <query>`` line, the reply is cut just
after that line (the tokens sampled past it are dropped: a prefix of a sample is a sample), the
call runs (:class:`marl.protocols.tools.ToolBox`), its ``RESULT`` line is appended to the reply
as tokens the policy did not write (mask 0, logprob 0.0), and the row continues from
``prompt + reply so far``. Every row that continues goes into one more ``generate`` call per
policy (seeded ``seed + 1_000_003 * k`` for the k-th continuation), so a round costs at most
``1 + calls`` calls per policy. A reply makes at most the sum of its tools' ``calls`` calls
(a ``CALL`` line past that is left as text), and generates at most ``max_new_tokens`` tokens in
all, tool output not counted.

Policies that are views of one shared base backend (a LoRA adapter per agent, or a frozen
copy, on one base model: a backend with ``base`` and ``adapter`` attributes, such as
:class:`marl.runtime.policies.AdapterBackend`) generate together: their rows go to the base in ONE
call, each row naming its policy's adapter. N agents with an adapter each then cost one call per
round (plus one per tool continuation), not N, and every agent's turns share the batch.

Before every call, each row's prompt (its reply so far included) and the new tokens it may still
get must fit in its backend's context (:func:`marl.agents.context.backend_context`): prompts
grow as an episode's messages accumulate, and one that does not fit is refused in one line
naming the agent (:class:`marl.agents.context.ContextLengthError`), never cut.

A policy may sample at a temperature of its own (``policies.<id>.temperature``): the caller
passes ``temperatures`` (policy id -> temperature, where it differs from
``sampling.temperature``). Views of one base that sample at different temperatures then go to
the base in one call per temperature, since one call samples at one.

A policy may answer a finite-choice turn by scoring its legal texts instead
(``policies.<id>.choice: scored``; the caller passes ``scored``, the ids of such policies): a
request whose info lists ``choices`` then gets one of them, drawn by its scores
(:mod:`marl.agents.scored_choice`), and every other request of the policy is sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from marl.agents.backends import Generation, PolicyBackend, SamplingConfig, backend_target
from marl.agents.context import backend_context, check_fits
from marl.agents.prompts import turn_prompt, untrusted_ids
from marl.agents.scored_choice import choices_of, choose_by_score
from marl.protocols.tools import ToolBox, find_call

CONTINUATION_SEED_STRIDE = 1_000_003

__all__ = [
    "SAMPLES_PER_CALL",
    "PromptRequest",
    "Reply",
    "generate_by_policy",
    "reply_sampler",
    "sample_in_batches",
]

# Replies sampled per generate call by :func:`sample_in_batches`: bounds the memory of one call
# (each sequence holds its prompt's key/value cache: about 1 GB for 128 of SmolLM2-135M's in
# fp32; the 2,560 of one listening measurement at once took 21 GB)
SAMPLES_PER_CALL = 128


@dataclass(frozen=True)
class PromptRequest:
    """One agent's prompt that needs ``n`` completions.

    info: the environment's info dict for the agent; it picks the response head when heads are
          on (``SamplingConfig.response_prefix``) and is otherwise unused.
    """

    agent: str
    system_prompt: str
    observation: str
    info: Mapping[str, Any] | None = None
    n: int = 1


@dataclass
class Reply:
    """One sampled completion of a request.

    text:         what the environment gets: the response head (if any) + the generated text,
                  with each tool call's ``RESULT`` line after its ``CALL`` line.
    prompt_ids:   the prompt as generated from, head tokens included (what the learner scores).
    response_ids: the reply's tokens: generated ones and tool output; ``logprobs`` and ``mask``
                  have one entry per token (``mask`` 1 where the policy generated the token, 0
                  for tool output, whose logprob is 0.0).
    tools:        whether the request declared tools (its info's ``tools``).
    tool_calls, tool_errors, tool_seconds: calls made, calls that failed, time spent in tools.
    """

    policy_id: str
    prompt_ids: list[int]
    text: str
    response_ids: list[int]
    logprobs: list[float]
    mask: list[int] = field(default_factory=list)
    tools: bool = False
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not self.mask:
            self.mask = [1] * len(self.response_ids)


@dataclass
class _Row:
    """One sample being generated, possibly over several calls (tool use)."""

    owner: int
    policy: str
    adapter: str | None
    prompt: list[int]
    tools: ToolBox | None
    response: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    text: str = ""
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    done: bool = False

    @property
    def generated(self) -> int:
        return sum(self.mask)


def generate_by_policy(
    backends: Mapping[str, PolicyBackend],
    policy_of: Callable[[str], str],
    requests: Sequence[PromptRequest],
    sampling: SamplingConfig,
    seed: int,
    *,
    policies: Sequence[str | None] | None = None,
    temperatures: Mapping[str, float] | None = None,
    scored: Collection[str] = frozenset(),
) -> tuple[list[list[Reply]], int]:
    """Every request's ``n`` replies (in request order), and the number of generate calls made.

    ``policy_of(agent)`` names the policy an agent uses and ``backends[policy]`` generates for
    it; ``policies[k]``, when given and not None, names request k's policy instead (the same
    agent may play different policies in different episodes: a league opponent, cross-play).
    Rows of one policy keep the requests' order; ``sampling.n`` is ignored (each request says
    its own ``n``, as repeated rows). Views of one base backend share each call (module
    docstring), so the count is per distinct generating backend (and temperature, where
    ``temperatures`` gives a policy its own) and tool continuation. A policy in ``scored``
    (``policies.<id>.choice: scored``) answers each request whose info lists ``choices`` with
    one of them, drawn by its scores (:mod:`marl.agents.scored_choice`: one scoring pass per
    such policy, counted as a call); its other requests are sampled as usual.
    """
    out: list[list[Reply]] = [[] for _ in requests]
    by_policy: dict[str, list[int]] = {}
    by_score: dict[str, list[int]] = {}
    if policies is not None and len(policies) != len(requests):
        raise ValueError(f"policies ({len(policies)}) must match requests ({len(requests)})")
    for k, request in enumerate(requests):
        chosen = policies[k] if policies is not None else None
        policy = chosen or policy_of(request.agent)
        picks = by_score if policy in scored and choices_of(request.info) else by_policy
        picks.setdefault(policy, []).append(k)
    own = temperatures or {}
    calls = 0
    for index, policy in enumerate(sorted(by_score)):  # each policy draws from its own stream
        asked = [requests[k] for k in by_score[policy]]
        chosen_replies = choose_by_score(
            backends[policy],
            policy,
            asked,
            temperature=own.get(policy, sampling.temperature),
            response_prefix=sampling.response_prefix,
            seed=seed + CONTINUATION_SEED_STRIDE * (index + 1) + 17,  # no continuation's seed
        )
        calls += 1
        for k, options in zip(by_score[policy], chosen_replies):
            out[k] = [
                Reply(policy, c.prompt_ids, c.text, c.response_ids, c.logprobs) for c in options
            ]
    # policies in sorted order; views of one base backend that sample at one temperature join
    # the call of the first of them
    targets: dict[tuple[int, float], tuple[PolicyBackend, list[str]]] = {}
    for policy in sorted(by_policy):
        backend, _ = backend_target(backends[policy])
        temperature = own.get(policy, sampling.temperature)
        targets.setdefault((id(backend), temperature), (backend, []))[1].append(policy)
    for (_, temperature), (backend, group) in targets.items():
        one = replace(sampling, n=1, temperature=temperature)
        rows: list[_Row] = []
        for policy in group:
            tokenizer = backends[policy].tokenizer
            _, adapter = backend_target(backends[policy])
            for k in by_policy[policy]:
                request = requests[k]
                turn = turn_prompt(
                    tokenizer,
                    request.system_prompt,
                    request.observation,
                    request.info,
                    response_prefix=sampling.response_prefix,
                )
                for _ in range(request.n):  # each sample keeps its own count of tool calls
                    tools = ToolBox.from_info(request.info)
                    rows.append(_Row(k, policy, adapter, turn.ids, tools, text=turn.head))
        limits = {policy: backend_context(backends[policy]) for policy in group}
        pending = rows
        for attempt in range(1 + max((r.tools.max_calls for r in rows if r.tools), default=0)):
            if not pending:
                break
            for r in pending:  # a row may grow past the context between calls (tool results)
                check_fits(
                    requests[r.owner].agent,
                    len(r.prompt) + len(r.response),
                    one.max_new_tokens - r.generated,
                    limits[r.policy],
                    f" (policy {r.policy})",
                )
            budget = max(one.max_new_tokens - r.generated for r in pending)
            prompts = [r.prompt + r.response for r in pending]
            settings = replace(one, max_new_tokens=budget)
            attempt_seed = seed + CONTINUATION_SEED_STRIDE * attempt
            if len(group) == 1:  # a policy of its own: its backend, as it routes its rows
                generations = backends[group[0]].generate(prompts, settings, seed=attempt_seed)
            else:
                adapters = [r.adapter for r in pending]
                generations = backend.generate(
                    prompts,
                    settings,
                    adapters=adapters,
                    seed=attempt_seed,  # type: ignore[call-arg]
                )
            calls += 1
            for row, options in zip(pending, generations):
                _absorb(row, options[0], backends[row.policy].tokenizer, one.max_new_tokens)
            pending = [r for r in pending if not r.done]
        for row in rows:
            out[row.owner].append(
                Reply(
                    policy_id=row.policy,
                    prompt_ids=list(row.prompt),
                    text=row.text,
                    response_ids=row.response,
                    logprobs=row.logprobs,
                    mask=row.mask,
                    tools=row.tools is not None,
                    tool_calls=row.calls,
                    tool_errors=row.errors,
                    tool_seconds=row.seconds,
                )
            )
    return out, calls


def _absorb(row: _Row, gen: Generation, tokenizer: Any, max_new_tokens: int) -> None:
    """Append one generated segment to ``row``: whole when it makes no tool call (the row is
    then done), else up to the end of its first ``CALL`` line, followed by the call's result."""
    ids, logprobs = list(gen.response_ids), list(gen.logprobs)
    room = max_new_tokens - row.generated
    text = gen.text
    if len(ids) > room:  # a continuation shares its call's budget with longer rows
        ids, logprobs = ids[:room], logprobs[:room]
        text = tokenizer.decode(ids, skip_special_tokens=True)
    start = len(row.text)
    call = None
    if row.tools is not None and row.calls < row.tools.max_calls:
        call = find_call(row.text + text, start)
    if call is not None and call.terminated:
        cut = _shortest_prefix(tokenizer, ids, row.text, start)
        ids, logprobs = ids[:cut], logprobs[:cut]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        call = find_call(row.text + text, start)
    elif call is not None:  # the CALL line ends the segment: drop a trailing end-of-turn token
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        while ids and ids[-1] in special:
            ids.pop()
            logprobs.pop()
    row.response += ids
    row.logprobs += logprobs
    row.mask += [1] * len(ids)
    row.text += text
    if call is None or row.tools is None:
        row.done = True
        return
    outcome = row.tools.call(call.name, call.query)
    result = ("" if row.text.endswith("\n") else "\n") + outcome.text
    tool_ids = untrusted_ids(tokenizer, result)
    row.response += tool_ids
    row.logprobs += [0.0] * len(tool_ids)
    row.mask += [0] * len(tool_ids)
    row.text += result
    row.calls += 1
    row.errors += int(outcome.error)
    row.seconds += outcome.seconds
    row.done = row.generated >= max_new_tokens


def _shortest_prefix(tokenizer: Any, ids: list[int], before: str, start: int) -> int:
    """The fewest leading ``ids`` whose text (after ``before``) holds a whole ``CALL`` line,
    newline included (binary search: once a prefix holds it, every longer one does)."""
    low, high = 1, len(ids)
    while low < high:
        mid = (low + high) // 2
        call = find_call(before + tokenizer.decode(ids[:mid], skip_special_tokens=True), start)
        if call is not None and call.terminated:
            high = mid
        else:
            low = mid + 1
    return high


def reply_sampler(
    backends: Mapping[str, PolicyBackend],
    policy_of: Callable[[str], str],
    sampling: SamplingConfig,
    *,
    seed: int = 0,
    temperatures: Mapping[str, float] | None = None,
    scored: Collection[str] = frozenset(),
) -> Callable[[Sequence[PromptRequest], int], list[list[str]]]:
    """``sample(requests, k)``: ``k`` reply texts to each request, as the rollout samples them
    (:func:`generate_by_policy`: ``sampling.response_prefix``, each policy's own
    ``temperatures``, the ``scored`` policies' scored choices), for the measures that sample a
    policy (listening, Kuhn's table)."""

    def sample(requests: Sequence[PromptRequest], k: int) -> list[list[str]]:
        asked = [replace(r, n=k) for r in requests]
        replies, _ = generate_by_policy(
            backends, policy_of, asked, sampling, seed, temperatures=temperatures, scored=scored
        )
        return [[reply.text for reply in row] for row in replies]

    return sample


def sample_in_batches(
    sample: Callable[[Sequence[PromptRequest], int], Sequence[Sequence[str]]],
    requests: Sequence[PromptRequest],
    k: int,
    limit: int = SAMPLES_PER_CALL,
) -> list[Sequence[str]]:
    """``sample(requests, k)`` in calls of at most ``limit`` replies (at least one request a
    call), in request order."""
    per_call = max(1, limit // max(k, 1))
    out: list[Sequence[str]] = []
    for start in range(0, len(requests), per_call):
        out += sample(requests[start : start + per_call], k)
    return out
