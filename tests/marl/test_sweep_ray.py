"""``marl train -m launcher=ray``: a sweep's jobs as Ray tasks, on a local Ray started by the sweep.

Real sweeps of the tiny model, run as a user runs them (the ``marl`` command in a subprocess):

- the Ray sweep writes what Hydra's basic launcher writes (the same run folders, ``.hydra/``
  files and config), its jobs' curves equal the serial ones bit for bit (same seeds, one torch
  thread each), its jobs ran side by side in processes of their own, and ``marl report`` reads
  the folder;
- a failing job is reported with its folder and its last error line, the others finish, and the
  exit status counts the failures;
- Ctrl-C stops the sweep and its jobs; launching it again skips the finished jobs (their files
  untouched) and trains only what is missing;
- jobs with in-run Ray actors reserve them with the job, so two such jobs on two CPUs take turns
  instead of deadlocking.

The sweeps whose point is the local Ray the sweep starts (its 2 CPUs decide what runs at once)
start one; the failing job's and Ctrl-C's sweeps only need *a* Ray, and join this xdist worker's
shared session (tests/marl/conftest.py) as a sweep joins a cluster (``hydra.launcher.address``):
starting a Ray costs about 10 CPU-seconds of daemons.

tests/marl/test_sweep_cluster.py runs a sweep on a two-node cluster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.subprocess]

SEEDS = "seed=0,1,2,3"
COMMON = ["model=tiny", "scenario=unison", "train.steps=2", "logging.progress=false"]
SKIPPED_FILES = {"output.log", "sweep_job.json"}  # the Ray launcher's own, beside the run's


def marl_command() -> list[str]:
    script = Path(sys.executable).with_name("marl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "marl.cli"]


def marl_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", **extra}


def sweep(
    marl_cli, cwd: Path, *args: str, check: bool = True, **env: str
) -> subprocess.CompletedProcess:
    done = marl_cli("train", "-m", *args, timeout=900, cwd=cwd, env=marl_env(**env))
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def ray_sweep_args(root: Path, *args: str) -> list[str]:
    """A sweep on a local Ray of 2 CPUs that the sweep starts (and stops)."""
    return ["launcher=ray", "hydra.launcher.num_cpus=2", *args, f"hydra.sweep.dir={root}"]


def joined_sweep_args(address: str, root: Path, *args: str) -> list[str]:
    """A sweep that joins the Ray at ``address`` and leaves it running."""
    return ["launcher=ray", f"hydra.launcher.address={address}", *args, f"hydra.sweep.dir={root}"]


@pytest.fixture(scope="module")
def shared_address(shared_ray: None) -> str:
    """The address of this xdist worker's shared Ray session, for a sweep to join."""
    import ray

    return ray.get_runtime_context().gcs_address


def files(run: Path) -> set[str]:
    names = set()
    for path in run.rglob("*"):
        if path.is_file() and path.name not in SKIPPED_FILES:
            name = path.relative_to(run).as_posix()
            names.add("EVENTS" if "events.out.tfevents" in name else name)
    return names


def record(job: Path) -> dict:
    return json.loads((job / "sweep_job.json").read_text())


