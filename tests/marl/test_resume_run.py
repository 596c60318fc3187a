"""A resumed run says what it does in one line and continues its run (issue 41 item 7): in the
checkpoint's own folder it is the same TensorBoard run, every step once (read back with
TensorBoard's own reader), what a crashed first process logged after the checkpoint dropped;
in another folder the line says so and its hparams name the checkpoint; ``marl train
resume=<run>`` without ``hydra.run.dir`` continues that folder instead of a new timestamped one."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.analysis.hparams import read_session
from marl.loop.run_folder import continue_in_place
from marl.loop.train import train

LOSS = "policies/shared/loss"


def tiny(steps: int, **extra: object) -> dict:
    config = {
        "scenario": {"name": "unison", "overrides": {}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 8},
        "train": {"steps": steps, "seeds_per_step": 1, "group_size": 2},
        "logging": {"progress": False, "transcripts_every": 0},
        "seed": 0,
    }
    config["train"].update(extra.pop("train", {}))  # type: ignore[union-attr]
    config.update(extra)
    return config


def event_runs(run: Path) -> list[str]:
    """The folders under ``run`` that TensorBoard would list as runs (they hold event files)."""
    folders = {p.parent for p in run.rglob("events.out.tfevents.*")}
    return sorted(str(f.relative_to(run)) for f in folders)


def curve(run: Path, tag: str = LOSS) -> list[tuple[int, float]]:
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_a_run_resumed_in_its_folder_is_one_tensorboard_run_with_each_step_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    train(tiny(2), run_dir=run)
    capsys.readouterr()
    train(tiny(4, resume=str(run)), run_dir=run)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("resume:")]
    assert line == (
        f"resume: {run} is step 2; train.steps=4: 2 step(s) to train, continuing {run} and its "
        "TensorBoard run"
    )
    assert event_runs(run) == ["tensorboard"]  # one run, not two
    assert [step for step, _ in curve(run)] == [1, 2, 3, 4]
    hparams, finals, status = read_session(run / "tensorboard")
    assert status == "success" and hparams["seed"] == 0 and "resumed_from" not in hparams
    assert finals  # the newest final metrics are those of the whole run's end
    # resuming the finished run: one line, and nothing in the folder changes
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}
    train(tiny(4, resume=str(run)), run_dir=run)
    assert "train.steps=4: nothing to train" in capsys.readouterr().err
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run.rglob("*") if p.is_file()}
    assert after == before


def test_what_a_crashed_run_logged_after_its_checkpoint_is_dropped_on_resume(
    tmp_path: Path,
) -> None:
    """Step 3 was logged, then the process 'crashed' (its checkpoint of step 3 is ignored): the
    run resumed from step 2 logs steps 3 and 4, and the curve equals a straight run's."""
    straight = tmp_path / "straight"
    train(tiny(4), run_dir=straight)
    run = tmp_path / "run"
    train(tiny(3, train={"checkpoint_every": 2}), run_dir=run)
    step2 = run / "checkpoints" / "step_000002"
    train(tiny(4, resume=str(step2)), run_dir=run)
    resumed, expected = curve(run), curve(straight)
    assert [step for step, _ in resumed] == [1, 2, 3, 4]
    if torch.cuda.is_available():  # CUDA reorders sums from run to run
        assert resumed == pytest.approx(expected, rel=1e-6, abs=1e-9)
    else:
        assert resumed == expected


def test_a_run_resumed_in_another_folder_says_so_and_names_its_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, other = tmp_path / "first", tmp_path / "other"
    train(tiny(1), run_dir=first)
    capsys.readouterr()
    train(tiny(2, resume=str(first)), run_dir=other)
    step1 = first / "checkpoints" / "step_000001"
    assert (
        f"resume: {first} is step 1; train.steps=2: 1 step(s) to train, in a new folder {other} "
        f"(a new TensorBoard run; its hparams say resumed_from={step1})"
    ) in capsys.readouterr().out
    hparams, _, _ = read_session(other / "tensorboard")
    assert hparams["resumed_from"] == str(step1)
    assert [step for step, _ in curve(other)] == [2]


def test_marl_train_resume_continues_the_checkpoints_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    args = ["model=tiny", f"resume={run}", "train.steps=4"]
    assert continue_in_place(args) == [*args, f"hydra.run.dir='{run}'", "hydra.output_subdir=null"]
    for given in (run / "checkpoints", run / "checkpoints" / "step_000002"):
        assert continue_in_place([f"resume={given}"])[1] == f"hydra.run.dir='{run}'"
    unchanged = (
        ["model=tiny"],  # no resume
        ["resume=null"],
        [f"resume={run}", f"hydra.run.dir={tmp_path / 'elsewhere'}"],  # the user's folder
        ["-m", f"resume={run}"],  # a sweep's jobs have folders of their own
        [f"resume={tmp_path / 'missing'}"],  # the run then says what is wrong
        [f"resume={tmp_path / 'bare_step'}"],  # a step outside any run: a new folder
    )
    for args in unchanged:
        assert continue_in_place(args) == args


@pytest.mark.slow
@pytest.mark.subprocess
def test_marl_train_resume_without_a_run_dir_writes_no_second_run(marl_cli, tmp_path: Path) -> None:
    common = ["model=tiny", "scenario=unison", "train.group_size=2", "sampling.max_new_tokens=8",
              "logging.progress=false", "runtime.threads=1"]  # fmt: skip
    run = tmp_path / "run"
    first = marl_cli(
        "train", *common, "train.steps=1", f"hydra.run.dir={run}", timeout=300, cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr[-3000:]
    overrides = (run / ".hydra" / "overrides.yaml").read_text()
    resumed = marl_cli(
        "train", *common, "train.steps=2", f"resume={run}", timeout=300, cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"continuing {run} and its TensorBoard run" in resumed.stdout
    assert not (tmp_path / "runs").exists()  # no timestamped folder
    assert (run / ".hydra" / "overrides.yaml").read_text() == overrides  # the launch that made it
    assert event_runs(run) == ["tensorboard"]
    assert [step for step, _ in curve(run)] == [1, 2]
