"""signal-code-v0 (issue 26 item 6): the listener sees the candidates only as attribute indices
under a per-run mapping, so a code must be learned; copying the speaker's words cannot succeed.

The conformance, golden and hostile-action suites cover it as every registered scenario; these
tests prove what is particular to it, on the real environment's prompts."""

from __future__ import annotations

import random
import re
import statistics

import pytest

import marl
from marl.scenarios.base import TextScenarioEnv
from marl.scenarios.bots import get_bot
from marl.scenarios.builtin.signal import COLOURS, SHAPES, signal_code
from marl.scenarios.problems import ScenarioError
from marl.scenarios.registry import load_document
from marl.scenarios.validation import validate_scenario

# every attribute word the rules know, not just the ones the shipped params draw from
WORDS = re.compile(r"\b(" + "|".join(COLOURS + SHAPES) + r")s?\b", re.IGNORECASE)


def _code_of(code_seed: int) -> dict[str, str]:
    env = marl.make("signal-code-v0", params={"code_seed": code_seed})
    env.reset(seed=0)
    return env.rules.code


def test_the_mapping_is_a_function_of_code_seed_alone() -> None:
    first = _code_of(3)
    # the same for every episode and every instance of a run
    env = marl.make("signal-code-v0", params={"code_seed": 3})
    for seed in range(5):
        env.reset(seed=seed)
        assert env.rules.code == first
    assert first == signal_code(4, 4, 3)
    # a permutation of the colour indices and one of the shape indices
    assert sorted(first[c] for c in COLOURS[:4]) == [f"colour {k}" for k in range(1, 5)]
    assert sorted(first[s] for s in SHAPES[:4]) == [f"shape {k}" for k in range(1, 5)]
    # and another code_seed draws another mapping (almost always: 24 x 24 possibilities)
    codes = [tuple(sorted(_code_of(s).items())) for s in range(10)]
    assert len(set(codes)) >= 9


def test_the_listener_sees_the_candidates_under_the_code() -> None:
    env = marl.make("signal-code-v0", params={"code_seed": 1})
    observations, infos = env.reset(seed=4)
    code = env.rules.code
    coded = [f"{code[c]}, {code[s]}" for c, s in env.rules.candidates]
    assert infos["listener"]["coded_candidates"] == coded
    for i, text in enumerate(coded):
        assert f"{i + 1}: {text}" in observations["listener"]
    # the speaker still sees the target in words
    colour, shape = env.rules.candidates[env.rules.target]
    assert f"The target is the {colour} {shape}." in observations["speaker"]
    assert env.rules.private_label("speaker") == f"{colour} {shape}"


def _listener_texts(env: TextScenarioEnv, seed: int) -> list[str]:
    """Everything the environment shows the listener in one episode, its received messages
    aside (the speaker here says nothing about the target): the system prompt, each round's
    observation (the last one included), and the action help."""
    observations, _ = env.reset(seed=seed)
    texts = [env.system_prompt("listener"), observations["listener"]]
    texts.append(env.rules.action_help("listener"))
    observations, *_ = env.step({"speaker": "SAY: hello", "listener": "ACTION: wait"})
    texts.append(observations["listener"])
    observations, *_ = env.step({"speaker": "ACTION: wait", "listener": "ACTION: 2"})
    texts.append(observations["listener"])
    return texts


@pytest.mark.parametrize("code_seed", [0, 1, 7, 12345])
def test_no_colour_or_shape_word_reaches_the_listener(code_seed: int) -> None:
    env = marl.make("signal-code-v0", params={"code_seed": code_seed})
    for seed in range(60):
        for text in _listener_texts(env, seed):
            assert not WORDS.search(text), (code_seed, seed, text)
    # the full vocabulary too
    wide = marl.make(
        "signal-code-v0", params={"code_seed": code_seed, "n_colours": 6, "n_shapes": 6}
    )
    for seed in range(20):
        for text in _listener_texts(wide, seed):
            assert not WORDS.search(text), (code_seed, seed, text)
    # the uncoded game does show them (the check can fail)
    plain = marl.make("signal-v0")
    assert any(WORDS.search(t) for t in _listener_texts(plain, 0))


