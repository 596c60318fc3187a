"""The data contract between phases: a rollout is plain data, and every later phase reads it.

A worker plays scripted episodes; its rollout must hold no environment anywhere (it is what
crosses to the driver over Ray), survive a pickle round trip, and carry exactly what the
environments it came from say: returns, router counters, success, turn log, transcript, the
recorded episode credit replays, and the emergence data. Metrics, outcomes, the evaluation
summary, emergence metrics and team credit are then computed from the unpickled copy alone.
"""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import fields, is_dataclass
from typing import Any

import pytest
from pettingzoo import ParallelEnv

from marl.analysis.emergence import emergence_metrics
from marl.analysis.evaluation import evaluation_metrics
from marl.analysis.metrics import rollout_metrics
from marl.competition.outcomes import outcome_metrics
from marl.config import load_config
from marl.credit import RecordedEpisode
from marl.loop.credit_phase import credit_phase
from marl.runtime.resimulation import merge_credit
from marl.runtime.rollout import RolloutResult
from marl.runtime.workers import RolloutWorker
from marl.scenarios.transcript import render_transcript


def _worker(scenario: str = "relay", bot: str = "rule") -> RolloutWorker:
    config = load_config(
        {
            "agents": "scripted",
            "bot": bot,
            "scenario": {"name": scenario, "overrides": {}},
            "train": {"steps": 1, "seeds_per_step": 2, "group_size": 3},
            "seed": 3,
        }
    )
    return RolloutWorker(config, None)


