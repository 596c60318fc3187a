"""bench/sweep_wall.py's reading of a job's TensorBoard events (what its jobs-per-hour and the GPU
sweep's table count): a job finished when it wrote its final metrics, and its step and update
times are the medians of its curves. Events written by TensorBoard's own writer, read back by
the bench's reader (TensorBoard's EventAccumulator)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import sweep_wall  # noqa: E402  (bench/ is not a package)


def _events(logdir: Path, curves: dict[str, list[float]]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(logdir))
    for tag, values in curves.items():
        for step, value in enumerate(values):
            writer.add_scalar(tag, value, step)
    writer.close()


def test_a_finished_job_gives_its_steps_last_reward_and_median_times(tmp_path: Path) -> None:
    _events(
        tmp_path / "0" / "tensorboard",
        {
            "team/reward": [0.1, 0.5, 0.25],
            "perf/step_time": [9.0, 1.0, 2.0],
            "perf/update_time": [4.0, 0.5, 0.75],
            "final/team/reward": [0.25],
        },
    )
    job = sweep_wall.job_figures(tmp_path / "0")
    assert job["finished"] and job["steps"] == 3
    assert abs(job["final_team_reward"] - 0.25) < 1e-6
    assert (job["step_time_s"], job["update_time_s"]) == (2.0, 0.75)


def test_a_job_stopped_before_its_final_metrics_has_not_finished(tmp_path: Path) -> None:
    _events(tmp_path / "1" / "tensorboard", {"team/reward": [0.1, 0.2]})
    job = sweep_wall.job_figures(tmp_path / "1")
    assert not job["finished"] and job["steps"] == 2
    assert job["step_time_s"] is None and job["update_time_s"] is None
    assert sweep_wall.job_figures(tmp_path / "never-started") == {"finished": False}
