"""Turn a rollout into the numbers a researcher watches: per agent, per edge, per policy.

A function of the rollout's data (turn records and episode records), not of environments nor
of the rollout runner: it reads what every phase reads."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import fmean

from marl.episodes import EpisodeRecord
from marl.protocols.router import COUNTER_KINDS
from marl.protocols.turn import TurnRecord


def rollout_metrics(
    turns: Sequence[TurnRecord], episodes: Sequence[EpisodeRecord]
) -> dict[str, float]:
    """Scalars of one iteration's turn records and episode records, tags namespaced by
    subject (``agents/<id>/...``, ``team/...``, ``policies/<id>/...``, ``comm/...``)."""
    out: dict[str, float] = {}
    per_agent_returns: dict[str, list[float]] = defaultdict(list)
    for record in episodes:
        for agent, value in record.returns.items():
            per_agent_returns[agent].append(value)
    for agent, values in per_agent_returns.items():
        out[f"agents/{agent}/reward"] = fmean(values)
    if per_agent_returns:
        out["team/reward"] = fmean(fmean(v) for v in per_agent_returns.values())
    turns_by_agent = defaultdict(list)
    for turn in turns:
        turns_by_agent[turn.agent].append(turn)
    for agent, mine in turns_by_agent.items():
        # the tokens the agent wrote (tool output, mask 0, is not its writing)
        out[f"agents/{agent}/response_length"] = fmean(sum(t.mask) for t in mine)
        out[f"agents/{agent}/parse_failure_rate"] = fmean(0.0 if t.parse_ok else 1.0 for t in mine)
        with_tools = [t for t in mine if "tool_calls" in t.extras]
        if with_tools:  # every step of a scenario with tools, 0 included (docs/tools.md)
            for key in ("tool_calls", "tool_errors", "tool_seconds"):
                out[f"agents/{agent}/{key}"] = fmean(t.extras[key] for t in with_tools)
    if turns:
        out["team/parse_failure_rate"] = fmean(0.0 if t.parse_ok else 1.0 for t in turns)
    turns_by_policy = defaultdict(list)
    for turn in turns:
        turns_by_policy[turn.policy_id].append(turn)
    for policy, theirs in turns_by_policy.items():
        logprobs = [lp for t in theirs for lp, m in zip(t.logprobs, t.mask) if m]
        # -mean log p of the sampled tokens: a Monte-Carlo estimate of the policy's entropy
        out[f"policies/{policy}/entropy_proxy"] = -fmean(logprobs) if logprobs else 0.0
    # comm/*: every router counter and every edge of the graph at every step, 0 included (a
    # tag that vanished when nothing was delivered hid exactly the collapse it should show)
    count = max(len(episodes), 1)
    edges: Counter[tuple[str, str]] = Counter()
    kinds: Counter[str] = Counter(dict.fromkeys(COUNTER_KINDS, 0))
    for record in episodes:
        edges.update(dict.fromkeys(record.edges, 0))
        edges.update(record.edge_counts)
        kinds.update(record.message_counts)
    for (u, v), n in sorted(edges.items()):
        out[f"comm/edges/{u}->{v}"] = n / count
    for kind, n in sorted(kinds.items()):
        out[f"comm/{kind}"] = n / count
    return out
