"""Every field of a checkpoint's ``state.pt``, checked before anything is built or loaded.

``marl train`` saves one state (:func:`marl.loop.trackers.checkpoint_state`); ``marl train
train.resume=...`` and ``marl eval`` read it back through :func:`check_state`, which refuses a
state that this code could not have written, in one line naming the field
(``policies.shared.learner.optimizer.state.3.exp_avg has shape (4, 8) != its parameter's
(8, 8) (weights.model.layers.0.self_attn.v_proj.weight)``). A state that passes loads as saved:
no field is cast to another type, broadcast to another shape or dropped on the way in, but for
what the run itself asks (a float32 checkpoint resumed into a bfloat16 model is rounded; role
baselines and a league are read only by a run that has them). The layout, field by field:

- ``step`` (an int, 0 to 10^18 - 1, equal to the manifest's), ``scenario`` (a string),
  ``config`` (plain data: dicts with string keys, lists, strings, numbers, None).
- ``rng``: ``python``, ``numpy`` and ``torch`` generator states, each of the type and size its
  generator takes.
- ``policies.<id>``: ``kind`` (``full`` or ``adapter``), ``version`` (an int >= 0), and
  ``weights``: named tensors, each dense, on the CPU, finite, float32 or bfloat16, one dtype per
  policy (:func:`tensor_problem`).
- ``policies.<id>.learner``: ``rng`` (a Python random state), ``nonfinite_in_a_row`` (an int
  >= 0), ``master`` (float32 copies of bfloat16 weights, in their order), ``reference`` (the
  KL reference model: the weights' names, shapes and dtypes), and ``optimizer``: AdamW's one
  parameter group (its settings' types and ranges, the flags marl's AdamW runs with, parameters
  0..N-1) and per parameter ``step`` (a whole, finite count >= 0), ``exp_avg`` and
  ``exp_avg_sq`` (float32, dense, finite, the second >= 0, no two sharing memory), whose shape
  is its parameter's: the master's of the same index, else the weight's in the same place.
- ``emergence`` (``words``: counts per key, ``last``: numbers per tag), ``advantage`` (the role
  baselines: ``decay``, ``baselines``, ``updates`` over the same roles) and ``league`` (the
  pool's snapshots, the records, the result windows and the Elo table), each optional.

Unknown fields are refused too: a typo'd or foreign key is not silently dropped.

Which tensor of the model each optimizer state steps is known for certain only once the model
is built; :func:`learner_fit_problem` checks that (every shape, the parameter count) before the
learner loads anything, for the rare state that passes here and would not fit.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marl.errors import RunError
from marl.protocols.values import is_finite_number, is_int
from marl.scenarios.problems import short

__all__ = [
    "check_state",
    "learner_fit_problem",
    "state_problem",
    "tensor_problem",
    "tied_weights_problem",
]

MAX_STEP = 10**18 - 1  # a step folder is step_<up to 18 digits>
MAX_COUNT = 2**63 - 1  # counts and versions fit an int64
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)  # what ModelSpec.dtype resolves to
LOW_PRECISION = (torch.bfloat16, torch.float16)  # weights that get fp32 masters
LEAGUE_RESULTS = ("win", "draw", "loss")  # marl.competition.league.RESULTS (a test compares)
MAX_DEPTH = 32  # nesting of a saved config
TOP_FIELDS = ("policies", "rng", "step", "config", "emergence", "advantage", "league", "scenario")
ADAM_STATE = ("step", "exp_avg", "exp_avg_sq")


class _Bad(Exception):
    """A field that no checkpoint of this code holds: ``path`` names it, ``what`` says why."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path} {what}".strip())


def check_state(
    state: object,
    source: str | Path,
    manifest_step: int | None = None,
    extra_fields: Sequence[str] = (),
) -> None:
    """Raise one :class:`RunError` line (``resume: <source>: <field> ...``) unless ``state`` is
    a checkpoint state as ``marl train`` writes it (:func:`state_problem`)."""
    problem = state_problem(state, manifest_step, extra_fields)
    if problem:
        raise RunError(f"resume: {source}: {problem}")


