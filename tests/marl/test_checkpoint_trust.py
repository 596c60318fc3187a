"""Checkpoints as untrusted input (issue 9, items 1, 3, 6, 7, 8): loading never runs code, a
tampered ``latest`` is not followed out of the run, ``latest`` is replaced atomically and a
killed save leaves nothing a resume trips over, corruption is caught by the checksum, and a
resume refuses a checkpoint that does not fit the run with one line naming what differs."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from marl.errors import RunError
from marl.loop.train import train
from marl.runtime.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from marl.runtime.seeding import rng_states, set_rng_states

TESTS = Path(__file__).resolve().parent
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"


def tiny_config(**overrides: object) -> dict:
    sys.path.insert(0, str(TESTS))
    try:
        from test_train import tiny_config as base
    finally:
        sys.path.remove(str(TESTS))
    return base(**overrides)


def fake_state(step: int = 1) -> dict:
    """The structure train.py checkpoints, with a two-tensor model."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return {
        "policies": {
            "shared": {
                "kind": "full",
                "weights": model.state_dict(),
                "learner": {
                    "optimizer": optimizer.state_dict(),
                    "rng": random.Random(4).getstate(),
                },
                "version": step,
            }
        },
        "rng": plain_rng_states(),
        "step": step,
        "config": {"scenario": {"name": "unison", "overrides": {}}},
    }


def plain_rng_states() -> dict:
    """rng_states() with NumPy's key array as a list, so a hand-made state.pt holds no NumPy
    object (and the tests below get past the unpickler to the check they are about)."""
    states = rng_states()
    kind, key, *rest = states["numpy"]
    return {**states, "numpy": (kind, np.asarray(key).tolist(), *rest)}


