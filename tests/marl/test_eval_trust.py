"""``marl eval`` reads checkpoints as data (issue 29, items 2 and 4).

- A ``rules_module`` that a checkpoint's config names (in ``scenario.overrides``, in
  ``scenario.rules_module`` or in the scenario file it points at) is never imported: one line
  says so, and ``--rules-module`` on the command line imports it.
- The model a checkpoint's config names is checked before anything is built: an unknown key, a
  bad value and a model larger than its weights (hidden 16384 x 64 layers) are each one line
  naming the key; weights of another shape are one line naming the tensor.
- A league snapshot is loaded with the same bounds as a checkpoint (no deflated records).

Every case is a real checkpoint on disk, run through ``marl.cli.main`` (what the console script
calls), asserting the exit status and one ``error:`` line with no traceback.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import subprocess
import sys
import textwrap
import uuid
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from marl.agents.models import ModelSpec, load_model
from marl.cli import main
from marl.errors import RunError
from marl.runtime.checkpoint import MANIFEST_FILE, STATE_FILE, save_checkpoint
from marl.runtime.seeding import rng_states


def tiny_weights(**fields: object) -> dict:
    model, _ = load_model(ModelSpec(kind="tiny", **fields))  # type: ignore[arg-type]
    return model.state_dict()


def plain_rng_states() -> dict:
    states = rng_states()
    kind, key, *rest = states["numpy"]
    return {**states, "numpy": (kind, np.asarray(key).tolist(), *rest)}


def fresh_learner(weights: dict) -> dict:
    """The learner state of a policy that has not stepped yet: AdamW's settings over one
    parameter per weight, no per-parameter state, a Python random state."""
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True) for _ in weights])
    return {"optimizer": optimizer.state_dict(), "rng": random.Random(0).getstate()}


def write_checkpoint(
    run: Path,
    model: object,
    scenario: dict | None = None,
    weights: dict | None = None,
    **config: object,
) -> Path:
    """A checkpoint as ``marl train`` writes it (manifest, checksum, ``latest``), holding a tiny
    model's weights and a saved config naming ``model`` and ``scenario``: what someone who
    can write a run directory can make."""
    state = {
        "policies": {
            "shared": {
                "kind": "full",
                "weights": tiny_weights() if weights is None else weights,
                "learner": fresh_learner(tiny_weights() if weights is None else weights),
            }
        },
        "rng": plain_rng_states(),
        "step": 1,
        "config": {
            "scenario": scenario or {"name": "matching-pennies", "overrides": {}},
            "model": model,
            **config,
        },
    }
    return save_checkpoint(run, 1, state)


def run_eval(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["eval", *args, "--episodes", "1", "--bootstrap", "2", "--max-new-tokens", "4"])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(code: int, err: str) -> str:
    """The one ``error:`` line of a refused command (exit 2, no traceback)."""
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A module on the import path that leaves a marker file when it is imported (what a
    hostile ``rules_module`` would run)."""
    name = f"marker_rules_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / f"{name}.imported"
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(folder))
    yield name, marker
    sys.modules.pop(name, None)


# --- item 2: a checkpoint never chooses code to import -------------------------------------------


@pytest.mark.parametrize("where", ["overrides", "scenario", "scenario_file"])
def test_a_rules_module_named_by_a_checkpoint_is_never_imported(
    tmp_path: Path, capsys: pytest.CaptureFixture, user_module: tuple[str, Path], where: str
) -> None:
    module, marker = user_module
    scenario: dict = {"name": "matching-pennies", "overrides": {}}
    key = {
        "overrides": "config.scenario.overrides.rules_module",
        "scenario": "config.scenario.rules_module",
    }.get(where, "the scenario file")
    if where == "overrides":
        scenario["overrides"] = {"rules_module": module}
    elif where == "scenario":
        scenario["rules_module"] = module
    else:  # the checkpoint points at a scenario file that names the module
        from marl.scenarios.registry import load_document

        document, _ = load_document("matching-pennies")
        game = tmp_path / "game.yaml"
        game.write_text(yaml.safe_dump({**document, "name": "mp-file", "rules_module": module}))
        scenario["name"] = str(game)
    write_checkpoint(tmp_path / "run", {"kind": "tiny"}, scenario)
    code, out, err = run_eval(capsys, str(tmp_path / "run"), "random", "--out", str(tmp_path / "e"))
    assert code == 0, err
    assert not marker.exists(), "marl eval imported a rules_module named by a checkpoint"
    assert module not in sys.modules
    notes = [line for line in err.splitlines() if line.strip()]
    assert len(notes) == 1, err
    assert notes[0].startswith(f"eval: not importing rules_module '{module}', named by {key}")
    assert notes[0].endswith(f"to import it, pass --rules-module {module}")
    assert "| run |" in out

    # the command line may name it: then it is imported, with no note
    code, out, err = run_eval(
        capsys,
        str(tmp_path / "run"),
        "random",
        "--rules-module",
        module,
        "--out",
        str(tmp_path / "e2"),
    )
    assert code == 0, err
    assert marker.exists() and "not importing" not in err