def state_problem(
    state: object, manifest_step: int | None = None, extra_fields: Sequence[str] = ()
) -> str:
    """The first field of ``state`` that no checkpoint of this code holds, as one line naming
    it ("" when every field checks out); ``manifest_step``: the step ``manifest.json`` says.
    ``extra_fields``: top-level fields a registered tracker adds (``marl.loop.trackers``); each
    must hold plain data (as ``config``: string keys, lists, numbers, strings, None)."""
    try:
        _state(state, manifest_step, tuple(extra_fields))
    except _Bad as bad:
        return str(bad)
    return ""


def tensor_problem(value: object) -> str:
    """Why ``value`` cannot be a model weight ("" when it can): not a tensor, sparse or another
    layout, a meta tensor (no data) or one off the CPU, integer or complex values, a float type
    no model of marl has (float32 and bfloat16 only), or NaN / infinite entries. Checked before
    anything loads: a weight cast to int64 once resumed as a zeroed model."""
    problem = _tensor_form(value)
    if problem:
        return problem
    assert isinstance(value, torch.Tensor)
    if not value.is_floating_point():
        return f"holds {_dtype(value.dtype)} values, not floating point"
    if value.dtype not in WEIGHT_DTYPES:
        return f"holds {_dtype(value.dtype)} values; a model's weights are float32 or bfloat16"
    if not bool(torch.isfinite(value).all()):
        return "holds NaN or infinite values"
    return ""


def learner_fit_problem(
    state: Mapping[str, Any], params: Sequence[torch.Tensor], masters: Sequence[torch.Tensor]
) -> str:
    """Why a learner state that :func:`check_state` passed does not fit the model built for it
    ("" when it does): the optimizer's parameter count, each ``exp_avg`` / ``exp_avg_sq`` shape
    and dtype against the parameter of its index (``params``: what the optimizer steps), and the
    saved masters against ``masters``. Cheap: shapes only, before anything loads."""
    groups = state["optimizer"]["param_groups"]
    count = sum(len(group["params"]) for group in groups)
    if len(groups) != 1 or count != len(params):
        return (
            f"optimizer.param_groups holds {count} parameters in {len(groups)} group(s); this "
            f"model trains {len(params)} in 1"
        )
    for index, entry in sorted(state["optimizer"]["state"].items()):
        param = params[index]
        for key in ADAM_STATE[1:]:
            value = entry[key]
            if tuple(value.shape) != tuple(param.shape) or value.dtype != param.dtype:
                return (
                    f"optimizer.state.{index}.{key} is {_dtype(value.dtype)} {_shape(value)}; "
                    f"its parameter is {_dtype(param.dtype)} {_shape(param)}"
                )
    saved = state.get("master")
    if saved is not None:
        if len(saved) != len(masters):
            return f"master holds {len(saved)} tensors; this model has {len(masters)}"
        for index, (value, master) in enumerate(zip(saved, masters)):
            if tuple(value.shape) != tuple(master.shape):
                return f"master.{index} has shape {_shape(value)} != its weight's {_shape(master)}"
    return ""


def tied_weights_problem(weights: Mapping[str, torch.Tensor], model: torch.nn.Module) -> str:
    """Why ``weights`` (a full model's, checked by :func:`check_state`) would not load as saved
    into ``model`` ("" when they would): two names that ``model`` ties to one tensor (an output
    layer tied to the embedding) saved with different values, of which loading keeps the last."""
    first: dict[int, str] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        owner = first.setdefault(id(tensor), name)
        if owner == name or name not in weights or owner not in weights:
            continue
        saved, other = weights[name], weights[owner]
        if saved.shape != other.shape or not torch.equal(saved, other):
            return f"weights.{name} differs from weights.{owner}, which this model ties it to"
    return ""


# --- the state ----------------------------------------------------------------------------------


