"""A run never writes over another run's checkpoints or mixes its events with another's: a run
folder that holds checkpoints or TensorBoard events is refused, in one line naming it, unless the
run resumes a checkpoint inside it (issue 42: ``hydra.run.dir=D`` used twice, with another seed,
once overwrote the first run's ``step_N`` and repointed ``latest``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from marl.errors import RunError
from marl.loop.train import train
from marl.runtime.checkpoint import check_run_folder


def tiny(**extra: object) -> dict:
    config = {
        "scenario": {"name": "unison", "overrides": {}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 8},
        "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2},
        "logging": {"progress": False, "transcripts_every": 0},
        "seed": 0,
    }
    config.update(extra)
    return config


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_second_run_in_a_used_folder_is_refused_and_the_first_is_untouched(
    tmp_path: Path,
) -> None:
    first = tmp_path / "run"
    train(tiny(), run_dir=first)
    before = digests(first)
    with pytest.raises(RunError) as refused:
        train(tiny(seed=1), run_dir=first)
    line = str(refused.value)
    assert "\n" not in line and str(first) in line
    assert "checkpoints (step_000001)" in line and "TensorBoard events" in line
    assert f"resume={first}" in line
    assert digests(first) == before  # nothing written, nothing repointed


def test_resuming_a_checkpoint_of_the_folder_continues_there(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(tiny(), run_dir=run)
    train(tiny(resume=str(run), train={"steps": 2, "seeds_per_step": 1, "group_size": 2}),
          run_dir=run)  # fmt: skip
    assert (run / "checkpoints" / "step_000002" / "manifest.json").is_file()


def test_what_counts_as_another_runs_folder(tmp_path: Path) -> None:
    check_run_folder(tmp_path / "new", None)  # nothing there
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    (empty / "tensorboard").mkdir()
    check_run_folder(empty, None)  # folders with nothing of a run's in them
    events = tmp_path / "events"
    (events / "tensorboard").mkdir(parents=True)
    (events / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"")
    with pytest.raises(RunError, match="TensorBoard events"):
        check_run_folder(events, None)
    with pytest.raises(RunError, match="checkpoints"):
        step = tmp_path / "steps" / "checkpoints" / "step_000004"
        step.mkdir(parents=True)
        check_run_folder(tmp_path / "steps", str(tmp_path / "elsewhere"))  # resumes another run
    check_run_folder(tmp_path / "steps", str(step))  # resumes its own checkpoint


def test_resuming_a_finished_run_says_there_is_nothing_to_train(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    train(tiny(), run_dir=run)
    capsys.readouterr()
    train(tiny(resume=str(run)), run_dir=run)  # train.steps=1: the checkpoint is step 1
    err = capsys.readouterr().err
    assert "is step 1; train.steps=1: nothing to train" in err
    train(tiny(resume=str(run), train={"steps": 3, "seeds_per_step": 1, "group_size": 2}),
          run_dir=run)  # fmt: skip
    assert "is step 1; train.steps=3: 2 step(s) to train" in capsys.readouterr().out
