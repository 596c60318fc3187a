"""The exact listening measures during ``marl train`` (issue 26): CIC, influence, swap and null
on held-out scenarios, at every held-out evaluation.

At every held-out evaluation (before the first update, every ``train.eval_every`` updates and
after the last: :func:`marl.analysis.evaluation.due`), and so always between two updates, never
after an update that the measured episodes did not see,
:func:`marl.analysis.listening.listening_per_scenario` measures the speaker -> listener pair (the
scenario's first two agents) on the first ``emergence.listening_episodes`` of the evaluation's
held-out scenarios (the same seeds at every evaluation of a run), with ``emergence.counterfactuals``
speaker replies per possible label. The speaker samples from the rollout's own backend with the
run's sampling settings; the listener is scored exactly at the temperature it samples at, or,
with ``emergence.listening_replies`` N > 0, each of its distributions is read by the scenario's
parser from N of its sampled replies (a listener that answers in its own words: every reply the
game accepts counts, and ``off_set`` is what the parser rejects).

Tags, logged at the number of updates done as ``eval/*`` is: ``eval/listening/<metric>`` (the
mean over scenarios) with ``_low`` / ``_high`` (a 95% t-interval over scenarios), for each
metric of :data:`marl.analysis.listening.LISTENING_METRICS`, ``eval/listening/off_set_flag``,
``eval/listening/replies`` (how the listener was read: 0 exactly, N from N sampled replies) and
``perf/listening_time``.

When: LLM agents in this process (:class:`marl.runtime.local.LocalRuntime`; under Ray one line on
stderr says it is skipped: measure checkpoints with ``marl eval --listening``), and a scenario
whose speaker has alternative labels (:meth:`marl.scenarios.rules.Rules.alternative_labels`)
and whose listener acts from a finite legal set; otherwise nothing is logged.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

__all__ = ["listening_tracker", "measurable"]


def measurable(scenario: str, overrides: dict[str, Any]) -> bool:
    """Whether the scenario's first agent has alternative labels (a speaker whose message the
    listening measures can vary) in a freshly reset episode."""
    from marl.scenarios.registry import make

    env = make(scenario, **overrides)
    env.reset(seed=0)
    agents = list(env.possible_agents)
    return len(agents) >= 2 and bool(env.rules.alternative_labels(agents[0]))


def listening_tracker(config: Any, plan: Any, runtime: Any) -> Callable[[int], dict[str, float]]:
    """``measure(updates_done) -> tags`` for the run (an empty dict when nothing is measured:
    scripted agents, ``emergence.counterfactuals`` 0, no held-out evaluation, a scenario the
    measures do not apply to, or a runtime without the policies in this process)."""
    e = config.emergence
    episodes = config.train.eval_episodes
    if e.listening_episodes is not None:
        episodes = min(episodes, e.listening_episodes)
    scenario, overrides = config.scenario.name, dict(config.scenario.overrides)
    if (
        config.agents != "llm"
        or not e.counterfactuals
        or not episodes
        or plan is None
        or not measurable(scenario, overrides)
    ):
        return lambda updates_done: {}
    from marl.runtime.local import LocalRuntime

    if not isinstance(runtime, LocalRuntime) or runtime.worker.policies is None:
        print(
            "listening: skipped, the policies are not in this process (ray.enabled); measure "
            "checkpoints with `marl eval --listening`",
            file=sys.stderr,
            flush=True,
        )
        return lambda updates_done: {}

    def measure(updates_done: int) -> dict[str, float]:
        from marl.agents.generation import reply_sampler
        from marl.analysis.listening import hf_scorer, listening_per_scenario
        from marl.runtime.workers import eval_seeds
        from marl.scenarios.registry import make

        began = time.perf_counter()
        backends = runtime.worker.policies.backends
        s = config.sampling
        env = make(scenario, **overrides)
        speaker, listener = list(env.possible_agents)[:2]
        seed = config.seed * 1_000_003 + updates_done
        parsed = e.listening_replies > 0
        scored = plan.policy_of(listener) in plan.scored  # it chooses among its legal texts
        result = listening_per_scenario(
            lambda: make(scenario, **overrides),
            eval_seeds(config.seed, config.train.eval_episodes)[:episodes],
            reply_sampler(
                backends,
                plan.policy_of,
                s,
                seed=seed,
                temperatures=plan.temperatures,
                scored=plan.scored,
            ),
            # the listener scored at the temperature it samples at (its policy's own, if set)
            None
            if parsed
            else hf_scorer(
                backends[plan.policy_of(listener)],
                sampling=replace(s, temperature=plan.temperatures[plan.policy_of(listener)]),
                scored=scored,
            ),
            counterfactuals=e.counterfactuals,
            speaker=speaker,
            listener=listener,
            swap_seed=config.seed,
            # or read by the parser from its sampled replies, at the same temperature
            listener_replies=reply_sampler(
                backends,
                plan.policy_of,
                s,
                seed=seed + 1,
                temperatures=plan.temperatures,
                scored=plan.scored,
            )
            if parsed
            else None,
            replies=e.listening_replies,
            spellings=not scored,
        )
        return {
            **result.scalars(),
            "eval/listening/replies": float(result.replies),
            "perf/listening_time": time.perf_counter() - began,
        }

    return measure
