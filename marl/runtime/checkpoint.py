"""Checkpoints: model weights, optimizer, RNG states and step, written atomically, checked on load.

A checkpoint is a directory ``<run>/checkpoints/step_<N>/`` holding ``state.pt`` and
``manifest.json`` (format, step, size and sha256 of ``state.pt``). It is written to a temporary
directory and renamed into place, so a crash never leaves half a checkpoint; ``latest`` names
the newest step directory and is replaced atomically too (write a temporary file, then
``os.replace``). Temporaries a killed save left behind are removed by the next save.

``state.pt`` holds tensors and plain data only (dicts, lists, tuples, numbers, strings): NumPy
arrays are stored as lists. Loading checks the manifest's size and sha256 before unpickling
anything, then the zip archive's records (torch.save stores them uncompressed, so a record that
is compressed, or records that declare more bytes than the file holds, are refused before any
is inflated: memory stays bounded by the file's size), then unpickles with
``torch.load(weights_only=True)``, which builds tensors and plain containers and refuses every
other object, so a checkpoint never runs code. Then every field of the state is checked against
what ``marl train`` writes (:mod:`marl.runtime.state_check`: types, ranges, and each tensor's
dtype, layout, device, shape and finiteness) before anything is built. Any failure is one
:class:`~marl.errors.RunError` line that names the file and what is wrong with it (the field,
for a state that does not check out).

A checkpoint's saved config is data too: :func:`saved_model_spec` checks the model it names
(known keys, values, and a size no larger than the weights it holds) before anything is built.

When ``latest`` names a step directory that does not exist (a kill between the two renames that
replace a step saved again), the newest complete ``step_N`` is taken, and a line says which.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import shutil
import stat
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marl.errors import RunError
from marl.protocols.values import is_int
from marl.runtime.state_check import check_state
from marl.scenarios.problems import short
from marl.scenarios.reader import read_bounded

FORMAT = "marl-checkpoint"
FORMAT_VERSION = 1
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
LATEST_FILE = "latest"
MAX_MANIFEST_BYTES = 64 * 1024
MAX_LATEST_BYTES = 256
_STEP_DIR = re.compile(r"step_(\d{1,18})")
_TEMP_PREFIXES = (".step_", ".latest.")
_CHUNK = 1 << 22


# --- save -------------------------------------------------------------------------------------


def plain(value: Any) -> Any:
    """``value`` with NumPy arrays and scalars turned into lists and Python numbers, so that
    ``torch.load(weights_only=True)`` reads it back. Containers that need no change are
    returned as they are (a model's state dict keeps its type and metadata)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        items = {key: plain(item) for key, item in value.items()}
        if all(items[key] is value[key] for key in value):
            return value
        return items
    if isinstance(value, (list, tuple)):
        items = [plain(item) for item in value]
        if all(new is old for new, old in zip(items, value)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


def save_checkpoint(run_dir: str | Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` as the checkpoint of ``step``; returns its directory."""
    if not is_int(step) or step < 0:
        raise ValueError(f"checkpoint step must be an integer >= 0, got {step!r}")
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(root)
    final = root / f"step_{step:06d}"
    scenario = _saved_scenario(state)
    if scenario is not None:  # the registered name it resolved to when saved (check_resume)
        state = {**state, "scenario": scenario}
    try:
        return _write_checkpoint(root, final, step, state)
    except (OSError, RuntimeError) as err:  # torch.save reports a full disk as a RuntimeError
        free = shutil.disk_usage(root).free / 2**30
        raise RunError(
            f"cannot write the checkpoint of step {step} under {root} "
            f"({free:.1f} GiB free on that disk): {err}. Free some space or set "
            "train.checkpoint_every=0; the run can resume from its last complete checkpoint"
        ) from err


def _write_checkpoint(root: Path, final: Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` into a temporary directory, then move it to ``final`` in one rename."""
    tmp = Path(tempfile.mkdtemp(prefix=f".step_{step:06d}.{os.getpid()}.", dir=root))
    aside = None
    try:
        payload = tmp / STATE_FILE
        with open(payload, "wb") as f:
            torch.save(plain(state), f)
            f.flush()
            os.fsync(f.fileno())
        with open(payload, "rb") as f:
            digest, size = _sha256(f)
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "step": step,
            "files": {STATE_FILE: {"bytes": size, "sha256": digest}},
        }
        _write_synced(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
        if final.exists():  # the same step saved again: move the old one aside, then replace
            aside = Path(tempfile.mkdtemp(prefix=f".step_{step:06d}.{os.getpid()}.", dir=root))
            os.replace(final, aside / "old")
        os.replace(tmp, final)
    finally:
        for leftover in (tmp, aside):
            if leftover is not None and leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)
    _replace_text(root / LATEST_FILE, final.name + "\n")
    _fsync_dir(root)
    return final


def remove_stale_temporaries(root: str | Path) -> list[Path]:
    """Remove the temporary directories and files that killed saves left in ``root`` (a
    ``checkpoints`` directory); those of a save still running in a live process are kept."""
    removed = []
    for entry in Path(root).iterdir():
        if not entry.name.startswith(_TEMP_PREFIXES):
            continue
        parts = entry.name.split(".")  # ".step_000003.<pid>.<random>", ".latest.<pid>.<random>"
        pid = int(parts[2]) if len(parts) > 3 and parts[2].isdigit() else None
        if pid is not None and pid != os.getpid() and _alive(pid):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would not be a probe there
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _replace_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically: a reader sees the old or the new content."""
    fd, tmp = tempfile.mkstemp(prefix=f".latest.{os.getpid()}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on a directory; the renames still hold
        pass
    finally:
        os.close(fd)


def _sha256(f: Any) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := f.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


# --- find -------------------------------------------------------------------------------------


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory ``path`` names: a step directory, or a run/checkpoints dir.

    In a checkpoints directory, ``latest`` says which step; it must name a ``step_N``
    directory inside that same directory (a pointer elsewhere is refused, not followed).
    Without ``latest``, the highest complete ``step_N`` is taken.
    """
    path = Path(path)
    for candidate in (path, path / "checkpoints"):
        if (candidate / MANIFEST_FILE).is_file() or (candidate / STATE_FILE).is_file():
            return candidate
        latest = candidate / LATEST_FILE
        if latest.exists() or latest.is_symlink():
            return _follow_latest(candidate, latest)
        steps = _complete_steps(candidate)
        if steps:
            return steps[-1]
    raise RunError(
        f"resume: no checkpoint found at {path} (expected a step_N directory with state.pt)"
    )


def _inside(root: Path, step_dir: Path) -> bool:
    """Whether ``step_dir`` is, after following links, a direct child of ``root``."""
    try:
        return step_dir.resolve(strict=True).parent == root.resolve(strict=True)
    except OSError:
        return False


def check_run_folder(run_dir: str | Path, resume: str | Path | None) -> None:
    """Refuse to start a run in a folder that holds another run's checkpoints or TensorBoard
    events (its ``step_N`` would be overwritten, its ``latest`` repointed, its curves mixed with
    the new run's), unless ``resume`` names a checkpoint inside that folder: a run continued
    where it stopped. One line naming the folder and what it holds."""
    run_dir = Path(run_dir)
    held = []
    root = run_dir / "checkpoints"
    if root.is_dir():
        steps = sorted(p.name for p in root.iterdir() if _STEP_DIR.fullmatch(p.name))
        if steps:
            shown = ", ".join(steps[:3]) + (", ..." if len(steps) > 3 else "")
            held.append(f"checkpoints ({shown})")
    events = run_dir / "tensorboard"
    if events.is_dir() and any(p.name.startswith("events.out.tfevents") for p in events.rglob("*")):
        held.append("TensorBoard events")
    if not held:
        return
    if resume is not None:
        try:
            inside = Path(resume).resolve().is_relative_to(run_dir.resolve())
        except OSError:
            inside = False
        if inside:
            return
    raise RunError(
        f"hydra.run.dir: the run folder {run_dir} already holds another run's "
        f"{' and '.join(held)}; a new run there would overwrite or mix with them. Choose another "
        f"folder, or continue that run with resume={run_dir}"
    )


def complete_checkpoints(run_dir: str | Path) -> list[Path]:
    """The complete ``step_N`` checkpoints of the run in ``run_dir`` (each with its manifest),
    oldest first."""
    return _complete_steps(Path(run_dir) / "checkpoints")


def _complete_steps(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.fullmatch(entry.name)
        if match and (entry / MANIFEST_FILE).is_file() and _inside(root, entry):
            found.append((int(match.group(1)), entry))
    return [entry for _, entry in sorted(found)]


def _newest_instead(root: Path, latest: Path, why: str) -> Path:
    """The newest complete step when ``latest`` is empty or unreadable, with one warning line
    (a pointer that names anything is followed or refused, never guessed past)."""
    steps = _complete_steps(root)
    if not steps:
        raise RunError(f"resume: {latest} {why}, and {root} holds no complete step_N directory")
    print(
        f"resume: {latest} {why}; taking {steps[-1].name}, the newest complete step",
        file=sys.stderr,
        flush=True,
    )
    return steps[-1]


def _follow_latest(root: Path, latest: Path) -> Path:
    if latest.is_symlink():
        raise RunError(f"resume: {latest} is a symbolic link; refusing to follow it")
    try:
        raw = read_bounded(latest, MAX_LATEST_BYTES)
        name = raw.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError, RunError) as exc:
        return _newest_instead(root, latest, f"cannot be read ({_first_line(exc)})")
    if not name:
        return _newest_instead(root, latest, "is empty")
    if not _STEP_DIR.fullmatch(name):
        raise RunError(
            f"resume: {latest} names {short(name)}, not a step_N directory; refusing to follow it"
        )
    step_dir = root / name
    if not step_dir.is_dir() and not step_dir.is_symlink():
        # a kill between the two renames of a step saved again (the old copy moved aside, the
        # new one not yet in place): the newest complete step is the checkpoint to resume
        steps = _complete_steps(root)
        if not steps:
            raise RunError(
                f"resume: {latest} names {name}, which does not exist in {root}, and no "
                "complete step_N directory is left"
            )
        print(
            f"resume: {latest} names {name}, which does not exist (a save killed between its "
            f"renames); taking {steps[-1].name}, the newest complete step",
            file=sys.stderr,
            flush=True,
        )
        return steps[-1]
    if not _inside(root, step_dir):
        raise RunError(f"resume: {step_dir} leads outside {root}; refusing to follow it")
    return step_dir


# --- load -------------------------------------------------------------------------------------


def load_checkpoint(
    path: str | Path, extra_fields: Sequence[str] = (), command: str = "resume"
) -> dict[str, Any]:
    """Load and check a checkpoint saved by :func:`save_checkpoint`; raises RunError, labelled
    with ``command`` (``eval: ...`` under ``marl eval``, ``resume: ...`` by default).
    ``extra_fields``: top-level fields of registered trackers, accepted as plain data."""
    try:
        return _load_checkpoint(path, extra_fields)
    except RunError as exc:
        text = str(exc)
        if command != "resume" and text.startswith("resume: "):
            raise RunError(f"{command}: {text.removeprefix('resume: ')}") from None
        raise


def _load_checkpoint(path: str | Path, extra_fields: Sequence[str]) -> dict[str, Any]:
    directory = resolve_checkpoint(path)
    manifest = _read_manifest(directory)
    payload = directory / STATE_FILE
    expected = manifest["files"][STATE_FILE]
    with _open_payload(payload) as f:
        size = os.fstat(f.fileno()).st_size
        if size != expected["bytes"]:
            raise RunError(
                f"resume: {payload} is corrupt: {size} bytes where {MANIFEST_FILE} says "
                f"{expected['bytes']} (truncated or replaced?)"
            )
        digest, _ = _sha256(f)
        if digest != expected["sha256"]:
            raise RunError(
                f"resume: {payload} is corrupt: its sha256 does not match {MANIFEST_FILE}"
            )
        state = _torch_load(f, payload, size, "resume")
    check_state(state, payload, manifest_step=manifest["step"], extra_fields=extra_fields)
    return state


def load_tensor_file(path: str | Path, what: str = "eval") -> Any:
    """Tensors and plain data from a ``torch.save`` file with no manifest (a league snapshot),
    with the same checks as a checkpoint's ``state.pt``: a regular file, a zip archive whose
    records are stored and fit in the file, loaded with ``weights_only=True``. ``what``
    begins the one-line :class:`RunError` ("eval: <file> ...")."""
    payload = Path(path)
    with _open_payload(payload, what) as f:
        return _torch_load(f, payload, os.fstat(f.fileno()).st_size, what)


def _torch_load(f: Any, payload: Path, size: int, what: str) -> Any:
    f.seek(0)
    if f.read(4) != b"PK\x03\x04":  # torch.save's zip format; never the legacy pickle one
        raise RunError(f"{what}: {payload} is not a readable checkpoint (not a zip archive)")
    _check_records(f, payload, size, what)
    f.seek(0)
    try:
        return torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read is one line, not a trace
        reason = _unpickling_reason(exc) if isinstance(exc, pickle.UnpicklingError) else ""
        if reason.startswith("Unsupported global"):
            raise RunError(
                f"{what}: {payload} holds objects other than tensors and plain data "
                f"({reason}); refusing to load it"
            ) from None
        raise RunError(
            f"{what}: {payload} is not a readable checkpoint "
            f"({type(exc).__name__}: {reason or _first_line(exc)})"
        ) from None


def _check_records(f: Any, payload: Path, size: int, what: str) -> None:
    """Refuse an archive that would inflate to more than its own size, before reading a record.

    ``torch.save`` stores every record uncompressed, and torch's reader allocates each record's
    declared uncompressed size. So a record that is compressed, one whose stored and declared
    sizes differ, or records that together declare more bytes than the file holds, are not a
    checkpoint this code wrote: a 500 KB deflated record can declare 500 MB or more."""
    f.seek(0)
    try:
        with zipfile.ZipFile(f) as archive:
            records = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        raise RunError(
            f"{what}: {payload} is not a readable checkpoint (not a zip archive: "
            f"{_first_line(exc)})"
        ) from None
    declared = 0
    for record in records:
        name = short(record.filename)
        if record.compress_type != zipfile.ZIP_STORED:
            raise RunError(
                f"{what}: {payload}: record {name} is compressed (zip method "
                f"{record.compress_type}) to {record.compress_size} bytes from "
                f"{record.file_size}; torch.save stores records uncompressed, so refusing to "
                "inflate it"
            )
        if record.compress_size != record.file_size:
            raise RunError(
                f"{what}: {payload}: record {name} declares {record.file_size} bytes but stores "
                f"{record.compress_size}; refusing to load it"
            )
        declared += record.file_size
    if declared > size:
        raise RunError(
            f"{what}: {payload}: its records declare {declared} bytes, more than the file's "
            f"{size}; refusing to load it"
        )


@contextlib.contextmanager
def _open_payload(payload: Path, what: str = "resume") -> Iterator[Any]:
    # a link is refused like a linked latest or step folder: O_NOFOLLOW, so no swap slips past
    if payload.is_symlink():
        raise RunError(f"{what}: {payload} is a symbolic link; refusing to follow it")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(payload, flags)
    except FileNotFoundError:
        raise RunError(f"{what}: {payload} is missing") from None
    except OSError as exc:
        raise RunError(f"{what}: cannot read {payload}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise RunError(f"{what}: {payload} is not a regular file")
        yield f


def _read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST_FILE
    if path.is_symlink():
        raise RunError(f"resume: {path} is a symbolic link; refusing to follow it")
    if not path.exists():
        raise RunError(
            f"resume: {directory} has no {MANIFEST_FILE} (not a checkpoint, or written by an "
            "older version without checksums); refusing to load it unchecked"
        )
    try:
        manifest = json.loads(read_bounded(path, MAX_MANIFEST_BYTES).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or _first_line(exc)
        raise RunError(f"resume: {path} is unreadable ({reason})") from None
    ok = (
        isinstance(manifest, dict)
        and manifest.get("format") == FORMAT
        and isinstance(manifest.get("files"), dict)
        and isinstance(entry := manifest["files"].get(STATE_FILE), dict)
        and is_int(entry.get("bytes"))
        and isinstance(entry.get("sha256"), str)
        and is_int(manifest.get("step"))
    )
    if not ok:
        raise RunError(f"resume: {path} is not a marl checkpoint manifest")
    if manifest.get("version") != FORMAT_VERSION:
        raise RunError(
            f"resume: {path} has format version {short(manifest.get('version'))}; this version "
            f"of marl reads version {FORMAT_VERSION}"
        )
    return manifest


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:160]


_UNSUPPORTED_GLOBAL = re.compile(r"unsupported global:?\s+(?:GLOBAL\s+)?([\w.]+)", re.IGNORECASE)


def _unpickling_reason(exc: BaseException) -> str:
    """The useful line of torch's weights-only refusal (its first lines are advice to load the
    file unsafely, which we will not give): ``Unsupported global: posix.system`` whatever the
    torch version's wording (``WeightsUnpickler error: Unsupported global: GLOBAL x``, ``Trying
    to load unsupported GLOBAL x whose module ...``); else its first other line, or ""."""
    text = str(exc)
    found = _UNSUPPORTED_GLOBAL.search(text)
    if found:
        return f"Unsupported global: {found.group(1)}"[:160]
    _, marker, rest = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in rest.splitlines() if line.strip()] if marker else []
    return lines[0][:160] if lines else ""


# --- the model a checkpoint names ---------------------------------------------------------------

# The most parameters a checkpoint's config may ask marl to build (40 GB in float32), whatever
# weights it holds; a full model may also not be larger than about twice the weights it holds.
MAX_MODEL_PARAMETERS = 10_000_000_000


def saved_model_spec(
    fields: object, source: str | Path, key: str = "config.model", weights: Any = None
) -> Any:
    """The :class:`~marl.agents.models.ModelSpec` that a checkpoint's saved config names,
    checked before anything is allocated; a :class:`RunError` line naming ``key`` otherwise.

    Refused: a value that is not a mapping, an unknown key, a value the spec refuses, and a
    model of more than :data:`MAX_MODEL_PARAMETERS` parameters or, when ``weights`` (the full
    model's state dict) are given, of more than about twice the parameters they hold: those
    weights must fill the model, so a larger one cannot be what was saved."""
    from dataclasses import fields as dataclass_fields

    from marl.agents.models import ModelSpec, estimate_parameters

    def fail(what: str) -> RunError:
        return RunError(f"eval: {source}: {what}")

    if not isinstance(fields, Mapping):
        raise fail(f"{key} is {short(fields)}, not a mapping of model settings")
    known = [f.name for f in dataclass_fields(ModelSpec)]
    unknown = [k for k in fields if k not in known]
    if unknown:
        name = unknown[0] if str(unknown[0]).isidentifier() else short(unknown[0])
        raise fail(f"{key}.{name} is not a model setting (known: {', '.join(known)})")
    for name, value in fields.items():
        default = ModelSpec.__dataclass_fields__[name].default
        expected = type(default) if default is not None else str
        ok = isinstance(value, expected) and not isinstance(value, bool)
        if not ok and not (value is None and default is None):
            raise fail(f"{key}.{name} is {short(value)}, not {_a(expected)}")
    try:
        spec = ModelSpec(**fields)
    except (TypeError, ValueError) as exc:
        raise fail(f"{key}.{_first_line(exc).removeprefix('model.')}") from None
    count = estimate_parameters(spec)
    if count is None:
        return spec
    held = None
    if isinstance(weights, Mapping):
        held = sum(v.numel() for v in weights.values() if isinstance(v, torch.Tensor))
    limit = MAX_MODEL_PARAMETERS if held is None else min(MAX_MODEL_PARAMETERS, 2 * held + 2**20)
    if count > limit:
        sizes = (
            ", ".join(
                f"{key}.{k} {getattr(spec, k)}"
                for k in ("hidden_size", "num_layers", "intermediate_size")
                if spec.kind == "tiny" and k in fields
            )
            or f"{key}.kind {spec.kind}, {key}.path {short(spec.path)}"
        )
        why = (
            f"the checkpoint's weights hold {held:,}"
            if held is not None and 2 * held + 2**20 < MAX_MODEL_PARAMETERS
            else f"at most {MAX_MODEL_PARAMETERS:,} are built from a checkpoint"
        )
        raise fail(
            f"{sizes} name a model of about {count:,} parameters ({count * 4 / 2**30:,.1f} GiB "
            f"in float32), but {why}; refusing to build it"
        )
    return spec


def _a(kind: type) -> str:
    return {int: "an integer", str: "a string", float: "a number"}.get(kind, kind.__name__)


# --- resume -----------------------------------------------------------------------------------


def _scenario_id(name: object) -> object:
    """A scenario reference as the registry resolves it (``relay`` -> ``relay-v1``)."""
    from marl.scenarios.problems import ScenarioError
    from marl.scenarios.registry import is_path, resolve_name

    if not isinstance(name, str) or is_path(name):
        return name
    try:
        return resolve_name(name)
    except ScenarioError:
        return name


def _saved_scenario(state: Mapping[str, Any]) -> object:
    """The scenario a checkpoint state was trained on: the registered name recorded at save
    time, else the one its config names (None when it records neither)."""
    if isinstance(state.get("scenario"), str):
        return state["scenario"]
    saved = state.get("config")
    if not isinstance(saved, Mapping) or not isinstance(saved.get("scenario"), Mapping):
        return None
    return _scenario_id(saved["scenario"].get("name"))


def check_resume(state: Mapping[str, Any], config: Any) -> None:
    """Refuse to resume ``state`` into a run on another scenario, unless the config says
    ``resume_allow_scenario_change=true``. ``config`` is a :class:`marl.config.Config`."""
    before = _saved_scenario(state)
    if before is None:
        return  # no record of the scenario: nothing to compare
    now = _scenario_id(config.scenario.name)
    if before != now and not getattr(config, "resume_allow_scenario_change", False):
        raise RunError(
            f"resume: the checkpoint was trained on scenario {short(before)}, this run plays "
            f"{short(now)}; set resume_allow_scenario_change=true to continue on another scenario"
        )


def check_weights(
    saved: Mapping[str, Mapping[str, Any]],
    current: Mapping[str, Mapping[str, Any]],
    saved_config: Mapping[str, Any] | None = None,
    config: Any = None,
) -> None:
    """Refuse checkpoint weights that do not fit the models built for this run.

    ``saved`` and ``current`` map policy ids to learner states (``kind`` and ``weights``);
    policies missing on either side are left to the runtime, which names them. The message
    names the first tensor that differs and, when the configs say why, the model settings.
    """
    differences: list[str] = []
    for pid in sorted(set(saved) & set(current)):
        old, new = saved[pid], current[pid]
        if old.get("kind", "full") != new.get("kind", "full"):
            differences.append(
                f"policy {pid!r} is {old.get('kind', 'full')!r} in the checkpoint, "
                f"{new.get('kind', 'full')!r} here"
            )
            continue
        old_w, new_w = old.get("weights", {}), new.get("weights", {})
        for name in sorted(set(old_w) | set(new_w)):
            if name not in new_w:
                differences.append(f"policy {pid!r}: {name} is in the checkpoint, not here")
            elif name not in old_w:
                differences.append(f"policy {pid!r}: {name} is missing from the checkpoint")
            elif tuple(old_w[name].shape) != tuple(new_w[name].shape):
                differences.append(
                    f"policy {pid!r}: {name} is {list(old_w[name].shape)} in the checkpoint, "
                    f"{list(new_w[name].shape)} here"
                )
    if not differences:
        return
    more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
    settings = _model_differences(saved_config, config)
    raise RunError(
        f"resume: the checkpoint's weights do not fit this run's model: {differences[0]}{more}"
        + (f"; {settings}" if settings else "")
    )


def _model_differences(saved_config: Mapping[str, Any] | None, config: Any) -> str:
    if not isinstance(saved_config, Mapping) or config is None:
        return ""
    before = saved_config.get("model")
    now = asdict(config.model) if is_dataclass(config.model) else None
    if not isinstance(before, Mapping) or not isinstance(now, dict):
        return ""
    keys = [k for k in now if k in before and before[k] != now[k]]
    if not keys:
        return ""
    pairs = ", ".join(
        f"model.{k} is {short(before[k])} in the checkpoint, {short(now[k])} here" for k in keys[:4]
    )
    return pairs
