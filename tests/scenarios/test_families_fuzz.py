"""Fuzzing the declarative rule families: no params that validate may crash an episode.

Hypothesis builds ``params`` for each family that are mostly well formed and sometimes broken
in one place (a missing table cell, a leaf of the wrong length, a NaN, a fact nobody holds, a
template with an unknown or malformed placeholder, junk of every YAML type). Validation must
never raise; when it finds no problem, the scenario must build and play to the end with the
random bot, the rule bot and hostile completions, every reward finite.
"""

from __future__ import annotations

import math
import random

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from marl.scenarios import validate_scenario
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import get_bot
from marl.scenarios.registry import list_scenarios
from marl.scenarios.spec import spec_from_dict

list_scenarios()  # registers the families

AGENTS = ["ann", "ben", "cat", "dan"]
NAMES = ["up", "down", "stag", "hare", "Stag", "a", "b", "c", "x-1", "a_b", "1up", "", "yes"]
junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**15), 10**15)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
template = st.lists(
    st.sampled_from(
        ["hi ", "{agent}", "{a}", "{b}", "{favourite}", "{payoffs}", "{values}", "{{", "}}"]
        + ["{reporter}", "{a.b}", "{0}", "{", "}", "{ranking}", "{actions}", "{zzz}"]
    ),
    max_size=5,
).map("".join)
private = template | st.dictionaries(st.sampled_from(AGENTS + ["zed"]), template, max_size=3)
completion = st.one_of(
    st.text(max_size=40),
    st.sampled_from(NAMES + ["park", "museum", "7" * 5000, "-3", "12", "1e9"]).map(
        lambda v: f"SAY: hi\nACTION: {v}"
    ),
    st.just(""),
)


def maybe(draw, value, breaker=junk):
    """``value`` mostly; now and then something else from ``breaker``."""
    return draw(breaker) if draw(st.integers(0, 9)) == 0 else value


@st.composite
def matrix_params(draw) -> tuple[list[str], dict]:
    agents = AGENTS[: draw(st.integers(2, 3))]
    shared = draw(st.booleans())
    pick = st.lists(st.sampled_from(NAMES[:10]), min_size=1, max_size=3, unique=True)
    actions = {a: draw(pick) for a in agents}
    if shared:
        actions = dict.fromkeys(agents, actions[agents[0]])

    def table(depth: int):
        if depth == len(agents):
            leaf = [draw(st.integers(-5, 5) | st.floats(-10, 10)) for _ in agents]
            return maybe(draw, leaf)
        cells = {x: table(depth + 1) for x in actions[agents[depth]]}
        if draw(st.integers(0, 14)) == 0 and cells:
            cells.pop(next(iter(cells)))
        return cells

    params = {
        "actions": actions[agents[0]] if shared else actions,
        "payoffs": table(0),
        "talk_rounds": maybe(draw, draw(st.integers(0, 2))),
        "repeats": maybe(draw, draw(st.integers(1, 3))),
    }
    if draw(st.booleans()):
        params["fallback"] = maybe(draw, draw(st.sampled_from(NAMES[:10])))
    if draw(st.integers(0, 3)) == 0:
        params["private"] = draw(private)
    return agents, params


@st.composite
def question_params(draw) -> tuple[list[str], dict]:
    agents = AGENTS[: draw(st.integers(2, 4))]
    op = draw(st.sampled_from(["sum", "max", "concat", "lookup"]))
    names = draw(st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, unique=True))
    numbers = st.integers(-30, 30) | st.integers(-(10**12), 10**12)
    words = st.sampled_from(["a", "b", "red", "x y", "{a}", "-", "Red", "7", "é"])
    value = numbers if op in ("sum", "max") else numbers | words
    holders = st.lists(st.sampled_from(agents), min_size=1, max_size=2, unique=True)
    facts = [
        {
            "name": name,
            "pool": maybe(draw, draw(st.lists(value, min_size=1, max_size=4))),
            "holders": maybe(draw, draw(holders), st.just([])),
        }
        for name in names
    ]
    question = {"op": maybe(draw, op), "facts": maybe(draw, list(names), st.just(["a", "zz"]))}
    if op == "lookup":
        question["key"] = "box"
        key_pool = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))
        facts.append({"name": "box", "pool": maybe(draw, key_pool), "holders": draw(holders)})
    if op == "concat" and draw(st.booleans()):
        question["separator"] = maybe(draw, draw(st.sampled_from(["", " ", ",", "-", ", "])))
    if draw(st.booleans()):
        question["text"] = draw(template)
    params = {
        "facts": facts,
        "question": question,
        "reporter": draw(st.sampled_from([None, *agents])),
        "scoring": maybe(draw, draw(st.sampled_from(["exact", "partial"]))),
        "talk_rounds": maybe(draw, draw(st.integers(0, 2))),
    }
    if draw(st.integers(0, 3)) == 0:
        params["private"] = draw(private)
    return agents, params


