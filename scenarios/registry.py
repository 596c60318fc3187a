"""The scenario registry: ``make(name_or_path, **overrides)`` and ``list_scenarios()``.

Built-in scenarios are the YAML files in ``scenarios/builtin/``; their Python rules live beside
them and register themselves on import. ``register_scenario(path)`` adds a YAML file of your own
under the ``name`` it declares. A name without a version suffix (``signal``) means the highest
registered version (``signal-v1`` over ``signal-v0``). A registered name wins over a file of
the same name in the working directory (:func:`scenario_path`).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from marl.protocols.registry import Registry
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.problems import Problem, ScenarioError
from marl.scenarios.reader import read_yaml
from marl.scenarios.spec import ScenarioSpec, deep_merge, spec_from_dict

BUILTIN_DIR = Path(__file__).parent / "builtin"
SCENARIOS: Registry[str, Path] = Registry("scenario")  # name -> its YAML file
# name -> why it cannot be used here (an optional extra is not installed); not listed
UNAVAILABLE: dict[str, str] = {}
_VERSION = re.compile(r"^(?P<base>.+)-v(?P<version>\d+)$")
_loaded = False


def load_builtins() -> None:
    """Register every built-in scenario (its rules modules, then its YAML files), once."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import marl.scenarios.builtin as builtin

    for module in pkgutil.iter_modules(builtin.__path__):
        importlib.import_module(f"marl.scenarios.builtin.{module.name}")
    for path in sorted(BUILTIN_DIR.glob("*.yaml")):
        register_scenario(path)


def register_scenario(path: str | Path) -> str:
    """Register the YAML file at ``path`` under its declared name; returns the name."""
    load_builtins()  # so a clash with a built-in name is reported here, not at a later lookup
    path = Path(path)
    data = read_yaml(path)
    name = data.get("name") if isinstance(data, Mapping) else None
    if not isinstance(name, str):
        raise ScenarioError([Problem("name", "required to register a scenario")], str(path))
    if name in SCENARIOS:
        if SCENARIOS[name].resolve() != path.resolve():
            raise ValueError(f"scenario {name!r} is already registered from {SCENARIOS[name]}")
        return name  # the same file again: nothing to do
    SCENARIOS[name] = path
    return name


def register_unavailable(name: str, reason: str) -> None:
    """Record that the built-in scenario ``name`` cannot be used here, and why (its optional
    dependency is missing). It is not listed; asking for it raises an error with ``reason``."""
    UNAVAILABLE[name] = reason


def list_scenarios() -> list[str]:
    """Names of every registered scenario, versions included."""
    load_builtins()
    return sorted(SCENARIOS)


def resolve_name(name: str) -> str:
    """The registered name ``name`` refers to (latest version when no ``-vN`` is given)."""
    load_builtins()
    if name in SCENARIOS:
        return name
    versions = []
    for registered in SCENARIOS:
        match = _VERSION.match(registered)
        if match and match.group("base") == name:
            versions.append((int(match.group("version")), registered))
    if versions:
        return max(versions)[1]
    for unavailable, reason in UNAVAILABLE.items():
        match = _VERSION.match(unavailable)
        if name == unavailable or (match and match.group("base") == name):
            raise ScenarioError([Problem("scenario", f"{unavailable!r} is unavailable: {reason}")])
    raise ScenarioError([Problem("scenario", SCENARIOS.unknown_message(name))])


def is_path(text: str) -> bool:
    """Whether a scenario reference is a file path by its form: a .yaml/.yml name or a name
    with a directory separator. Anything else is looked up in the registry first."""
    separators = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return text.endswith((".yaml", ".yml")) or any(sep in text for sep in separators)


def scenario_path(name_or_path: str | Path) -> Path:
    """The YAML file a scenario reference means.

    A reference that looks like a path (``my.yaml``, ``./relay-v0``) is that file. Otherwise a
    registered name wins: a file called ``relay-v0`` in the working directory does not replace
    the registered ``relay-v0``. Only a bare name that no registered scenario has falls back to
    a file of that name in the working directory.
    """
    load_builtins()
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or is_path(text):
        return Path(text)
    try:
        return SCENARIOS[resolve_name(text)]
    except ScenarioError:
        if Path(text).is_file():
            return Path(text)
        raise


def load_document(name_or_path: str | Path) -> tuple[dict, str]:
    """The raw YAML document of a scenario name or file path, and where it came from
    (:func:`scenario_path` says which file a name means)."""
    path = scenario_path(name_or_path)
    data = read_yaml(path)
    if not isinstance(data, Mapping):
        raise ScenarioError([Problem("", "a scenario must be a YAML mapping")], str(path))
    return dict(data), str(path)


def load_scenario_spec(
    name_or_path: str | Path, overrides: Mapping[str, Any] | None = None
) -> ScenarioSpec:
    """Validated spec of a scenario, with ``overrides`` deep-merged into its YAML first."""
    data, source = load_document(name_or_path)
    if overrides:
        data = deep_merge(data, overrides)
    return spec_from_dict(data, source)


def make(
    name_or_path: str | Path, render_mode: str | None = None, **overrides: Any
) -> TextScenarioEnv:
    """Build a scenario environment, as ``gymnasium.make`` does.

    ``overrides`` are deep-merged into the YAML document:
    ``make("relay", graph={"topology": "line"}, episode={"rounds": 6})``.
    """
    return TextScenarioEnv(load_scenario_spec(name_or_path, overrides), render_mode=render_mode)
