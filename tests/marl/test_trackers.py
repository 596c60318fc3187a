"""Trackers hang off the loop (issue 41 item 2): a measure registered from outside the package,
one class plus one line, has every hook called at its point of every step of a two-step tiny
run; what it logs is in the event file (TensorBoard's own reader), and its state is in every
checkpoint under its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.loop import trackers
from marl.loop.tracking import Run, Tracker
from marl.loop.train import train
from marl.runtime.rollout import RolloutResult


def tiny(**extra: object) -> dict:
    config = {
        "scenario": {"name": "unison", "overrides": {}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 8},
        "train": {"steps": 2, "seeds_per_step": 1, "group_size": 2, "checkpoint_every": 1},
        "logging": {"progress": False, "transcripts_every": 0},
        "seed": 0,
    }
    config.update(extra)
    return config


class Probe(Tracker):
    """Records each hook call; logs the turns of each step as ``probe/turns``."""

    name = "probe"
    key = "probe"
    calls: list[tuple[str, int]] = []

    def on_start(self, run: Run) -> None:
        self.calls.append(("start", run.start))

    def on_rollout(self, run: Run, step: int, rollout: RolloutResult) -> dict[str, float]:
        self.calls.append(("rollout", step))
        return {}

    def on_update(self, run: Run, updates_done: int, rollout: RolloutResult) -> dict[str, float]:
        self.calls.append(("update", updates_done))
        return {"probe/turns": float(len(rollout.turns))}

    def on_logged(self, run: Run, updates_done: int) -> None:
        self.calls.append(("logged", updates_done))

    def state_dict(self) -> Any:
        return {"calls": len(self.calls)}

    def load_state_dict(self, state: Any) -> None:
        self.calls.append(("loaded", state["calls"]))


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> list[type[Tracker]]:
    """A copy of the registry for the test, so nothing registered here outlives it."""
    monkeypatch.setattr(trackers, "TRACKERS", list(trackers.TRACKERS))
    monkeypatch.setattr(Probe, "calls", [])
    return trackers.TRACKERS


def test_a_registered_tracker_is_called_at_every_step_and_logs_to_tensorboard(
    tmp_path: Path, registry: list[type[Tracker]]
) -> None:
    trackers.register(Probe)  # the one line
    assert registry[-1] is trackers.Checkpoints and Probe in registry  # saved after the step
    metrics = train(tiny(), run_dir=tmp_path)
    assert Probe.calls == [
        ("start", 0),
        ("rollout", 0), ("update", 1), ("logged", 1),
        ("rollout", 1), ("update", 2), ("logged", 2),
    ]  # fmt: skip
    assert metrics["probe/turns"] > 0
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    logged = [(e.step, e.value) for e in events.Scalars("probe/turns")]
    assert [step for step, _ in logged] == [1, 2] and all(v > 0 for _, v in logged)
    assert len(events.Scalars("perf/probe_time")) == 2  # its on_rollout is timed as a phase
    # its state is in each checkpoint, taken after its own hooks of that step ran
    for step, calls in ((1, 4), (2, 7)):
        state = torch.load(tmp_path / "checkpoints" / f"step_{step:06d}" / "state.pt")
        assert state["probe"] == {"calls": calls}


def test_a_registered_tracker_s_state_resumes_and_an_unknown_field_is_refused(
    tmp_path: Path, registry: list[type[Tracker]]
) -> None:
    """The checkpoint checker accepts a registered tracker's field (plain data) and hands it
    back on resume; without the tracker registered, the same field is a foreign one, refused
    in one line naming it."""
    from marl.errors import RunError
    from marl.runtime.checkpoint import load_checkpoint

    trackers.register(Probe)
    train(tiny(), run_dir=tmp_path / "run")
    Probe.calls.clear()
    resumed = tiny(resume=str(tmp_path / "run" / "checkpoints"))
    resumed["train"] = {**resumed["train"], "steps": 3}
    train(resumed, run_dir=tmp_path / "run")
    assert Probe.calls[0] == ("loaded", 7) and ("update", 3) in Probe.calls
    registry.remove(Probe)
    known = "policies, rng, step, config, emergence, advantage, league, scenario"
    refused = rf"probe is not a field of a checkpoint \(known: {known}\)$"
    with pytest.raises(RunError, match=refused):
        load_checkpoint(tmp_path / "run" / "checkpoints", extra_fields=trackers.tracker_fields())


def test_a_name_taken_is_refused_with_the_registered_names(
    registry: list[type[Tracker]],
) -> None:
    class Emergence(Tracker):
        name = "emergence"

    with pytest.raises(ValueError, match="'emergence' is empty or taken; registered: emergence"):
        trackers.register(Emergence)
    assert [t.name for t in registry] == [
        "emergence", "baselines", "league", "held_out", "exploitability", "checkpoints",
    ]  # fmt: skip
