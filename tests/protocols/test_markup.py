"""The SAY/ACTION markup parser: a table of cases, hostile inputs, and hypothesis fuzzing of the
parser and of a whole environment step fed arbitrary text."""

from __future__ import annotations

import math
import time
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marl
from marl.protocols.markup import (
    MAX_COMPLETION_CHARS,
    ParsedCompletion,
    markup_instructions,
    parse_completion,
    sanitize,
)
from marl.scenarios.rules import RULES

# (completion, expected messages as (to, text), expected action, expected error substrings)
CASES = [
    ("SAY: hello\nACTION: 3", [(None, "hello")], "3", []),
    ("say: hello\naction: 3", [(None, "hello")], "3", []),
    ("**SAY:** the red circle\n**ACTION:** 2", [(None, "the red circle")], "2", []),
    ("- SAY: hi\n- ACTION: 1", [(None, "hi")], "1", []),
    ("### Action: `4`", [], "4", []),
    ("> SAY: quoted\n  ACTION :  7  ", [(None, "quoted")], "7", []),
    ("ACTION: 1\nthinking...\nACTION: 2\nACTION: 3", [], "3", []),  # the last one wins
    (
        "SAY @bob @carol: meet at the bridge\nACTION: go",
        [(("bob", "carol"), "meet at the bridge")],
        "go",
        [],
    ),
    ("SAY @bob, @carol: x\nACTION: a", [(("bob", "carol"), "x")], "a", []),
    ("SAY @bob @bob: twice\nACTION: a", [(("bob",), "twice")], "a", []),
    ("**SAY @bob:** bold\nACTION: a", [(("bob",), "bold")], "a", []),
    ("SAY: a: b: c\nACTION: a", [(None, "a: b: c")], "a", []),  # the first colon splits
    ("SAY: one\nSAY @x: two\nACTION: a", [(None, "one"), (("x",), "two")], "a", []),
    ("SAY:\nACTION: 1", [], "1", ["empty SAY line ignored"]),
    ("SAY:   **  \nACTION: 1", [], "1", ["empty SAY line ignored"]),
    ("SAY: hello", [(None, "hello")], None, ["no ACTION line"]),
    ("", [], None, ["no ACTION line"]),
    ("ACTION:", [], "", ["no ACTION line"]),
    ("just some thoughts, no markup", [], None, ["no ACTION line"]),
    ("SAYING: not a say line\nACTION: 1", [], "1", []),
    # an address with words in it: not sent, and the sender is told (issue 42)
    ("SAY hello @bob: words in the address\nACTION: 1", [], "1", ["is not @name tokens"]),
    ("I SAY: not at line start\nACTION: 1", [], "1", []),
    ("SAY: zero\u200bwidth\x07bell\nACTION: 1\x00", [(None, "zerowidthbell")], "1", []),
    ("SAY: tab\tkept\r\nACTION: 1\r\n", [(None, "tab\tkept")], "1", []),
    ("SAY: ünïcödé 🚀\nACTION: ✓", [(None, "ünïcödé 🚀")], "✓", []),
    ("SAY @ällä: hej\nACTION: 1", [(("ällä",), "hej")], "1", []),
]


@pytest.mark.parametrize(("completion", "messages", "action", "errors"), CASES)
def test_parse_table(completion: str, messages: list, action: str | None, errors: list) -> None:
    parsed = parse_completion(completion)
    assert [(m.to, m.text) for m in parsed.messages] == messages
    assert parsed.action == action
    assert len(parsed.errors) == len(errors)
    for got, want in zip(parsed.errors, errors):
        assert want in got
    assert parsed.ok == (not errors)


def test_free_text_keeps_the_lines_that_are_neither_say_nor_action() -> None:
    parsed = parse_completion("I think\nSAY: hi\nso\nACTION: 2")
    assert parsed.free_text == "I think\nso"


def test_action_is_optional_when_not_required() -> None:
    assert parse_completion("SAY: hi", require_action=False).ok
    assert parse_completion("", require_action=False).errors == []


@pytest.mark.parametrize("value", [None, 3, b"SAY: hi\nACTION: 1", ["ACTION: 1"], {"a": 1}])
def test_non_text_input_is_an_error_not_an_exception(value: object) -> None:
    parsed = parse_completion(value)
    assert parsed.messages == [] and parsed.action is None
    assert parsed.errors == [f"completion is not text (got {type(value).__name__})"]


def test_overlong_completion_is_cut_and_flagged() -> None:
    text = "ACTION: 1\n" + "x" * MAX_COMPLETION_CHARS + "\nACTION: 2"
    parsed = parse_completion(text)
    assert parsed.action == "1", "the tail beyond the limit is not read"
    assert any("was cut" in e for e in parsed.errors)


@pytest.mark.parametrize(
    "line",
    [
        "SAY @a" + "," * 19_990,  # once 22 s: nested quantifiers over overlapping classes
        "SAY @a" + "*" * 19_990,
        "SAY @a" + "-" * 19_990 + "x",
        "SAY " + "@a " * 6_000 + "x",
        "ACTION" + " " * 19_990 + "x",
        "-" * 19_990,
        "**" * 9_000 + "SAY" + "_" * 1_000,
    ],
)
def test_hostile_lines_parse_in_linear_time(line: str) -> None:
    start = time.perf_counter()
    parse_completion(line)
    assert time.perf_counter() - start < 0.5


