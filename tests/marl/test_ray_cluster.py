"""Training on a two-node Ray cluster (``ray.cluster_utils.Cluster`` starts both nodes on this
machine, each with logical GPUs): ``ray.address`` joins it, the learners of two independent
policies are spread over the two nodes, a training step runs end to end, and leaving the run
disconnects the driver without stopping the cluster."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from marl.loop.train import train  # noqa: E402
from marl.runtime.checkpoint import load_checkpoint  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(fresh_ray):
    # a cluster of its own: two nodes with logical GPUs, which the driver joins by address
    assert not ray.is_initialized()
    nodes = cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "num_gpus": 2, "include_dashboard": False},
    )
    nodes.add_node(num_cpus=2, num_gpus=2)
    nodes.wait_for_nodes()
    yield nodes
    if ray.is_initialized():
        ray.shutdown()
    nodes.shutdown()


def test_learners_spread_over_two_nodes_train_a_step(cluster, tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        metrics = train(
            {
                "scenario": {"name": "signal", "overrides": {}},
                "model": {"kind": "tiny"},
                "sampling": {"max_new_tokens": 8},
                "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2},
                "logging": {"progress": False, "transcripts_every": 1},
                "sharing": "independent",  # speaker and listener: a full policy each
                "ray": {
                    "enabled": True,
                    "address": cluster.address,
                    "placement_strategy": "STRICT_SPREAD",
                    "worker_num_cpus": 0.25,
                    "learner_num_cpus": 0.25,
                },
            },
            run_dir=tmp_path,
        )
    finally:
        torch.set_num_threads(threads)
    placement = json.loads((tmp_path / "placement.json").read_text())
    learners = placement["learners"]
    assert sorted(learners) == ["listener", "speaker"]
    assert len({info["node_id"] for info in learners.values()}) == 2  # one per node
    assert all(len(info["gpu_ids"]) == 1 for info in learners.values())
    for policy in ("speaker", "listener"):
        assert math.isfinite(metrics[f"policies/{policy}/loss"])
    state = load_checkpoint(tmp_path / "checkpoints")
    assert sorted(state["policies"]) == ["listener", "speaker"] and state["step"] == 1
    # the run disconnected its driver; the cluster itself is still up with both nodes
    assert not ray.is_initialized()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        assert ray.available_resources().get("GPU") == 4  # the placement group was released
    finally:
        ray.shutdown()
