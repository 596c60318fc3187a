"""Layering holds at import time: a lower package, imported alone, loads none of the upper ones.

The layout's rule is that dependencies flow one way: ``protocols`` knows none of the others;
``scenarios`` knows protocols but nothing of LLMs; ``agents`` turns text into text and knows no
scenario; ``credit`` works on turn records and on callables it is handed, not on scenarios,
agents, the trainer or Ray; ``marl`` (the driver) sits on top. Each case imports a package and
every module inside it in a fresh interpreter and reads ``sys.modules``, so an import hidden
behind ``marl/__init__.py``, a re-export or a helper module is caught, which a check of the
source text alone would miss.
"""

from __future__ import annotations

import json
import subprocess
import sys

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