def _environments_in(obj: Any, seen: set[int] | None = None) -> list[str]:
    """Every place in ``obj``'s object graph that holds a PettingZoo environment."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return []
    seen.add(id(obj))
    if isinstance(obj, ParallelEnv):
        return [type(obj).__name__]
    if isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)
    elif is_dataclass(obj):
        children = [getattr(obj, f.name) for f in fields(obj)]
    else:
        children = list(getattr(obj, "__dict__", {}).values())
    return [hit for child in children for hit in _environments_in(child, seen)]


@pytest.fixture(scope="module")
def played() -> tuple[RolloutWorker, RolloutResult, RolloutResult]:
    worker = _worker()
    rollout = worker.rollout(0, [0, 1])
    return worker, rollout, pickle.loads(pickle.dumps(rollout))


def test_rollout_holds_no_environment_and_pickles(played) -> None:
    worker, rollout, copy = played
    assert worker.envs and all(isinstance(env, ParallelEnv) for env in worker.envs.values())
    assert _environments_in(rollout) == []
    assert len(copy.episodes) == 6
    assert [r.episode_id for r in copy.episodes] == list(range(6))
    assert [r.group_id for r in copy.episodes] == [0, 0, 0, 1, 1, 1]
    assert all(r.recorded.points is None for r in copy.episodes)


def test_records_say_what_the_environments_say(played) -> None:
    worker, _, copy = played
    for record in copy.episodes:
        env = worker.envs[0, record.episode_id]  # (stage, episode): the env holding this episode
        assert record.seed == env.episode_seed
        assert record.returns == env.returns and record.malformed == env.malformed
        assert record.edge_counts == dict(env.router.edge_counts)
        assert record.message_counts == dict(env.router.counts)
        assert record.success == env.rules.success()
        assert record.transcript == render_transcript(env)
        assert [(t.round, t.agent, t.completion) for t in record.log] == [
            (t.round, t.agent, t.completion) for t in env.log
        ]
        assert record.recorded == RecordedEpisode.from_env(
            env, episode_id=record.episode_id, group_id=record.group_id
        )
    assert sum(sum(r.edge_counts.values()) for r in copy.episodes) > 0  # the rule bots talk


def test_later_phases_are_functions_of_the_data(played) -> None:
    worker, rollout, copy = played
    envs = [worker.envs[0, r.episode_id] for r in copy.episodes]  # (stage, episode)
    metrics = rollout_metrics(copy.turns, copy.episodes)
    edges: Counter = Counter()
    for env in envs:
        edges.update(env.router.edge_counts)
    for (u, v), count in edges.items():
        assert metrics[f"comm/edges/{u}->{v}"] == count / len(envs)
    assert metrics == rollout_metrics(rollout.turns, rollout.episodes)
    assert outcome_metrics(copy, 0, None) == outcome_metrics(rollout, 0, None)
    assert evaluation_metrics(copy)["eval/episodes"] == 6.0
    # emergence: from the records exactly what it measures from the environments themselves
    from_data = emergence_metrics([r.emergence for r in copy.episodes], previous_words={})
    from_envs = emergence_metrics(envs, previous_words={})
    assert from_data == from_envs and from_data


def test_team_credit_needs_no_environment(played) -> None:
    _, _, copy = played
    result, metrics = credit_phase(load_config({}).credit, copy, None, "grpo")
    assert result.episode_ids == list(range(6))
    assert result.credit == [r.returns for r in copy.episodes]
    assert any(k.startswith("credit/") for k in metrics)


def test_credit_from_the_workers_must_match_the_rollout_episodes(played) -> None:
    _, _, copy = played
    result, _ = credit_phase(load_config({}).credit, copy, None, "grpo")
    swapped = merge_credit([_slice(result, range(3, 6)), _slice(result, range(3))])
    with pytest.raises(ValueError, match="episodes"):
        credit_phase(load_config({}).credit, copy, None, "grpo", computed=swapped)
    merged = merge_credit([_slice(result, range(3)), _slice(result, range(3, 6))])
    assert merged.credit == result.credit and merged.episode_ids == result.episode_ids


def _slice(result: Any, index: range) -> Any:
    from marl.credit import CreditResult

    return CreditResult(
        method=result.method,
        episode_ids=[result.episode_ids[k] for k in index],
        group_ids=[result.group_ids[k] for k in index],
        returns=[result.returns[k] for k in index],
        credit=[result.credit[k] for k in index],
        stats={"branches": len(index)},
    )


@pytest.mark.slow
def test_worker_credit_is_a_pure_function_of_step_and_episodes() -> None:
    """What Ray's worker replacement relies on: a fresh worker, asked for the same step's
    credit of the same episodes, returns exactly what the first one did (the generation of the
    resamples is seeded by the step, not by how many calls the worker has made)."""
    import torch

    from marl.runtime.local import LocalRuntime
    from marl.runtime.policy_map import plan_for

    scenario = {"system_prompt": "", "agents": ["a0", "a1"], "params": {"target": "E"}}
    config = load_config(
        {
            "scenario": {"name": "unison", "overrides": scenario},
            "model": {"kind": "tiny"},
            "sampling": {"max_new_tokens": 8},
            "credit": {"name": "coma", "samples": 2, "keep_action": False},
            "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2},
            "seed": 0,
        }
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = LocalRuntime(config, plan_for(config))
        rollout = first.rollout(0)
        before = first.credit(0, rollout)
        other = first.credit(1, rollout)  # another step's call in between
        again = first.credit(0, rollout)
        fresh = LocalRuntime(config, plan_for(config)).credit(
            0, pickle.loads(pickle.dumps(rollout))
        )
    finally:
        torch.set_num_threads(threads)
    assert before.stats["samples"] > 0  # the resamples were generated
    assert other.baseline != before.baseline  # other samples at another step: a seed shows
    assert again.credit == before.credit and fresh.credit == before.credit
    assert again.baseline == before.baseline == fresh.baseline


def test_comm_metrics_are_logged_when_nothing_is_delivered() -> None:
    """A cut speaker->listener edge delivers nothing: every comm/ tag is still there, at 0."""
    from marl.protocols.router import COUNTER_KINDS

    config = load_config(
        {
            "agents": "scripted",
            "bot": "rule",
            "scenario": {
                "name": "signal",
                "overrides": {"graph": {"cut": [["speaker", "listener"]]}},
            },
            "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2},
        }
    )
    rollout = RolloutWorker(config, None).rollout(0, [0])
    metrics = rollout_metrics(rollout.turns, rollout.episodes)
    assert metrics["comm/edges/speaker->listener"] == 0.0
    assert metrics["comm/delivered"] == 0.0 and metrics["comm/sent"] > 0
    assert metrics["comm/cut_dropped"] == metrics["comm/sent"]
    for kind in COUNTER_KINDS:
        assert f"comm/{kind}" in metrics, kind
    assert {"over_budget", "not_neighbour", "noise_dropped", "muted"} <= set(COUNTER_KINDS)
