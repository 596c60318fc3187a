"""Every field of a checkpoint is checked before anything loads (issue 42, item 2).

A checkpoint whose manifest matches (whoever edits ``state.pt`` rewrites it too) but one of
whose fields is no longer what ``marl train`` writes is refused in one line that names the
field: weights (dtype, layout, device, finiteness), the learner (Python random state, counts,
masters, KL reference), AdamW's state and settings (shapes against the parameters, dtype,
finiteness, memory), the generator states, the step and version, the config, and the
emergence, role-baseline and league states (:mod:`marl.runtime.state_check`).

- Each kind on a crafted state, through :func:`load_checkpoint` (fast).
- The kinds of the issue through the real CLI (``marl train resume=...`` and ``marl eval``): exit
  2, at most two lines on stderr (one ``error:`` line naming ``state.pt`` and the field, and
  perhaps the machine's load warning), no traceback, the run folder unchanged.
- A state that passes the data checks but does not fit the built model is refused before the
  learner loads anything.
- A fuzz: 200 seeded mutations of a real checkpoint (tensors, fields, bytes) each either load
  bit-exact, through the same steps as a resume, or are refused in one line.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import math
import random
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from marl.credit.advantages import RoleBaselines
from marl.errors import RunError
from marl.loop.train import train
from marl.protocols.values import is_int
from marl.runtime.checkpoint import (
    MANIFEST_FILE,
    STATE_FILE,
    check_resume,
    check_weights,
    load_checkpoint,
    save_checkpoint,
)
from marl.runtime.seeding import rng_states, set_rng_states
from marl.runtime.state_check import LEAGUE_RESULTS

TESTS = Path(__file__).resolve().parent


def tiny_config(**overrides: object) -> dict:
    sys.path.insert(0, str(TESTS))
    try:
        from test_train import tiny_config as base
    finally:
        sys.path.remove(str(TESTS))
    return base(**overrides)


def plain_rng_states() -> dict:
    """rng_states() with NumPy's key array as a list (what ``save_checkpoint`` stores)."""
    states = rng_states()
    kind, key, *rest = states["numpy"]
    return {**states, "numpy": (kind, np.asarray(key).tolist(), *rest)}


def league_state(tmp_path: Path) -> dict:
    """A real league's state: one snapshot in the pool, a result and an Elo update."""
    from marl.competition.league import League
    from marl.config import LeagueConfig

    league = League(
        LeagueConfig(enabled=True, mix={"latest": 1.0}), ["a", "b"], tmp_path / "league"
    )
    league.add_snapshot(0, {"w": torch.ones(2)})
    league.windows["latest"].append("win")
    league.elo.update("learner", "snapshot_0", 1.0)
    return league.state_dict()