def write_raw_checkpoint(step_dir: Path, payload: bytes, step: int = 1) -> None:
    """A checkpoint directory with ``payload`` as state.pt and a manifest that matches it, as
    someone who can write the run directory could make."""
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / STATE_FILE).write_bytes(payload)
    manifest = {
        "format": "marl-checkpoint",
        "version": 1,
        "step": step,
        "files": {
            STATE_FILE: {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
        },
    }
    (step_dir / MANIFEST_FILE).write_text(json.dumps(manifest))


# --- 1. loading never runs code ------------------------------------------------------------------


class _Payload:
    """Unpickling this runs ``exec``: what a crafted state.pt does under weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return (builtins.exec, (f"open({str(self.marker)!r}, 'w').close()",))


def test_a_crafted_checkpoint_is_refused_without_running_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    step_dir = tmp_path / "run" / "checkpoints" / "step_000001"
    step_dir.mkdir(parents=True)
    state = fake_state()
    state["extra"] = _Payload(marker)
    torch.save(state, step_dir / STATE_FILE)
    write_raw_checkpoint(step_dir, (step_dir / STATE_FILE).read_bytes())
    (step_dir.parent / "latest").write_text("step_000001\n")
    with pytest.raises(RunError, match="objects other than tensors and plain data") as info:
        load_checkpoint(tmp_path / "run")
    assert not marker.exists(), "unpickling the checkpoint ran code"
    assert "\n" not in str(info.value) and "(Unsupported global: exec)" in str(info.value)


class _SystemPayload:
    """Unpickling this calls ``os.system``: torch words the refusal of a blocked module's
    global differently ("Trying to load unsupported GLOBAL posix.system whose module ...")."""

    def __reduce__(self):  # noqa: ANN204
        return (os.system, ("true",))


def test_a_blocked_modules_global_is_refused_with_the_same_line(tmp_path: Path) -> None:
    step_dir = tmp_path / "run" / "checkpoints" / "step_000001"
    step_dir.mkdir(parents=True)
    state = fake_state()
    state["extra"] = _SystemPayload()
    torch.save(state, step_dir / STATE_FILE)
    write_raw_checkpoint(step_dir, (step_dir / STATE_FILE).read_bytes())
    with pytest.raises(RunError, match="objects other than tensors and plain data") as info:
        load_checkpoint(step_dir)
    line = str(info.value)
    assert "\n" not in line and f"(Unsupported global: {os.system.__module__}.system)" in line
    assert "Weights only load failed" not in line and "weights_only" not in line


def test_the_state_file_loads_with_weights_only_and_rng_states_round_trip(tmp_path: Path) -> None:
    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    random.random(), np.random.random(), torch.rand(1)  # move off the seeded states
    state = fake_state(step=2)
    state["rng"] = rng_states()  # NumPy's state holds an ndarray: the save makes it a list
    directory = save_checkpoint(tmp_path, 2, state)
    raw = torch.load(directory / STATE_FILE, weights_only=True)  # no pickled objects in it
    assert raw["step"] == 2
    expected = (random.random(), np.random.random(), torch.rand(3))
    loaded = load_checkpoint(tmp_path / "checkpoints")
    set_rng_states(loaded["rng"])
    assert (random.random(), np.random.random()) == expected[:2]
    assert torch.equal(torch.rand(3), expected[2])
    policy = loaded["policies"]["shared"]
    learner_rng = random.Random()
    learner_rng.setstate(policy["learner"]["rng"])
    assert learner_rng.random() == random.Random(4).random()
    for name, tensor in state["policies"]["shared"]["weights"].items():
        assert torch.equal(policy["weights"][name], tensor)
    before = state["policies"]["shared"]["learner"]["optimizer"]["state"][0]["exp_avg"]
    after = policy["learner"]["optimizer"]["state"][0]["exp_avg"]
    assert torch.equal(before, after)


# --- 3. a tampered latest pointer ----------------------------------------------------------------


def test_a_tampered_latest_is_not_followed_out_of_the_checkpoints_dir(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    save_checkpoint(outside, 1, fake_state())
    run = tmp_path / "run"
    save_checkpoint(run, 1, fake_state())
    latest = run / "checkpoints" / "latest"
    target = Path("..") / ".." / "elsewhere" / "checkpoints" / "step_000001"
    for text in (str(target), str((outside / "checkpoints" / "step_000001").resolve())):
        latest.write_text(text + "\n")
        with pytest.raises(RunError, match="refusing to follow"):
            load_checkpoint(run)
    # a step directory that is a link out of the run is refused too
    (run / "checkpoints" / "step_000002").symlink_to(outside / "checkpoints" / "step_000001")
    latest.write_text("step_000002\n")
    with pytest.raises(RunError, match="leads outside"):
        load_checkpoint(run)
    latest.unlink()
    latest.symlink_to(outside / "checkpoints" / "latest")
    with pytest.raises(RunError, match="symbolic link"):
        load_checkpoint(run)


def test_a_step_directory_given_explicitly_still_loads(tmp_path: Path) -> None:
    directory = save_checkpoint(tmp_path, 3, fake_state(3))
    assert load_checkpoint(directory)["step"] == 3
    assert resolve_checkpoint(tmp_path) == directory


# --- 6. the latest pointer and killed saves ------------------------------------------------------


def test_latest_is_replaced_atomically_not_rewritten_in_place(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 1, fake_state(1))
    latest = tmp_path / "checkpoints" / "latest"
    with open(latest) as reader:  # a resume that opened latest just before the next save
        inode = os.fstat(reader.fileno()).st_ino
        save_checkpoint(tmp_path, 2, fake_state(2))
        assert reader.read() == "step_000001\n", "the old pointer was truncated under a reader"
    assert os.stat(latest).st_ino != inode
    assert latest.read_text() == "step_000002\n"
    assert sorted(p.name for p in latest.parent.iterdir()) == [
        "latest",
        "step_000001",
        "step_000002",
    ]


def test_a_save_that_dies_before_the_pointer_moves_leaves_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint(tmp_path, 1, fake_state(1))
    real_replace = os.replace

    class Killed(BaseException):
        pass

    def dying_replace(src, dst):  # noqa: ANN001, ANN202
        if Path(dst).name == "latest":
            raise Killed  # a kill between writing the new pointer and renaming it
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(Killed):
        save_checkpoint(tmp_path, 2, fake_state(2))
    monkeypatch.undo()
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_000001\n"
    assert load_checkpoint(tmp_path)["step"] == 1


def test_a_missing_latest_falls_back_to_the_highest_complete_step(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, fake_state(step))
    (tmp_path / "checkpoints" / "latest").unlink()
    assert load_checkpoint(tmp_path)["step"] == 3


def test_temporaries_of_killed_saves_are_removed_by_the_next_save(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    save_checkpoint(tmp_path, 1, fake_state(1))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead = root / ".step_000002.999999999.abcd"  # no such pid
        old_style = root / ".step_000002.x1y2z3"  # written before pids were in the name
        live = root / f".step_000002.{sleeper.pid}.efgh"  # a save still running elsewhere
        for folder in (dead, old_style, live):
            folder.mkdir()
            (folder / STATE_FILE).write_bytes(b"half")
        (root / ".latest.999999999.tmp").write_text("step_0")
        save_checkpoint(tmp_path, 2, fake_state(2))
        names = sorted(p.name for p in root.iterdir())
        assert names == sorted(["latest", "step_000001", "step_000002", live.name])
    finally:
        sleeper.kill()
        sleeper.wait()
    save_checkpoint(tmp_path, 3, fake_state(3))  # its process is gone now
    assert not live.exists()


KILL_LOOP = textwrap.dedent(
    """
    import random, torch
    from marl.runtime.checkpoint import save_checkpoint
    from marl.runtime.seeding import rng_states
    model = torch.nn.Linear(1000, 1000)  # 4 MB: the kill lands inside a save
    optimizer = torch.optim.AdamW(model.parameters())
    state = {{
        "policies": {{"shared": {{
            "kind": "full", "weights": model.state_dict(),
            "learner": {{"optimizer": optimizer.state_dict(), "rng": random.getstate()}},
        }}}},
        "rng": rng_states(),
    }}
    step = 0
    while True:
        step += 1
        state["step"] = step
        save_checkpoint({run!r}, step, state)
        print(step, flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_save_killed_at_any_moment_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code = KILL_LOOP.format(run=str(run))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for _ in range(3):  # let a few saves complete
            assert proc.stdout.readline(), "the saving subprocess died"
        time.sleep(random.Random(0).uniform(0.0, 0.05))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    state = load_checkpoint(run)
    assert state["step"] >= 3
    save_checkpoint(run, state["step"] + 1, fake_state(state["step"] + 1))
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


# --- 7. checksums --------------------------------------------------------------------------------


def corrupt(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "flip":
        middle = len(data) // 2
        data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    elif how == "truncate":
        data = data[: len(data) // 2]
    elif how == "empty":
        data = bytearray()
    elif how == "random":
        data = bytearray(random.Random(1).randbytes(len(data)))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("flip", "sha256 does not match"),
        ("truncate", "bytes where manifest.json says"),
        ("empty", "0 bytes where manifest.json says"),
        ("random", "sha256 does not match"),
    ],
)
def test_a_corrupt_state_file_is_refused(tmp_path: Path, how: str, message: str) -> None:
    directory = save_checkpoint(tmp_path, 1, fake_state())
    corrupt(directory / STATE_FILE, how)
    with pytest.raises(RunError, match=message) as info:
        load_checkpoint(tmp_path)
    assert "\n" not in str(info.value) and str(directory / STATE_FILE) in str(info.value)


GARBAGE = {
    "empty": b"",
    "zeros": b"\x00" * 100,
    "random": random.Random(2).randbytes(4096),
    "zip-header": b"PK\x03\x04" + random.Random(3).randbytes(4096),
    "legacy-pickle": b"\x80\x02}q\x00.",
}


@pytest.mark.parametrize("payload", list(GARBAGE.values()), ids=list(GARBAGE))
def test_garbage_with_a_matching_manifest_is_refused_in_one_line(
    tmp_path: Path, payload: bytes
) -> None:
    write_raw_checkpoint(tmp_path / "step_000001", payload)
    with pytest.raises(RunError, match="not a readable checkpoint") as info:
        load_checkpoint(tmp_path / "step_000001")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        (None, "has no manifest.json"),
        (b"{not json", "is unreadable"),
        (b"[]", "not a marl checkpoint manifest"),
        (
            b'{"format": "marl-checkpoint", "version": 99, "step": 1, '
            b'"files": {"state.pt": {"bytes": 1, "sha256": "x"}}}',
            "format version 99",
        ),
    ],
)
def test_a_missing_or_broken_manifest_is_refused(
    tmp_path: Path, manifest: bytes | None, message: str
) -> None:
    directory = save_checkpoint(tmp_path, 1, fake_state())
    if manifest is None:
        (directory / MANIFEST_FILE).unlink()
    else:
        (directory / MANIFEST_FILE).write_bytes(manifest)
    with pytest.raises(RunError, match=message):
        load_checkpoint(directory)


