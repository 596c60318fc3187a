"""marl: multi-agent reinforcement learning for LLM agents that talk over a communication graph.

``marl.make(name_or_path, **overrides)`` and ``marl.list_scenarios()`` work like
``gymnasium.make``; the driver (rollouts, learners, trainer, CLI) lives in this package, and the
building blocks live in ``marl.protocols``, ``marl.scenarios``, ``marl.agents`` and
``marl.credit``.
"""

from marl.scenarios.registry import list_scenarios, make

__version__ = "0.1.0"
__all__ = ["__version__", "list_scenarios", "make"]
