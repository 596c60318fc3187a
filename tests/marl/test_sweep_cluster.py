"""A sweep on a two-node Ray cluster: ``ray start --head`` and ``ray start --address`` on this
machine, one CPU each, joined by ``hydra.launcher.address``.

Four one-CPU jobs must use both nodes (each job's record says which node ran it, from Ray's
runtime context), and every job's curves equal those of the same job run serially by Hydra's
basic launcher (one torch thread, bit for bit). Token authentication is off for this private
cluster, in the nodes and in the launcher alike.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.subprocess]

COMMON = ["model=tiny", "scenario=unison", "train.steps=2", "logging.progress=false"]
ENV = {
    **os.environ,
    "RAY_AUTH_MODE": "disabled",
    "PYTHONWARNINGS": "ignore",
    "OMP_NUM_THREADS": "1",
}


def marl(marl_cli, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    done = marl_cli(*args, timeout=900, cwd=cwd, env=ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


# fresh_ray: the test joins the cluster as a driver in this process (ray_nodes), which cannot
# hold the worker's shared session at the same time
@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, start_ray_head, start_ray_node, fresh_ray) -> Iterator[str]:
    logs = tmp_path_factory.mktemp("two-nodes")
    with start_ray_head(logs / "head.log", ENV, num_cpus=1) as (address, _):
        with start_ray_node(address, logs / "node.log", ENV, num_cpus=1):
            yield address


def test_a_sweep_on_two_nodes_uses_both_and_matches_the_serial_runs(
    marl_cli, two_nodes: str, tmp_path: Path, curves
) -> None:
    seeds = "seed=0,1,2,3"
    cluster = tmp_path / "cluster"
    done = marl(
        marl_cli,
        tmp_path,
        "train",
        "-m",
        *COMMON,
        seeds,
        "launcher=ray",
        f"hydra.launcher.address={two_nodes}",
        f"hydra.sweep.dir={cluster}",
    )
    assert "2 node(s), 2 CPUs" in done.stdout and "4 finished" in done.stdout
    nodes = {n["NodeID"] for n in ray_nodes(two_nodes)}
    where = [json.loads((cluster / j / "sweep_job.json").read_text())["node"] for j in "0123"]
    assert set(where) == nodes and len(nodes) == 2, where  # every job on a node, both used
    serial = tmp_path / "serial"  # jobs 0 and 1 again, one after another
    marl(marl_cli, tmp_path, "train", "-m", *COMMON, "seed=0,1", f"hydra.sweep.dir={serial}")
    for job in "01":
        assert curves(cluster / job) == curves(serial / job), f"job {job} differs"


def ray_nodes(address: str) -> list[dict]:
    """The cluster's live nodes, asked by a driver that joins and leaves."""
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        return [n for n in ray.nodes() if n.get("Alive")]
    finally:
        ray.shutdown()