def test_agent_info_never_reaches_the_prompt() -> None:
    """An LLM's prompt is rendered from the system prompt and the observation; the info (which
    holds the coded listener's candidate names and the code, for the rule bot) picks only the
    response head. The ids a backend is asked to continue decode to no attribute word."""
    from marl.agents.backends import SamplingConfig
    from marl.agents.generation import PromptRequest, generate_by_policy
    from marl.agents.models import build_char_tokenizer

    class Captured(Exception):
        pass

    class Spy:
        tokenizer = build_char_tokenizer()
        prompts: list[list[int]] = []

        def generate(self, prompts, settings, seed=None):  # noqa: ANN001, ANN202
            Spy.prompts = [list(p) for p in prompts]
            raise Captured

    env = marl.make("signal-code-v0", params={"code_seed": 2})
    env.reset(seed=9)
    observations, _, _, _, infos = env.step({"speaker": "SAY: hi", "listener": "ACTION: wait"})
    assert "code" in infos["listener"] and infos["listener"]["needs_action"]
    assert any(WORDS.search(name) for name in infos["listener"]["candidates"])
    request = PromptRequest(
        "listener", env.system_prompt("listener"), observations["listener"], infos["listener"]
    )
    with pytest.raises(Captured):
        generate_by_policy(
            {"p": Spy()}, lambda a: "p", [request], SamplingConfig(response_prefix=True), 0
        )
    (prompt,) = Spy.prompts
    text = Spy.tokenizer.decode(prompt)
    assert "colour" in text and text.rstrip().endswith("ACTION:")
    assert not WORDS.search(text), text


def test_the_coded_listener_answers_by_number_only() -> None:
    env = marl.make("signal-code-v0")
    env.reset(seed=3)
    env.step({"speaker": "SAY: hello", "listener": "ACTION: wait"})
    legal = env.rules.legal_actions("listener")
    names = [" ".join(c) for c in env.rules.candidates]
    assert legal == {str(i + 1): name for i, name in enumerate(names)}  # meaning stays a name
    assert env.rules.legal_actions("speaker") is None
    assert env.rules.action_help("listener") == "the number of the target, 1 to 4."
    # a name is no answer
    target = names[env.rules.target]
    env.step({"speaker": "ACTION: wait", "listener": f"ACTION: {target}"})
    assert env.rules.picked() is None and env.rules.success() == 0.0


def test_the_pick_is_named_in_words() -> None:
    env = marl.make("signal-code-v0")
    env.reset(seed=3)
    env.step({"speaker": "SAY: hello", "listener": "ACTION: wait"})
    pick = (env.rules.target + 1) % 4
    env.step({"speaker": "ACTION: wait", "listener": f"ACTION: {pick + 1}"})
    assert env.rules.picked() == " ".join(env.rules.candidates[pick])


def test_answer_by_name_with_coded_is_refused_naming_the_key() -> None:
    data, _ = load_document("signal-code-v0")
    data["params"]["answer_by_name"] = True
    problems = validate_scenario(data)
    assert [p.path for p in problems] == ["params.answer_by_name"], problems
    with pytest.raises(ScenarioError, match="answer_by_name"):
        marl.make("signal-code-v0", params={"answer_by_name": True})


def test_signal_code_v0_is_registered_and_valid() -> None:
    assert "signal-code-v0" in marl.list_scenarios()
    data, _ = load_document("signal-code-v0")
    assert validate_scenario(data) == []
    assert data["params"]["coded"] is True
    # v0 and v1 are not coded
    for name in ("signal-v0", "signal-v1"):
        env = marl.make(name)
        env.reset(seed=0)
        assert env.rules.params.coded is False


def _successes(name: str, speaker_bot: str, listener, episodes: int, **params) -> list[float]:
    env = marl.make(name, params=params) if params else marl.make(name)
    speaker = get_bot(env.spec.rules, speaker_bot)
    rng = random.Random(0)
    out = []
    for seed in range(episodes):
        observations, infos = env.reset(seed=seed)
        while env.agents:
            actions = {
                "speaker": speaker("speaker", observations["speaker"], infos["speaker"], rng),
                "listener": listener(observations["listener"], infos["listener"], rng),
            }
            observations, _, _, _, infos = env.step(actions)
        out.append(env.rules.success())
    return out


def _rule_listener(observation: str, info: dict, rng: random.Random) -> str:
    return get_bot("signal", "rule")("listener", observation, info, rng)


