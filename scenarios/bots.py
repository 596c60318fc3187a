"""Scripted agents: a random one that fits every scenario, and rule-based ones per scenario.

A bot is a function ``(agent, observation, info, rng) -> completion``. Rule-based bots live with
their scenario's rules (they know the rules; LLM agents do not) and register under the rules
name: ``@register_bot("signal", "rule")``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from marl.protocols.registry import Registry
from marl.scenarios.problems import Problem, ScenarioError

Bot = Callable[[str, str, dict[str, Any], random.Random], str]
# (rules name, bot name) -> bot
BOTS: Registry[tuple[str, str], Bot] = Registry(
    "bot", label=lambda key: f"{key[1]!r} for rules {key[0]!r}"
)

_WORDS = ["red", "blue", "circle", "square", "yes", "no", "1", "2", "3", "4", "help", "ok"]


def register_bot(rules: str, name: str) -> Callable[[Bot], Bot]:
    """Register a scripted bot for the rules called ``rules``; duplicate names are refused."""

    return BOTS.register((rules, name))


def random_bot(agent: str, observation: str, info: dict[str, Any], rng: random.Random) -> str:
    """Says and does something random but well-formed (valid actions come from ``info``)."""
    neighbours = info.get("neighbours", [])
    lines = []
    if neighbours and rng.random() < 0.7:
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4)))
        lines.append(f"SAY: {words}")
    choices = info.get("valid_actions") or ["wait"]
    lines.append(f"ACTION: {rng.choice(choices)}")
    return "\n".join(lines)


def play_bot_episode(env: Any, bot: str, seed: int, rng: random.Random) -> dict[str, float]:
    """Reset ``env`` at ``seed`` and play it to the end with ``bot`` for every agent, drawing the
    bot's randomness from ``rng``; returns the episode returns."""
    policy = get_bot(env.spec.rules, bot)
    observations, infos = env.reset(seed=seed)
    while env.agents:
        actions = {a: policy(a, observations[a], infos[a], rng) for a in env.agents}
        observations, _, _, _, infos = env.step(actions)
    return env.returns


def get_bot(rules: str, name: str) -> Bot:
    """The bot called ``name`` for ``rules`` (``random`` fits every scenario)."""
    if name == "random":
        return random_bot
    if name == "format" and (rules, name) not in BOTS:
        return random_bot  # well-formed markup with random content: the generic format bot
    if (rules, name) not in BOTS:
        known = ["format", "random"] + sorted(n for r, n in BOTS if r == rules and n != "format")
        raise ScenarioError(
            [
                Problem(
                    "bot",
                    f"no scripted bot {name!r} for rules {rules!r}; known: {', '.join(known)}",
                )
            ]
        )
    return BOTS[(rules, name)]


def bot_names(rules: str) -> list[str]:
    """Every bot that can play ``rules``."""
    return ["random"] + sorted(n for r, n in BOTS if r == rules)
