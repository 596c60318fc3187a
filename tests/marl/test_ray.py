"""The Ray runtime on one machine: ``ray.init(num_gpus=4)`` declares logical GPUs, each trainable
policy's learner gets its own, and so does each rollout worker (``ray.worker_num_gpus: null``),
frozen policies none; new weights reach the rollout side before
the next rollout; learners update concurrently; a killed rollout worker is replaced without
losing or repeating a step; Ray and one process give the same episodes; Ray is shut down cleanly.

One Ray session for the whole module (start-up costs seconds): the runtime fixture starts a local
cluster and its teardown checks that it was shut down.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from marl.config import load_config  # noqa: E402
from marl.loop.credit_phase import credit_phase  # noqa: E402
from marl.loop.train import train  # noqa: E402
from marl.runtime.local import LocalRuntime  # noqa: E402
from marl.runtime.policy_map import plan_for  # noqa: E402
from marl.runtime.ray_runtime import RayRuntime  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _turn_logprobs(model, adapter, prompt_ids, response_ids, sampling) -> list[float]:
    """Logprob of each response token under ``model`` with only ``adapter`` on, sampled as
    ``sampling`` says (run inside an actor, through Ray's ``__ray_call__``)."""
    from marl.agents.logprobs import sequence_logprobs
    from marl.runtime.policies import adapter_active

    with torch.no_grad(), adapter_active(model, adapter):
        values, _ = sequence_logprobs(
            model,
            [list(prompt_ids)],
            [list(response_ids)],
            temperature=sampling.temperature or 1.0,
            top_p=sampling.top_p,
        )
    return values[0].tolist()


def _worker_logprobs(worker, pid, prompt_ids, response_ids) -> list[float]:
    """Under the weights the rollout worker holds for ``pid``."""
    backend = worker.policies.backends[pid]
    adapter = getattr(backend, "adapter", None)
    return _turn_logprobs(backend.model, adapter, prompt_ids, response_ids, worker.config.sampling)


def _learner_logprobs(learner, prompt_ids, response_ids) -> list[float]:
    """Under the learner's current weights (its own adapter on, if any; dropout off)."""
    was_training = learner.model.training
    learner.model.eval()
    try:
        return _turn_logprobs(
            learner.model, learner.spec.adapter, prompt_ids, response_ids, learner.config.sampling
        )
    finally:
        learner.model.train(was_training)
        learner.activate()


def on_worker(rt, pid: str, turn) -> list[float]:
    return rt.call_worker(
        0, "__ray_call__", _worker_logprobs, pid, turn.prompt_ids, turn.response_ids
    )


def on_learner(rt, pid: str, turn) -> list[float]:
    return rt.call_learner(
        pid, "__ray_call__", _learner_logprobs, turn.prompt_ids, turn.response_ids
    )


AGENTS = ["a", "b", "c", "d"]
# Fractional CPUs: four actors fit on this 2-core machine without waiting for each other.
RAY = {
    "enabled": True,
    "num_cpus": 4,
    "num_gpus": 4,
    "worker_num_cpus": 0.25,
    "learner_num_cpus": 0.25,
}


def config(**overrides: object) -> dict:
    scenario = {"system_prompt": "", "agents": AGENTS, "reward": {"cooperation": 0.0}}
    base = {
        "scenario": {"name": "unison", "overrides": scenario},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 16},
        "algo": {"lr": 3e-3, "epochs": 2},
        "train": {"steps": 1, "seeds_per_step": 2, "group_size": 2},
        "logging": {"progress": False, "transcripts_every": 0, "tensorboard": False},
        # a and b share "team"; c has its own LoRA adapter; d plays a frozen copy
        "sharing": "custom",
        "policy_map": {"a": "team", "b": "team", "c": "own", "d": "opponent"},
        "policies": {
            "team": {},
            "own": {"lora": {"r": 4, "alpha": 8}, "lr": 1e-2},
            "opponent": {"trainable": False},
        },
        "ray": dict(RAY),
        "seed": 1,
    }
    base.update(overrides)
    return base


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the actors (Ray sets OMP_NUM_THREADS=1): same arithmetic
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runtime(fresh_ray):
    # a session of its own: ray.init(num_gpus=4) declares the logical GPUs this module places
    # learners and workers on (the shared session has none), and the runtime that started it
    # must shut it down
    assert not ray.is_initialized()
    loaded = load_config(config())
    rt = RayRuntime(loaded, plan_for(loaded))
    yield loaded, rt
    rt.close()
    assert not ray.is_initialized(), "the runtime started Ray, so it must shut it down"


def _step(loaded, rt, step: int):
    rollout = rt.rollout(step)
    credit_phase(loaded.credit, rollout, None, loaded.algo.advantage)
    return rollout


def test_each_trainable_learner_and_worker_gets_its_own_gpu_and_frozen_none(runtime) -> None:
    _, rt = runtime
    placement = rt.placement()
    learners = placement["learners"]
    assert sorted(learners) == ["own", "team"]  # the frozen opponent has no learner
    ids = [tuple(info["gpu_ids"]) for info in learners.values()]
    assert all(len(gpus) == 1 for gpus in ids) and len(set(ids)) == 2, ids
    assert placement["frozen"] == ["opponent"]
    # ray.worker_num_gpus: null packs the rollout workers with the learners: 3 actors, 4 GPUs
    workers = [tuple(worker["gpu_ids"]) for worker in placement["workers"]]
    assert all(len(gpus) == 1 for gpus in workers) and not set(workers) & set(ids), workers
    assert ray.cluster_resources()["GPU"] == 4


