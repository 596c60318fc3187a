"""The Ray launcher's pure parts: what a job reserves (from its own composed config), the one-line
refusal of a job no node holds, what a job's folder says on re-launch, and the job's last error.

These need no Ray: :mod:`tests.marl.test_sweep_ray` runs real sweeps."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module

from marl.cli import _guarded, launcher_args, register_scenario_options
from marl.sweep.demand import job_demand, refusal
from marl.sweep.job import JobExit, exits_as_errors, last_error_line, was_interrupted
from marl.sweep.job_dirs import RECORD, job_state, read_record, set_aside, write_record
from marl.sweep.settings import LauncherSettings

CPU_NODE = [{"CPU": 2.0, "GPU": 0.0}]


def composed(*overrides: str):
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return compose(config_name="train", overrides=["model=tiny", "scenario=unison", *overrides])


def test_a_one_process_job_reserves_one_cpu_by_default_and_its_threads_when_set() -> None:
    demand = job_demand(composed(), LauncherSettings(), CPU_NODE)
    assert demand.bundles == ({"CPU": 1.0},) and demand.threads == 1
    demand = job_demand(composed("runtime.threads=2"), LauncherSettings(), CPU_NODE)
    assert demand.bundles == ({"CPU": 2.0},) and demand.threads == 2
    settings = LauncherSettings(cpus_per_job=0.5)  # the launcher's setting wins; 1 thread at least
    demand = job_demand(composed("runtime.threads=2"), settings, CPU_NODE)
    assert demand.bundles == ({"CPU": 0.5},) and demand.threads == 1


def test_a_job_that_trains_on_a_gpu_takes_a_share_of_one() -> None:
    gpu_node = [{"CPU": 16.0, "GPU": 1.0}]
    assert job_demand(composed(), LauncherSettings(), gpu_node).own == {"CPU": 1.0, "GPU": 0.125}
    settings = LauncherSettings(jobs_per_gpu=4)
    assert job_demand(composed(), settings, gpu_node).own["GPU"] == 0.25
    settings = LauncherSettings(gpus_per_job=0.5)
    assert job_demand(composed(), settings, gpu_node).own["GPU"] == 0.5
    # scripted agents have no model: no GPU for them
    demand = job_demand(composed("agents=scripted"), LauncherSettings(), gpu_node)
    assert "GPU" not in demand.own


def test_a_job_with_in_run_ray_reserves_its_actors_in_the_same_group() -> None:
    cfg = composed(
        "ray=local",
        "ray.num_rollout_workers=2",
        "ray.worker_num_cpus=0.5",
        "ray.learner_num_cpus=0.25",
        "sharing=independent",
    )
    demand = job_demand(cfg, LauncherSettings(), CPU_NODE)
    # the job's process, one learner per trainable policy (unison: 2 agents), 2 workers
    assert demand.bundles == (
        {"CPU": 1.0},
        {"CPU": 0.25},
        {"CPU": 0.25},
        {"CPU": 0.5},
        {"CPU": 0.5},
    )
    assert (demand.learners, demand.workers, demand.strategy) == (2, 2, "PACK")
    assert demand.total() == {"CPU": 2.5, "GPU": 0.0}
    assert refusal(demand, CPU_NODE, "the local Ray") is not None  # 2.5 CPUs on a 2-CPU node
    assert refusal(demand, [{"CPU": 2.0}, {"CPU": 1.0}], "x") is None  # PACK may use two nodes


def test_a_job_no_node_holds_is_refused_naming_the_key() -> None:
    demand = job_demand(composed(), LauncherSettings(cpus_per_job=4), CPU_NODE)
    line = refusal(demand, CPU_NODE, "the local Ray")
    assert line is not None and line.startswith("hydra.launcher.cpus_per_job=4:")
    assert "\n" not in line and "[2.0]" in line
    demand = job_demand(composed("runtime.threads=3"), LauncherSettings(), CPU_NODE)
    assert refusal(demand, CPU_NODE, "x").startswith("runtime.threads=3:")
    demand = job_demand(composed(), LauncherSettings(gpus_per_job=2), [{"CPU": 8, "GPU": 1}])
    assert refusal(demand, [{"CPU": 8, "GPU": 1}], "x").startswith("hydra.launcher.gpus_per_job=2:")
    demand = job_demand(
        composed("ray=local", "ray.learner_num_cpus=3"), LauncherSettings(), CPU_NODE
    )
    assert refusal(demand, CPU_NODE, "x").startswith("ray.learner_num_cpus=3:")
    assert refusal(job_demand(composed(), LauncherSettings(), CPU_NODE), CPU_NODE, "x") is None


def _finished_job(job_dir: Path, overrides: list[str], steps: list[int]) -> None:
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    for step in steps:
        step_dir = job_dir / "checkpoints" / f"step_{step:06d}"
        step_dir.mkdir(parents=True)
        (step_dir / "manifest.json").write_text("{}")


def test_a_job_folder_says_what_a_relaunch_does(tmp_path: Path) -> None:
    ours = ["seed=1", "train.steps=3"]
    assert job_state(tmp_path / "new", ours, 3, True).kind == "fresh"
    done = tmp_path / "done"
    _finished_job(done, ours, [1, 2, 3])
    # the final checkpoint without the launcher's record (killed before it wrote it): resume,
    # which finds nothing left to train
    assert job_state(done, ours, 3, True).kind == "resume"
    write_record(done, status="finished", num=0)
    assert job_state(done, ours, 3, True).kind == "finished"
    assert job_state(done, ours, 3, False).kind == "restart"  # skip_finished=false
    half = tmp_path / "half"
    _finished_job(half, [*ours, "resume=x/checkpoints/step_000001"], [1, 2])
    state = job_state(half, ours, 3, True)  # the resume= the launcher added is not the job's
    assert state.kind == "resume" and state.checkpoint == half / "checkpoints" / "step_000002"
    write_record(half, status="finished")  # a record without the final checkpoint: resume still
    assert job_state(half, ours, 3, True).kind == "resume"
    early = tmp_path / "early"
    _finished_job(early, ours, [])
    assert job_state(early, ours, 3, True).kind == "restart"
    other = job_state(done, ["seed=2", "train.steps=3"], 3, True)
    assert other.kind == "foreign" and "seed=1" in other.detail
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    assert job_state(stranger, ours, 3, True).kind == "foreign"


def test_a_finished_record_without_its_final_checkpoint_is_not_finished(tmp_path: Path) -> None:
    job = tmp_path / "0"
    _finished_job(job, ["seed=0"], [])
    write_record(job, status="finished")
    assert job_state(job, ["seed=0"], 2, True).kind == "restart"


def test_records_are_replaced_whole_and_unreadable_ones_read_as_empty(tmp_path: Path) -> None:
    write_record(tmp_path, status="running", num=3)
    write_record(tmp_path, status="failed", num=3, error="error: x")
    assert read_record(tmp_path) == {"status": "failed", "num": 3, "error": "error: x"}
    assert [p.name for p in tmp_path.iterdir()] == [RECORD]
    (tmp_path / RECORD).write_text("{not json")
    assert read_record(tmp_path) == {}
    (tmp_path / RECORD).write_text(json.dumps([1, 2]))
    assert read_record(tmp_path) == {}


def test_a_restarted_job_folder_is_moved_out_of_the_sweep_whole(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    job = sweep / "2"
    job.mkdir(parents=True)
    (job / "output.log").write_text("half a run")
    first = set_aside(job, sweep)
    job.mkdir()
    (job / "output.log").write_text("another half")
    second = set_aside(job, sweep)
    assert first != second and not job.exists()
    assert first.parent == second.parent == tmp_path / "sweep.set-aside"
    assert (first / "output.log").read_text() == "half a run"
    assert (second / "output.log").read_text() == "another half"


def test_the_last_error_line_is_the_one_the_job_printed(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    log.write_text("devices: CPU\n 50%|#####  | 1/2\rerror: resume: no checkpoint at x\n\n")
    assert last_error_line(log) == "error: resume: no checkpoint at x"
    log.write_text("step 1\nTraceback ...\nValueError: bad\n")
    assert last_error_line(log) == "ValueError: bad"
    assert last_error_line(log, "RuntimeError: x") == "RuntimeError: x"
    assert last_error_line(tmp_path / "missing.log", "fallback") == "fallback"


def _ends_with(error: BaseException | Callable[[], None] | None) -> BaseException | None:
    """What a sweep job's task (marl's train, wrapped as the launcher wraps it) raises when the
    run raises ``error`` (or calls it); None when it returns."""

    def run() -> None:
        if callable(error):
            error()
        elif error is not None:
            raise error

    try:
        exits_as_errors(lambda _cfg: _guarded(run))(None)
    except Exception as exc:  # noqa: BLE001 - Hydra's run_job catches Exception alike
        return exc
    return None


def test_a_job_stopped_by_ctrl_c_is_interrupted_and_a_user_error_is_a_failure() -> None:
    from marl.errors import RunError

    stopped = _ends_with(KeyboardInterrupt())
    assert isinstance(stopped, JobExit) and stopped.code == 130 and was_interrupted(stopped)
    failed = _ends_with(RunError("bad"))
    assert isinstance(failed, JobExit) and failed.code == 2 and not was_interrupted(failed)
    assert not was_interrupted(_ends_with(ValueError("a crash")))
    # what a job sees when Ray stops it (the launcher's cancel on Ctrl-C, a node shutting down):
    # Ray's worker raises this from its SIGTERM handler, a plain exit status 1
    from ray._raylet import raise_sys_exit_with_custom_error_message as ray_exit

    killed = _ends_with(lambda: ray_exit("The process receives a SIGTERM.", exit_code=1))
    assert isinstance(killed, JobExit) and killed.code == 1 and was_interrupted(killed)
    assert killed.stopped_by == "The process receives a SIGTERM."
    assert not was_interrupted(_ends_with(SystemExit(1)))  # the job's own exit status 1
    assert _ends_with(None) is None
    assert was_interrupted(KeyboardInterrupt())  # raised where Hydra's own set-up runs


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["launcher=ray", "seed=0,1"], ["hydra/launcher=ray", "seed=0,1"]),
        (["hydra/launcher=ray"], ["hydra/launcher=ray"]),
        (["launcher=basic"], ["hydra/launcher=basic"]),
        (["scenario.launcher=ray"], ["scenario.launcher=ray"]),
    ],
)
def test_launcher_is_short_for_hydra_launcher(given: list[str], expected: list[str]) -> None:
    assert launcher_args(given) == expected
