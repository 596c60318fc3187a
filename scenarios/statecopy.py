"""Fast deep copies of an episode's plain-data state, for the transactional step and snapshots.

``copy.deepcopy`` is general and slow: every object goes through a dispatch table, ``__reduce_ex__``
and ``_reconstruct``. The state an environment copies every round is plain data by contract (the
rules keep "plain data plus ``self.rng``"): lists, dicts, tuples, sets, numbers, strings and small
dataclass objects such as a rules class's ``Params``. :func:`deep_copy` copies exactly those
directly and gives the same result as ``copy.deepcopy``: a sub-object reached twice is copied
once (aliasing and cycles are kept), immutable atoms and tuples of them are shared, and nothing
of the copy is shared with the original that ``deepcopy`` would have copied. Anything else (a
class with its own ``__deepcopy__``, ``__reduce__``, ``__getstate__``, ``__slots__``, a dict
subclass other than ``collections.Counter``, a graph) goes to ``copy.deepcopy`` with the same
memo, so it is copied exactly as before. The one visible difference: a ``frozenset`` whose
members are all atoms is returned as is instead of rebuilt (it cannot change, so only ``is``
can tell).

``random.Random`` generators are cloned through ``getstate``/``setstate`` on an instance made
without seeding: ``deepcopy`` builds ``Random()``, which reads the OS entropy pool, only to
overwrite that seed at once.
"""

from __future__ import annotations

import copy
import copyreg
import random
import types
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["copy_random", "deep_copy"]

# what copy.deepcopy returns as is (its _deepcopy_atomic list)
_ATOMIC: frozenset[type] = frozenset(
    {
        type(None),
        type(Ellipsis),
        type(NotImplemented),
        int,
        float,
        bool,
        complex,
        bytes,
        str,
        types.CodeType,
        type,
        range,
        types.BuiltinFunctionType,
        types.FunctionType,
        weakref.ref,
        property,
    }
)

Memo = dict[int, Any]


def copy_random(rng: random.Random) -> random.Random:
    """An independent generator in the same state as ``rng`` (what ``deepcopy`` gives, faster).

    Exact ``random.Random`` only; a subclass may keep more state and is deep-copied.
    """
    if type(rng) is not random.Random:
        return copy.deepcopy(rng)
    clone = random.Random.__new__(random.Random)
    clone.setstate(rng.getstate())
    return clone


def deep_copy(obj: Any, memo: Memo | None = None) -> Any:
    """A deep copy of ``obj``, equal to ``copy.deepcopy(obj, memo)`` (see the module docstring).

    ``memo`` maps ``id(original)`` to its copy, as ``deepcopy``'s does; pre-fill it to share an
    object (map it to itself) or to substitute a copy made elsewhere.
    """
    if memo is None:
        memo = {}
    return _copy(obj, memo)


def _copy(obj: Any, memo: Memo) -> Any:
    cls = obj.__class__
    if cls in _ATOMIC:
        return obj
    found = memo.get(id(obj), memo)
    if found is not memo:
        return found
    copier = _COPIERS.get(cls)
    if copier is None:
        copier = _COPIERS[cls] = _object_copier(cls)
    return copier(obj, memo)


def _copy_list(obj: list, memo: Memo) -> list:
    out: list = []
    memo[id(obj)] = out
    atomic = _ATOMIC
    for item in obj:
        out.append(item if item.__class__ in atomic else _copy(item, memo))
    return out


def _copy_dict(obj: dict, memo: Memo) -> dict:
    out: dict = {}
    memo[id(obj)] = out
    atomic = _ATOMIC
    for key, value in obj.items():
        if key.__class__ not in atomic:
            key = _copy(key, memo)
        out[key] = value if value.__class__ in atomic else _copy(value, memo)
    return out


def _copy_tuple(obj: tuple, memo: Memo) -> tuple:
    atomic = _ATOMIC
    for item in obj:
        if item.__class__ not in atomic:
            break
    else:
        return obj  # atoms only: deepcopy returns the tuple itself
    items = [_copy(item, memo) for item in obj]
    found = memo.get(id(obj), memo)  # a cycle through a mutable member copied this tuple
    if found is not memo:
        return found
    for old, new in zip(obj, items):
        if old is not new:
            out = tuple(items)
            memo[id(obj)] = out
            return out
    return obj


def _copy_set(obj: set, memo: Memo) -> set:
    out = {_copy(item, memo) for item in obj}
    memo[id(obj)] = out
    return out


def _copy_frozenset(obj: frozenset, memo: Memo) -> frozenset:
    items = [_copy(item, memo) for item in obj]
    if all(old is new for old, new in zip(obj, items)):
        return obj
    out = frozenset(items)
    memo[id(obj)] = out
    return out


def _copy_random_memo(obj: random.Random, memo: Memo) -> random.Random:
    out = copy_random(obj)
    memo[id(obj)] = out
    return out


def _copy_counter(obj: Counter, memo: Memo) -> Counter:
    # deepcopy rebuilds a Counter from a deep copy of its items (Counter.__reduce__)
    out: Counter = Counter()
    memo[id(obj)] = out
    for key, value in obj.items():
        dict.__setitem__(out, _copy(key, memo), _copy(value, memo))
    return out


def _deepcopy(obj: Any, memo: Memo) -> Any:
    return copy.deepcopy(obj, memo)


def _plain_class(cls: type) -> bool:
    """True when ``deepcopy`` rebuilds instances of ``cls`` as ``cls.__new__(cls)`` plus a deep
    copy of ``__dict__`` (no hook of the class changes that)."""
    if cls in copy._deepcopy_dispatch or cls in copyreg.dispatch_table:  # type: ignore[attr-defined]
        return False
    if issubclass(cls, type) or getattr(cls, "__deepcopy__", None) is not None:
        return False
    if cls.__reduce_ex__ is not object.__reduce_ex__ or cls.__reduce__ is not object.__reduce__:
        return False
    if getattr(cls, "__getstate__", object.__getstate__) is not object.__getstate__:
        return False
    for hook in ("__setstate__", "__getnewargs_ex__", "__getnewargs__"):
        if hasattr(cls, hook):
            return False
    if cls.__new__ is not object.__new__:
        return False
    # __slots__ anywhere in the hierarchy puts state outside __dict__
    return all("__slots__" not in vars(k) for k in cls.__mro__[:-1]) and hasattr(cls, "__dict__")


def _object_copier(cls: type) -> Callable[[Any, Memo], Any]:
    """The copier for instances of ``cls``: a direct one for plain classes, else ``deepcopy``."""
    if not _plain_class(cls):
        return _deepcopy

    def copy_object(obj: Any, memo: Memo) -> Any:
        out = object.__new__(cls)
        memo[id(obj)] = out
        state = obj.__dict__
        if state:
            out.__dict__.update(_copy_dict(state, memo))
        return out

    return copy_object


_COPIERS: dict[type, Callable[[Any, Memo], Any]] = {
    list: _copy_list,
    dict: _copy_dict,
    tuple: _copy_tuple,
    set: _copy_set,
    frozenset: _copy_frozenset,
    random.Random: _copy_random_memo,
    Counter: _copy_counter,
}
