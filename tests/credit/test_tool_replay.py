"""Counterfactual re-simulation of episodes whose replies call tools: the recording replays
exactly (tool output is part of each recorded completion), regenerated turns run the tools
again through the same generation loop and get the same results, and a counterfactual that
takes the clerk's message away changes the outcome, as the scenario says it must."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import marl
from marl.agents.backends import SamplingConfig
from marl.credit import Branch, Intervention, Resimulator, compute_credit
from marl.runtime.resimulation import backend_generate
from marl.runtime.rollout import EpisodeSlot, run_episodes

_spec = importlib.util.spec_from_file_location(
    "tool_policy", Path(__file__).resolve().parents[1] / "agents" / "tool_policy.py"
)
tool_policy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool_policy)

SAMPLING = SamplingConfig(max_new_tokens=200)


def _recorded():
    backend = tool_policy.ScriptedTextBackend(tool_policy.ledger_script)
    slots = [EpisodeSlot(marl.make("ledger-v0"), seed=s, group_id=0, episode_id=s) for s in (0, 1)]
    result = run_episodes(slots, {"p": backend}, lambda a: "p", SAMPLING, seed=0)
    return backend, [e.recorded for e in result.episodes]


def test_branches_with_tool_calls_replay_and_regenerate_deterministically() -> None:
    backend, episodes = _recorded()
    assert all(e.returns["auditor"] == 1.0 for e in episodes)
    assert "RESULT lookup:" in episodes[0].completions[0]["clerk"]

    def run(mode: str):
        generate = backend_generate({"p": backend}, lambda a: "p", SAMPLING, seed=1)
        engine = Resimulator(marl.make("ledger-v0"), generate, mode=mode)
        branches = [
            Branch(0),
            Branch(0, (Intervention("clerk", "null"),)),
            Branch(1, (Intervention("auditor", "null", frozenset({0})),)),
        ]
        return engine.run(episodes, branches), engine.stats

    outcomes, stats = run("regenerate")
    unchanged, silenced, auditor_silenced = outcomes
    assert not unchanged.diverged and unchanged.returns == episodes[0].returns
    # without the clerk's message the auditor has no price: it multiplies 0 by the quantity
    assert silenced.diverged and silenced.returns["auditor"] == 0.0
    auditor_turn = silenced.completions[1]["auditor"]
    assert "CALL calculator: 0*" in auditor_turn and "RESULT calculator: 0" in auditor_turn
    # the auditor's round-1 "ready" changes nothing the clerk writes or the answer
    assert auditor_silenced.returns == episodes[1].returns
    assert stats.generate_calls > 0
    again, _ = run("regenerate")
    assert [o.completions for o in again] == [o.completions for o in outcomes]
    assert [o.returns for o in again] == [o.returns for o in outcomes]


def test_difference_credit_of_a_tool_episode_credits_the_clerk() -> None:
    backend, episodes = _recorded()
    generate = backend_generate({"p": backend}, lambda a: "p", SAMPLING, seed=2)
    result = compute_credit("difference", episodes, marl.make("ledger-v0"), generate)
    for credit in result.credit:
        assert credit["clerk"] == 1.0  # V(z) - V(z without the clerk's message) = 1 - 0
