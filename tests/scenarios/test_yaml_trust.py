"""Scenario files as untrusted input (issue 9, items 3 and 11): only regular files within a
size limit are read, registered names win over files in the working directory, the YAML loader
refuses alias bombs, duplicate keys, huge numbers and deep nesting, problem messages stay short
whatever the value, and agent names can be neither invisible nor look-alikes. Fuzzed with
hypothesis, over YAML text and over documents."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import marl
from marl.cli import main
from marl.scenarios import ScenarioError, validate_scenario
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import random_bot
from marl.scenarios.reader import read_yaml
from marl.scenarios.registry import BUILTIN_DIR
from marl.scenarios.spec import spec_from_dict

marl.list_scenarios()  # registers the built-in rules

RELAY = {
    "name": "trust-relay-v0",
    "rules": "relay",
    "agents": ["alice", "bob", "carol", "dave"],
    "graph": {"topology": "line"},
    "params": {"reporter": "dave"},
}
MESSAGE_LIMIT = 300  # no problem line may be longer than this, whatever the document holds


def problems(doc: object) -> list[str]:
    found = [str(p) for p in validate_scenario(doc)]
    assert all(len(line) <= MESSAGE_LIMIT for line in found), max(found, key=len)[:500]
    return found


def load_text(tmp_path: Path, text: str | bytes, name: str = "s.yaml") -> object:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return read_yaml(path)


def refusal(tmp_path: Path, text: str | bytes) -> str:
    with pytest.raises(ScenarioError) as info:
        load_text(tmp_path, text)
    return str(info.value)


# --- 3. untrusted paths ------------------------------------------------------------------------


@pytest.mark.subprocess
def test_validate_dev_zero_is_refused_without_reading_it() -> None:
    """Run in a child limited to 1 GB of address space: reading /dev/zero would die there."""
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from marl.cli import main\n"
        "sys.exit(main(['validate', '/dev/zero']))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.returncode == 1
    assert result.stdout == (
        "/dev/zero: cannot read /dev/zero: not a regular file (a character device)\n"
    )


def test_a_fifo_named_yaml_does_not_block(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            read_yaml(fifo)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():  # unblock the reader, then fail
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        reader.join(timeout=10)
        pytest.fail("reading a FIFO blocked")
    assert len(outcome) == 1 and isinstance(outcome[0], ScenarioError)
    assert "not a regular file (a FIFO)" in str(outcome[0])


def test_files_over_the_size_limit_are_refused(tmp_path: Path) -> None:
    text = "name: big-v0\ndescription: " + "x" * 1_000_000 + "\n"
    assert "over the limit of 1000000" in refusal(tmp_path, text)
    (tmp_path / "ok.yaml").write_text("name: small-v0\ndescription: " + "x" * 900_000 + "\n")
    assert read_yaml(tmp_path / "ok.yaml")["name"] == "small-v0"


def test_a_file_in_the_working_directory_does_not_hijack_a_registered_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hijack = dict(RELAY, name="hijacked-v0", agents=["mallory", "bob", "carol", "dave"])
    for name in ("relay", "relay-v0"):
        (tmp_path / name).write_text(yaml.safe_dump(hijack))
    monkeypatch.chdir(tmp_path)
    for name in ("relay", "relay-v0"):
        env = marl.make(name)
        assert env.spec.name == "relay-v0" and env.spec.source == str(BUILTIN_DIR / "relay.yaml")
    # the file is still reachable, as a path
    assert marl.make("./relay-v0").spec.name == "hijacked-v0"
    # and a bare name no scenario is registered under still finds a file of that name
    (tmp_path / "mine").write_text(yaml.safe_dump(dict(hijack, name="mine-v0")))
    assert marl.make("mine").spec.name == "mine-v0"


# --- 11. the YAML loader -----------------------------------------------------------------------


def alias_bomb(levels: int, width: int = 9) -> str:
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, levels + 1):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    began = time.perf_counter()
    message = refusal(tmp_path, alias_bomb(9))  # 9**9 strings once expanded; 400 bytes
    assert time.perf_counter() - began < 2
    assert "line 1, column 5: YAML anchors (&name) are not allowed" in message
    assert "aliases (*name) are not allowed" in refusal(tmp_path, "a: *undefined\n")


def test_problem_messages_stay_short_whatever_the_value() -> None:
    bomb: object = ["lol"] * 9
    for _ in range(6):  # 9**7 strings when printed in full
        bomb = [bomb] * 9
    selfish: list = []
    selfish.append(selfish)
    for value in (bomb, selfish, "x" * 1_000_000, 10**5000, {"k" * 10_000: bomb}):
        began = time.perf_counter()
        doc = dict(RELAY, rules=value, graph={"topology": value, "center": value})
        doc["roles"] = {"x" * 10_000: value}
        doc["params"] = {"reporter": value, "y" * 10_000: 1}
        doc["graph"]["edges"] = [["alice", value]]
        found = problems(doc)
        assert time.perf_counter() - began < 2
        assert any(line.startswith("graph.topology: unknown topology") for line in found), found


def test_huge_numbers_are_problems_not_tracebacks(tmp_path: Path) -> None:
    digits = "7" * 5000
    message = refusal(tmp_path, f"name: x\nepisode: {{rounds: {digits}}}\n")
    assert "line 2, column 19: a number of 5000 characters (at most 100)" in message
    assert "a number of 5001 characters" in refusal(tmp_path, f"p: -{digits}\n")
    assert "a number of 5002 characters" in refusal(tmp_path, f"p: {digits}.5\n")
    # the same values arriving as Python data (overrides) are problems too
    for key, value in [("rounds", 10**5000), ("rounds", -(10**5000))]:
        assert problems(dict(RELAY, episode={key: value})) == [
            "episode.rounds: must be an integer between 1 and 1000"
        ]
    assert problems(dict(RELAY, reward={"malformed_penalty": 10**400})) == [
        "reward.malformed_penalty: must be a finite number"  # float() of it overflows
    ]
    found = problems(dict(RELAY, params={"reporter": 10**5000}))
    expected = "params.reporter: must be a string or null, got <an integer of about 5001 digits>"
    assert found == [expected], found


NESTED = [["alice"], [["alice"]], {"alice": 1}, [[[[[[[[["x"]]]]]]]]]]


@pytest.mark.parametrize("value", NESTED, ids=["list", "list2", "dict", "deep"])
def test_nested_values_where_names_belong_are_problems(value: object) -> None:
    places = {
        "name": dict(RELAY, name=value),
        "rules": dict(RELAY, rules=value),
        "agents": dict(RELAY, agents=["alice", value, "carol", "dave"]),
        "graph.center": dict(RELAY, graph={"topology": "star", "center": value}),
        "graph.topology": dict(RELAY, graph={"topology": value}),
        "graph.edges": dict(RELAY, graph={"topology": "explicit", "edges": [["alice", value]]}),
        "params.reporter": dict(RELAY, params={"reporter": value}),
        "roles": dict(RELAY, roles={"alice": value}),
    }
    for where, doc in places.items():
        found = problems(doc)
        assert any(line.startswith(where) for line in found), (where, found)
        with pytest.raises(ScenarioError):
            spec_from_dict(doc)


def test_a_sequence_as_a_key_is_a_problem(tmp_path: Path) -> None:
    text = "name: x\nroles: {[alice]: hi}\n"
    assert "found unhashable key" in refusal(tmp_path, text)
    text = "name: x\nroles:\n  ? [alice, bob]\n  : hi\n"
    assert "found unhashable key" in refusal(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("name: a\nrules: relay\nname: b\n", "line 3, column 1: duplicate key 'name'"),
        (
            "graph: {topology: line, topology: ring}\n",
            "line 1, column 25: duplicate key 'topology'",
        ),
        ("params:\n  reporter: dave\n  reporter: alice\n", "line 3, column 3: duplicate key"),
        ("roles: {1: a, 1.0: b}\n", "duplicate key 1.0"),
    ],
)
def test_duplicate_keys_are_refused(tmp_path: Path, text: str, where: str) -> None:
    assert where in refusal(tmp_path, text)


def test_deep_nesting_and_code_tags_are_refused(tmp_path: Path) -> None:
    assert "YAML nested too deeply" in refusal(tmp_path, "[" * 100_000)
    assert "YAML nested too deeply" in refusal(
        tmp_path, "a:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 80))
    )
    assert read_yaml_ok(tmp_path, "[" * 40 + "]" * 40)
    marker = tmp_path / "ran"
    for tag in ("!!python/object/apply:os.system", "!!python/name:os.system", "!!python/object"):
        message = refusal(tmp_path, f"name: {tag} ['touch {marker}']\n")
        assert "could not determine a constructor" in message
    assert not marker.exists()


def read_yaml_ok(tmp_path: Path, text: str) -> bool:
    load_text(tmp_path, text, "ok.yaml")
    return True


# --- agent names -------------------------------------------------------------------------------

INVISIBLE = {
    "zero-width space": "b\u200bob",
    "zero-width joiner": "bo\u200db",
    "word joiner": "\u2060bob",
    "right-to-left override": "bob\u202e",
    "left-to-right isolate": "\u2066bob",
    "byte-order mark": "\ufeffbob",
    "soft hyphen": "bo\u00adb",
    "bell": "bob\x07",
    "escape": "\x1b[31mbob",
    "Hangul filler": "bob\u3164",
    "variation selector": "bob\ufe0f",
    "combining grapheme joiner": "bo\u034fb",
    "private use": "bob\ue000",
}


@pytest.mark.parametrize("name", list(INVISIBLE.values()), ids=list(INVISIBLE))
def test_agent_names_with_invisible_characters_are_refused(name: str) -> None:
    found = problems(dict(RELAY, agents=["alice", name, "carol", "dave"]))
    assert len(found) == 1 and found[0].startswith("agents[1]: ")
    assert "invisible or control character" in found[0] or "spaces" in found[0], found


LOOKALIKES = {
    "case": ("alice", "Alice"),
    "fullwidth": ("alice", "\uff41\uff4c\uff49\uff43\uff45"),
    "ligature": ("fine", "\ufb01ne"),
    "mixed Cyrillic": ("alice", "\u0430lice"),
    "mixed Greek": ("bob", "b\u03bfb"),
    "all Cyrillic": ("scope", "\u0455\u0441\u043e\u0440\u0435"),
    "combining": ("caf\u00e9", "cafe\u0301"),
}


@pytest.mark.parametrize(("first", "second"), list(LOOKALIKES.values()), ids=list(LOOKALIKES))
def test_look_alike_agent_names_are_refused(first: str, second: str) -> None:
    found = problems(dict(RELAY, agents=[first, "zed", second, "dave"], params={}))
    found = [line for line in found if line.startswith("agents[")]
    assert len(found) == 1 and found[0].startswith("agents[2]: "), found
    assert "looks like agent" in found[0] or "mixes" in found[0], found


def test_distinct_names_in_any_script_are_accepted() -> None:
    for agents in (
        ["alice", "bob", "carol", "dave"],
        ["\u0430\u043d\u044f", "\u0431\u043e\u0440\u044f", "\u0432\u0435\u0440\u0430", "dave"],
        ["\u82b1\u5b50", "\u3072\u308d\u3057", "\u30b1\u30f3", "dave"],
        ["agent_1", "agent-2", "A3", "dave"],
    ):
        doc = dict(RELAY, agents=agents, params={"reporter": "dave"})
        assert problems(doc) == [], agents
    too_long = problems(dict(RELAY, agents=["a" * 65, "bob", "carol", "dave"]))
    assert too_long == [f"agents[0]: agent name '{'a' * 65}' is 65 characters long (at most 64)"]


# --- fuzzing -----------------------------------------------------------------------------------

YAML_TOKENS = [
    "name",
    "agents",
    "graph",
    "params",
    "roles",
    "rules",
    "relay",
    "alice",
    "bob",
    ":",
    ": ",
    "- ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "\n",
    "  ",
    "\t",
    "&a",
    "*a",
    "&b",
    "*b",
    "<<: ",
    "!!int ",
    "!!str ",
    "!!python/object:os.system ",
    "!!binary ",
    "!!set ",
    "? ",
    "'",
    '"',
    "#",
    "---\n",
    "...\n",
    "7" * 120,
    "1e400",
    "-.inf",
    ".nan",
    "0x1F",
    "0o17",
    "1_000",
    "12:30:00",
    "2001-12-14",
    "2001-13-45",
    "!!timestamp ",
    "!!float ",
    "~",
    "null",
    "yes",
    "\u200b",
    "\u202e",
    "\x00",
    "\ufeff",
    "|\n",
    ">\n",
    "%YAML",
]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.sampled_from(YAML_TOKENS), max_size=40))
def test_fuzz_read_yaml_gives_data_or_a_scenario_error(tmp_path: Path, tokens: list[str]) -> None:
    text = "".join(tokens)
    began = time.perf_counter()
    try:
        data = load_text(tmp_path, text)
    except ScenarioError as exc:
        assert all(len(str(p)) <= MESSAGE_LIMIT for p in exc.problems)
    else:
        problems(data)
    assert time.perf_counter() - began < 5


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=300))
def test_fuzz_read_yaml_on_bytes(tmp_path: Path, data: bytes) -> None:
    try:
        problems(load_text(tmp_path, data))
    except ScenarioError:
        pass


def hostile_values() -> st.SearchStrategy:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers()
        | st.integers(4000, 6000).map(lambda digits: 10**digits)
        | st.sampled_from([2**64, -(2**64), math.nan, math.inf, -math.inf, 1e308])
        | st.floats()
        | st.text(max_size=12)
        | st.sampled_from(["alice", "dave", "\u200balice", "Alice", "a" * 5000, "", " "])
    )
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(max_size=4) | st.integers(), inner, max_size=3)
            | st.tuples(inner, inner)
        ),
        max_leaves=8,
    )


def paths(doc: object, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            found += paths(value, (*prefix, i))
    return found


def replaced(doc: object, path: tuple, value: object) -> object:
    if not path:
        return value
    head, *rest = path
    if isinstance(doc, dict):
        return {**doc, head: replaced(doc[head], tuple(rest), value)}
    copy = list(doc)  # type: ignore[call-overload]
    copy[head] = replaced(copy[head], tuple(rest), value)
    return copy


BUILTIN_DOCS = [read_yaml(path) for path in sorted(BUILTIN_DIR.glob("*.yaml"))]
EXTRA_KEYS = [
    ("graph", "center"),
    ("graph", "edges"),
    ("roles", "alice"),
    ("params", "junk"),
    ("messages", "noise"),
    ("episode", "lenient_actions"),
    ("agents", 0),
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(BUILTIN_DOCS),
    st.data(),
    st.lists(hostile_values(), min_size=1, max_size=3),
)
def test_fuzz_every_builtin_document_with_hostile_values(
    doc: dict, data: st.DataObject, values: list
) -> None:
    for value in values:
        targets = paths(doc)[1:] + [p for p in EXTRA_KEYS if p[0] in doc]
        path = data.draw(st.sampled_from(targets))
        try:
            doc = replaced(doc, path, value)  # type: ignore[assignment]
        except (IndexError, KeyError, TypeError):
            continue
    found = problems(doc)
    try:
        spec = spec_from_dict(doc)
    except ScenarioError as exc:
        assert found and [str(p) for p in exc.problems] == found
        return
    assert not found
    env = TextScenarioEnv(spec)
    rng = random.Random(0)
    observations, infos = env.reset(seed=0)
    for _ in range(3):
        if not env.agents:
            break
        actions = {a: random_bot(a, observations[a], infos[a], rng) for a in env.agents}
        observations, rewards, *_, infos = env.step(actions)


def test_validate_cli_bounds_every_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    doc = dict(RELAY, agents=["bob"] * 200, graph={"topology": "x" * 100_000})
    path = tmp_path / "many.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert all(len(line) <= MESSAGE_LIMIT + len(str(path)) + 2 for line in lines)
    assert len(lines) == 51 and lines[-1].startswith(f"{path}: ... and ")
    assert lines[-1].endswith(" more problems")
