"""marl: multi-agent reinforcement learning for LLM agents that talk over a communication graph.

``marl.make(name_or_path, **overrides)`` and ``marl.list_scenarios()`` work like
``gymnasium.make``; the driver lives in this package, in rooms (``marl.runtime``: policies,
learners, rollout workers; ``marl.analysis``: the measures; ``marl.competition``: leagues and
``marl eval``; ``marl.loop``: ``marl train``; the CLI and the records every room reads at the
top level), and the building blocks live in ``marl.protocols``, ``marl.scenarios``,
``marl.agents`` and ``marl.credit``.

The two names are imported on first use, not here: importing a lower package
(``import marl.protocols``) runs this file first, and it must not pull in the scenarios,
pettingzoo or torch (tests/test_layering.py checks this in a fresh interpreter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marl.scenarios.registry import list_scenarios, make

__version__ = "0.1.0"
__all__ = ["__version__", "list_scenarios", "make"]

_LAZY = {"list_scenarios", "make"}


def __getattr__(name: str) -> Any:
    """Resolve ``marl.make`` and ``marl.list_scenarios`` from the scenario registry on first use."""
    if name in _LAZY:
        from marl.scenarios import registry

        value = getattr(registry, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'marl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY)
