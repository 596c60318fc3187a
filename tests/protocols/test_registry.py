"""The one registry class: duplicates refused, unknown names listed with their key, lazy names,
and every extension point of the project using it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from marl.protocols.registry import Registry, UnknownNameError


def test_register_refuses_a_taken_name_and_names_the_holder() -> None:
    reg: Registry[str, object] = Registry("widget")

    @reg.register("a")
    def first() -> None: ...

    assert reg.lookup("a") is first and "a" in reg and list(reg) == ["a"]
    with pytest.raises(ValueError, match=r"widget 'a' is already registered \(by .*first\)"):
        reg.register("a")(lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        reg["a"] = object()  # item assignment is registration too
    assert reg.lookup("a") is first


def test_lookup_of_an_unknown_name_names_the_key_and_lists_the_known() -> None:
    reg: Registry[str, int] = Registry("widget")
    reg.add("b", 2)
    reg.add("a", 1)
    with pytest.raises(UnknownNameError) as err:
        reg.lookup("c", key="parts.widget")
    assert str(err.value) == "parts.widget: unknown widget 'c'; known: a, b"
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    with pytest.raises(KeyError, match=r"^unknown widget \['x'\]; known: a, b$"):
        reg.lookup(["x"])  # type: ignore[arg-type]  # unhashable YAML value: no TypeError
    assert ["x"] not in reg


def test_copy_is_independent() -> None:
    reg: Registry[str, int] = Registry("widget")
    reg.add("a", 1)
    twin = reg.copy()
    twin.add("b", 2)
    assert list(reg) == ["a"] and sorted(twin) == ["a", "b"]


@pytest.mark.subprocess
def test_a_lazy_name_is_known_before_import_and_imported_on_lookup() -> None:
    code = (
        "import sys\n"
        "from marl.agents.backends.base import BACKENDS, backend_names\n"
        "assert backend_names() == ['hf', 'vllm'] and 'hf' not in BACKENDS\n"
        "assert 'marl.agents.backends.hf' not in sys.modules\n"
        "factory = BACKENDS.lookup('hf')\n"
        "assert 'marl.agents.backends.hf' in sys.modules and 'hf' in BACKENDS\n"
        "print(factory.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "HFBackend"


def test_every_extension_point_uses_the_one_registry_class() -> None:
    from marl.agents.backends.base import BACKENDS
    from marl.credit.advantages import ADVANTAGES
    from marl.credit.registry import CREDITS
    from marl.protocols.graphs import TOPOLOGIES
    from marl.scenarios.bots import BOTS
    from marl.scenarios.registry import SCENARIOS, list_scenarios
    from marl.scenarios.rules import RULES
    from marl.scenarios.shaping import SHAPING_KINDS

    list_scenarios()  # loads the built-in scenarios, rules and bots
    registries = [BACKENDS, ADVANTAGES, CREDITS, TOPOLOGIES, BOTS, SCENARIOS, RULES, SHAPING_KINDS]
    assert all(type(r) is Registry for r in registries)
    assert all(len(r) for r in registries if r is not BACKENDS)
