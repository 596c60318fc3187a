"""The declarative rule families (matrix, question, vote): games written in YAML alone.

The built-in YAML-only games have no Python of their own and are picked up by the conformance
suite; each family plays and pays as its docstring says; ``marl validate`` names the key of
each mistake in a family's params; templates substitute values as data and never evaluate.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import pytest
import yaml

import marl
from marl.cli import main
from marl.scenarios import validate_scenario
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import bot_names
from marl.scenarios.conformance import play_episode
from marl.scenarios.families.common import match_choice, parse_int
from marl.scenarios.families.templates import render, template_problems
from marl.scenarios.registry import BUILTIN_DIR, load_document
from marl.scenarios.rules import RULES
from marl.scenarios.spec import spec_from_dict

YAML_ONLY = {
    "prisoners-dilemma-v0": "matrix",
    "stag-hunt-v0": "matrix",
    "sum-relay-v0": "question",
    "majority-vote-v0": "vote",
}


def builtin(name: str) -> dict:
    """The YAML document of a built-in scenario (a fresh copy to break)."""
    return copy.deepcopy(load_document(name)[0])


def problems(doc: dict) -> list[str]:
    return [str(p) for p in validate_scenario(doc)]


# --- the YAML-only games --------------------------------------------------------------------


@pytest.mark.parametrize(("name", "family"), sorted(YAML_ONLY.items()))
def test_yaml_only_games_have_no_python_of_their_own(name: str, family: str) -> None:
    doc, source = load_document(name)
    assert Path(source).parent == BUILTIN_DIR and doc["rules"] == family
    assert RULES[family].__module__ == f"marl.scenarios.families.{family}"
    stem = Path(source).stem
    assert not (BUILTIN_DIR / f"{stem}.py").exists()
    python = [p.read_text() for p in BUILTIN_DIR.glob("*.py")]
    assert not any(f'"{family}"' in text or f'"{name}"' in text for text in python)


def test_the_conformance_suite_and_the_golden_transcripts_cover_them() -> None:
    conformance = importlib.util.find_spec("marl.scenarios.conformance")
    assert conformance is not None
    names = marl.list_scenarios()  # what tests/scenarios/test_conformance.py parametrizes over
    assert set(YAML_ONLY) <= set(names)
    golden = Path(__file__).resolve().parents[1] / "golden"
    for name, family in YAML_ONLY.items():
        assert bot_names(family) == ["random", "rule"]
        for bot in bot_names(family):
            assert (golden / f"{name}__{bot}.txt").exists()


def test_the_rule_bot_hunts_the_stag_and_cooperates_in_the_dilemma() -> None:
    for name, action in (("stag-hunt-v0", "stag"), ("prisoners-dilemma-v0", "cooperate")):
        env = marl.make(name)
        play_episode(env, "rule", seed=0)
        assert {t.action for t in env.log if t.action} == {action}
        assert env.malformed == dict.fromkeys(env.possible_agents, 0)


def test_the_rule_bot_solves_the_sum_relay_at_every_seed() -> None:
    env = marl.make("sum-relay")
    for seed in range(10):
        play_episode(env, "rule", seed=seed)
        assert env.rules.success() == 1.0
        assert env.returns == dict.fromkeys(env.possible_agents, 1.0)


def test_the_rule_bots_reach_a_majority_within_two_ballots() -> None:
    env = marl.make("majority-vote")
    for seed in range(10):
        play_episode(env, "rule", seed=seed)
        assert env.rules.success() == 1.0 and env.rules.adopted in env.rules.options


# --- matrix: payoffs and the cooperation coefficient ------------------------------------------


def play(env, rounds: list[dict[str, str]], seed: int = 0) -> dict[str, float]:
    env.reset(seed=seed)
    for actions in rounds:
        env.step(actions)
    assert not env.agents
    return env.returns


@pytest.mark.parametrize(
    ("cooperation", "expected"),
    [(1.0, {"alice": 2.5, "bob": 2.5}), (0.0, {"alice": 5.0, "bob": -5.0})],
)
def test_the_dilemma_pays_the_table_through_the_cooperation_coefficient(
    cooperation: float, expected: dict[str, float]
) -> None:
    env = marl.make("prisoners-dilemma", reward={"cooperation": cooperation}, params={"repeats": 1})
    talk = {"alice": "SAY: I will cooperate", "bob": "SAY: me too"}
    returns = play(env, [talk, {"alice": "ACTION: defect", "bob": "ACTION: Cooperate."}])
    assert returns == expected  # table (defect, cooperate) = (5, 0): team 2.5, zero-sum +-5


def test_an_invalid_action_counts_as_the_fallback_and_costs_the_penalty() -> None:
    env = marl.make("stag-hunt", reward={"cooperation": 1.0}, params={"fallback": "hare"})
    returns = play(env, [{}, {"alice": "ACTION: stag", "bob": "ACTION: the moon"}])
    assert returns == {"alice": 1.5, "bob": 1.5 - 0.1}  # (stag, hare) = (0, 3), mean 1.5
    assert "counted as hare" in env.log[-1].invalid_action


def test_an_action_naming_two_choices_is_invalid() -> None:
    env = marl.make("stag-hunt", reward={"cooperation": 1.0})
    play(env, [{}, {"alice": "ACTION: stag or hare", "bob": "ACTION: I hunt the stag"}])
    assert env.malformed == {"alice": 1, "bob": 0}


THREE_PLAYER = {
    "name": "test-three-v0",
    "rules": "matrix",
    "agents": ["p", "q", "r"],
    "reward": {"cooperation": 0.0},
    "params": {
        "actions": {"p": ["up", "down"], "q": ["left", "right"], "r": ["go"]},
        "payoffs": {
            "up": {"left": {"go": [1, 2, 3]}, "right": {"go": [0, 0, 0]}},
            "down": {"left": {"go": [4, 5, 6]}, "right": {"go": [7, 8, 9]}},
        },
        "talk_rounds": 0,
        "repeats": 2,
    },
}


def test_three_players_with_their_own_actions_and_repeated_play(tmp_path: Path) -> None:
    path = tmp_path / "three.yaml"
    path.write_text(yaml.safe_dump(THREE_PLAYER))
    env = marl.make(path)
    assert env.spec.rounds == 2  # (talk_rounds + 1) x repeats
    returns = play(
        env,
        [
            {"p": "ACTION: down", "q": "ACTION: right", "r": "ACTION: go"},
            {"p": "ACTION: up", "q": "ACTION: left", "r": "ACTION: go"},
        ],
    )
    # zero-sum: x_i - mean of the others; stages (7, 8, 9) then (1, 2, 3)
    assert returns == pytest.approx({"p": -3.0, "q": 0.0, "r": 3.0})
    assert "Last actions: p=up, q=left, r=go" in env.rules.public_state()


# --- question: operations and scoring --------------------------------------------------------


def question_env(tmp_path: Path, question: dict, scoring: str = "exact", pools=None, **extra):
    pools = pools or {"a": [3], "b": [4], "c": [5]}
    doc = {
        "name": "test-question-v0",
        "rules": "question",
        "agents": ["ann", "ben", "cat"],
        "params": {
            "facts": [
                {"name": n, "pool": pool, "holders": [agent]}
                for (n, pool), agent in zip(pools.items(), ["ann", "ben", "cat", "cat"])
            ],
            "question": question,
            "scoring": scoring,
            "talk_rounds": 0,
            **extra,
        },
    }
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert problems(doc) == []
    return marl.make(path)


@pytest.mark.parametrize(
    ("question", "right"),
    [
        ({"op": "sum", "facts": ["a", "b", "c"]}, 12),
        ({"op": "max", "facts": ["a", "c", "b"]}, 5),
        ({"op": "concat", "facts": ["c", "a", "b"]}, "534"),
        ({"op": "concat", "facts": ["a", "b"], "separator": "-"}, "3-4"),
    ],
)
def test_each_operation_computes_the_answer_from_the_dealt_facts(
    tmp_path: Path, question: dict, right: object
) -> None:
    env = question_env(tmp_path, question, reporter="cat")
    env.reset(seed=0)
    assert env.rules.right_answer() == right
    env.step({"cat": f"ACTION: {right}"})
    assert env.rules.success() == 1.0 and env.returns["cat"] == 1.0


def test_a_lookup_reads_the_fact_the_key_names(tmp_path: Path) -> None:
    pools = {"box": ["red", "blue"], "red": ["apple", "pear"], "blue": ["plum", "fig"]}
    env = question_env(
        tmp_path, {"op": "lookup", "key": "box", "facts": ["red", "blue"]}, pools=pools
    )
    for seed in range(6):
        env.reset(seed=seed)
        values = env.rules.values
        right = values[values["box"]]
        assert env.rules.right_answer() == right
        assert env.rules.score(f"it is the {right}") == 1.0
        wrong = next(v for v in ["apple", "pear", "plum", "fig"] if v != right)
        assert env.rules.score(wrong) == 0.0
        assert env.rules.score("no idea") is None


def test_partial_scoring_pays_for_closeness(tmp_path: Path) -> None:
    pools = {"a": [0, 9], "b": [0, 9], "c": [0, 9]}
    env = question_env(tmp_path, {"op": "sum", "facts": ["a", "b", "c"]}, "partial", pools)
    env.reset(seed=0)
    right = env.rules.right_answer()
    assert env.rules.score(str(right)) == 1.0
    off_by_three = right + 3 if right <= 24 else right - 3
    assert env.rules.score(str(off_by_three)) == pytest.approx(1 - 3 / 27)
    concat = question_env(tmp_path, {"op": "concat", "facts": ["a", "b", "c"]}, "partial")
    concat.reset(seed=0)
    assert concat.rules.score("345") == 1.0 and concat.rules.score("340") == pytest.approx(2 / 3)
    exact = question_env(tmp_path, {"op": "concat", "facts": ["a", "b", "c"]}, "exact")
    exact.reset(seed=0)
    assert exact.rules.score("340") == 0.0


def test_with_no_reporter_every_agent_answers_and_the_team_gets_the_mean(tmp_path: Path) -> None:
    env = question_env(tmp_path, {"op": "sum", "facts": ["a", "b", "c"]})
    env.reset(seed=0)
    assert all(env.rules.needs_action(a, 0) for a in env.possible_agents)
    env.step({"ann": "ACTION: 12", "ben": "ACTION: 12", "cat": "ACTION: 13"})
    assert env.returns == pytest.approx(dict.fromkeys(["ann", "ben", "cat"], 2 / 3))


def test_each_agent_sees_only_the_facts_it_holds() -> None:
    env = marl.make("sum-relay")
    observations, _ = env.reset(seed=4)
    values = env.rules.values
    for agent, fact in (("ann", "a"), ("ben", "b"), ("cat", "c")):
        assert f"{fact}={values[fact]}" in observations[agent]
        for other in {"a", "b", "c"} - {fact}:
            assert f"{other}=" not in observations[agent]


# --- vote ----------------------------------------------------------------------------------


def test_unanimity_fails_on_one_dissent_and_pays_no_agreement() -> None:
    env = marl.make(
        "majority-vote",
        reward={"cooperation": 1.0},
        params={"threshold": "unanimous", "ballots": 1, "no_agreement": -0.5},
    )
    env.reset(seed=0)
    env.step({a: "ACTION: park" for a in env.agents})
    assert env.rules.ballot == ["park"]
    votes = {a: "ACTION: park" for a in env.agents} | {"eve": "ACTION: beach"}
    env.step(votes)  # beach is not on the ballot: eve's vote is invalid, no agreement
    assert env.rules.success() == 0.0 and env.malformed["eve"] == 1
    assert env.returns["ann"] == -0.5 and env.returns["eve"] == pytest.approx(-0.6)


def test_an_adopted_option_pays_agreement_plus_each_agents_own_utility() -> None:
    env = marl.make("majority-vote", reward={"cooperation": 0.0})
    env.reset(seed=0)
    env.step({a: "ACTION: park" if a != "eve" else "ACTION: beach" for a in env.agents})
    assert env.rules.ballot == ["park", "beach"]
    env.step({a: "ACTION: beach" if a in ("ann", "ben") else "ACTION: park" for a in env.agents})
    assert env.rules.adopted == "park"
    worth = {a: 1.0 + env.rules.worth(a)["park"] for a in env.possible_agents}
    mean_others = {a: (sum(worth.values()) - w) / 4 for a, w in worth.items()}
    assert env.returns == pytest.approx({a: worth[a] - mean_others[a] for a in worth})


# --- marl validate names the key of each mistake ---------------------------------------------


def broken(name: str, path: str, value: object) -> dict:
    """The built-in ``name`` with the params key at ``path`` (dots, [i]) set to ``value``."""
    doc = builtin(name)
    target = doc
    keys = path.replace("[", ".").replace("]", "").split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


MISTAKES = [
    # a payoff table of the wrong shape
    (
        broken("prisoners-dilemma", "params.payoffs.cooperate.defect", [0]),
        "params.payoffs.cooperate.defect: must be a list of 2 payoffs, one per agent (alice, bob)",
    ),
    (
        broken("prisoners-dilemma", "params.payoffs.defect", {"cooperate": [5, 0]}),
        "params.payoffs.defect: missing action 'defect' of bob",
    ),
    (
        broken("stag-hunt", "params.payoffs.stag", [4, 4]),
        "params.payoffs.stag: must map each action of bob (player 2: stag, hare)",
    ),
    # an action name that is not declared
    (
        broken(
            "prisoners-dilemma", "params.payoffs.cooperate", {"cooperate": [3, 3], "betray": [0, 5]}
        ),
        "params.payoffs.cooperate.betray: undeclared action 'betray' of bob "
        "(declared: cooperate, defect)",
    ),
    (
        broken("stag-hunt", "params.fallback", "rabbit"),
        "params.fallback: undeclared action 'rabbit' of alice, bob (declared: alice: stag, hare; "
        "bob: stag, hare)",
    ),
    (
        broken("stag-hunt", "params.actions", [True, "hare"]),
        "params.actions[0]: action name True must start with a letter",
    ),
    (
        broken("majority-vote", "params.options", ["park", "Park_", "beach"]),
        "params.options[1]: duplicate option 'Park_' (names must differ by more than case",
    ),
    # a placeholder that names no dealt value
    (
        broken("sum-relay", "params.private.ann", "Your number is {b}."),
        "params.private.ann: placeholder {b} names no dealt value for ann (known: a, agent, "
        "reporter)",
    ),
    (
        broken("majority-vote", "params.private", "You like {favorite}."),
        "params.private: placeholder {favorite} names no dealt value (known: agent, favourite, "
        "ranking, values)",
    ),
    (
        broken("sum-relay", "params.private", "Your number is {a}."),
        "params.private: placeholder {a} names no value dealt to ben, cat (held only by ann)",
    ),
    (
        broken("sum-relay", "params.question.text", "What is {a}?"),
        "params.question.text: placeholder {a} names no dealt value (known: reporter)",
    ),
    (
        broken("sum-relay", "params.private.ben", "{b.__class__}"),
        "params.private.ben: '{b.__class__}' is not a placeholder",
    ),
    # a question over facts that nobody holds, or that do not exist
    (
        broken("sum-relay", "params.facts[2].holders", []),
        "params.question.facts[2]: fact 'c' is held by nobody, so no one can know the answer",
    ),
    (
        broken("sum-relay", "params.question.facts", ["a", "b", "d"]),
        "params.question.facts[2]: unknown fact 'd' (declared: a, b, c)",
    ),
    (
        broken("sum-relay", "params.facts[0].pool", [1, "two"]),
        "params.question.facts[0]: op 'sum' needs whole numbers; fact 'a' has pool value 'two'",
    ),
    (
        broken("sum-relay", "params.facts[1].holders", ["bob"]),
        "params.facts[1].holders[0]: unknown agent 'bob'",
    ),
    # votes
    (
        broken("majority-vote", "params.utilities", [1.0, 0.5]),
        "params.utilities: must hold one value per option (3 options), got 2",
    ),
    (
        broken("majority-vote", "params.threshold", "plurality"),
        "params.threshold: must be majority or unanimous, got 'plurality'",
    ),
    # the rounds follow the params
    (
        broken("stag-hunt", "episode", {"rounds": 3}),
        "episode.rounds: the params of these rules make 2 rounds, got 3",
    ),
]


@pytest.mark.parametrize(("doc", "expected"), MISTAKES, ids=[m[1].split(":")[0] for m in MISTAKES])
def test_validate_names_the_key_of_each_mistake(doc: dict, expected: str) -> None:
    found = problems(doc)
    assert any(p.startswith(expected) for p in found), found


def test_marl_validate_prints_the_key_of_each_mistake(tmp_path: Path, capsys) -> None:
    files = []
    for i, (doc, _) in enumerate(MISTAKES):
        files.append(tmp_path / f"bad{i}.yaml")
        files[-1].write_text(yaml.safe_dump(doc, sort_keys=False))
    good = [str(BUILTIN_DIR / f"{n}.yaml") for n in ("stag_hunt", "sum_relay", "majority_vote")]
    assert main(["validate", *map(str, files), *good]) == 1
    out = capsys.readouterr().out
    for path, (_, expected) in zip(files, MISTAKES):
        assert f"{path}: {expected}" in out
    for path in good:
        assert f"{path}: ok" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("name", sorted(YAML_ONLY))
def test_any_value_for_any_param_is_a_problem_or_plays(name: str) -> None:
    junk = [None, 3, -1, 2.5, "x", [], {}, [[1]], {"a": {"b": []}}, True, "{", [None], "ann"]
    refused = 0
    for key in builtin(name)["params"]:
        for value in junk:
            doc = builtin(name)
            doc["params"][key] = value
            if validate_scenario(doc):  # never raises
                refused += 1
                continue
            env = TextScenarioEnv(spec_from_dict(doc))
            play_episode(env, "rule", seed=0)
            play_episode(env, "random", seed=1)
            assert all(math.isfinite(r) for r in env.returns.values())
    assert refused >= len(junk)  # most junk is refused


# --- templates and action help -----------------------------------------------------------------


def test_a_reply_names_a_choice_whole_or_as_the_only_choice_word_in_it() -> None:
    choices = ["stag", "hare", "x-1"]
    assert match_choice("  `Stag`. ", choices) == "stag"
    assert match_choice("I will hunt the HARE!", choices) == "hare"
    assert match_choice("x-1", choices) == "x-1" and match_choice("x-12", choices) is None
    assert match_choice("stag or hare", choices) is None
    assert match_choice("stagger", choices) is None
    assert match_choice("", choices) is None and match_choice(None, choices) is None
    assert match_choice("7" * 20_000 + " stag", choices) is None  # only the first 2,000 chars


def test_the_first_whole_number_of_a_reply() -> None:
    assert parse_int("I give 7 coins, not 3") == 7
    assert parse_int("ACTION: -2") == -2 and parse_int("option-2", signed=False) == 2
    assert parse_int("1.5") == 1  # a decimal's whole part: the rules then judge the range
    assert parse_int("7" * 19 + " then 4") == 4  # 19 digits is no number; the search goes on
    assert parse_int("7" * 5000) is None and parse_int("٣ or 𝟕") is None  # ASCII digits only
    assert parse_int("x" * 2000 + "5") is None  # only the first 2,000 characters
    assert parse_int("") is None and parse_int(None) is None and parse_int("none") is None


def test_public_goods_and_spotlight_read_their_numbers_with_it() -> None:
    goods = marl.make("public-goods")
    goods.reset(seed=0)
    contribute = goods.rules.params.talk_rounds  # the first round with an action
    reply = dict.fromkeys(goods.rules.agents, "I put in 3 of my coins")
    result = goods.rules.step(reply, contribute, False)
    assert not result.invalid
    assert goods.rules.history[-1] == dict.fromkeys(goods.rules.agents, 3)
    spot = marl.make("spotlight")
    spot.reset(seed=0)
    assert spot.rules._parse("option-2, surely") == 1  # the second option; no sign read
    assert spot.rules._parse("7" * 5000) is None


def test_templates_substitute_data_and_never_evaluate() -> None:
    values = {"a": "{b}", "b": "secret", "obj": object()}
    assert render("x={a} {{a}} y", values) == "x={b} {a} y"  # a value is not parsed again
    for text in ("{a.__class__}", "{a[0]}", "{a!r}", "{a:>9}", "{0}", "{}", "{a + b}", "{"):
        assert template_problems(text, {"a", "b"}, "t"), text
    assert template_problems("{a} and {{literal}}", {"a"}, "t") == []


@pytest.mark.parametrize("name", sorted(YAML_ONLY))
def test_action_help_gives_no_example_value(name: str) -> None:
    env = marl.make(name)
    observations, infos = env.reset(seed=1)
    rules = env.rules
    while env.agents:
        for agent in env.agents:
            if not infos[agent]["needs_action"]:
                continue
            text = rules.action_help(agent)
            assert not any(w in text.lower() for w in ("e.g", "for example", "such as", "like "))
            assert not any(c.isdigit() for c in text), text  # never a number to copy
            choices = infos[agent].get("valid_actions")
            if env.spec.rules != "question":  # named choices: every one is listed, none picked
                assert all(c in text for c in choices), (text, choices)
        observations, _, _, _, infos = env.step({a: "ACTION: x" for a in env.agents})
    assert all(math.isfinite(r) for r in env.returns.values())