# --- 8. resume checks what it resumes ------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": -5}, "step is -5; it must be an integer >= 0"),
        ({"step": "5"}, "step is '5'"),
        ({"rng": {"python": (1, 2), "numpy": None, "torch": None}}, "rng.python"),
        ({"policies": {}}, "holds no policy states"),
    ],
)
def test_a_state_with_impossible_values_is_refused(
    tmp_path: Path, change: dict, message: str
) -> None:
    state = fake_state(5)
    state.update(change)
    step_dir = tmp_path / "step_000005"
    step_dir.mkdir()
    torch.save(state, step_dir / STATE_FILE)
    write_raw_checkpoint(step_dir, (step_dir / STATE_FILE).read_bytes(), step=5)
    with pytest.raises(RunError, match=message):
        load_checkpoint(step_dir)


@pytest.fixture(scope="module")
def unison_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("unison")
    train(tiny_config(**{"train.steps": 1}), run_dir=run)
    return run


@pytest.mark.slow
def test_resume_refuses_another_scenario_unless_allowed(unison_run: Path, tmp_path: Path) -> None:
    relay = tiny_config(**{"train.steps": 2}, resume=str(unison_run))
    relay["scenario"] = {"name": "relay", "overrides": {}}
    refused = "trained on scenario 'unison-v0', this run plays 'relay-v0'"
    with pytest.raises(RunError, match=refused):
        train(relay, run_dir=tmp_path / "refused")
    assert not (tmp_path / "refused").exists(), "refused before the run directory was made"
    relay["resume_allow_scenario_change"] = True
    metrics = train(relay, run_dir=tmp_path / "allowed")
    assert metrics and load_checkpoint(tmp_path / "allowed")["scenario"] == "relay-v0"