def test_markup_instructions_teach_the_markup_and_name_nobody() -> None:
    text = markup_instructions(True)
    assert "SAY @name" in text and "ACTION:" in text and "whom you can message" in text
    assert "Nobody can receive" in markup_instructions(False)
    assert "ACTION" not in markup_instructions(True, needs_action=False)


# --- fuzzing -----------------------------------------------------------------------------------

MARKUP_BITS = [
    "SAY",
    "say",
    "ACTION",
    "action",
    ":",
    "@",
    "@bob",
    "**",
    "- ",
    "#",
    "`",
    ",",
    "\n",
    "\r",
    "\t",
    " ",
    "\x00",
    "\u200b",
    "\u2028",
    "\x85",
    "😀",
    "ß",
]
markupish = st.lists(st.sampled_from(MARKUP_BITS) | st.text(max_size=5), max_size=40).map("".join)
any_text = st.text() | markupish | st.binary().map(lambda b: b.decode("latin-1"))


@settings(max_examples=150, deadline=None)
@given(any_text, st.booleans())
def test_parse_completion_never_raises(text: str, require_action: bool) -> None:
    parsed = parse_completion(text, require_action=require_action)
    assert isinstance(parsed, ParsedCompletion)
    for message in parsed.messages:
        assert message.text and message.text == message.text.strip()
        assert "\n" not in message.text
        assert message.to is None or (message.to and all(message.to))
    if require_action and not parsed.action:
        assert "no ACTION line" in parsed.errors
    if parsed.action:
        assert "\n" not in parsed.action


@settings(max_examples=10, deadline=None)
@given(st.integers(MAX_COMPLETION_CHARS - 10, 3 * MAX_COMPLETION_CHARS), st.sampled_from("x\n@:"))
def test_huge_inputs_never_raise(size: int, char: str) -> None:
    parsed = parse_completion("SAY @" + char * size)
    assert any("was cut" in e for e in parsed.errors) or size + 5 <= MAX_COMPLETION_CHARS


SCENARIOS = marl.list_scenarios()


@pytest.fixture(scope="module")
def envs() -> dict:
    return {name: marl.make(name) for name in SCENARIOS}


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(SCENARIOS),
    seed=st.integers(0, 1000),
    texts=st.lists(any_text | st.none() | st.integers(), min_size=1, max_size=12),
)
def test_env_step_with_arbitrary_text_never_raises(envs: dict, name: str, seed: int, texts) -> None:
    env = envs[name]
    env.reset(seed=seed)
    free_text = RULES[env.spec.rules].info.free_text_action
    i = 0
    while env.agents:
        actions = {}
        for agent in env.agents:
            actions[agent] = texts[i % len(texts)]
            i += 1
        needs = {a: env.rules.needs_action(a, env.round) for a in env.agents}
        before = env.malformed
        observations, rewards, terminations, truncations, infos = env.step(actions)
        assert set(rewards) == set(terminations) == set(truncations) == set(observations)
        assert all(math.isfinite(r) for r in rewards.values())
        assert all(isinstance(o, str) for o in observations.values())
        for agent, completion in actions.items():
            parsed = parse_completion(completion, require_action=needs[agent] and not free_text)
            if parsed.errors:
                assert env.malformed[agent] == before[agent] + 1, (agent, completion)
                assert "Your reply was malformed" in observations[agent]
            if needs[agent] and not free_text and not parsed.action:
                assert env.malformed[agent] == before[agent] + 1
    assert all(math.isfinite(r) for r in env.returns.values())


def _sanitize_by_category(text: str) -> str:
    """The definition :func:`sanitize` implements (its fast path must agree with it)."""
    kept = [ch for ch in text if ch in "\n\t" or unicodedata.category(ch)[0] != "C"]
    return "".join(kept).strip()


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\t\n\x00\u200b\u2028 ")))
def test_sanitize_drops_exactly_the_control_and_format_characters(text: str) -> None:
    assert sanitize(text) == _sanitize_by_category(text)
    assert sanitize(" plain text ") == "plain text"


@pytest.mark.parametrize(
    "line",
    ["SAY @@bob: hi", "SAY ＠ｂｏｂ: hi", "SAY @bob @: hi", "SAY to @bob: hi"],
)
def test_a_say_line_with_a_broken_address_is_told_not_dropped(line: str) -> None:
    parsed = parse_completion(f"{line}\nACTION: 1")
    assert parsed.messages == [] and parsed.action == "1"
    assert len(parsed.errors) == 1 and "is not @name tokens" in parsed.errors[0]
    assert "that message was not sent" in parsed.errors[0]


def test_prose_that_starts_with_say_is_still_free_text() -> None:
    parsed = parse_completion("Saying: hello there\nSAY @bob: hi\nACTION: 1")
    assert parsed.errors == [] and parsed.free_text == "Saying: hello there"
    assert [(m.to, m.text) for m in parsed.messages] == [(("bob",), "hi")]
