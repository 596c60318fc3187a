"""The tool loop within a turn: a CALL line is cut off, run, its RESULT inserted with mask 0,
and the reply continues; limits, budgets, determinism, and the path without tools unchanged."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import marl
from marl.agents.backends import SamplingConfig
from marl.agents.backends.hf import HFBackend
from marl.agents.generation import PromptRequest, _shortest_prefix, generate_by_policy
from marl.agents.models import ModelSpec
from marl.protocols.markup import parse_completion
from marl.runtime.rollout import EpisodeSlot, run_episodes

_spec = importlib.util.spec_from_file_location(
    "tool_policy", Path(__file__).resolve().parent / "tool_policy.py"
)
tool_policy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool_policy)

CALC = {"calculator": {"calls": 2, "max_chars": 80, "timeout": 1.0, "data": None}}
SAMPLING = SamplingConfig(max_new_tokens=200)


def _generate(script, info, sampling=SAMPLING, n=1):
    backend = tool_policy.ScriptedTextBackend(script)
    request = PromptRequest("ann", "You add numbers.", "What is 17 times 23?", info, n)
    replies, calls = generate_by_policy({"p": backend}, lambda a: "p", [request], sampling, 0)
    return backend, replies[0], calls


def _two_step(prompt: str) -> str:
    if "RESULT calculator" not in prompt:
        return "Thinking.\nCALL calculator: 17*23\nACTION: a guess the loop drops"
    return "SAY: it is 391\nACTION: 391"


def test_the_result_follows_the_call_with_mask_zero_and_the_reply_continues() -> None:
    backend, (reply,), calls = _generate(_two_step, {"tools": CALC})
    assert calls == 2 and backend.calls == 2
    assert reply.text == (
        "Thinking.\nCALL calculator: 17*23\nRESULT calculator: 391\nSAY: it is 391\nACTION: 391"
    )
    tok = backend.tokenizer
    tool_ids = [t for t, m in zip(reply.response_ids, reply.mask) if m == 0]
    assert tok.decode(tool_ids) == "RESULT calculator: 391\n"
    assert all(lp == 0.0 for lp, m in zip(reply.logprobs, reply.mask) if m == 0)
    assert all(lp < 0.0 for lp, m in zip(reply.logprobs, reply.mask) if m == 1)
    # the second call's prompt is the first prompt + everything so far, tool output included
    first, second = backend.prompts
    assert second == first + reply.response_ids[: len(second) - len(first)]
    assert tok.decode(second[len(first) :]).endswith("RESULT calculator: 391\n")
    # the environment reads the agent's lines only: the ACTION after the result
    parsed = parse_completion(reply.text)
    assert parsed.action == "391" and [m.text for m in parsed.messages] == ["it is 391"]
    assert (reply.tool_calls, reply.tool_errors) == (1, 0)


def test_without_tools_a_call_line_is_plain_text_and_one_call_is_made() -> None:
    backend, (reply,), calls = _generate(_two_step, {"needs_action": True})
    assert calls == 1
    assert "RESULT" not in reply.text and "a guess the loop drops" in reply.text
    assert reply.mask == [1] * len(reply.response_ids) and not reply.tools


def test_calls_stop_at_the_limit_and_a_further_call_line_stays_text() -> None:
    backend, (reply,), calls = _generate(lambda p: "CALL calculator: 1+1\n", {"tools": CALC})
    assert calls == 1 + 2  # the first pass and one per allowed call
    assert reply.tool_calls == 2
    assert reply.text.count("RESULT calculator: 2") == 2
    assert reply.text.count("CALL calculator") == 3


def test_unknown_tool_and_bad_input_are_errors_in_the_reply() -> None:
    def script(prompt: str) -> str:
        if "RESULT" not in prompt:
            return "CALL search: weather\n"
        if prompt.count("RESULT") == 1:
            return "CALL calculator: 9**9**9\n"
        return "ACTION: 0"

    _, (reply,), _ = _generate(script, {"tools": CALC})
    assert "RESULT search: error: unknown tool 'search'; your tools: calculator" in reply.text
    assert "RESULT calculator: error: exponent 387420489 is too large" in reply.text
    assert reply.tool_errors == 2 and reply.tool_calls == 2


def test_generated_tokens_stay_within_max_new_tokens() -> None:
    sampling = SamplingConfig(max_new_tokens=40)
    script = lambda p: "CALL calculator: 2*3\n" + "x" * 100  # noqa: E731
    _, (reply,), _ = _generate(script, {"tools": CALC}, sampling)
    assert sum(reply.mask) <= 40
    assert reply.mask.count(0) > 0  # tool output does not count against the budget


def test_each_sample_counts_its_own_calls() -> None:
    _, replies, calls = _generate(_two_step, {"tools": CALC}, n=3)
    assert calls == 2 and len(replies) == 3
    assert len({r.text for r in replies}) == 1 and all(r.tool_calls == 1 for r in replies)


class _ChunkTokenizer:
    """Decodes ids as 4-character chunks of a fixed text: tokens that straddle a newline."""

    def __init__(self, text: str) -> None:
        self.chunks = [text[i : i + 4] for i in range(0, len(text), 4)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(self.chunks[i] for i in ids)


def test_the_cut_keeps_the_token_that_ends_the_call_line() -> None:
    text = "ok\nCALL calculator: 1+2\nSAY: later"
    tok = _ChunkTokenizer(text)
    cut = _shortest_prefix(tok, list(range(len(tok.chunks))), "", 0)
    kept = tok.decode(list(range(cut)))
    assert kept.startswith("ok\nCALL calculator: 1+2\n") and len(kept) - len(text[:24]) < 4
    assert not tok.decode(list(range(cut - 1))).startswith("ok\nCALL calculator: 1+2\n")


def test_a_tools_scenario_replays_the_same_tool_calls_with_the_same_seed() -> None:
    def play():
        backend = tool_policy.ScriptedTextBackend(tool_policy.ledger_script)
        slots = [
            EpisodeSlot(marl.make("ledger-v0"), seed=s, group_id=0, episode_id=s) for s in (0, 1)
        ]
        return run_episodes(slots, {"p": backend}, lambda a: "p", SAMPLING, seed=3)

    first, second = play(), play()
    assert [t.text for t in first.turns] == [t.text for t in second.turns]
    assert [t.mask for t in first.turns] == [t.mask for t in second.turns]
    # the scripted tool user solves the task: every episode's total is exact
    assert all(e.success == 1.0 for e in first.episodes)
    assert first.generated_tokens == sum(sum(t.mask) for t in first.turns)
    assert all(t.extras["tool_calls"] >= 0 for t in first.turns)


def test_the_hf_backend_path_with_tools_but_no_call_is_unchanged() -> None:
    backend = HFBackend(ModelSpec(seed=0))
    requests = [PromptRequest("ann", "sys", "obs", {"needs_action": True}, 2)]
    with_tools = [PromptRequest("ann", "sys", "obs", {"needs_action": True, "tools": CALC}, 2)]
    sampling = SamplingConfig(max_new_tokens=16)
    plain, _ = generate_by_policy({"p": backend}, lambda a: "p", requests, sampling, 5)
    tooled, calls = generate_by_policy({"p": backend}, lambda a: "p", with_tools, sampling, 5)
    assert calls >= 1
    for a, b in zip(plain[0], tooled[0]):
        if "CALL" not in a.text.upper():  # the random tiny model writes no call line
            assert (a.text, a.response_ids, a.logprobs) == (b.text, b.response_ids, b.logprobs)
            assert b.mask == [1] * len(b.response_ids) and b.tools


@pytest.mark.parametrize("seed", [0, 1])
def test_rollout_turn_records_carry_the_mask(seed: int) -> None:
    backend = tool_policy.ScriptedTextBackend(tool_policy.ledger_script)
    slots = [EpisodeSlot(marl.make("ledger-v0"), seed=seed, group_id=0, episode_id=0)]
    result = run_episodes(slots, {"p": backend}, lambda a: "p", SAMPLING, seed=0)
    auditor = [t for t in result.turns if t.agent == "auditor" and t.round == 1][0]
    tok = backend.tokenizer
    generated = tok.decode([i for i, m in zip(auditor.response_ids, auditor.mask) if m])
    inserted = tok.decode([i for i, m in zip(auditor.response_ids, auditor.mask) if not m])
    assert "RESULT" not in generated and "CALL lookup" in generated
    assert inserted.count("RESULT") == 2 and "CALL" not in inserted
    assert auditor.extras["tool_calls"] == 2.0