@pytest.fixture(scope="module")
def serial(marl_cli, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 2 of the same jobs through Hydra's basic launcher, one after another, one
    thread each (jobs 0 and 1 of both sweeps are the same runs)."""
    root = tmp_path_factory.mktemp("serial") / "sweep"
    sweep(marl_cli, root.parent, *COMMON, "seed=0,1", f"hydra.sweep.dir={root}")
    return root


@pytest.fixture(scope="module")
def on_ray(
    marl_cli, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, subprocess.CompletedProcess]:
    """4 jobs on a local Ray of 2 CPUs: two at a time. A Ray of its own, started by the sweep:
    that is what these tests check (the user's default), and its 2 CPUs are what make the jobs
    run two at a time (the shared session has 8)."""
    root = tmp_path_factory.mktemp("ray") / "sweep"
    return root, sweep(marl_cli, root.parent, *COMMON, SEEDS, *ray_sweep_args(root))


def test_a_ray_sweep_writes_what_the_basic_launcher_writes(serial: Path, on_ray, curves) -> None:
    root, done = on_ray
    assert sorted(p.name for p in root.iterdir()) == ["0", "1", "2", "3", "multirun.yaml"]
    for job in ("0", "1"):
        mine, theirs = root / job, serial / job
        assert files(mine) == files(theirs)
        for same in (".hydra/overrides.yaml", "config.yaml"):
            assert (mine / same).read_text() == (theirs / same).read_text(), same
        assert curves(mine) == curves(theirs), f"job {job}: curves differ from the serial run"
    for job in ("0", "1", "2", "3"):
        assert record(root / job)["status"] == "finished"
    assert "sweep: 4 job(s)" in done.stdout and "4 finished" in done.stdout
    assert "each reserving 1 CPU" in done.stdout


def test_the_jobs_ran_side_by_side_in_processes_of_their_own(on_ray) -> None:
    root, _ = on_ray
    records = [record(root / job) for job in ("0", "1", "2", "3")]
    assert len({r["pid"] for r in records}) == 4 and os.getpid() not in {r["pid"] for r in records}
    spans = sorted((r["started"], r["started"] + r["wall_s"]) for r in records)
    overlapping = sum(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))
    assert overlapping >= 2, spans  # two at a time on 2 CPUs: most neighbours overlap


def test_marl_report_reads_a_ray_sweep_as_it_reads_a_serial_one(
    marl_cli, serial: Path, on_ray
) -> None:
    """(The finals of 4 seeds and of 2 differ; the equal curves are checked above.)"""
    root, _ = on_ray
    summaries = []
    for where in (root, serial):
        out = where.parent / f"report-{where.parent.name}"
        done = marl_cli("report", str(where), "--out", str(out), timeout=300, env=marl_env())
        assert done.returncode == 0, done.stderr[-2000:]
        summaries.append(json.loads((out / "summary.json").read_text())["finals"])
    assert summaries[0][0]["seeds"] == 4 and summaries[1][0]["seeds"] == 2
    assert summaries[0][0]["group"] == summaries[1][0]["group"]


def test_a_failing_job_is_reported_and_the_others_finish(
    marl_cli, shared_address: str, tmp_path: Path
) -> None:
    root = tmp_path / "sweep"
    missing = tmp_path / "no-such-checkpoint"
    done = sweep(marl_cli, tmp_path, *COMMON, "seed=0", f"resume=null,{missing}",
                 *joined_sweep_args(shared_address, root), check=False)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr  # the exit status: 1 job failed
    assert record(root / "0")["status"] == "finished"
    failed = record(root / "1")
    assert failed["status"] == "failed" and "no checkpoint found" in failed["error"]
    line = next(x for x in done.stderr.splitlines() if x.strip().startswith("failed #1"))
    # the folder as the user named it (here relative to the working directory)
    assert " sweep/1: " in line and "error: resume: no checkpoint found" in line
    assert "Traceback" not in done.stderr
    assert "1 finished" in done.stdout and "1 failed" in done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))


def test_ctrl_c_stops_the_sweep_and_a_relaunch_trains_only_what_is_missing(
    marl_cli, shared_address: str, tmp_path: Path
) -> None:
    """Four jobs, one at a time: #0 and #1 finish, #2 is stopped after a checkpoint, #3 never
    starts; the relaunch skips #0 and #1, resumes #2 and trains #3. Both launches join the
    shared Ray (Ctrl-C must then kill the jobs itself: nothing stops the cluster)."""
    root = tmp_path / "sweep"
    args = [
        *COMMON[:2],
        "train.steps=4",
        "train.checkpoint_every=1",
        "logging.progress=false",
        SEEDS,
        *joined_sweep_args(shared_address, root, "hydra.launcher.max_parallel=1"),
    ]
    launcher = subprocess.Popen(
        [*marl_command(), "train", "-m", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=marl_env(),
        # as from a shell: an xdist worker ignores SIGINT, and a child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 600
    finished = []
    while len(finished) < 2:
        assert launcher.poll() is None, launcher.communicate()
        assert time.monotonic() < deadline, "two jobs did not finish in 10 minutes"
        time.sleep(0.2)
        finished = [j for j in "0123" if (root / j / "sweep_job.json").exists()
                    and record(root / j)["status"] == "finished"]  # fmt: skip
    assert finished == ["0", "1"], finished  # one at a time
    first = root / "2" / "checkpoints" / "step_000001" / "manifest.json"
    while not first.is_file():  # the third job has a checkpoint, and 3 steps to go
        assert launcher.poll() is None and time.monotonic() < deadline, "job 2 never saved"
        time.sleep(0.05)
    launcher.send_signal(signal.SIGINT)  # what Ctrl-C sends the launcher
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, out + err
    assert "interrupted" in err
    assert not (root / "3").exists(), "job 3 started before Ctrl-C"
    running = [record(root / j) for j in "0123" if (root / j / "sweep_job.json").exists()]
    # job 2's: "running" when its process was killed first, "interrupted" when the cancel
    # reached its task; never "failed" (its last printed line is not an error of its own)
    stopped = [r for r in running if r["status"] != "finished"]
    assert [r["num"] for r in stopped] == [2], running
    assert stopped[0]["status"] in ("running", "interrupted"), stopped
    pids = [r["pid"] for r in stopped]
    stop = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < stop:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids), "a job's process outlived Ctrl-C"
    done_files = {
        j: {p: p.stat().st_mtime_ns for p in (root / j).rglob("*") if p.is_file()} for j in finished
    }

    again = sweep(marl_cli, tmp_path, *args)
    for j in finished:
        assert f"#{j} " in again.stdout and "skipped, finished before" in again.stdout
        assert {p: p.stat().st_mtime_ns for p in (root / j).rglob("*") if p.is_file()} == (
            done_files[j]
        ), f"job {j} finished before, but its files changed"
    assert "2 finished (1 resumed)" in again.stdout and "2 skipped" in again.stdout, again.stdout
    resumed = next(x for x in again.stdout.splitlines() if x.strip().startswith("#2 "))
    assert "resumes from" in resumed and "checkpoints/step_00000" in resumed
    for j in "0123":
        assert record(root / j)["status"] == "finished"
        assert (root / j / "checkpoints" / "step_000004" / "manifest.json").is_file()
        saved = yaml.safe_load((root / j / ".hydra" / "overrides.yaml").read_text())
        assert f"seed={j}" in saved


def test_jobs_with_in_run_ray_reserve_their_actors_and_take_turns(marl_cli, tmp_path: Path) -> None:
    """A local Ray of its own: its 2 CPUs are what make the jobs take turns (the shared
    session has 8, which would hold both at once)."""
    root = tmp_path / "sweep"
    in_run = [
        "ray=local",
        "ray.num_rollout_workers=1",
        "ray.worker_num_cpus=0.5",
        "ray.learner_num_cpus=0.5",
        "train.steps=1",
    ]
    done = sweep(marl_cli, tmp_path, *COMMON, *in_run, "seed=0,1", *ray_sweep_args(root))
    assert "each reserving 2 CPUs" in done.stdout  # 1 for the job, 0.5 learner, 0.5 worker
    spans = []
    for job in ("0", "1"):
        placement = json.loads((root / job / "placement.json").read_text())
        assert placement["runtime"] == "ray" and len(placement["workers"]) == 1
        assert len(placement["learners"]) == 1
        r = record(root / job)
        spans.append((r["started"], r["started"] + r["wall_s"]))
    spans.sort()
    assert spans[1][0] >= spans[0][1] - 1.0  # 2 CPUs hold one such job at a time
