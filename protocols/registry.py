"""One registry class for every extension point: names -> entries, registered by decorator.

Scenarios, rules, bots, topologies, shaping kinds, credit methods, advantage estimators and
policy backends each keep one :class:`Registry`. It lives here, in the lowest layer, because
every package may import ``marl.protocols`` and this module imports nothing at all.

- ``@registry.register(name)`` (or ``registry.add(name, entry)``) refuses a name already taken,
  naming what holds it.
- ``registry.lookup(name, key=...)`` raises :class:`UnknownNameError` listing the known names,
  prefixed by the config or YAML key the name came from (``graph.topology: unknown topology
  'torus'; known: complete, ...``).
- ``lazy`` names are known before their module is imported: looking one up imports the module,
  which registers the entry (the backends do this, so naming ``vllm`` does not import vLLM).

A registry is a mapping (``name in TOPOLOGIES``, ``sorted(RULES)``); deleting an entry
(``del``/``pop``) is for tests that register something temporary.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Hashable, Iterator, Mapping, MutableMapping
from typing import Generic, TypeVar

__all__ = ["Registry", "UnknownNameError"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A name that nothing is registered under; the message names the key and the known names.

    A KeyError (a failed lookup) and a ValueError (a bad config value), so both kinds of caller
    catch it; ``str()`` is the plain message, without the quotes KeyError adds.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(MutableMapping[K, T], Generic[K, T]):
    """Entries of one kind (``kind`` names it in messages: "topology", "credit method").

    ``label(name)`` words a name in messages (default ``repr``); ``lazy`` maps names to the
    module that registers them when imported.
    """

    def __init__(
        self,
        kind: str,
        *,
        label: Callable[[K], str] = repr,
        lazy: Mapping[K, str] | None = None,
    ) -> None:
        self.kind = kind
        self.label = label
        self.lazy = dict(lazy or {})
        self._entries: dict[K, T] = {}

    # --- registering -------------------------------------------------------------------------
    def register(self, name: K) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name``; duplicates are refused."""

        def decorator(entry: T) -> T:
            self.add(name, entry)
            return entry

        return decorator

    def add(self, name: K, entry: T) -> T:
        """Register ``entry`` under ``name``; a name already taken raises ValueError."""
        if name in self._entries:
            held = self._entries[name]
            origin = getattr(held, "__qualname__", None)
            module = getattr(held, "__module__", None)
            where = f" (by {module}.{origin})" if origin and module else ""
            raise ValueError(f"{self.kind} {self.label(name)} is already registered{where}")
        self._entries[name] = entry
        return entry

    __setitem__ = add  # registry[name] = entry refuses duplicates too

    # --- looking up --------------------------------------------------------------------------
    def names(self) -> list[K]:
        """Every name a lookup accepts (registered or lazy), sorted."""
        return sorted(set(self._entries) | set(self.lazy), key=str)

    def lookup(self, name: K, key: str | None = None) -> T:
        """The entry registered as ``name``, importing its module first when it is lazy.

        An unknown name raises :class:`UnknownNameError`; ``key`` (the config or YAML key the
        name came from) starts its message.
        """
        if name not in self:  # also an unhashable name (a list from YAML)
            if not isinstance(name, Hashable) or name not in self.lazy:
                raise self.unknown(name, key)
            importlib.import_module(self.lazy[name])  # registers the entry
            if name not in self:
                raise self.unknown(name, key)
        return self._entries[name]

    def unknown(self, name: object, key: str | None = None) -> UnknownNameError:
        """The error for a name nothing is registered under (to raise, or to report)."""
        return UnknownNameError(self.unknown_message(name, key))

    def unknown_message(
        self, name: object, key: str | None = None, shown: str | None = None
    ) -> str:
        """``[key: ]unknown <kind> <name>; known: <names>``; ``shown`` replaces the name's
        wording (a shortened value, for instance)."""
        known = ", ".join(str(n) for n in self.names()) or "none"
        word = shown if shown is not None else self.label(name)  # type: ignore[arg-type]
        text = f"unknown {self.kind} {word}; known: {known}"
        return f"{key}: {text}" if key else text

    # --- the mapping -------------------------------------------------------------------------
    def __getitem__(self, name: K) -> T:
        return self._entries[name]

    def __delitem__(self, name: K) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[K]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._entries
        except TypeError:  # an unhashable name is never registered
            return False

    def copy(self) -> Registry[K, T]:
        """A registry with the same entries (a test registers into it without leaking)."""
        twin: Registry[K, T] = Registry(self.kind, label=self.label, lazy=self.lazy)
        twin._entries = dict(self._entries)
        return twin

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()!r})"
