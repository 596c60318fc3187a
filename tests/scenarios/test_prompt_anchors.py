"""What an agent is told holds nothing a small model can copy instead of answering.

Two anchors were found in training SmolLM2-135M (docs/communication.md): the action help's
example value (``(e.g. ACTION: 2)``: the listener answered 2 in 40 of 40 prompts) and the
placeholder of the markup help (``SAY: <message>``: a trained speaker settled on sending the
placeholder). Every registered scenario is played with its rule bot and every prompt is checked.
"""

from __future__ import annotations

import random
import re

import pytest

import marl
from marl.scenarios.bots import bot_names, get_bot

PLACEHOLDER = re.compile(r"<[^<>\n]{1,40}>")
EXAMPLE = re.compile(r"\be\.g\.|\bfor example\b|\bsuch as\b", re.IGNORECASE)


def _prompts(name: str) -> list[str]:
    env = marl.make(name)
    bot = get_bot(env.spec.rules, "rule" if "rule" in bot_names(env.spec.rules) else "random")
    rng = random.Random(0)
    observations, infos = env.reset(seed=0)
    texts = [env.system_prompt(a) for a in env.possible_agents]
    while env.agents:
        texts += list(observations.values())
        actions = {a: bot(a, observations[a], infos[a], rng) for a in env.agents}
        observations, _, _, _, infos = env.step(actions)
    return texts


@pytest.mark.parametrize("name", marl.list_scenarios())
def test_no_placeholder_or_example_value_in_any_prompt(name: str) -> None:
    for text in _prompts(name):
        assert not PLACEHOLDER.search(text), (name, PLACEHOLDER.search(text).group(), text)
        assert not EXAMPLE.search(text), (name, EXAMPLE.search(text).group(), text)


def test_the_check_finds_the_old_anchors() -> None:
    assert PLACEHOLDER.search("Reply with one line `SAY: <message>`.")
    assert EXAMPLE.search("the number of the target (e.g. ACTION: 2)")