def _state(state: object, manifest_step: int | None, extra_fields: tuple[str, ...] = ()) -> None:
    if not isinstance(state, dict):
        raise _Bad("", f"holds a {type(state).__name__}, not a checkpoint state")
    extra_fields = tuple(k for k in dict.fromkeys(extra_fields) if k not in TOP_FIELDS)
    _fields(state, "", TOP_FIELDS + extra_fields, required=("step",))
    for key in extra_fields:  # a registered tracker's state: plain data only
        if key in state:
            _plain(state[key], key, 0)
    step = state["step"]
    if not is_int(step) or not 0 <= step <= MAX_STEP:
        raise _Bad("step", f"is {short(step)}; it must be an integer >= 0 and < 10^18")
    if manifest_step is not None and step != manifest_step:
        raise _Bad("step", f"is {step} but manifest.json says {manifest_step}")
    _rng(state.get("rng"))
    policies = state.get("policies")
    if not isinstance(policies, dict) or not policies:
        raise _Bad("policies", f"is {short(policies)}: the state holds no policy states")
    for pid, policy in policies.items():
        _policy(policy, _at("policies", pid))
    if state.get("config") is not None:
        if not isinstance(state["config"], dict):
            raise _Bad("config", f"is {_a(state['config'])}, not a mapping")
        _plain(state["config"], "config", 0)
    if state.get("scenario") is not None and not isinstance(state["scenario"], str):
        raise _Bad("scenario", f"is {_a(state['scenario'])}, not a scenario name")
    _emergence(state.get("emergence"), "emergence")
    _advantage(state.get("advantage"), "advantage")
    _league(state.get("league"), "league")


def _fields(
    value: Mapping[Any, Any], path: str, known: Sequence[str], required: Sequence[str] = ()
) -> None:
    """``value``'s keys are among ``known`` and hold every one of ``required``."""
    for key in value:
        if key not in known:
            raise _Bad(
                _at(path, key), f"is not a field of a checkpoint (known: {', '.join(known)})"
            )
    for key in required:
        if key not in value:
            raise _Bad(_at(path, key), "is missing")


def _at(path: str, key: object) -> str:
    """``path.key``, the key as it is when it is a short printable string, else its repr."""
    if isinstance(key, str) and key and key.isprintable() and len(key) <= 80:
        name = key
    elif is_int(key):
        name = str(key)
    else:
        name = short(key, 40)
    return f"{path}.{name}" if path else name