def test_eval_listening_does_not_import_a_checkpoints_rules_module(
    tmp_path: Path, capsys: pytest.CaptureFixture, user_module: tuple[str, Path]
) -> None:
    from marl.competition.role_eval import load_pairs

    module, marker = user_module
    scenario = {"name": "signal", "overrides": {"rules_module": module}}
    write_checkpoint(tmp_path / "run", {"kind": "tiny"}, scenario)
    (pair,) = load_pairs([f"a={tmp_path / 'run'}"])
    assert not marker.exists() and module not in sys.modules
    assert "rules_module" not in pair.config["scenario"]["overrides"]
    assert f"not importing rules_module '{module}'" in capsys.readouterr().err


# --- item 2: the model a checkpoint names is bounded before it is built --------------------------


def test_a_huge_model_in_a_checkpoint_is_refused_before_it_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """hidden 16384 x 64 layers: about 69 billion parameters; the audit saw 4.5 GB allocated."""
    write_checkpoint(tmp_path / "run", {"kind": "tiny", "hidden_size": 16384, "num_layers": 64})
    code, _, err = run_eval(capsys, str(tmp_path / "run"), "random", "--out", str(tmp_path / "e"))
    line = error_line(code, err)
    assert line.startswith(
        f"error: eval: {tmp_path / 'run'}: config.model.hidden_size 16384, "
        "config.model.num_layers 64 name a model of about 69,125,898,240 parameters"
    )
    assert line.endswith("but the checkpoint's weights hold 95,168; refusing to build it")


def test_a_model_under_the_cap_but_larger_than_its_weights_is_refused(tmp_path: Path) -> None:
    """The weights must fill the model, so a model far larger than them is not what was saved,
    even under the absolute cap (here 256 x 8 layers, about 5.4 million parameters)."""
    from marl.runtime.checkpoint import saved_model_spec

    with pytest.raises(RunError, match="config.model.hidden_size 256, config.model.num_layers 8"):
        saved_model_spec(
            {"kind": "tiny", "hidden_size": 256, "num_layers": 8}, "run", weights=tiny_weights()
        )
    spec = saved_model_spec({"kind": "tiny"}, "run", weights=tiny_weights())
    assert spec == ModelSpec(kind="tiny")


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            {"kind": "tiny", "bogus": 3},  # the audit's TypeError: ModelSpec.__init__()
            "config.model.bogus is not a model setting (known: kind, path, dtype, hidden_size",
        ),
        ({"kind": "tiny", "hidden_size": "64"}, "config.model.hidden_size is '64', not an integer"),
        ({"kind": "huge"}, "config.model.kind: 'huge' is not one of tiny, embedded, hf"),
        ({"kind": "tiny", "num_layers": 0}, "config.model.num_layers: must be > 0, got 0"),
        ({"kind": "tiny", "seed": 2**70}, "config.model.seed: must be in [-2**63, 2**64)"),
        (["tiny"], "config.model is ['tiny'], not a mapping of model settings"),
    ],
)
def test_a_bad_model_config_in_a_checkpoint_is_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture, model: object, message: str
) -> None:
    write_checkpoint(tmp_path / "run", model)
    code, _, err = run_eval(capsys, str(tmp_path / "run"), "random", "--out", str(tmp_path / "e"))
    line = error_line(code, err)
    assert line.startswith(f"error: eval: {tmp_path / 'run'}: {message}"), line


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ([48], "the first checkpoint's config.sampling is not a mapping: [48]"),
        (
            {"max_new_tokens": "many"},
            "the first checkpoint's config.sampling.max_new_tokens is 'many', not a number; "
            "set it with --max-new-tokens",
        ),
        ({"top_p": 7}, "sampling.top_p: "),
    ],
)
def test_bad_sampling_settings_in_a_checkpoint_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, sampling: object, message: str
) -> None:
    write_checkpoint(tmp_path / "run", {"kind": "tiny"}, sampling=sampling)
    code, _, err = run_eval(capsys, str(tmp_path / "run"), "random", "--out", str(tmp_path / "e"))
    assert error_line(code, err).startswith(f"error: eval: {message}")