def test_ray_rollout_equals_the_single_process_one(runtime) -> None:
    loaded, rt = runtime
    local = LocalRuntime(loaded, plan_for(loaded))
    here, there = local.rollout(0), rt.rollout(0)
    assert [(t.agent, t.text) for t in here.turns] == [(t.agent, t.text) for t in there.turns]
    assert here.returns == there.returns


def _step_with_signal(loaded, rt, policies: tuple[str, ...], first: int = 0):
    """The first step's rollout (of ``first`` .. ``first + 7``) that gives each of
    ``policies`` something to learn: a turn with a nonzero advantage (a group with unequal
    returns). Which step that is depends on what was sampled."""
    for step in range(first, first + 8):
        rollout = _step(loaded, rt, step)
        if all(
            any(t.advantage != 0 for t in rollout.turns if t.policy_id == pid) for pid in policies
        ):
            return rollout
    pytest.fail(f"no step in {first}..{first + 7} gave {policies} a nonzero advantage")


def test_new_weights_reach_the_rollout_side_before_the_next_rollout(runtime) -> None:
    loaded, rt = runtime
    rollout = _step_with_signal(loaded, rt, ("team", "own"))
    turns = {pid: next(t for t in rollout.turns if t.policy_id == pid) for pid in ("team", "own")}

    def through_rollout(pid: str) -> list[float]:
        turn = turns[pid]
        return on_worker(rt, pid, turn)

    def from_learner(pid: str) -> list[float]:
        turn = turns[pid]
        return on_learner(rt, pid, turn)

    before = {pid: through_rollout(pid) for pid in turns}
    for pid in turns:  # full model and LoRA adapter alike
        assert before[pid] == pytest.approx(turns[pid].logprobs, abs=1e-4)
    rt.update(rollout.turns)
    rt.sync()
    for pid in turns:
        after, learned = through_rollout(pid), from_learner(pid)
        assert max(abs(x - y) for x, y in zip(before[pid], after)) > 1e-3, pid
        assert after == pytest.approx(learned, abs=1e-5), pid


def test_independent_learners_update_concurrently(runtime) -> None:
    loaded, rt = runtime
    # an update whose advantages are all zero is over at once and cannot overlap anything
    rollout = _step_with_signal(loaded, rt, tuple(rt.learners), first=1)
    rt.update(rollout.turns)
    windows = [info["update_window"] for info in rt.placement()["learners"].values()]
    (s1, e1), (s2, e2) = windows
    assert s1 < e2 and s2 < e1, f"update windows do not overlap: {windows}"


def test_killed_rollout_worker_is_replaced_without_losing_a_step(runtime) -> None:
    loaded, rt = runtime
    rt.sync()
    expected = rt.rollout(2)  # what step 2 plays with these weights
    versions = {pid: rt.call_learner(pid, "info")["version"] for pid in rt.learners}
    old_pid = rt.placement()["workers"][0]["pid"]
    pending = rt.submit_rollout(2)
    os.kill(old_pid, signal.SIGKILL)  # mid-rollout
    got = rt.collect_rollout(pending)
    assert rt.restarts == 1 and rt.placement()["workers"][0]["pid"] != old_pid
    groups, size = loaded.train.seeds_per_step, loaded.train.group_size
    assert sorted({t.episode_id for t in got.turns}) == list(range(groups * size))
    assert len(got.returns) == groups * size  # every episode once, none twice
    # the replacement holds the current weights, so it plays exactly what the dead one would have
    assert [(t.agent, t.text, t.logprobs) for t in got.turns] == [
        (t.agent, t.text, t.logprobs) for t in expected.turns
    ]
    credit_phase(loaded.credit, got, None, loaded.algo.advantage)
    rt.update(got.turns)
    after = {pid: rt.call_learner(pid, "info")["version"] for pid in rt.learners}
    assert after == {pid: v + 1 for pid, v in versions.items()}  # exactly one more update


def test_checkpoint_state_round_trips_through_the_learners(runtime) -> None:
    loaded, rt = runtime
    rollout = _step(loaded, rt, 3)
    turn = next(t for t in rollout.turns if t.policy_id == "own")
    saved = rt.state()
    assert {p: s["kind"] for p, s in saved.items()} == {"team": "full", "own": "adapter"}
    before = on_learner(rt, "own", turn)
    rt.update(rollout.turns)
    rt.sync()
    rt.load_state(saved)  # back to the saved weights, on the learners and the workers alike
    assert on_learner(rt, "own", turn) == before
    again = on_worker(rt, "own", turn)
    assert again == pytest.approx(before, abs=1e-5)
    assert rt.call_learner("own", "info")["version"] == saved["own"]["version"]


def test_scripted_episodes_same_through_ray_and_in_one_process(runtime, tmp_path: Path) -> None:
    scripted = {
        "agents": "scripted",
        "bot": "random",
        "scenario": {"name": "relay", "overrides": {}},
        "train": {"steps": 2, "seeds_per_step": 3, "group_size": 2},
    }
    in_process = train(config(**scripted, ray={"enabled": False}), run_dir=tmp_path / "local")
    through_ray = train(
        config(**scripted, ray={**RAY, "num_rollout_workers": 2}), run_dir=tmp_path / "ray"
    )
    rewards = {k: v for k, v in in_process.items() if k.startswith(("agents/", "team/"))}
    assert rewards and rewards == {k: through_ray[k] for k in rewards}
    assert ray.is_initialized()  # train() joined the session it found and left it running