@pytest.mark.slow
def test_resume_refuses_another_model_size_in_one_line(unison_run: Path, tmp_path: Path) -> None:
    config = tiny_config(**{"train.steps": 2, "model.hidden_size": 32}, resume=str(unison_run))
    with pytest.raises(RunError, match="do not fit this run's model") as info:
        train(config, run_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "[101, 64] in the checkpoint, [101, 32] here" in message
    assert "model.hidden_size is 64 in the checkpoint, 32 here" in message


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_cli_prints_one_line_for_a_corrupt_checkpoint(
    marl_cli, unison_run: Path, tmp_path: Path
) -> None:
    run = tmp_path / "copy"
    directory = save_checkpoint(run, 1, load_checkpoint(unison_run))
    corrupt(directory / STATE_FILE, "flip")
    result = marl_cli(
        "train",
        "model=tiny",
        "scenario=unison",
        f"resume={run}",
        f"hydra.run.dir={tmp_path / 'out'}",
        "logging.progress=false",
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert lines == [
        f"error: resume: {directory / STATE_FILE} is corrupt: its sha256 does not match "
        "manifest.json"
    ]


# --- issue 29: bounded inflation, and resume after a kill between a re-save's renames ------------


def test_records_that_declare_more_bytes_than_the_file_holds_are_refused(tmp_path: Path) -> None:
    """A central directory can declare any size for a stored record, and torch's reader
    allocates the declared size: the declared total must fit in the file."""
    directory = save_checkpoint(tmp_path, 1, fake_state())
    data = bytearray((directory / STATE_FILE).read_bytes())
    entry = data.index(b"PK\x01\x02")  # the first record's central directory entry
    data[entry + 20 : entry + 28] = (2**31).to_bytes(4, "little") * 2  # stored and declared
    write_raw_checkpoint(directory, bytes(data))
    with pytest.raises(RunError, match=r"records declare \d+ bytes, more than the file's") as info:
        load_checkpoint(directory)
    assert "\n" not in str(info.value) and str(directory / STATE_FILE) in str(info.value)


KILL_BETWEEN_RENAMES = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from marl.runtime.checkpoint import load_checkpoint, save_checkpoint
    run = sys.argv[1]
    state = load_checkpoint(sys.argv[2])
    for step in (1, 2):
        save_checkpoint(run, step, {{**state, "step": step}})
    real_replace = os.replace

    def replace_then_die(src, dst):
        real_replace(src, dst)
        if os.path.basename(dst) == "old":  # the old step_000002 is aside, the new one not in
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace_then_die
    save_checkpoint(run, 2, {{**state, "step": 2}})  # step 2 saved again
    """
)


def kill_between_renames(run: Path, source: Path) -> None:
    """Save steps 1 and 2 under ``run`` from ``source``'s state, then save step 2 again and
    SIGKILL the process between the rename that moves the old step 2 aside and the one that
    moves the new one in: the state the audit found (issue 29, L1)."""
    done = subprocess.run(
        [sys.executable, "-c", KILL_BETWEEN_RENAMES.format(), str(run), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    root = run / "checkpoints"
    assert (root / "latest").read_text() == "step_000002\n"
    assert not (root / "step_000002").exists() and (root / "step_000001").is_dir()
    assert len([p for p in root.iterdir() if p.name.startswith(".step_000002.")]) == 2


def test_resume_takes_the_newest_complete_step_when_latest_names_a_missing_one(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    save_checkpoint(tmp_path / "source", 1, fake_state())
    kill_between_renames(tmp_path / "run", tmp_path / "source")
    root = tmp_path / "run" / "checkpoints"
    state = load_checkpoint(tmp_path / "run")
    assert state["step"] == 1
    assert capfd.readouterr().err.splitlines() == [
        f"resume: {root / 'latest'} names step_000002, which does not exist (a save killed "
        "between its renames); taking step_000001, the newest complete step"
    ]
    # with no complete step left, the refusal is one line
    shutil.rmtree(root / "step_000001")
    with pytest.raises(RunError, match="no complete step_N directory is left") as info:
        load_checkpoint(tmp_path / "run")
    assert "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.subprocess
def test_marl_train_resumes_from_the_newest_complete_step_after_a_killed_resave(
    marl_cli, unison_run: Path, tmp_path: Path
) -> None:
    """The real thing: a run's checkpoint saved as steps 1 and 2, the re-save of step 2 killed
    between its renames, then ``marl train resume=...`` continues from step 1 and says so."""
    kill_between_renames(tmp_path / "killed", unison_run)
    done = marl_cli(
        "train",
        "model=tiny",
        "scenario=unison",
        "train.steps=2",
        f"resume={tmp_path / 'killed'}",
        f"hydra.run.dir={tmp_path / 'resumed'}",
        "logging.progress=false",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    root = tmp_path / "killed" / "checkpoints"
    assert (
        f"resume: {root / 'latest'} names step_000002, which does not exist (a save killed "
        "between its renames); taking step_000001, the newest complete step"
    ) in done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    assert load_checkpoint(tmp_path / "resumed")["step"] == 2


def test_an_empty_or_unreadable_latest_falls_back_with_one_warning(tmp_path: Path, capsys) -> None:
    save_checkpoint(tmp_path, 1, fake_state(1))
    newest = save_checkpoint(tmp_path, 2, fake_state(2))
    latest = tmp_path / "checkpoints" / "latest"
    for content, why in ((b"", "is empty"), (b"\xff\xfe\x00", "cannot be read")):
        latest.write_bytes(content)
        assert resolve_checkpoint(tmp_path) == newest
        warning = capsys.readouterr().err.strip().splitlines()
        assert len(warning) == 1 and why in warning[0] and "step_000002" in warning[0]
    latest.unlink()
    os.mkfifo(latest)  # not a regular file: refused without blocking, then the fallback
    assert resolve_checkpoint(tmp_path) == newest
    assert "cannot be read" in capsys.readouterr().err


@pytest.mark.parametrize("linked", [STATE_FILE, MANIFEST_FILE])
def test_a_linked_state_or_manifest_is_refused_like_a_linked_step(
    tmp_path: Path, linked: str
) -> None:
    real = save_checkpoint(tmp_path / "elsewhere", 1, fake_state(1))
    step = save_checkpoint(tmp_path / "run", 1, fake_state(1))
    (step / linked).unlink()
    (step / linked).symlink_to(real / linked)  # the same bytes, from outside the run
    with pytest.raises(RunError, match="symbolic link; refusing to follow it") as info:
        load_checkpoint(tmp_path / "run")
    assert str(step / linked) in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda w: w.to(torch.int64), "holds int64 values, not floating point"),
        (lambda w: w.clone().fill_(float("nan")), "holds NaN or infinite values"),
        (lambda w: w.to_sparse(), "is a sparse_coo tensor, not a dense one"),
    ],
    ids=["int64", "nan", "sparse"],
)
def test_a_spoilt_weight_is_refused_before_it_loads(
    unison_run: Path, tmp_path: Path, spoil, message: str
) -> None:
    """A checkpoint whose manifest matches (rewritten by save_checkpoint) but one weight of
    which is no longer a dense float tensor: refused in one line naming it, never loaded."""
    state = load_checkpoint(unison_run)
    weights = state["policies"]["shared"]["weights"]
    name = sorted(weights)[0]
    weights[name] = spoil(weights[name])
    save_checkpoint(tmp_path / "spoilt", 1, state)
    config = tiny_config(**{"train.steps": 2}, resume=str(tmp_path / "spoilt"))
    with pytest.raises(RunError) as info:
        train(config, run_dir=tmp_path / "resumed")
    line = str(info.value)
    assert "\n" not in line and f"policies.shared.weights.{name} {message}" in line, line
    assert not (tmp_path / "resumed").exists()


def test_an_oversized_manifest_or_latest_is_never_read_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``manifest.json`` is read up to 64 KiB and ``latest`` up to 256 bytes (docs/security.md,
    Limits): a larger manifest, or a FIFO in its place, is refused in one line naming it; a
    larger ``latest`` cannot be read, so resume takes the newest complete step and says so."""
    from marl.runtime.checkpoint import MAX_LATEST_BYTES, MAX_MANIFEST_BYTES

    for step in (1, 2):
        save_checkpoint(tmp_path, step, fake_state(step))
    root = tmp_path / "checkpoints"
    latest = root / "latest"
    latest.write_text("step_000001" + " " * MAX_LATEST_BYTES)  # a name, padded past the limit
    assert load_checkpoint(tmp_path)["step"] == 2  # not step 1, which it names
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and f"over the limit of {MAX_LATEST_BYTES}" in warning[0]
    assert warning[0].endswith("taking step_000002, the newest complete step")

    manifest = root / "step_000002" / "manifest.json"
    manifest.write_text(manifest.read_text() + " " * MAX_MANIFEST_BYTES)
    with pytest.raises(RunError) as refused:
        load_checkpoint(root / "step_000002")
    message = str(refused.value)
    assert "\n" not in message and str(manifest) in message
    assert f"over the limit of {MAX_MANIFEST_BYTES}" in message
    manifest.unlink()
    os.mkfifo(manifest)
    with pytest.raises(RunError, match=r"manifest.json is unreadable \(not a regular file"):
        load_checkpoint(root / "step_000002")  # returns at once: a FIFO is never opened blocking
