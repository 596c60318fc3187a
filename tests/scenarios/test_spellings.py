"""Exact measures score every spelling of an action that the scenario's parser accepts (issue
40, item 1): each scored variant means its action to the real parser, no variant moves mass to
another action, and a model that writes ``Bet`` instead of ``bet`` is scored as betting."""

from __future__ import annotations

import random

import pytest

import marl
from marl.scenarios.registry import list_scenarios
from marl.scenarios.spellings import MAX_SPELLINGS, accepted_texts, variants


def acting_states(name: str, episodes: int = 4):
    """(rules, agent) at every turn where some agent has a finite legal set, over a few seeded
    episodes played with random legal actions."""
    rng = random.Random(0)
    for seed in range(episodes):
        env = marl.make(name)
        env.reset(seed=seed)
        for _ in range(32):
            if not env.agents:
                break
            replies = {}
            for agent in env.agents:
                legal = env.rules.legal_actions(agent) if not env.is_idle(agent) else None
                if legal:
                    yield env.rules, agent
                    replies[agent] = f"ACTION: {rng.choice(list(legal))}"
                else:
                    replies[agent] = "SAY: hello\nACTION: wait"
            env.step(replies)


@pytest.mark.parametrize("name", list_scenarios())
def test_every_scored_spelling_means_its_action_to_the_parser(name: str) -> None:
    seen = 0
    for rules, agent in acting_states(name):
        legal = rules.legal_actions(agent)
        accepted = accepted_texts(rules, agent)
        assert accepted is not None and set(legal.items()) <= set(accepted.items())
        for text, action in accepted.items():
            if text not in legal:
                assert rules.parse_action(agent, text) == action, (name, text)
        per_action: dict[str, int] = {}
        for action in accepted.values():
            per_action[action] = per_action.get(action, 0) + 1
        assert max(per_action.values()) <= max(MAX_SPELLINGS, *per_action.values())
        seen += 1
    if name in {"signal-v0", "signal-v1", "kuhn-poker-v0", "matching-pennies-v0"}:
        assert seen > 0  # these act from a finite set: the test saw them act


def test_the_lenient_parsers_gain_their_common_spellings() -> None:
    assert variants("bet") == ["bet", "bet.", "Bet", "Bet.", "BET", "BET.", "I bet", "I bet."]
    assert "the red circle" in variants("red circle") and variants("2") == ["2", "2."]
    env = marl.make("kuhn-poker-v0")
    env.reset(seed=1)
    mover = env.rules.to_move()
    texts = accepted_texts(env.rules, mover)
    assert texts["Bet"] == "bet" and texts["I check."] == "check"
    env = marl.make("signal-v0")  # numbers only: "2." yes, a name no (v0 answers by number)
    env.reset(seed=1)
    env.step({a: "SAY: red circle" if a == "speaker" else "ACTION: wait" for a in env.agents})
    texts = accepted_texts(env.rules, "listener")
    assert "2." in texts and not any(t[0].isalpha() for t in texts)


def test_the_kuhn_table_sums_each_move_s_spellings_with_a_real_model() -> None:
    """With the tiny model: each move's table probability is the sum over its scored spellings
    (``ACTION: Bet`` counts as betting), ``malformed`` is the mass on none of them, and the
    spellings hold at least the canonical replies' mass (what the table scored before)."""
    from marl.agents.action_scores import action_scores
    from marl.agents.models import ModelSpec, load_model
    from marl.runtime.exploitability import info_set_prompts, llm_policy_table

    model, tokenizer = load_model(ModelSpec(kind="tiny", seed=3))
    sets = info_set_prompts(tokenizer, "kuhn-poker-v0")
    _, per_set = llm_policy_table(model, tokenizer, "kuhn-poker-v0")
    prompts = [s.prompt_ids for s in sets]
    spelled = action_scores(model, tokenizer, prompts, [s.spellings for s in sets])
    canonical = action_scores(model, tokenizer, prompts, [s.replies for s in sets])
    for i, s in enumerate(sets):
        assert s.replies == tuple(f"ACTION: {m}" for m in s.moves)  # canonical, unchanged
        assert {"ACTION: Bet", "ACTION: Call", "ACTION: Check", "ACTION: Fold"} & set(s.spellings)
        for move in s.moves:
            summed = sum(
                float(spelled.probs[i, j]) for j, m in enumerate(s.spelling_moves) if m == move
            )
            assert per_set[s.key]["moves"][move] == pytest.approx(summed, rel=1e-9)
        assert per_set[s.key]["malformed"] == pytest.approx(float(spelled.off_set[i]))
        assert float(spelled.mass[i]) >= float(canonical.mass[i]) - 1e-12
