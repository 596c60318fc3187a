"""Layering holds at import time: a lower package, imported alone, loads none of the upper ones.

The layout's rule is that dependencies flow one way: ``protocols`` knows none of the others;
``scenarios`` knows protocols but nothing of LLMs; ``agents`` turns text into text and knows no
scenario; ``credit`` works on turn records and on callables it is handed, not on scenarios,
agents, the trainer or Ray; ``marl`` (the driver) sits on top. Each case imports a package and
every module inside it in a fresh interpreter and reads ``sys.modules``, so an import hidden
behind ``marl/__init__.py``, a re-export or a helper module is caught, which a check of the
source text alone would miss.

A static pass over the source (ast) then checks every import statement, including those inside
functions (deferred) and under ``TYPE_CHECKING``, which the fresh-interpreter check cannot see:
an upward import anywhere fails it.

Inside the driver the same rule holds between its rooms (:data:`ROOMS`, bottom first): the
records and the config every part reads, the runtime, the measures (analysis), the
competition, the training loop, and the command line on top. A module may import its own room
and the rooms below it, never one above, deferred or not.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import marl

# What each package may load from marl, and third-party packages it must not load.
LAYERS = {
    "marl": ((), ("torch", "pettingzoo", "transformers", "ray", "networkx")),
    "marl.protocols": (
        ("marl.protocols",),
        ("torch", "pettingzoo", "gymnasium", "transformers", "peft", "ray"),
    ),
    "marl.scenarios": (
        ("marl.protocols", "marl.scenarios"),
        ("torch", "transformers", "peft", "ray"),
    ),
    "marl.agents": (
        ("marl.protocols", "marl.agents"),
        ("pettingzoo", "gymnasium", "ray"),
    ),
    "marl.credit": (
        ("marl.protocols", "marl.credit"),
        ("pettingzoo", "gymnasium", "transformers", "peft", "ray"),
    ),
}

# Imports the package and every module in it (vLLM itself is imported only inside functions, so
# the vllm backend module is imported too), then prints the loaded module names.
PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module({name!r})
if {name!r} != "marl":
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_modules(name: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(name=name)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_package_imports_only_its_own_layer_and_below(name):
    allowed, forbidden_third_party = LAYERS[name]
    modules = loaded_modules(name)
    assert name in modules
    upper = [
        m
        for m in modules
        if m.startswith("marl.") and not any(m == a or m.startswith(a + ".") for a in allowed)
    ]
    assert upper == [], f"import {name} loads modules outside its layer: {upper}"
    third = sorted({m.split(".")[0] for m in modules} & set(forbidden_third_party))
    assert third == [], f"import {name} loads {third}"


def test_make_and_list_scenarios_resolve_on_first_use():
    assert "make" in dir(marl) and "list_scenarios" in dir(marl)
    assert "relay-v0" in marl.list_scenarios()
    assert marl.make("relay-v0").possible_agents
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        marl.nonexistent  # noqa: B018


# The credit methods and the engine, imported alone: pure Python, no tensor library.
TORCH_FREE = (
    "marl.credit",
    "marl.credit.counterfactual",
    "marl.credit.estimators",
    "marl.credit.registry",
    "marl.credit.responders",
    "marl.credit.shapley",
)


def loaded_modules_of(name: str) -> list[str]:
    """The modules that ``import <name>`` alone loads, in a fresh interpreter."""
    probe = f"import importlib, json, sys; importlib.import_module({name!r}); "
    probe += "print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.subprocess
@pytest.mark.parametrize("name", TORCH_FREE)
def test_credit_methods_load_no_torch(name):
    modules = loaded_modules_of(name)
    assert name in modules
    assert "torch" not in modules, f"import {name} loads torch"
    assert "marl.credit.advantages" not in modules


# --- the same rule, read from the source: every import statement, wherever it stands ------------
ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = {  # folder -> the package setuptools installs it as (pyproject's package-dir)
    "protocols": "marl.protocols",
    "scenarios": "marl.scenarios",
    "agents": "marl.agents",
    "credit": "marl.credit",
    "marl": "marl",
}


def layer_of(module: str) -> str:
    """The layer (a key of LAYERS) that a ``marl`` module belongs to."""
    return max(
        (name for name in LAYERS if module == name or module.startswith(name + ".")), key=len
    )


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``marl`` module that ``tree`` imports anywhere: at the top,
    inside a function (deferred), under ``if TYPE_CHECKING:``, or by ``importlib.import_module``
    with a literal name. ``package`` resolves relative imports."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = parts[: len(parts) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return sorted((line, m) for line, m in found if m == "marl" or m.startswith("marl."))


def upward_imports(source: str, module: str) -> list[str]:
    """Every import in ``source`` (the text of ``module``) that reaches above its layer."""
    layer = layer_of(module)
    # the driver sits on top: it may import every layer (LAYERS["marl"] says what ``import marl``
    # alone may load, which is nothing)
    allowed = tuple(LAYERS) if layer == "marl" else LAYERS[layer][0]
    package = module if module.endswith(".__init__") else module.rsplit(".", 1)[0]
    bad = []
    for line, imported in imported_modules(ast.parse(source), package.removesuffix(".__init__")):
        target = layer_of(imported)
        if target != layer and target not in allowed:
            bad.append(f"{module}:{line} imports {imported}")
    return bad


def source_modules() -> dict[str, Path]:
    """Every module of the installed packages, by dotted name, from the source folders."""
    out = {}
    for folder, package in SOURCE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            out[".".join((package, *parts))] = path
    return out


# The driver's rooms, bottom first: a module may import its own room and those below it.
ROOMS = (
    # the records and settings every part reads: the episode record, the errors, the config
    # schema and the registries it checks ``algo.level`` and ``league.mix`` against
    ("marl.errors", "marl.episodes", "marl.config", "marl.losses", "marl.opponents"),
    ("marl.runtime",),  # policies, learners, workers, rollouts, checkpoints, Ray
    ("marl.analysis",),  # what the records say: metrics, emergence, listening, reports
    ("marl.competition",),  # leagues, ratings, marl eval, exploitability tracking
    ("marl.loop",),  # marl train's iteration
    ("marl.sweep",),  # many runs of it: the Ray launcher of a Hydra multirun
    ("marl.cli", "marl.play"),  # the command line and the interactive game
)


def room_of(module: str) -> int | None:
    """The floor (index in :data:`ROOMS`) of a driver module; None for another layer or for
    the ``marl`` package face itself."""
    for floor, names in enumerate(ROOMS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return floor
    return None


def upward_room_imports(source: str, module: str) -> list[str]:
    """Every import in ``source`` (the text of the driver module ``module``) of a driver room
    above the module's own."""
    floor = room_of(module)
    assert floor is not None, f"{module} is in no room of ROOMS: place it there"
    package = module if module.endswith(".__init__") else module.rsplit(".", 1)[0]
    bad = []
    for line, imported in imported_modules(ast.parse(source), package.removesuffix(".__init__")):
        target = room_of(imported)
        if target is not None and target > floor:
            bad.append(f"{module}:{line} imports {imported} ({ROOMS[target][0]} is above it)")
    return bad


