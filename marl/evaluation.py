"""Held-out evaluation: the current policies on scenarios training never sees, no update.

The training rollout's success is a noisy measure of the policy: its B x G episodes cover only
B scenarios (a GRPO group repeats one), and they are sampled while the policy changes. The
evaluation plays ``train.eval_episodes`` distinct scenarios, one episode each, with the same
seeds at every evaluation of a run (:func:`marl.workers.eval_seeds`), before the first update
and after the last (and every ``train.eval_every`` updates). Tags ``eval/*``, logged at the
number of updates done (0 = before any RL update, after the warm-up).
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean
from typing import Any


def evaluation_metrics(rollout: Any) -> dict[str, float]:
    """``eval/success`` (when the scenario defines it), ``eval/reward``, per-agent rewards and
    the share of malformed replies, from a finished evaluation rollout."""
    out: dict[str, float] = {"eval/episodes": float(len(rollout.episodes))}
    successes = [record.success for record in rollout.episodes]
    if successes and all(v is not None for v in successes):
        out["eval/success"] = fmean(successes)  # type: ignore[arg-type]
    per_agent: dict[str, list[float]] = defaultdict(list)
    for returns in rollout.returns:
        for agent, value in returns.items():
            per_agent[agent].append(value)
    for agent, values in sorted(per_agent.items()):
        out[f"eval/{agent}/reward"] = fmean(values)
    if per_agent:
        out["eval/reward"] = fmean(fmean(v) for v in per_agent.values())
    if rollout.turns:
        out["eval/parse_failure_rate"] = fmean(0.0 if t.parse_ok else 1.0 for t in rollout.turns)
    return out


def due(updates_done: int, total: int, every: int) -> bool:
    """Whether an evaluation runs after ``updates_done`` of ``total`` updates."""
    if updates_done in (0, total):
        return True
    return every > 0 and updates_done % every == 0