def test_weights_of_another_shape_are_one_line_naming_the_tensor(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The audit's ``size mismatch`` traceback: a config of hidden 32 over weights of 64."""
    write_checkpoint(tmp_path / "run", {"kind": "tiny", "hidden_size": 32})
    code, _, err = run_eval(capsys, str(tmp_path / "run"), "random", "--out", str(tmp_path / "e"))
    assert error_line(code, err) == (
        f"error: eval: the weights of run ({tmp_path / 'run'}) do not fit its model: "
        "model.embed_tokens.weight is [101, 64] in the weights, [101, 32] in the model its "
        "config names (and 20 more)"
    )


# --- item 2: bounded inflation, the league snapshot too -------------------------------------------


def deflated(payload: bytes, record: str = "data/0", size: int = 64 * 2**20) -> bytes:
    """``payload`` (a torch.save archive) with its record ``record`` padded to ``size`` bytes
    and deflated: a small file that inflates to ``size``."""
    source = zipfile.ZipFile(io.BytesIO(payload))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith(record):
                data += bytes(size - len(data))
                archive.writestr(info.filename, data, zipfile.ZIP_DEFLATED, 9)
            else:
                archive.writestr(info.filename, data)
    return out.getvalue()


def test_a_snapshot_with_a_deflated_record_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "run" / "league").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({"model": {"kind": "tiny"}}))
    snapshot = tmp_path / "run" / "league" / "snapshot_0.pt"
    buffer = io.BytesIO()
    torch.save(tiny_weights(), buffer)
    snapshot.write_bytes(deflated(buffer.getvalue()))
    code, _, err = run_eval(capsys, str(snapshot), "random", "--scenario", "matching-pennies")
    line = error_line(code, err)
    assert line.startswith(f"error: eval: {snapshot}: record 'archive/data/0' is compressed")
    assert line.endswith("torch.save stores records uncompressed, so refusing to inflate it")


def test_a_snapshots_model_is_bounded_by_its_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "run" / "league").mkdir(parents=True)
    config = {"model": {"kind": "tiny", "hidden_size": 16384, "num_layers": 64}}
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(config))
    snapshot = tmp_path / "run" / "league" / "snapshot_0.pt"
    torch.save(tiny_weights(), snapshot)
    code, _, err = run_eval(capsys, str(snapshot), "random", "--scenario", "matching-pennies")
    line = error_line(code, err)
    assert f"{tmp_path / 'run' / 'config.yaml'}: model.hidden_size 16384" in line


BOMB = textwrap.dedent(
    """
    import resource, sys
    from marl.cli import main
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = main(["eval", sys.argv[1], "random", "--episodes", "1"])
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    print(f"{code} {grown:.0f}")
    """
)


@pytest.mark.subprocess
def test_a_deflated_state_file_is_refused_before_it_inflates(tmp_path: Path) -> None:
    """The audit's 523 KB state.pt that added 512 MB of RSS: here a 512 MB record deflated to
    about 0.5 MB, with a manifest that matches it (whoever crafts the file writes that too).
    A fresh process runs the real CLI and reports how much its peak memory grew."""
    directory = write_checkpoint(tmp_path / "run", {"kind": "tiny"})
    payload = deflated((directory / STATE_FILE).read_bytes(), size=512 * 2**20)
    assert len(payload) < 2**20
    (directory / STATE_FILE).write_bytes(payload)
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    manifest["files"][STATE_FILE] = {
        "bytes": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
    }
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))
    done = subprocess.run(
        [sys.executable, "-c", BOMB, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, grown = done.stdout.split()
    assert code == "2", done.stderr
    assert int(grown) < 64, f"peak memory grew {grown} MB before the refusal"
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    stored = zipfile.ZipFile(io.BytesIO(payload)).getinfo("archive/data/0").compress_size
    assert errors == [
        f"error: eval: {directory / STATE_FILE}: record 'archive/data/0' is compressed (zip "
        f"method 8) to {stored} bytes from {512 * 2**20}; torch.save stores records "
        "uncompressed, so refusing to inflate it"
    ]


@pytest.mark.parametrize("name", ["../../x", "../model/tiny", "/etc/passwd", "tiny/../tiny"])
def test_a_model_preset_is_a_name_never_a_path(name: str) -> None:
    from marl.competition.players import model_preset

    with pytest.raises(RunError) as refused:
        model_preset(name)
    assert str(refused.value).startswith("eval: unknown model preset ")
    assert "known: smollm2, tiny" in str(refused.value)
    assert model_preset("tiny")["kind"] == "tiny"


def test_a_stray_file_is_told_what_a_checkpoint_is(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``marl eval`` on a file that is no snapshot says it is not a checkpoint and what one is
    (once: 'no /tmp/config.yaml to read its model from'); a run's state.pt is pointed at its
    step folder. Both labelled ``eval:``."""
    from marl.cli import main

    stray = tmp_path / "weights.pt"
    stray.write_bytes(b"junk")
    assert main(["eval", str(stray), "random", "--scenario", "signal", "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: eval: {stray} is a file, not a checkpoint: name a run, its checkpoints folder "
        "or a step_N folder (which holds state.pt and manifest.json), or a league snapshot "
        "<run>/league/snapshot_N.pt"
    ]
    step = tmp_path / "run" / "checkpoints" / "step_000003"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"junk")
    state = str(step / "state.pt")
    assert main(["eval", state, "random", "--scenario", "signal", "--episodes", "1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: eval: ") and line.endswith(f"name its step folder ({step})")
