"""Held-out evaluation: the current policies on scenarios training never sees, no update.

The training rollout's success is a noisy measure of the policy: its B x G episodes cover only
B scenarios (a GRPO group repeats one), and they are sampled while the policy changes. The
evaluation plays ``train.eval_episodes`` distinct scenarios, one episode each, with the same
seeds at every evaluation of a run (:func:`marl.runtime.workers.eval_seeds`), before the first
update and after the last (and every ``train.eval_every`` updates). Tags ``eval/*``, logged at the
number of updates done (0 = before any RL update, after the warm-up).

Because every evaluation plays the same scenarios, two evaluations are paired: each scenario
(keyed by its seed) succeeded or failed at both. :func:`evaluation_successes` reads one
evaluation's per-scenario outcomes and :func:`paired_metrics` compares two with McNemar's exact
test (:func:`marl.analysis.stats.mcnemar`), which uses the pairing that two Wilson intervals ignore.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from statistics import fmean
from typing import Any

from marl.analysis.stats import mcnemar

GOT_WORSE = "eval/paired/got_worse"
GOT_BETTER = "eval/paired/got_better"
MCNEMAR_P = "eval/paired/mcnemar_p"
PAIRED = (GOT_WORSE, GOT_BETTER, MCNEMAR_P)


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


def evaluation_successes(rollout: Any) -> dict[int, bool] | None:
    """Each held-out scenario's outcome, keyed by its scenario seed (``EpisodeRecord.seed``).
    None when the scenario defines no success, or a success that is not 0 or 1 (a paired test
    of binary outcomes does not apply)."""
    out: dict[int, bool] = {}
    for record in rollout.episodes:
        if record.success not in (0.0, 1.0):  # None or fractional
            return None
        out[int(record.seed)] = record.success == 1.0
    return out or None


def paired_metrics(before: Mapping[int, bool], after: Mapping[int, bool]) -> dict[str, float]:
    """Two evaluations of the same scenarios compared scenario by scenario, on the seeds both
    played: ``eval/paired/got_worse`` (succeeded before, failed after), ``got_better`` (the
    reverse) and ``mcnemar_p``, McNemar's exact two-sided p-value for "no change"
    (:func:`marl.analysis.stats.mcnemar`; 1 when no scenario changed)."""
    seeds = sorted(before.keys() & after.keys())
    worse, better, p = mcnemar([before[s] for s in seeds], [after[s] for s in seeds])
    return {GOT_WORSE: float(worse), GOT_BETTER: float(better), MCNEMAR_P: p}


def due(updates_done: int, total: int, every: int) -> bool:
    """Whether an evaluation runs after ``updates_done`` of ``total`` updates."""
    if updates_done in (0, total):
        return True
    return every > 0 and updates_done % every == 0