def _a(value: object) -> str:
    """``a str``, ``an int``, ``None``: what a value is, for a message."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _an(dtype: torch.dtype) -> str:
    """``a float32``, ``an int64``."""
    name = _dtype(dtype)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(value: torch.Tensor) -> str:
    return str(tuple(value.shape))


def _mapping(value: object, path: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise _Bad(path, f"is {_a(value)}, not a mapping")
    return value


def _count(value: object, path: str, low: int = 0, high: int = MAX_COUNT) -> int:
    if not is_int(value) or not low <= value <= high:  # type: ignore[operator]
        top = {MAX_COUNT: "< 2^63", MAX_STEP: "< 10^18"}.get(high, f"<= {high}")
        raise _Bad(path, f"is {short(value)}; it must be an integer >= {low} and {top}")
    return value  # type: ignore[return-value]


def _number(value: object, path: str, low: float = -math.inf, high: float = math.inf) -> float:
    if not is_finite_number(value) or not low <= float(value) <= high:  # type: ignore[arg-type]
        bounds = (f" >= {low:g}" if low > -math.inf else "") + (
            f" and <= {high:g}" if high < math.inf else ""
        )
        raise _Bad(path, f"is {short(value)}; it must be a finite number{bounds}")
    return float(value)  # type: ignore[arg-type]


def _names(value: object, path: str) -> dict[str, Any]:
    """A mapping whose keys are non-empty strings."""
    mapping = _mapping(value, path)
    for key in mapping:
        if not isinstance(key, str) or not key:
            raise _Bad(_at(path, key), "is not a name (a non-empty string)")
    return mapping


def _plain(value: object, path: str, depth: int) -> None:
    """Plain data: dicts with string keys, lists, tuples, strings, numbers, None."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return
    if depth >= MAX_DEPTH:
        raise _Bad(path, f"nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise _Bad(_at(path, key), "is not a name (a string key)")
            _plain(item, _at(path, key), depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _plain(item, _at(path, index), depth + 1)
    else:
        raise _Bad(path, f"is {_a(value)}, not plain data (dicts, lists, strings, numbers)")


# --- tensors ------------------------------------------------------------------------------------


def _tensor_form(value: object) -> str:
    """Why ``value`` is no dense CPU tensor with data ("" when it is one)."""
    if not isinstance(value, torch.Tensor):
        return f"is {_a(value)}, not a tensor"
    if value.layout != torch.strided:
        return f"is a {str(value.layout).removeprefix('torch.')} tensor, not a dense one"
    if value.is_meta:
        return "is a meta tensor (shape only, no values)"
    if value.device.type != "cpu":
        return f"is on {value.device}, not the CPU"
    return ""


def _weight(value: object, path: str) -> torch.Tensor:
    problem = tensor_problem(value)
    if problem:
        raise _Bad(path, problem)
    return value  # type: ignore[return-value]


def _float32(value: object, path: str, what: str) -> torch.Tensor:
    """A dense, non-overlapping, finite float32 tensor: an optimizer state (stepped in place as
    loaded: an expanded, stride-0 one fails the first step) or a master weight."""
    problem = _tensor_form(value)
    if problem:
        raise _Bad(path, problem)
    assert isinstance(value, torch.Tensor)
    if value.dtype != torch.float32:
        raise _Bad(path, f"holds {_dtype(value.dtype)} values; {what} is float32")
    if not _non_overlapping(value):
        raise _Bad(path, f"has strides {tuple(value.stride())} that overlap; {what} is dense")
    if not bool(torch.isfinite(value).all()):
        raise _Bad(path, "holds NaN or infinite values")
    return value


def _non_overlapping(value: torch.Tensor) -> bool:
    """Whether no two elements of ``value`` share memory (contiguous in some dimension order)."""
    order = sorted(range(value.dim()), key=lambda d: value.stride(d), reverse=True)
    return value.permute(order).is_contiguous()


# --- generators ---------------------------------------------------------------------------------


def _rng(rng: object, path: str = "rng") -> None:
    if not isinstance(rng, dict):
        raise _Bad(path, "must hold the python, numpy and torch generator states")
    _fields(rng, path, ("python", "numpy", "torch"), ("python", "numpy", "torch"))
    _python_rng(rng["python"], f"{path}.python")
    _numpy_rng(rng["numpy"], f"{path}.numpy")
    value = rng["torch"]
    problem = _tensor_form(value)
    if not problem and (value.dtype != torch.uint8 or value.dim() != 1):
        problem = f"is {_an(value.dtype)} tensor of shape {_shape(value)}, not uint8 bytes"
    if problem:
        raise _Bad(f"{path}.torch", problem)
    try:
        torch.Generator().set_state(value)
    except Exception:  # noqa: BLE001 - any refusal is the same line
        raise _Bad(f"{path}.torch", "is not a torch random state") from None


def _python_rng(value: object, path: str) -> None:
    """``random.getstate()``'s tuple: (3, 625 ints, None or a float), which a generator takes."""
    ok = (
        isinstance(value, tuple)
        and len(value) == 3
        and is_int(value[0])
        and value[0] == 3
        and isinstance(value[1], tuple)
        and all(is_int(word) for word in value[1])
        and (value[2] is None or isinstance(value[2], float))
    )
    try:
        if ok:
            random.Random().setstate(value)
    except Exception:  # noqa: BLE001 - any refusal is the same line
        ok = False
    if not ok:
        raise _Bad(path, "is not a Python random state")


def _numpy_rng(value: object, path: str) -> None:
    ok = isinstance(value, (list, tuple)) and len(value) == 5
    if ok:
        kind, key, pos, has_gauss, cached = value  # type: ignore[misc]
        ok = (
            kind == "MT19937"
            and isinstance(key, (list, tuple))
            and len(key) == 624
            and all(is_int(k) and 0 <= k < 2**32 for k in key)
            and is_int(pos)
            and 0 <= pos <= 624
            and is_int(has_gauss)
            and has_gauss in (0, 1)
            and is_finite_number(cached)
        )
    if ok:
        try:
            np.random.RandomState().set_state(value)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001
            ok = False
    if not ok:
        raise _Bad(path, "is not a NumPy random state")


# --- a policy -----------------------------------------------------------------------------------


def _policy(value: object, path: str) -> None:
    policy = _mapping(value, path)
    _fields(policy, path, ("kind", "weights", "learner", "version"), ("weights", "learner"))
    kind = policy.get("kind", "full")
    if kind not in ("full", "adapter"):
        raise _Bad(f"{path}.kind", f"is {short(kind)}; it must be 'full' or 'adapter'")
    if "version" in policy:
        _count(policy["version"], f"{path}.version")
    weights = _names(policy["weights"], f"{path}.weights")
    if not weights:
        raise _Bad(f"{path}.weights", "is empty")
    dtype = None
    for name, tensor in weights.items():
        tensor = _weight(tensor, _at(f"{path}.weights", name))
        if dtype is not None and tensor.dtype != dtype:
            raise _Bad(
                _at(f"{path}.weights", name),
                f"holds {_dtype(tensor.dtype)} values where the policy's other weights hold "
                f"{_dtype(dtype)}; a model has one dtype",
            )
        dtype = tensor.dtype
    _learner(policy["learner"], f"{path}.learner", kind, weights)


def _learner(value: object, path: str, kind: str, weights: dict[str, torch.Tensor]) -> None:
    learner = _mapping(value, path)
    known = ("optimizer", "rng", "nonfinite_in_a_row", "master", "reference")
    _fields(learner, path, known, ("optimizer", "rng"))
    _python_rng(learner["rng"], f"{path}.rng")
    if "nonfinite_in_a_row" in learner:
        _count(learner["nonfinite_in_a_row"], f"{path}.nonfinite_in_a_row")
    masters = (
        _masters(learner["master"], f"{path}.master", weights) if "master" in learner else None
    )
    if "reference" in learner:
        _reference(learner["reference"], f"{path}.reference", kind, weights)
    _optimizer(learner["optimizer"], f"{path}.optimizer", weights, masters)


def _masters(value: object, path: str, weights: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """fp32 copies of the low-precision weights, in the weights' order."""
    if not isinstance(value, (list, tuple)):
        raise _Bad(path, f"is {_a(value)}, not a list of tensors")
    low = [(f"weights.{name}", w) for name, w in weights.items() if w.dtype in LOW_PRECISION]
    if not low:
        raise _Bad(path, "is saved, but the weights are float32 (masters copy bfloat16 weights)")
    if not value or len(value) > len(low):
        raise _Bad(path, f"holds {len(value)} tensors for the {len(low)} bfloat16 weights")
    masters = [_float32(t, _at(path, i), "a master weight") for i, t in enumerate(value)]
    _align([tuple(m.shape) for m in masters], low, path, "its weight's")
    return masters


def _reference(value: object, path: str, kind: str, weights: dict[str, torch.Tensor]) -> None:
    """The KL reference: a copy of the full model, the weights' names, shapes and dtypes."""
    if kind != "full":
        raise _Bad(path, "is saved for a LoRA adapter, whose KL reference is its base model")
    reference = _names(value, path)
    if set(reference) != set(weights):
        extra = sorted(set(reference) - set(weights)) or sorted(set(weights) - set(reference))
        which = "is not among the weights" if extra[0] in reference else "is missing"
        raise _Bad(_at(path, extra[0]), which)
    for name, tensor in reference.items():
        tensor = _weight(tensor, _at(path, name))
        like = weights[name]
        if tensor.shape != like.shape or tensor.dtype != like.dtype:
            raise _Bad(
                _at(path, name),
                f"is {_dtype(tensor.dtype)} {_shape(tensor)}; the weight is "
                f"{_dtype(like.dtype)} {_shape(like)}",
            )


def _align(
    shapes: Sequence[tuple[int, ...] | None],
    candidates: Sequence[tuple[str, torch.Tensor]],
    path: str,
    whose: str,
    key: str = "",
) -> None:
    """Each entry of ``shapes`` (None: any) has the shape of its tensor among ``candidates``:
    the one in the same place when there are as many, else one of an in-order selection (a
    tied output layer is saved as a weight but trained as one parameter with the embedding).
    The message names the first entry whose tensor in the same place differs."""
    if len(shapes) > len(candidates):
        raise _Bad(path, f"has {len(shapes)} entries for {len(candidates)} tensors")
    mismatch = next(
        (i for i, s in enumerate(shapes) if s is not None and s != tuple(candidates[i][1].shape)),
        None,
    )
    if mismatch is None:
        return
    if len(shapes) < len(candidates):  # an in-order selection may still fit
        place = 0
        for shape in shapes:
            while place < len(candidates) and shape not in (
                None,
                tuple(candidates[place][1].shape),
            ):
                place += 1
            if place == len(candidates):
                break
            place += 1
        else:
            return
    name, tensor = candidates[mismatch]
    field = f"{path}.{mismatch}{key}"
    raise _Bad(field, f"has shape {shapes[mismatch]} != {whose} {_shape(tensor)} ({name})")


# --- the optimizer ------------------------------------------------------------------------------


@functools.cache
def _adamw_defaults() -> dict[str, Any]:
    """The settings of one AdamW parameter group in this torch, with their defaults."""
    group = torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).param_groups[0]
    return {k: v for k, v in group.items() if k != "params"}


# Set as marl's AdamW sets them (marl.runtime.learner._adamw): a different value would change
# the update silently (maximize: ascend the loss) or fail on the first step (capturable on CPU).
_FIXED_FLAGS = ("amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")
_CHOICE_FLAGS = ("foreach", "fused")  # None (torch picks) or a bool
# what every AdamW state_dict of torch 2.x holds (a missing flag would fall back to torch's
# default, fused=None included: another kernel than the run used); newer settings may be absent
_GROUP_REQUIRED = (
    "params", "lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach",
    "capturable", "differentiable", "fused",
)  # fmt: skip


def _optimizer(
    value: object,
    path: str,
    weights: dict[str, torch.Tensor],
    masters: list[torch.Tensor] | None,
) -> None:
    optimizer = _mapping(value, path)
    _fields(optimizer, path, ("state", "param_groups"), ("state", "param_groups"))
    groups = optimizer["param_groups"]
    if not isinstance(groups, (list, tuple)) or len(groups) != 1:
        shown = len(groups) if isinstance(groups, (list, tuple)) else _a(groups)
        raise _Bad(f"{path}.param_groups", f"holds {shown} groups; marl's AdamW has one")
    count = _param_group(groups[0], f"{path}.param_groups.0")
    if count > len(weights):
        raise _Bad(
            f"{path}.param_groups.0.params",
            f"names {count} parameters, more than the policy's {len(weights)} weights",
        )
    states = _mapping(optimizer["state"], f"{path}.state")
    shapes: list[tuple[int, ...] | None] = [None] * count
    seen: dict[int, str] = {}
    for index, entry in states.items():
        where = _at(f"{path}.state", index)
        if not is_int(index) or not 0 <= index < count:
            raise _Bad(where, f"names no parameter (param_groups.0.params is 0 to {count - 1})")
        shapes[index] = _adam_state(entry, where, seen)
    if masters is not None and len(masters) == count:  # bfloat16: a master per parameter
        pairs = [(f"master {i}", m) for i, m in enumerate(masters)]
        _align(shapes, pairs, f"{path}.state", "its parameter's", ".exp_avg")
    else:
        pairs = [(f"weights.{name}", w) for name, w in weights.items()]
        _align(shapes, pairs, f"{path}.state", "its parameter's", ".exp_avg")


def _param_group(value: object, path: str) -> int:
    """Check one AdamW parameter group; returns how many parameters it names."""
    group = _mapping(value, path)
    defaults = _adamw_defaults()
    _fields(group, path, ("params", *defaults), _GROUP_REQUIRED)
    for key, item in group.items():
        where = _at(path, key)
        if key == "params":
            if not isinstance(item, (list, tuple)) or list(item) != list(range(len(item))):
                raise _Bad(where, "must be 0, 1, ... (the parameters' indices, in order)")
            if not all(is_int(i) for i in item):
                raise _Bad(where, "must hold integers")
        elif key in ("lr", "weight_decay"):
            _number(item, where, 0.0)
        elif key == "eps":
            if _number(item, where, 0.0) <= 0:
                raise _Bad(where, f"is {short(item)}; it must be > 0")
        elif key == "betas":
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise _Bad(where, f"is {short(item)}, not a pair of numbers")
            for i, beta in enumerate(item):
                if _number(beta, f"{where}.{i}", 0.0, 1.0) >= 1.0:
                    raise _Bad(f"{where}.{i}", f"is {short(beta)}; it must be < 1")
        elif key in _CHOICE_FLAGS:
            if item is not None and not isinstance(item, bool):
                raise _Bad(where, f"is {short(item)}; it must be true, false or None")
        elif key in _FIXED_FLAGS or isinstance(defaults[key], bool):
            if item is not defaults[key]:
                raise _Bad(where, f"is {short(item)}; marl's AdamW runs with {defaults[key]!r}")
        elif defaults[key] is None:
            if item is not None and not isinstance(item, bool):
                raise _Bad(where, f"is {short(item)}; it must be true, false or None")
        elif is_finite_number(defaults[key]):
            _number(item, where)
        elif item != defaults[key]:
            raise _Bad(where, f"is {short(item)}; this torch's AdamW has {short(defaults[key])}")
    return len(group["params"])


def _adam_state(value: object, path: str, seen: dict[int, str]) -> tuple[int, ...]:
    """One parameter's AdamW state; returns its shape. ``seen``: the memory of the optimizer's
    tensors checked so far (each must have its own)."""
    entry = _mapping(value, path)
    _fields(entry, path, ADAM_STATE, ADAM_STATE)
    step = entry["step"]
    problem = _tensor_form(step)
    if not problem and (step.dim() != 0 or not step.is_floating_point()):
        problem = f"is {_an(step.dtype)} tensor of shape {_shape(step)}, not a 0-dim float"
    if not problem:
        count = float(step)
        if not math.isfinite(count) or count < 0 or count != math.floor(count):
            problem = f"is {count}; it must be a whole count >= 0"
    if problem:
        raise _Bad(f"{path}.step", problem)
    exp_avg = _float32(entry["exp_avg"], f"{path}.exp_avg", "AdamW's state")
    exp_avg_sq = _float32(entry["exp_avg_sq"], f"{path}.exp_avg_sq", "AdamW's state")
    if exp_avg_sq.shape != exp_avg.shape:
        raise _Bad(
            path,
            f"has exp_avg {_shape(exp_avg)} and exp_avg_sq {_shape(exp_avg_sq)}; both must have "
            "the shape of its parameter",
        )
    if bool((exp_avg_sq < 0).any()):
        raise _Bad(f"{path}.exp_avg_sq", "holds negative values (a mean of squares)")
    for key in ADAM_STATE:  # torch steps these tensors in place, as loaded: none may alias
        ptr = entry[key].untyped_storage().data_ptr()
        if ptr and ptr in seen:
            raise _Bad(f"{path}.{key}", f"shares memory with {seen[ptr]}")
        seen[ptr] = f"{path}.{key}"
    return tuple(exp_avg.shape)


# --- the measures' states -----------------------------------------------------------------------


def _emergence(value: object, path: str) -> None:
    """:meth:`marl.analysis.emergence.EmergenceTracker.state_dict` (None: saved before it)."""
    if value is None:
        return
    state = _mapping(value, path)
    _fields(state, path, ("words", "last"))
    if state.get("words") is not None:
        for key, counts in _names(state["words"], f"{path}.words").items():
            where = _at(f"{path}.words", key)
            for word, count in _names(counts, where).items():
                _number(count, _at(where, word), 0.0)
    if state.get("last") is not None:
        for tag, number in _names(state["last"], f"{path}.last").items():
            if not isinstance(number, (int, float)) or isinstance(number, bool):
                raise _Bad(_at(f"{path}.last", tag), f"is {short(number)}, not a number")


def _advantage(value: object, path: str) -> None:
    """:meth:`credit.advantages.RoleBaselines.state_dict`."""
    if value is None:
        return
    state = _mapping(value, path)
    _fields(state, path, ("decay", "baselines", "updates"), ("decay", "baselines", "updates"))
    if _number(state["decay"], f"{path}.decay", 0.0, 1.0) >= 1.0:
        raise _Bad(f"{path}.decay", f"is {short(state['decay'])}; it must be < 1")
    baselines = _names(state["baselines"], f"{path}.baselines")
    updates = _names(state["updates"], f"{path}.updates")
    for role, baseline in baselines.items():
        _number(baseline, _at(f"{path}.baselines", role))
    for role, count in updates.items():
        _count(count, _at(f"{path}.updates", role))
    if set(baselines) != set(updates):
        odd = sorted(set(baselines) ^ set(updates))[0]
        raise _Bad(path, f"has a baseline or an update count for role {short(odd)}, not both")


def _league(value: object, path: str) -> None:
    """:meth:`marl.competition.league.League.state_dict`."""
    if value is None:
        return
    state = _mapping(value, path)
    known = ("snapshots", "records", "windows", "elo")
    _fields(state, path, known, known)
    snapshots = state["snapshots"]
    if not isinstance(snapshots, (list, tuple)):
        raise _Bad(f"{path}.snapshots", f"is {_a(snapshots)}, not a list")
    names = set()
    for i, snapshot in enumerate(snapshots):
        where = f"{path}.snapshots.{i}"
        snapshot = _mapping(snapshot, where)
        fields = ("name", "step", "path", "rating")
        _fields(snapshot, where, fields, fields)
        step = _count(snapshot["step"], f"{where}.step", 0, MAX_STEP)
        if snapshot["name"] != f"snapshot_{step}" or snapshot["name"] in names:
            raise _Bad(
                f"{where}.name", f"is {short(snapshot['name'])}; it must be snapshot_{step}, once"
            )
        names.add(snapshot["name"])
        if not isinstance(snapshot["path"], str) or not snapshot["path"]:
            raise _Bad(f"{where}.path", f"is {short(snapshot['path'])}, not a file path")
        _number(snapshot["rating"], f"{where}.rating")
    for opponent, record in _names(state["records"], f"{path}.records").items():
        where = _at(f"{path}.records", opponent)
        if not isinstance(record, (list, tuple)) or len(record) != 3:
            raise _Bad(where, f"is {short(record)}, not [wins, draws, losses]")
        for i, n in enumerate(record):
            _count(n, f"{where}.{i}")
    for kind, window in _names(state["windows"], f"{path}.windows").items():
        where = _at(f"{path}.windows", kind)
        if not isinstance(window, (list, tuple)) or any(r not in LEAGUE_RESULTS for r in window):
            raise _Bad(where, f"must be a list of {', '.join(LEAGUE_RESULTS)}")
    elo = _mapping(state["elo"], f"{path}.elo")
    fields = ("k", "initial", "ratings", "fixed")
    _fields(elo, f"{path}.elo", fields, fields)
    _number(elo["k"], f"{path}.elo.k", 0.0)
    _number(elo["initial"], f"{path}.elo.initial")
    for player, rating in _names(elo["ratings"], f"{path}.elo.ratings").items():
        _number(rating, _at(f"{path}.elo.ratings", player))
    fixed = elo["fixed"]
    if not isinstance(fixed, (list, tuple)) or not all(isinstance(p, str) for p in fixed):
        raise _Bad(f"{path}.elo.fixed", f"is {short(fixed)}, not a list of player names")