def driver_modules() -> dict[str, Path]:
    """The driver's own modules (not marl/__init__.py, the package face)."""
    return {
        name: path
        for name, path in source_modules().items()
        if layer_of(name) == "marl" and name != "marl.__init__"
    }


def test_every_driver_module_is_in_a_room():
    unplaced = [name for name in driver_modules() if room_of(name) is None]
    assert unplaced == [], f"driver modules in no room of ROOMS: {unplaced}"
    assert "marl.runtime.workers" in driver_modules() and "marl.loop.train" in driver_modules()


def test_no_driver_module_imports_a_room_above_its_own_even_deferred():
    bad = [
        b
        for name, path in driver_modules().items()
        for b in upward_room_imports(path.read_text(), name)
    ]
    assert bad == [], "imports of a room above:\n" + "\n".join(bad)


def test_the_room_pass_sees_deferred_and_type_checking_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from marl.episodes import EpisodeRecord\n"
        "if TYPE_CHECKING:\n"
        "    from marl.loop.train import train\n"
        "def f():\n"
        "    from marl.analysis.emergence import tracker_for\n"
        "    from ..competition import league\n"
        "    from marl.runtime.policies import InferencePolicies\n"
    )
    assert upward_room_imports(source, "marl.runtime.workers") == [
        "marl.runtime.workers:4 imports marl.loop.train.train (marl.loop is above it)",
        "marl.runtime.workers:6 imports marl.analysis.emergence.tracker_for"
        " (marl.analysis is above it)",
        "marl.runtime.workers:7 imports marl.competition.league (marl.competition is above it)",
    ]
    assert upward_room_imports(source, "marl.cli") == []  # the command line is on top


def test_no_module_imports_above_its_layer_even_deferred_or_for_type_checking():
    modules = source_modules()
    assert "marl.scenarios.validation" in modules and "marl.credit.apply" in modules
    bad = [b for name, path in modules.items() for b in upward_imports(path.read_text(), name)]
    assert bad == [], "imports above their layer:\n" + "\n".join(bad)


def test_the_static_pass_sees_deferred_and_type_checking_imports():
    source = (
        "from typing import TYPE_CHECKING\n"
        "import marl.protocols.messages\n"
        "if TYPE_CHECKING:\n"
        "    from marl.agents.turn import TurnRecord\n"
        "def f():\n"
        "    from marl.config import Config\n"
        "    import importlib\n"
        "    importlib.import_module('marl.scenarios.base')\n"
        "    from ..agents import generation\n"
    )
    assert upward_imports(source, "marl.credit.example") == [
        "marl.credit.example:4 imports marl.agents.turn.TurnRecord",
        "marl.credit.example:6 imports marl.config.Config",
        "marl.credit.example:8 imports marl.scenarios.base",
        "marl.credit.example:9 imports marl.agents.generation",
    ]
    assert upward_imports(source, "marl.loop.train") == []  # the driver may import every layer