def _copier(observation: str, info: dict, rng: random.Random) -> str:
    """A listener that copies names: the candidate of its observation whose words appear in the
    message it heard, else a random candidate. It reads only its observation."""
    if "Messages you received:" not in observation:
        return "ACTION: wait"
    heard = observation.split("Messages you received:")[-1].lower()
    listing = observation.split("Candidates: ")[1].split(". speaker knows")[0]
    candidates = [entry.split(": ", 1) for entry in listing.split("; ")]
    for number, text in candidates:
        if text in heard:
            return f"ACTION: {number}"
    return f"ACTION: {rng.choice(candidates)[0]}"


@pytest.mark.parametrize("code_seed", [0, 5])
def test_the_rule_bot_with_the_code_always_succeeds(code_seed: int) -> None:
    successes = _successes("signal-code-v0", "rule", _rule_listener, 50, code_seed=code_seed)
    assert successes == [1.0] * 50


def test_copying_names_scores_chance() -> None:
    # the copier works where names are shown...
    assert statistics.mean(_successes("signal-v0", "rule", _copier, 50)) == 1.0
    # ...and on the coded variant, with the rule speaker naming the target, it is at chance
    coded = _successes("signal-code-v0", "rule", _copier, 400)
    assert 0.18 <= statistics.mean(coded) <= 0.32, statistics.mean(coded)


def test_the_format_bot_plays_the_coded_game() -> None:
    env = marl.make("signal-code-v0")
    bot = get_bot(env.spec.rules, "format")
    rng = random.Random(1)
    picks = []
    for seed in range(40):
        observations, infos = env.reset(seed=seed)
        said = bot("speaker", observations["speaker"], infos["speaker"], rng)
        assert re.fullmatch(r"SAY: [a-z]+ [a-z]+\nACTION: wait", said)
        while env.agents:
            actions = {a: bot(a, observations[a], infos[a], rng) for a in env.agents}
            observations, _, _, _, infos = env.step(actions)
        assert env.rules.choice is not None and env.malformed["listener"] == 0
        picks.append(env.rules.choice)
    assert set(picks) == {0, 1, 2, 3}


# --------------------------------------------------------------------------- signal-code-v1


def _answered(answer: str, seed: int = 3) -> TextScenarioEnv:
    env = marl.make("signal-code-v1", params={"code_seed": 2})
    env.reset(seed=seed)
    env.step({"speaker": "SAY: hello", "listener": "ACTION: wait"})
    env.step({"speaker": "ACTION: wait", "listener": f"ACTION: {answer}"})
    return env


def test_v1_takes_the_code_as_listed_as_well_as_the_number() -> None:
    env = marl.make("signal-code-v1", params={"code_seed": 2})
    env.reset(seed=3)
    codes = [env.rules._coded(c) for c in env.rules.candidates]
    names = [" ".join(c) for c in env.rules.candidates]
    legal = env.rules.legal_actions("listener")
    assert legal == {
        **{str(i + 1): name for i, name in enumerate(names)},
        **dict(zip(codes, names)),
    }
    assert env.rules.agent_info("listener")["valid_actions"] == codes  # the format bot picks these
    assert "colour and shape" in env.rules.action_help("listener")
    pick = (env.rules.target + 1) % 4
    code = codes[pick]  # "colour 3, shape 1"
    for spelling in (code, code.upper(), code.replace(",", "") + ".", f"I pick {code}!"):
        assert _answered(spelling).rules.picked() == names[pick], spelling
    assert _answered(str(pick + 1)).rules.picked() == names[pick]  # the number still counts


def test_v1_refuses_a_partial_an_ambiguous_or_a_longer_code_and_a_name() -> None:
    env = _answered("wait")  # a non-answer, to read the episode's candidates
    codes = [env.rules._coded(c) for c in env.rules.candidates]
    names = [" ".join(c) for c in env.rules.candidates]
    colour = codes[0].split(",")[0]  # "colour 3": half a code
    for answer in (colour, f"{codes[0]} or {codes[1]}", codes[0] + "2", names[0]):
        played = _answered(answer)
        assert played.rules.picked() is None and played.rules.success() == 0.0, answer


def test_answer_by_code_without_the_code_is_refused_naming_the_key() -> None:
    with pytest.raises(ScenarioError, match="answer_by_code"):
        marl.make("signal-v0", params={"answer_by_code": True})


def test_v1_still_cannot_be_won_by_copying_names() -> None:
    coded = _successes("signal-code-v1", "rule", _copier, 400)
    assert 0.18 <= statistics.mean(coded) <= 0.32, statistics.mean(coded)