def crafted_state(tmp_path: Path, step: int = 1) -> dict:
    """A state with every field ``marl train`` writes: a two-layer model stepped once by AdamW,
    generator states, the emergence tracker's, role baselines' and a league's state."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    baselines = RoleBaselines(0.9)
    baselines.advantages([1.0, 0.0], [("g", "a"), ("g", "b")])
    return {
        "policies": {
            "shared": {
                "kind": "full",
                "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "learner": {
                    "optimizer": copy.deepcopy(optimizer.state_dict()),
                    "rng": random.Random(4).getstate(),
                    "nonfinite_in_a_row": 0,
                },
                "version": step,
            }
        },
        "rng": plain_rng_states(),
        "step": step,
        "config": {"scenario": {"name": "unison", "overrides": {}}, "model": {"kind": "tiny"}},
        "emergence": {"words": {"a": {"hi": 2}}, "last": {"emergence/a/entropy": 0.5}},
        "advantage": baselines.state_dict(),
        "league": league_state(tmp_path),
        "scenario": "unison-v0",
    }


def write_state(step_dir: Path, state: object, step: int = 1) -> Path:
    """``state`` as ``state.pt`` with a manifest that matches it: what someone who can write
    the run folder makes (``step``: the manifest's)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return write_bytes(step_dir, buffer.getvalue(), step)


def write_bytes(step_dir: Path, payload: bytes, step: int = 1) -> Path:
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / STATE_FILE).write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    manifest = {
        "format": "marl-checkpoint",
        "version": 1,
        "step": step,
        "files": {STATE_FILE: {"bytes": len(payload), "sha256": digest}},
    }
    (step_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
    return step_dir


def refusal(directory: Path) -> str:
    """The one line that refuses the checkpoint in ``directory``."""
    with pytest.raises(RunError) as info:
        load_checkpoint(directory)
    line = str(info.value)
    assert "\n" not in line and len(line) < 400, line
    assert str(directory / STATE_FILE) in line, line
    return line


# --- each kind, on a crafted state ---------------------------------------------------------------

POLICY = ("policies", "shared")
LEARNER = (*POLICY, "learner")
OPT = (*LEARNER, "optimizer")
GROUP = (*OPT, "param_groups", 0)
ADAM = (*OPT, "state", 0)


def at(*path: object) -> Callable[[dict], Any]:
    def get(state: dict) -> Any:
        for key in path:
            state = state[key]
        return state

    return get


def put(path: tuple, value: object) -> Callable[[dict], None]:
    """A mutation that sets the field at ``path`` to ``value`` (a callable: of the old value)."""

    def mutate(state: dict) -> None:
        parent = at(*path[:-1])(state)
        parent[path[-1]] = value(parent[path[-1]]) if callable(value) else value

    return mutate


def drop(path: tuple) -> Callable[[dict], None]:
    def mutate(state: dict) -> None:
        del at(*path[:-1])(state)[path[-1]]

    return mutate


def nan_at_first(tensor: torch.Tensor) -> torch.Tensor:
    spoilt = tensor.clone()
    spoilt.view(-1)[0] = float("nan")
    return spoilt


W0 = (*POLICY, "weights", "0.weight")


def transposed_reference(state: dict) -> None:
    """A KL reference (a copy of the model) whose first weight is transposed."""
    reference = {k: v.clone() for k, v in at(*POLICY, "weights")(state).items()}
    reference["0.weight"] = reference["0.weight"].t().contiguous()
    at(*LEARNER)(state)["reference"] = reference


KINDS: dict[str, tuple[Callable[[dict], None], str]] = {
    # weights
    "int64 weight": (put(W0, lambda w: w.to(torch.int64)), "weights.0.weight holds int64 values"),
    "nan weight": (put(W0, nan_at_first), "weights.0.weight holds NaN or infinite values"),
    "sparse weight": (put(W0, lambda w: w.to_sparse()), "0.weight is a sparse_coo tensor"),
    "meta weight": (put(W0, lambda w: torch.empty_like(w, device="meta")), "is a meta tensor"),
    "float64 weight": (put(W0, lambda w: w.double()), "holds float64 values; a model's weights"),
    "mixed dtypes": (
        put((*POLICY, "weights", "1.bias"), lambda w: w.bfloat16()),
        "weights.1.bias holds bfloat16 values where the policy's other weights hold float32",
    ),
    "list weight": (put(W0, lambda w: w.tolist()), "weights.0.weight is a list, not a tensor"),
    "no weights": (put((*POLICY, "weights"), {}), "policies.shared.weights is empty"),
    "kind": (put((*POLICY, "kind"), "lora"), "policies.shared.kind is 'lora'"),
    "str version": (put((*POLICY, "version"), "1"), "policies.shared.version is '1'; it must"),
    "bool version": (put((*POLICY, "version"), True), "policies.shared.version is True"),
    "negative version": (put((*POLICY, "version"), -1), "policies.shared.version is -1"),
    "huge version": (put((*POLICY, "version"), 2**70), "an integer >= 0 and < 2^63"),
    "policy field": (put((*POLICY, "bogus"), 1), "shared.bogus is not a field of a checkpoint"),
    # the learner
    "no learner rng": (drop((*LEARNER, "rng")), "learner.rng is missing"),
    "learner rng": (put((*LEARNER, "rng"), [3, [0] * 625, None]), "not a Python random state"),
    "skip count": (put((*LEARNER, "nonfinite_in_a_row"), 1.5), "nonfinite_in_a_row is 1.5"),
    "fp32 masters": (put((*LEARNER, "master"), [torch.ones(4, 3)]), "the weights are float32"),
    "reference shape": (
        transposed_reference,
        "learner.reference.0.weight is float32 (3, 4); the weight is float32 (4, 3)",
    ),
    # the optimizer
    "garbage optimizer": (put(OPT, "adam"), "learner.optimizer is a str, not a mapping"),
    "no optimizer state": (drop((*OPT, "state")), "optimizer.state is missing"),
    "exp_avg shape": (
        put((*ADAM, "exp_avg"), torch.zeros(3, 4)),
        "optimizer.state.0 has exp_avg (3, 4) and exp_avg_sq (4, 3)",
    ),
    "both shapes": (
        lambda s: at(*ADAM)(s).update(exp_avg=torch.zeros(2, 4), exp_avg_sq=torch.zeros(2, 4)),
        "optimizer.state.0.exp_avg has shape (2, 4) != its parameter's (4, 3) (weights.0.weight)",
    ),
    "exp_avg nan": (put((*ADAM, "exp_avg"), nan_at_first), "state.0.exp_avg holds NaN"),
    "negative exp_avg_sq": (put((*ADAM, "exp_avg_sq"), lambda t: -t - 1), "negative values"),
    "float64 exp_avg": (put((*ADAM, "exp_avg"), lambda t: t.double()), "AdamW's state is float32"),
    "expanded exp_avg": (
        put((*ADAM, "exp_avg"), lambda t: t.reshape(-1)[:1].expand(4, 3)),
        "state.0.exp_avg has strides (0, 0) that overlap",
    ),
    "aliased state": (
        lambda s: at(*ADAM)(s).update(exp_avg_sq=at(*ADAM)(s)["exp_avg"].abs_()),
        "state.0.exp_avg_sq shares memory with",
    ),
    "fractional step": (put((*ADAM, "step"), torch.tensor(1.5)), "state.0.step is 1.5"),
    "int step": (put((*ADAM, "step"), torch.tensor(1)), "state.0.step is an int64 tensor"),
    "vector step": (put((*ADAM, "step"), torch.ones(2)), "not a 0-dim float"),
    "state of no parameter": (
        lambda s: at(*OPT, "state")(s).__setitem__(7, copy.deepcopy(at(*ADAM)(s))),
        "optimizer.state.7 names no parameter (param_groups.0.params is 0 to 3)",
    ),
    "state field": (put((*ADAM, "momentum"), torch.ones(1)), "state.0.momentum is not a field"),
    "str lr": (put((*GROUP, "lr"), "0.1"), "param_groups.0.lr is '0.1'; it must be a finite"),
    "nan lr": (put((*GROUP, "lr"), math.nan), "param_groups.0.lr is nan"),
    "zero eps": (put((*GROUP, "eps"), 0.0), "param_groups.0.eps is 0.0; it must be > 0"),
    "beta": (put((*GROUP, "betas"), (0.9, 1.5)), "param_groups.0.betas.1 is 1.5"),
    "maximize": (put((*GROUP, "maximize"), True), "maximize is True; marl's AdamW runs with"),
    "no fused flag": (drop((*GROUP, "fused")), "param_groups.0.fused is missing"),
    "group field": (put((*GROUP, "nesterov"), True), "nesterov is not a field of a checkpoint"),
    "param order": (put((*GROUP, "params"), [1, 0, 2, 3]), "params must be 0, 1, ..."),
    "two groups": (put((*OPT, "param_groups"), lambda g: g * 2), "holds 2 groups"),
    # the generators, the step, the config
    "torch rng": (put(("rng", "torch"), torch.zeros(3, dtype=torch.int64)), "rng.torch is a"),
    "numpy rng": (put(("rng", "numpy"), ("MT19937", [1.5] * 624, 0, 0, 0.0)), "rng.numpy is"),
    "no rng": (drop(("rng",)), "rng must hold the python, numpy and torch generator states"),
    "bool step": (put(("step",), True), "step is True; it must be an integer >= 0"),
    "huge step": (put(("step",), 10**19), "step is 10000000000000000000"),
    "tensor in config": (
        put(("config", "scenario", "name"), torch.ones(1)),
        "config.scenario.name is a Tensor, not plain data",
    ),
    "scenario": (put(("scenario",), 5), "scenario is an int, not a scenario name"),
    "top field": (put(("bogus",), 1), "bogus is not a field of a checkpoint"),
    "no policies": (put(("policies",), {}), "the state holds no policy states"),
    # the measures' states
    "emergence shape": (
        put(("emergence",), {"words": ["hi"], "last": {}}),
        "emergence.words is a list, not a mapping",
    ),
    "emergence count": (put(("emergence", "words", "a", "hi"), -2), "words.a.hi is -2"),
    "emergence value": (put(("emergence", "last", "x"), "high"), "emergence.last.x is 'high'"),
    "emergence field": (put(("emergence", "counts"), {}), "emergence.counts is not a field"),
    "decay": (put(("advantage", "decay"), 1.0), "advantage.decay is 1.0; it must be < 1"),
    "update count": (put(("advantage", "updates", "g:a"), 1.5), "advantage.updates.g:a is 1.5"),
    "roles": (put(("advantage", "updates", "g:c"), 1), "not both"),
    "snapshot name": (
        put(("league", "snapshots", 0, "name"), "../x"),
        "league.snapshots.0.name is '../x'; it must be snapshot_0",
    ),
    "record": (put(("league", "records", "snapshot_0"), [1, 2]), "not [wins, draws, losses]"),
    "window": (put(("league", "windows", "latest"), ["won"]), "windows.latest must be a list"),
    "elo": (put(("league", "elo", "k"), "16"), "league.elo.k is '16'"),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_field_is_refused_in_one_line_naming_it(tmp_path: Path, kind: str) -> None:
    state = crafted_state(tmp_path)
    spoil, message = KINDS[kind]
    spoil(state)
    directory = write_state(tmp_path / "step_000001", state)
    line = refusal(directory)
    assert message in line, line


def test_the_crafted_state_and_its_lean_forms_load(tmp_path: Path) -> None:
    """The crafted state loads as saved; so does one without the optional fields (a checkpoint
    of an older version, a policy that never stepped)."""
    state = crafted_state(tmp_path)
    loaded = load_checkpoint(write_state(tmp_path / "full", state))
    assert torch.equal(loaded["policies"]["shared"]["weights"]["0.weight"], at(*W0)(state))
    for field in ("emergence", "advantage", "league", "scenario", "config"):
        del state[field]
    for field in ("version", "kind"):
        del state["policies"]["shared"][field]
    state["policies"]["shared"]["learner"]["optimizer"]["state"] = {}
    del state["policies"]["shared"]["learner"]["nonfinite_in_a_row"]
    assert load_checkpoint(write_state(tmp_path / "lean", state))["step"] == 1


def test_bfloat16_weights_with_their_masters_load_and_a_wrong_master_is_named(
    tmp_path: Path,
) -> None:
    """Mixed precision: bf16 weights, fp32 masters (one per weight, in order) that AdamW steps;
    the optimizer's shapes are checked against the masters."""
    state = crafted_state(tmp_path)
    policy = state["policies"]["shared"]
    masters = [w.clone() for w in policy["weights"].values()]
    policy["weights"] = {k: v.bfloat16() for k, v in policy["weights"].items()}
    policy["learner"]["master"] = masters
    load_checkpoint(write_state(tmp_path / "good", state))
    masters[1] = torch.zeros(5)
    line = refusal(write_state(tmp_path / "bad", state))
    assert "learner.master.1 has shape (5,) != its weight's (4,) (weights.0.bias)" in line, line


def test_the_league_results_are_the_leagues() -> None:
    from marl.competition.league import RESULTS

    assert LEAGUE_RESULTS == RESULTS


# --- a real run: the CLI, the built model, the fuzz -------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("trained")
    train(tiny_config(**{"train.steps": 1}), run_dir=run)
    return run


def spoilt_copy(trained: Path, folder: Path, spoil: Callable[[dict], None]) -> Path:
    """A copy of the trained run whose checkpoint ``spoil`` changed, saved (manifest and all)
    with ``save_checkpoint``, as someone with the repository at hand would."""
    shutil.copytree(trained, folder)
    state = load_checkpoint(folder)
    spoil(state)
    save_checkpoint(folder, 1, state)
    return folder


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under ``folder``: its size, mtime and sha256."""
    return {
        str(p.relative_to(folder)): (
            p.stat().st_size,
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


TINY = "model.embed_tokens.weight"
CLI_KINDS: dict[str, tuple[Callable[[dict], None], str]] = {
    "int64": (
        put((*POLICY, "weights", TINY), lambda w: w.to(torch.int64)),
        f"policies.shared.weights.{TINY} holds int64 values, not floating point",
    ),
    "nan": (
        put((*POLICY, "weights", TINY), nan_at_first),
        f"policies.shared.weights.{TINY} holds NaN or infinite values",
    ),
    "sparse": (
        put((*POLICY, "weights", TINY), lambda w: w.to_sparse()),
        f"policies.shared.weights.{TINY} is a sparse_coo tensor, not a dense one",
    ),
    "meta": (
        put((*POLICY, "weights", TINY), lambda w: torch.empty_like(w, device="meta")),
        f"policies.shared.weights.{TINY} is a meta tensor (shape only, no values)",
    ),
    "optimizer": (
        put((*OPT, "state", 3), {"step": "many", "exp_avg": [0.0], "exp_avg_sq": None}),
        "policies.shared.learner.optimizer.state.3.step is a str, not a tensor",
    ),
    "emergence": (
        put(("emergence",), {"words": {"solo_a": [["hi", 3]]}, "last": {}}),
        "emergence.words.solo_a is a list, not a mapping",
    ),
    "version": (
        put((*POLICY, "version"), 1.0),
        "policies.shared.version is 1.0; it must be an integer >= 0 and < 2^63",
    ),
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("command", ["train", "eval"])
@pytest.mark.parametrize("kind", list(CLI_KINDS))
def test_the_cli_refuses_each_kind_in_one_line_and_changes_nothing(
    marl_cli,
    trained: Path,
    tmp_path: Path,
    kind: str,
    command: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``marl train resume=`` as a process of its own (Hydra's entry point), ``marl eval``
    through the console script's ``main`` in this process (as tests/marl/test_eval_trust.py
    calls it): the same exit code and standard error a user gets."""
    from marl.cli import main

    spoil, message = CLI_KINDS[kind]
    run = spoilt_copy(trained, tmp_path / "run", spoil)
    before = snapshot(run)
    out = tmp_path / "out"
    if command == "train":
        args = [
            "train", "model=tiny", "scenario=unison", f"resume={run}", "train.steps=2",
            f"hydra.run.dir={out}", "logging.progress=false", "runtime.threads=1",
        ]  # fmt: skip
        done = marl_cli(*args, timeout=300)
        code, stderr = done.returncode, done.stderr
    else:
        code = main(["eval", str(run), "random", "--episodes", "1", "--out", str(out)])
        stderr = capsys.readouterr().err
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, stderr  # the error, and perhaps the machine's load warning
    state_file = run / "checkpoints" / "step_000001" / STATE_FILE
    label = "resume" if command == "train" else "eval"  # errors say which command met them
    assert lines[-1] == f"error: {label}: {state_file}: {message}"
    assert snapshot(run) == before, "the run folder changed"
    # the output folder: nothing of marl's (Hydra keeps its own .hydra and log there)
    made = {p.name for p in out.iterdir()} if out.exists() else set()
    assert made <= {".hydra", "train.log"}, made


def last_state_as_the_output_layers(state: dict) -> None:
    """The last parameter's (the final norm's) AdamW state given the tied output layer's shape:
    every data check passes, for a tied weight is saved but not trained, so the optimizer's
    shapes need only be an in-order selection of the weights'."""
    entry = at(*OPT, "state", 19)(state)
    entry["exp_avg"] = torch.zeros(101, 64)
    entry["exp_avg_sq"] = torch.zeros(101, 64)


def untied_output_layer(state: dict) -> None:
    """The output layer, which the tiny model ties to the embedding, saved with other values:
    loading would keep whichever of the two comes last."""
    weights = at(*POLICY, "weights")(state)
    weights["lm_head.weight"] = weights["lm_head.weight"] + 1.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (
            last_state_as_the_output_layers,
            "the checkpoint's learner state does not fit this model: optimizer.state.19.exp_avg "
            "is float32 (101, 64); its parameter is float32 (64,)",
        ),
        (
            untied_output_layer,
            f"the checkpoint's weights.lm_head.weight differs from weights.{TINY}, which this "
            "model ties it to",
        ),
    ],
    ids=["optimizer", "tied"],
)
def test_a_state_that_does_not_fit_the_built_model_is_refused_before_it_loads(
    trained: Path, tmp_path: Path, spoil: Callable[[dict], None], problem: str
) -> None:
    """What only the built model can tell (which weight each AdamW state steps; which weights
    are one tensor) is checked before the learner loads anything."""
    run = spoilt_copy(trained, tmp_path / "run", spoil)
    load_checkpoint(run)  # the data checks pass
    config = tiny_config(**{"train.steps": 2}, resume=str(run))
    with pytest.raises(RunError) as info:
        train(config, run_dir=tmp_path / "resumed")
    assert str(info.value) == f"resume: policy 'shared': {problem}"