@st.composite
def vote_params(draw) -> tuple[list[str], dict]:
    agents = AGENTS[: draw(st.integers(2, 4))]
    options = draw(st.lists(st.sampled_from(NAMES[:10]), min_size=2, max_size=4, unique=True))
    params = {
        "options": maybe(draw, options),
        "ballots": maybe(draw, draw(st.integers(1, 3))),
        "threshold": maybe(draw, draw(st.sampled_from(["majority", "unanimous"]))),
    }
    if draw(st.booleans()):
        size = len(options) + draw(st.sampled_from([0, 0, 0, 0, 0, 1, -1]))
        params["utilities"] = draw(
            st.lists(st.floats(-5, 5) | st.integers(-5, 5), min_size=size, max_size=size)
        )
    for key in ("agreement", "no_agreement"):
        if draw(st.booleans()):
            params[key] = maybe(draw, draw(st.floats(-3, 3)))
    if draw(st.integers(0, 3)) == 0:
        params["private"] = draw(private)
    return agents, params


FAMILIES = {"matrix": matrix_params(), "question": question_params(), "vote": vote_params()}
family_case = st.sampled_from(sorted(FAMILIES)).flatmap(
    lambda family: FAMILIES[family].map(lambda case: (family, *case))
)


def document(family: str, agents: list[str], params: dict) -> dict:
    return {
        "name": f"fuzz-{family}-v0",
        "rules": family,
        "agents": agents,
        "graph": {"topology": "ring"},
        "params": params,
    }


def play_to_the_end(env: TextScenarioEnv, bot: str | None, completions: list[str], seed: int):
    observations, infos = env.reset(seed=seed)
    policy = get_bot(env.spec.rules, bot) if bot else None
    rng = random.Random(seed)
    i = 0
    while env.agents:
        if policy:
            actions = {a: policy(a, observations[a], infos[a], rng) for a in env.agents}
        else:
            actions = {}
            for agent in env.agents:
                actions[agent] = completions[i % len(completions)]
                i += 1
        observations, rewards, _, _, infos = env.step(actions)
        assert all(isinstance(o, str) for o in observations.values())
        assert all(math.isfinite(r) for r in rewards.values()), rewards
    assert all(math.isfinite(r) for r in env.returns.values())
    success = env.rules.success()
    assert success is None or 0.0 <= success <= 1.0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=family_case, completions=st.lists(completion, min_size=1, max_size=5))
def test_params_that_validate_never_crash_an_episode(case, completions) -> None:
    family, agents, params = case
    doc = document(family, agents, params)
    problems = validate_scenario(doc)
    event(f"{family}: {'invalid' if problems else 'valid, played'}")
    if problems:
        return
    env = TextScenarioEnv(spec_from_dict(doc))
    for seed in (0, 1):
        for bot in ("rule", "random", None):
            play_to_the_end(env, bot, completions, seed)
    snap = env.snapshot()  # a snapshot of a finished episode restores too
    env.restore(snap)


@settings(max_examples=300, deadline=None)
@given(family=st.sampled_from(sorted(FAMILIES)), params=junk, agents=st.just(AGENTS[:3]))
def test_validation_is_total_over_any_params(family: str, params, agents) -> None:
    doc = document(family, agents, params if isinstance(params, dict) else {"x": params})
    problems = validate_scenario(doc)
    assert problems, "junk params validated"
    assert all(p.path.startswith(("params", "episode")) for p in problems), problems


@settings(max_examples=200, deadline=None)
@given(case=family_case, key=st.text(max_size=8), value=junk)
def test_one_junk_value_anywhere_is_a_problem_or_plays(case, key: str, value) -> None:
    family, agents, params = case
    target = params
    for step in key:  # walk a little way into the params along the key's characters
        children = [v for v in target.values() if isinstance(v, dict)]
        if not children:
            break
        target = children[ord(step) % len(children)]
    target[key or "talk_rounds"] = value
    doc = document(family, agents, params)
    if not validate_scenario(doc):
        play_to_the_end(TextScenarioEnv(spec_from_dict(doc)), "random", ["x"], 0)
