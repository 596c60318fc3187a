"""``ray=cluster`` against a real head node: a run that can never be placed fails at once.

The module starts ``ray start --head --block --num-cpus=2`` in its own process group, on free
ports, and kills exactly that group afterwards (never ``ray stop``, which would also stop other
Ray sessions on the machine). Token authentication is turned off for this private head node: a
driver reads ``RAY_AUTH_MODE`` when it imports Ray, before any test runs.

The ``cluster`` preset asks 4 CPUs per learner: on a 2-CPU head it used to wait
``ray.placement_timeout_s`` (120 s) and then fail. Now it fails before any actor is requested,
with the numbers and the overrides that would fit, and those overrides train a step.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from hydra import compose, initialize_config_module  # noqa: E402

from marl.cli import register_scenario_options  # noqa: E402
from marl.errors import RunError  # noqa: E402
from marl.loop.train import train  # noqa: E402
from marl.runtime.ray_runtime import can_place  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.subprocess]

RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def head_node(tmp_path_factory: pytest.TempPathFactory, start_ray_head, fresh_ray) -> Iterator[str]:
    """The address of a 2-CPU head node started by ``ray start --head`` for this module. No
    session may be up in this process: the driver joins the head by address (one already up
    would be used instead) and must be disconnected after a refusal."""
    log = tmp_path_factory.mktemp("ray-head") / "ray-start.log"
    with start_ray_head(log, {**os.environ, "RAY_AUTH_MODE": "disabled"}) as (address, _):
        try:
            yield address
        finally:
            if ray.is_initialized():
                ray.shutdown()


CLUSTER_OVERRIDES = [
    "ray=cluster",
    "model=tiny",
    "scenario=unison",
    "sampling.max_new_tokens=4",
    "train.steps=1",
    "train.seeds_per_step=2",
    "train.group_size=2",
    "logging.progress=false",
    "logging.tensorboard=false",
    "logging.transcripts_every=0",
]


def cluster_run(address: str, *overrides: str):
    """``marl train ray=cluster ray.address=<address> model=tiny`` for one short step."""
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return compose(
            config_name="train",
            overrides=[*CLUSTER_OVERRIDES, f"ray.address={address}", *overrides],
        )


def test_the_cluster_preset_fails_at_once_on_a_two_cpu_head(
    marl_cli, head_node: str, tmp_path
) -> None:
    start = time.monotonic()
    with pytest.raises(RunError) as err:
        train(cluster_run(head_node), run_dir=tmp_path / "too-big")
    elapsed = time.monotonic() - start
    message = str(err.value)
    assert elapsed < 60, f"took {elapsed:.0f}s: it waited for the placement timeout"
    assert "can never be placed" in message and "CPUs [2.0]" in message, message
    assert "1 learner(s) x 4 CPU (ray.learner_num_cpus" in message, message
    assert not ray.is_initialized(), "the failed run disconnected its driver"

    # the overrides the message suggests fit the same head node, and train a step there. As a
    # user would: `marl train` in a process of its own (in this one, the Ray sessions of earlier
    # test modules leave driver state behind that made the new worker actor get cancelled)
    suggested = re.search(r"this would fit: (.*)$", message).group(1).split()
    assert "ray.learner_num_cpus=1" in suggested, message
    run_dir = tmp_path / "fits"
    proc = marl_cli(
        "train", *CLUSTER_OVERRIDES, f"ray.address={head_node}", *suggested,
        f"hydra.run.dir={run_dir}", timeout=300,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert (run_dir / "checkpoints" / "latest").is_file()
    assert "Traceback" not in proc.stderr


def test_can_place_follows_the_placement_strategy() -> None:
    two = [{"CPU": 2.0, "GPU": 0.0}, {"CPU": 2.0, "GPU": 1.0}]
    learner = {"CPU": 2.0}
    assert can_place([learner, learner], "PACK", [], two)
    assert can_place([learner, learner], "STRICT_SPREAD", [], two)
    assert not can_place([learner, learner], "STRICT_PACK", [], two)
    assert not can_place([learner] * 3, "STRICT_SPREAD", [], two + [{"CPU": 1.0}])
    assert not can_place([{"CPU": 4.0}], "SPREAD", [], two)
    # workers share the nodes with the learners, fractions included
    assert can_place([{"CPU": 1.0}], "PACK", [{"CPU": 0.5, "GPU": 0.0}] * 6, two)
    assert not can_place([{"CPU": 1.0}], "PACK", [{"CPU": 1.0, "GPU": 0.0}] * 4, two)
    assert not can_place([{"CPU": 0.5, "GPU": 1.0}] * 2, "PACK", [], two)
    # a search too big to finish gives no verdict (the placement timeout then decides)
    assert can_place([{"CPU": 1.0}] * 12, "SPREAD", [], [{"CPU": 1.0}] * 11, max_steps=50) is None
