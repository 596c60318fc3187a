"""runtime.threads in Ray actors (issue 10): every rollout worker and learner sets torch's thread
count, and OMP_NUM_THREADS / MKL_NUM_THREADS through its runtime_env, from the config: the
actor's CPU reservation, capped by ``runtime.threads``. Checked inside real actors of a real
local Ray session, then one rollout and one update run with them."""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from marl.config import load_config  # noqa: E402
from marl.runtime.policy_map import plan_for  # noqa: E402
from marl.runtime.ray_runtime import RayRuntime  # noqa: E402
from marl.runtime.threads import actor_threads  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def config(threads: int | None, learner_cpus: float, worker_cpus: float) -> dict:
    return {
        "scenario": {
            "name": "unison",
            "overrides": {"system_prompt": "", "agents": ["a", "b"]},
        },
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 8},
        "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2},
        "logging": {"progress": False, "transcripts_every": 0, "tensorboard": False},
        "runtime": {"threads": threads},
        "ray": {
            "enabled": True,
            "num_cpus": 6,  # logical CPUs: what Ray hands out, whatever the machine has
            "num_rollout_workers": 1,
            "worker_num_cpus": worker_cpus,
            "learner_num_cpus": learner_cpus,
        },
        "seed": 3,
    }


@pytest.mark.parametrize(
    ("threads", "learner_cpus", "worker_cpus", "learner_expected", "worker_expected"),
    [
        (None, 2, 3, 2, 3),  # no setting: each actor its whole reserved CPUs
        (2, 3, 0.5, 2, 1),  # runtime.threads caps it; a fraction of a CPU runs one thread
    ],
)
def test_every_actor_runs_the_threads_the_config_gives_it(
    shared_ray: None,
    threads: int | None,
    learner_cpus: float,
    worker_cpus: float,
    learner_expected: int,
    worker_expected: int,
) -> None:
    assert actor_threads(threads, learner_cpus) == learner_expected
    assert actor_threads(threads, worker_cpus) == worker_expected
    driver_threads = torch.get_num_threads()
    loaded = load_config(config(threads, learner_cpus, worker_cpus))
    rt = RayRuntime(loaded, plan_for(loaded))
    try:
        placement = rt.placement()
        (learner,) = placement["learners"].values()
        (worker,) = placement["workers"]
        assert learner["torch_threads"] == learner_expected
        assert worker["torch_threads"] == worker_expected
        for info, expected in ((learner, learner_expected), (worker, worker_expected)):
            assert info["thread_env"] == {
                "OMP_NUM_THREADS": str(expected),
                "MKL_NUM_THREADS": str(expected),
            }
        # the actors work with them: a rollout, an update, and the counts hold afterwards
        rollout = rt.rollout(0)
        assert rollout.turns
        metrics = rt.update(rollout.turns)
        assert metrics and all(m for m in metrics.values())
        after = rt.placement()
        assert [i["torch_threads"] for i in after["learners"].values()] == [learner_expected]
        assert after["workers"][0]["torch_threads"] == worker_expected
    finally:
        rt.close()
    assert torch.get_num_threads() == driver_threads, "the driver's own count is untouched"