# --- the fuzz -----------------------------------------------------------------------------------


def tensors(node: object, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(node, torch.Tensor):
        yield path
    elif isinstance(node, dict):
        for key, item in node.items():
            yield from tensors(item, (*path, key))
    elif isinstance(node, (list, tuple)) and len(node) <= 16:
        for i, item in enumerate(node):
            yield from tensors(item, (*path, i))


def nodes(node: object, path: tuple = ()) -> Iterator[tuple]:
    """Every field below the root (a long list, such as a generator's words, is one field)."""
    if path:
        yield path
    if isinstance(node, dict):
        for key, item in node.items():
            yield from nodes(item, (*path, key))
    elif isinstance(node, list) and len(node) <= 16:
        for i, item in enumerate(node):
            yield from nodes(item, (*path, i))


def replace(state: dict, path: tuple, value: object) -> None:
    parent = at(*path[:-1])(state)
    if isinstance(parent, tuple):  # a tuple field: rebuild it in its parent
        items = list(parent)
        items[path[-1]] = value
        replace(state, path[:-1], tuple(items))
    else:
        parent[path[-1]] = value


JUNK = ["x", "", None, [], [1, 2], True, False, 2**70, -1, 0, 1.5, math.nan, math.inf, {}, {"a": 1}]
DTYPES = [torch.int64, torch.int32, torch.float64, torch.float16, torch.bfloat16, torch.bool,
          torch.complex64, torch.uint8]  # fmt: skip


def mutate_tensor(t: torch.Tensor, rng: random.Random) -> torch.Tensor:
    how = rng.choice(["dtype", "shape", "nan", "sparse", "meta", "expand", "values", "scalar"])
    if how == "dtype":
        return t.to(rng.choice(DTYPES))
    if how == "shape":
        options = [t.reshape(-1), t.unsqueeze(0), torch.zeros(rng.randint(1, 9), 3)]
        if t.numel() > 1:
            options.append(t.reshape(-1)[:-1])
        if t.dim() == 2:
            options.append(t.t().contiguous())
        return rng.choice(options)
    if how == "nan" and t.is_floating_point() and t.numel():
        spoilt = t.clone()
        spoilt.view(-1)[rng.randrange(t.numel())] = rng.choice([math.nan, math.inf, -math.inf])
        return spoilt
    if how == "sparse" and t.dim():
        return t.to_sparse()
    if how == "meta":
        return torch.empty_like(t, device="meta")
    if how == "expand" and t.numel() > 1:
        return t.reshape(-1)[:1].expand(t.shape)
    if how == "scalar":
        return torch.tensor(rng.choice([0.0, 1.0, -1.0, 2.5]))
    if t.is_floating_point():  # new finite values: a change a checkpoint may hold
        return t + torch.rand(t.shape, generator=torch.Generator().manual_seed(rng.randrange(99)))
    return t.clone()


def mutate_state(state: dict, rng: random.Random) -> str:
    """Change ``state`` in place one random way; returns what was done."""
    how = rng.choice(["tensor", "tensor", "tensor", "replace", "drop", "add", "swap", "number",
                      "bfloat16", "alias"])  # fmt: skip
    fields = list(nodes(state))
    if how == "tensor":
        path = rng.choice(list(tensors(state)))
        replace(state, path, mutate_tensor(at(*path)(state), rng))
    elif how == "replace":
        path = rng.choice(fields)
        replace(state, path, copy.deepcopy(rng.choice(JUNK + [torch.ones(2)])))
    elif how in ("drop", "add", "swap"):
        parents = [p for p in [(), *fields] if isinstance(at(*p)(state), dict) and at(*p)(state)]
        path = rng.choice(parents)
        parent = at(*path)(state)
        keys = list(parent)
        if how == "drop":
            del parent[rng.choice(keys)]
        elif how == "add":
            key = rng.choice(["bogus", 7, "weights", "exp_avg", "step", "", "master", "reference"])
            parent[key] = copy.deepcopy(rng.choice(JUNK + [torch.ones(2)]))
        elif len(keys) > 1:
            a, b = rng.sample(keys, 2)
            parent[a], parent[b] = parent[b], parent[a]
    elif how == "number":
        numbers = [p for p in fields if isinstance(at(*p)(state), (int, float))]
        path = rng.choice(numbers)
        old = at(*path)(state)
        replace(state, path, rng.choice([old + 1, old * 2, -old, 0, math.nan, 10**30]))
    elif how == "bfloat16":  # a whole policy in bfloat16: what a GPU run's checkpoint holds
        weights = state["policies"]["shared"]["weights"]
        for name in weights:
            weights[name] = weights[name].bfloat16()
    else:  # two optimizer tensors share one memory
        paths = [p for p in tensors(state) if "optimizer" in p]
        a, b = rng.sample(paths, 2)
        replace(state, b, at(*a)(state))
    return how


def mutate_bytes(payload: bytes, rng: random.Random) -> tuple[bytes, str]:
    how = rng.choice(["truncate", "flip", "append", "cut"])
    data = bytearray(payload)
    if how == "truncate":
        return bytes(data[: rng.randrange(len(data))]), how
    if how == "flip":
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        return bytes(data), how
    if how == "append":
        return bytes(data) + rng.randbytes(rng.randint(1, 64)), how
    start = rng.randrange(len(data))
    return bytes(data[:start] + data[start + rng.randint(1, 512) :]), how


def same(saved: object, loaded: object, path: str = "") -> None:
    """``loaded`` is ``saved`` bit for bit (a tensor may be held in a wider float type that
    holds each saved value exactly: bfloat16 weights in a float32 model)."""
    if isinstance(saved, torch.Tensor):
        assert isinstance(loaded, torch.Tensor), path
        assert saved.shape == loaded.shape, path
        if saved.dtype != loaded.dtype:
            assert saved.to(loaded.dtype).to(saved.dtype).equal(saved), path
        assert torch.equal(saved.to(loaded.dtype), loaded), path
    elif isinstance(saved, dict):
        assert isinstance(loaded, dict) and set(saved) == set(loaded), path
        for key in saved:
            same(saved[key], loaded[key], f"{path}.{key}")
    elif isinstance(saved, (list, tuple)):
        assert type(saved) is type(loaded) and len(saved) == len(loaded), path
        for i, (a, b) in enumerate(zip(saved, loaded)):
            same(a, b, f"{path}.{i}")
    else:
        assert type(saved) is type(loaded) and (saved == loaded or saved != saved), path


def resume_into(runtime: Any, config: Any, tracker: Any, directory: Path) -> dict:
    """What ``train`` does with ``resume=directory`` before its first step: load and check the
    checkpoint, then load it into the built runtime, the generators and the emergence tracker."""
    state = load_checkpoint(directory)
    check_resume(state, config)
    check_weights(state["policies"], runtime.state(), state.get("config"), config)
    runtime.load_state(state["policies"])
    set_rng_states(state["rng"])
    tracker.load_state_dict(state.get("emergence"))
    return state


def loaded_as_saved(state: dict, runtime: Any, tracker: Any) -> None:
    """Every tensor and number the runtime holds now is the checkpoint's."""
    saved = state["policies"]["shared"]
    now = runtime.state()["shared"]
    assert now["kind"] == saved.get("kind", "full")
    assert now["version"] == saved.get("version", 0)
    same(saved["weights"], now["weights"], "weights")
    learner, held = saved["learner"], now["learner"]
    same(learner["optimizer"]["state"], held["optimizer"]["state"], "optimizer.state")
    group, live = learner["optimizer"]["param_groups"][0], held["optimizer"]["param_groups"][0]
    assert {k: live[k] for k in group} == group
    assert live.keys() - group.keys() <= {"decoupled_weight_decay"}
    assert held["rng"] == learner["rng"]
    assert held["nonfinite_in_a_row"] == learner.get("nonfinite_in_a_row", 0)
    assert "master" not in learner and "master" not in held  # a float32 model
    emergence = state.get("emergence")
    if emergence:
        assert tracker.state_dict() == {
            "words": emergence.get("words"),
            "last": dict(emergence.get("last") or {}),
        }


@pytest.mark.slow
def test_every_mutation_of_a_real_checkpoint_loads_bit_exact_or_is_refused_in_one_line(
    trained: Path, tmp_path: Path
) -> None:
    from marl.analysis.emergence import tracker_for
    from marl.config import load_config
    from marl.runtime.local import LocalRuntime
    from marl.runtime.policy_map import plan_for

    config = load_config(tiny_config(**{"train.steps": 2}))
    runtime = LocalRuntime(config, plan_for(config))
    tracker = tracker_for(config, runtime.influence)
    original = load_checkpoint(trained)
    buffer = io.BytesIO()
    torch.save(original, buffer)
    payload = buffer.getvalue()
    rng = random.Random(42)
    outcomes: dict[str, int] = {}
    generators = rng_states()
    try:
        for i in range(200):
            directory = tmp_path / f"m{i:03d}"
            state = copy.deepcopy(original)
            if rng.random() < 0.2:
                data, how = mutate_bytes(payload, rng)
                write_bytes(directory, data)
                state = None
            else:
                how = mutate_state(state, rng)
                step = state.get("step")  # the manifest says what the state says, if it can
                write_state(directory, state, step if is_int(step) and step >= 0 else 1)
            try:
                loaded = resume_into(runtime, config, tracker, directory)
            except RunError as exc:
                line = str(exc)
                assert "\n" not in line and len(line) < 400, f"{how}: {line}"
                assert "state.pt" in line or "manifest.json" in line or "policy" in line, line
                outcomes[f"{how}: refused"] = outcomes.get(f"{how}: refused", 0) + 1
                continue
            if state is not None:
                same(state, loaded, "state")  # the file holds what was saved
            loaded_as_saved(loaded, runtime, tracker)
            outcomes[f"{how}: loaded"] = outcomes.get(f"{how}: loaded", 0) + 1
    finally:
        set_rng_states(generators)
        runtime.close()
    print(sorted(outcomes.items()))
    refused = sum(n for k, n in outcomes.items() if k.endswith("refused"))
    assert refused >= 100 and 200 - refused >= 10, outcomes  # both ways, many times
