"""Emergent-communication metrics (marl.analysis.emergence): each formula on hand-made data, each
metric on scripted play of signal-v0 where the answer is known, the LLM path through a real tiny
model, and ``marl train agents=scripted`` logging every ``emergence/*`` tag at every step."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from pathlib import Path
from statistics import fmean

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl.analysis.emergence import (
    STOP_WORDS,
    EmergenceTracker,
    content_words,
    corrected_mutual_information,
    emergence_metrics,
    entropy_bits,
    js_divergence_bits,
    message_metrics,
    mutual_information_bits,
    permutation_mutual_information,
    speaker_consistency,
    vocabulary_drift,
    word_distributions,
)
from marl.config import ConfigError, load_config
from marl.credit.responders import bot_generate
from marl.episodes import TalkTurn, normalise, talk_turns
from marl.runtime.resimulation import discrete_energy
from marl.scenarios.bots import get_bot, play_bot_episode
from marl.scenarios.registry import make

SMALL = {"params": {"n_colours": 2, "n_shapes": 2, "n_candidates": 4}}  # 4 possible targets
NO_EDGE = {"graph": {"topology": "random", "p": 0.0}}  # the speaker reaches nobody
CUT = {"graph": {"cut": [["speaker", "listener"]]}}  # the edge is there, nothing crosses it


def played(bot: str, episodes: int, **overrides: object) -> list:
    """``episodes`` finished signal-v0 episodes, every agent played by ``bot``."""
    envs = []
    for i in range(episodes):
        env = make("signal", **overrides)
        play_bot_episode(env, bot, seed=10_000 + i, rng=random.Random(i))
        envs.append(env)
    return envs


def metrics_of(bot: str, episodes: int, **overrides: object) -> dict[str, float]:
    envs = played(bot, episodes, **overrides)
    generate = bot_generate(get_bot("signal", bot), seed=1)
    return emergence_metrics(envs, generate=generate, previous_words={})


# --- formulas on hand-made data ---------------------------------------------------------------
def test_entropy_bits() -> None:
    assert entropy_bits([1, 1, 1, 1]) == pytest.approx(2.0)
    assert entropy_bits([5]) == 0.0
    assert entropy_bits([]) == 0.0
    assert entropy_bits([1, 3, 0]) == pytest.approx(
        -(0.25 * math.log2(0.25) + 0.75 * math.log2(0.75))
    )


def test_mutual_information_of_a_copy_and_of_independent_variables() -> None:
    copy = [(s, s) for s in "abcd"] * 3
    assert mutual_information_bits(copy) == pytest.approx(2.0)
    product = [(x, y) for x in "abcd" for y in "xyz"]  # every combination once: independent
    assert mutual_information_bits(product) == pytest.approx(0.0, abs=1e-12)
    assert mutual_information_bits([]) == 0.0


def test_permutation_correction_removes_the_small_sample_bias() -> None:
    rng = random.Random(0)
    independent = [(rng.randrange(4), rng.randrange(20)) for _ in range(60)]
    corrected, plugin = corrected_mutual_information(independent, permutations=50, seed=1)
    assert plugin > 0.8  # the plug-in estimate sees a lot of "information" in pure noise
    assert abs(corrected) < 0.15
    dependent = [(s, f"word{s}") for s in (rng.randrange(4) for _ in range(400))]
    corrected, plugin = corrected_mutual_information(dependent, permutations=50, seed=1)
    assert plugin == pytest.approx(entropy_bits(Counter(s for s, _ in dependent).values()))
    assert corrected == pytest.approx(plugin, abs=0.05)


def test_permutation_p_value() -> None:
    """(1 + #{null >= observed}) / (1 + permutations): a copy of a 4-valued label beats every
    shuffle (p = 1/21), an independent pair does not look significant."""
    copy = [(s, f"w{s}") for s in "abcd"] * 4
    corrected, plugin, p = permutation_mutual_information(copy, permutations=20, seed=0)
    assert plugin == pytest.approx(2.0) and p == pytest.approx(1 / 21)
    assert (corrected, plugin) == corrected_mutual_information(copy, permutations=20, seed=0)
    rng = random.Random(3)
    independent = [(rng.randrange(4), rng.randrange(4)) for _ in range(64)]
    _, _, p = permutation_mutual_information(independent, permutations=200, seed=1)
    assert p > 0.2
    assert permutation_mutual_information(copy[:1], permutations=20)[2] == 1.0


def namer_turns(filler: int, kind: str, repeats: int = 4) -> list[TalkTurn]:
    """A perfect namer (4 labels x ``repeats``): each message names its label, padded with
    ``filler`` words: ``stop`` = stop words drawn at random per message, ``constant`` = the
    same non-stop phrase every time."""
    rng = random.Random(filler)
    stops = sorted(STOP_WORDS)
    turns = []
    for i, label in enumerate(["red circle", "red square", "blue circle", "blue square"] * repeats):
        if kind == "stop":
            pad = [rng.choice(stops) for _ in range(filler)]
        else:
            pad = [f"hello{j}" for j in range(filler)]
        words = pad[: filler // 2] + label.split() + pad[filler // 2 :]
        turns.append(turn("speaker", i, [" ".join(words)], label=label))
    return turns


@pytest.mark.parametrize("kind", ["stop", "constant"])
def test_a_perfect_namer_scores_the_same_at_any_message_length(kind: str) -> None:
    """speaker_mi_content does not dilute with message length (speaker_mi_words went 1.49,
    0.75, 0.50, 0.30 bits with 0, 2, 4, 8 filler words on these 16 turns)."""
    plain = speaker_consistency(namer_turns(0, kind), permutations=20, seed=0)
    assert plain["speaker/speaker_mi_content"] == pytest.approx(plain["speaker/speaker_mi"])
    assert plain["speaker/speaker_mi_content"] > 1.0
    assert plain["speaker/speaker_mi_p"] == pytest.approx(1 / 21)
    for filler in (2, 4, 8):
        padded = speaker_consistency(namer_turns(filler, kind), permutations=20, seed=0)
        got = padded["speaker/speaker_mi_content"]
        assert got == pytest.approx(plain["speaker/speaker_mi_content"], abs=1e-9), filler
        if kind == "constant":  # the whole message is a relabelling of the label: unchanged
            assert padded["speaker/speaker_mi"] == pytest.approx(plain["speaker/speaker_mi"])
            assert padded["speaker/speaker_mi_p"] == pytest.approx(1 / 21)
        else:  # every padded message is new: the message-level MI sees nothing, shuffled or not
            assert padded["speaker/speaker_mi"] == pytest.approx(0.0)
            assert padded["speaker/speaker_mi_p"] == 1.0


def test_content_words() -> None:
    assert content_words(["The target is the RED circle!", "red, please"]) == {"red", "circle"}
    assert content_words(["it is the one"]) == frozenset()
    assert content_words([]) == {"<silence>"}  # silence is told apart from stop words only
    assert not {"red", "blue", "circle", "square", "left", "1", "one2"} & STOP_WORDS


def test_a_speaker_independent_of_its_label_scores_about_zero() -> None:
    rng = random.Random(0)
    labels = ["red circle", "red square", "blue circle", "blue square"]
    turns = [
        turn("u", i, [f"the {rng.choice(labels)}"], label=rng.choice(labels)) for i in range(200)
    ]
    m = speaker_consistency(turns, permutations=100, seed=0)
    for key in ("u", "edges/u->v"):
        assert abs(m[f"{key}/speaker_mi"]) < 0.05
        assert abs(m[f"{key}/speaker_mi_content"]) < 0.05
        assert m[f"{key}/speaker_mi_p"] > 0.1


def test_js_divergence_bits() -> None:
    assert js_divergence_bits({"a": 2, "b": 1}, {"a": 4, "b": 2}) == pytest.approx(0.0)
    assert js_divergence_bits({"a": 1}, {"b": 3}) == pytest.approx(1.0)
    m = {"a": 0.75, "b": 0.25}
    expected = 0.5 * math.log2(1 / m["a"]) + 0.5 * (
        0.5 * math.log2(0.5 / m["a"]) + 0.5 * math.log2(0.5 / m["b"])
    )
    assert js_divergence_bits({"a": 1}, {"a": 1, "b": 1}) == pytest.approx(expected)
    assert js_divergence_bits({}, {}) == 0.0
    assert js_divergence_bits({}, {"a": 1}) == 1.0


def test_discrete_energy_is_unbiased_for_half_the_squared_distance() -> None:
    """Exact expectation over every draw of 2 samples from p and 3 from q."""
    p = {"1": 0.5, "2": 0.3, "3": 0.2}
    q = {"1": 0.1, "2": 0.6, "4": 0.3}
    expected = 0.0
    for f in itertools.product(p, repeat=2):
        for n in itertools.product(q, repeat=3):
            weight = math.prod(p[a] for a in f) * math.prod(q[b] for b in n)
            expected += weight * discrete_energy(list(f), list(n))
    keys = set(p) | set(q)
    half_l2 = 0.5 * sum((p.get(k, 0) - q.get(k, 0)) ** 2 for k in keys)
    assert expected == pytest.approx(half_l2)
    assert discrete_energy(["a", "a"], ["b", "b"]) == 1.0
    with pytest.raises(ValueError):
        discrete_energy(["a"], ["b", "b"])


def turn(agent: str, rnd: int, texts: list[str], label: str | None = None, to=("v",)) -> TalkTurn:
    """A talk turn in which everything sent was delivered."""
    messages = tuple((t, tuple(to)) for t in texts)
    return TalkTurn(0, rnd, agent, tuple(to), messages, label, messages)


def test_message_metrics_per_agent_and_per_edge() -> None:
    turns = [
        turn("u", 0, ["Red circle!"], to=("v", "w")),
        turn("u", 1, [], to=("v", "w")),
        TalkTurn(0, 2, "u", ("v", "w"), (("red  circle", ("v",)), ("blue", ("w",)))),
        turn("u", 3, ["blue square"], to=("v", "w")),
    ]
    m = message_metrics(turns)
    assert m["u/message_rate"] == pytest.approx(4 / 4)
    assert m["u/length_chars"] == pytest.approx((11 + 11 + 4 + 11) / 4)
    assert m["u/length_words"] == pytest.approx((2 + 2 + 1 + 2) / 4)
    assert m["u/vocab_messages"] == 3  # "red circle" twice after normalisation
    assert m["u/vocab_words"] == 4
    assert m["u/entropy"] == pytest.approx(entropy_bits([2, 1, 1]))
    assert m["edges/u->v/message_rate"] == pytest.approx(3 / 4)
    assert m["edges/u->w/message_rate"] == pytest.approx(3 / 4)
    assert m["edges/u->v/vocab_messages"] == 2
    silent = message_metrics([turn("x", 0, [])])
    assert silent["x/message_rate"] == 0.0 and silent["x/entropy"] == 0.0
    assert normalise("  Red,  CIRCLE! ") == "red circle"


def test_speaker_consistency_counts_silence_as_a_message() -> None:
    # the speaker talks about "a" and is silent about "b": silence carries the label
    turns = [
        turn("u", i, ["hello"] if i % 2 else [], label="a" if i % 2 else "b") for i in range(200)
    ]
    m = speaker_consistency(turns, permutations=20, seed=0)
    assert m["u/speaker_mi_plugin"] == pytest.approx(1.0)
    assert m["u/speaker_mi"] == pytest.approx(1.0, abs=0.05)
    assert m["u/speaker_mi_norm"] == pytest.approx(1.0, abs=0.05)
    unlabelled = speaker_consistency([turn("u", 0, ["hello"])])
    assert unlabelled["u/speaker_mi"] == 0.0 and unlabelled["edges/u->v/speaker_mi"] == 0.0


def test_vocabulary_drift_between_steps() -> None:
    before = word_distributions([turn("u", 0, ["red circle"])])
    same = word_distributions([turn("u", 0, ["circle red"])])
    other = word_distributions([turn("u", 0, ["blue square"])])
    assert vocabulary_drift(before, same)["u/drift"] == 0.0
    assert vocabulary_drift(before, other)["u/drift"] == pytest.approx(1.0)
    assert vocabulary_drift({}, other)["u/drift"] == 0.0  # first time seen


# --- scripted play with a known answer -------------------------------------------------------
def test_rule_bots_signal_the_target_and_are_heard() -> None:
    """4 possible targets, the rule speaker names the target, the rule listener picks what it
    hears and guesses uniformly without a message. Expected: I(M; S) = H(S) ~ 2 bits;
    influence_action = 1/2 ||delta_target - uniform(4)||^2 = 3/8; influence_return = 1 - E[null
    return] = 1 - (1 + 0.5 + 0.5 + 0) / 4 = 0.5 (partial credit: half for one shared attribute)."""
    m = metrics_of("rule", 160, **SMALL)
    speaker, edge = "emergence/speaker", "emergence/edges/speaker->listener"
    labels_entropy = m[f"{speaker}/speaker_mi_plugin"]
    assert 1.95 < labels_entropy <= 2.0  # messages are a copy of S: plug-in MI = H(S)
    assert m[f"{speaker}/speaker_mi"] == pytest.approx(2.0, abs=0.1)
    assert m[f"{speaker}/speaker_mi"] <= labels_entropy
    assert m[f"{speaker}/speaker_mi_norm"] == pytest.approx(1.0)
    # the content words {colour, shape} name the target as the message does
    assert m[f"{speaker}/speaker_mi_content"] == pytest.approx(m[f"{speaker}/speaker_mi"])
    assert m[f"{speaker}/speaker_mi_p"] == pytest.approx(1 / 21)
    assert m[f"{edge}/speaker_mi"] == pytest.approx(m[f"{speaker}/speaker_mi"], abs=0.05)
    assert m[f"{speaker}/message_rate"] == 1.0 and m[f"{edge}/message_rate"] == 1.0
    assert m[f"{speaker}/vocab_messages"] == 4 and m[f"{speaker}/length_words"] == 2.0
    assert m[f"{speaker}/entropy"] == pytest.approx(2.0, abs=0.05)
    assert m[f"{edge}/influence_action"] == pytest.approx(3 / 8, abs=0.1)
    assert m[f"{edge}/influence_return"] == pytest.approx(0.5, abs=0.1)
    assert m[f"{speaker}/influence_action"] == m[f"{edge}/influence_action"]
    # the listener says nothing and has no private label
    assert m["emergence/listener/message_rate"] == 0.0
    assert m["emergence/listener/speaker_mi"] == 0.0


def test_rule_speaker_mi_is_bounded_by_the_target_entropy() -> None:
    """Default signal-v0 (16 possible targets): high, but at most H(S) of the targets seen."""
    m = metrics_of("rule", 64)
    mi, h = m["emergence/speaker/speaker_mi"], m["emergence/speaker/speaker_mi_plugin"]
    assert 1.0 < mi <= h <= 4.0
    assert m["emergence/speaker/speaker_mi_norm"] == pytest.approx(1.0)


def test_random_bots_carry_no_information_and_have_no_influence() -> None:
    m = metrics_of("random", 160, **SMALL)
    for key in ("emergence/speaker", "emergence/edges/speaker->listener"):
        assert m[f"{key}/speaker_mi_plugin"] > 0.3  # the raw estimate is biased upward
        assert abs(m[f"{key}/speaker_mi"]) < 0.1
        assert abs(m[f"{key}/speaker_mi_content"]) < 0.1
        assert m[f"{key}/speaker_mi_p"] > 0.05
        assert abs(m[f"{key}/influence_action"]) < 0.1
        assert abs(m[f"{key}/influence_return"]) < 0.1
    assert 0.5 < m["emergence/speaker/message_rate"] < 0.9  # the random bot talks 70% of turns


def test_without_the_edge_nothing_is_heard() -> None:
    m = metrics_of("rule", 40, **NO_EDGE)
    assert not [k for k in m if "/edges/" in k]
    for metric in ("message_rate", "speaker_mi", "influence_action", "influence_return"):
        assert m[f"emergence/speaker/{metric}"] == 0.0, metric
    assert all(
        t.agent != "speaker" for env in played("rule", 3, **NO_EDGE) for t in talk_turns(env)
    )
    assert m["emergence/speaker/speaker_mi_p"] == 1.0  # no data: no evidence


def test_a_cut_edge_keeps_the_speaker_talking_and_measured_but_nobody_hears() -> None:
    """signal-v1 with ``graph.cut``: the speaker is told it can message the listener and
    names the target as with the edge, the router drops it, the listener (rule bot) guesses
    among 4 candidates: success about 1/4, speaker_mi as high as with the edge."""
    with_edge = [played_v1(i) for i in range(120)]
    cut = [played_v1(i, **CUT) for i in range(120)]
    for a, b in zip(with_edge[:5], cut[:5]):
        fresh_a, fresh_b = make("signal-v1"), make("signal-v1", **CUT)
        assert fresh_a.reset(seed=a.episode_seed) == fresh_b.reset(seed=b.episode_seed)
        assert fresh_a.system_prompt("speaker") == fresh_b.system_prompt("speaker")
        assert [t.completion for t in a.log if t.agent == "speaker"] == [
            t.completion for t in b.log if t.agent == "speaker"
        ]
    assert all(not t.delivered for env in cut for t in env.log)
    assert all(env.router.counts["cut_dropped"] == 1 for env in cut)
    assert all(env.router.counts["delivered"] == 0 for env in cut)
    talk = [t for env in cut for t in talk_turns(env) if t.agent == "speaker"]
    assert len(talk) == 120 and all(t.sent and not t.messages for t in talk)
    assert [t.sent[0][1] for t in talk[:1]] == [("listener",)]
    success = [fmean(env.rules.success() for env in envs) for envs in (with_edge, cut)]
    assert success[0] == 1.0 and 0.12 < success[1] < 0.4
    m_edge, m_cut = emergence_metrics(with_edge), emergence_metrics(cut)
    for key in ("emergence/speaker", "emergence/edges/speaker->listener"):
        assert m_cut[f"{key}/speaker_mi"] == pytest.approx(m_edge[f"{key}/speaker_mi"])
        assert m_cut[f"{key}/speaker_mi"] > 2.0  # 16 possible targets, 120 turns
        assert m_cut[f"{key}/speaker_mi_norm"] == pytest.approx(1.0)
        assert m_cut[f"{key}/speaker_mi_p"] == pytest.approx(1 / 21)
        assert m_cut[f"{key}/message_rate"] == 0.0  # delivered: none
    assert m_edge["emergence/speaker/message_rate"] == 1.0


@pytest.mark.parametrize(
    "override",
    [
        "+scenario.overrides={graph: {cut: [[speaker, listener]]}}",
        "+scenario.overrides.graph.cut=[[speaker, listener]]",
    ],
)
def test_the_cut_is_a_command_line_override(override: str) -> None:
    """``marl train --config-name demo '<override>'`` cuts the edge of signal-v1; an unknown
    agent is a problem naming ``graph.cut``."""
    from hydra import compose, initialize_config_module

    from marl.cli import register_scenario_options
    from marl.scenarios.problems import ScenarioError

    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        config = load_config(compose(config_name="demo", overrides=[override]))
        bad = load_config(compose(config_name="demo", overrides=[override.replace("er]", "x]")]))
    env = make(config.scenario.name, **config.scenario.overrides)
    assert env.spec.name == "signal-v1" and env.spec.graph.cut == (("speaker", "listener"),)
    assert env.spec.graph.edges == (("speaker", "listener"),)  # the edge itself stays
    with pytest.raises(ScenarioError, match=r"graph\.cut\[0\]: unknown agent 'listenx'"):
        make(bad.scenario.name, **bad.scenario.overrides)


def played_v1(i: int, **overrides: object):
    """One finished signal-v1 episode played by the rule bots."""
    env = make("signal-v1", **overrides)
    play_bot_episode(env, "rule", seed=20_000 + i, rng=random.Random(i))
    return env


def test_llm_path_regenerates_the_listener_with_the_model() -> None:
    """Influence through ``marl.runtime.resimulation.backend_generate`` over a real tiny model: the
    null branches and the fresh factual sample are generated by the model (which never answers
    right), so the rule-played episodes' return (1) drops in every branch."""
    from marl.agents.backends import SamplingConfig
    from marl.agents.backends.hf import HFBackend
    from marl.agents.models import ModelSpec
    from marl.runtime.resimulation import backend_generate

    envs = played("rule", 4, **SMALL)
    inner = backend_generate(
        {"shared": HFBackend(ModelSpec(seed=0))},
        lambda agent: "shared",
        SamplingConfig(max_new_tokens=8),
    )
    asked: list[str] = []

    def generate(requests):
        asked.extend(r.agent for r in requests for _ in range(r.n))
        return inner(requests)

    m = emergence_metrics(envs, generate=generate)
    assert asked.count("listener") == 4 * 2 + 4  # two null branches + one fresh sample each
    assert m["emergence/edges/speaker->listener/influence_return"] > 0.5
    assert math.isfinite(m["emergence/edges/speaker->listener/influence_action"])


def test_tracker_logs_every_tag_every_step_and_carries_influence() -> None:
    bot = get_bot("signal", "rule")
    tracker = EmergenceTracker(
        lambda: make("signal"),
        lambda step: bot_generate(bot, seed=step),
        influence_every=2,
        total_steps=4,
    )
    steps = [tracker.step(played("rule", 6), step) for step in range(4)]
    assert all(set(s) == set(steps[0]) for s in steps)
    assert [s["emergence/influence_fresh"] for s in steps] == [1.0, 0.0, 1.0, 1.0]
    tag = "emergence/speaker/influence_return"
    assert steps[0][tag] > 0 and steps[1][tag] == steps[0][tag]
    restored = EmergenceTracker(lambda: make("signal"), None, influence_every=0)
    restored.load_state_dict(tracker.state_dict())
    assert restored.words == tracker.words
    random_step = restored.step(played("random", 6), 4)
    assert random_step["emergence/speaker/drift"] > 0.5  # new words replace the rule bot's
    assert random_step["emergence/influence_fresh"] == 0.0
    assert random_step[tag] == steps[-1][tag]  # never measured here: the restored last value


def test_config_checks_name_the_key() -> None:
    with pytest.raises(ConfigError, match="emergence.influence_samples"):
        load_config({"emergence": {"influence_samples": 1}})
    with pytest.raises(ConfigError, match="emergence.influence_every"):
        load_config({"emergence": {"influence_every": -1}})


# --- marl train and marl report --------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.subprocess
def test_cli_train_scripted_logs_emergence_every_step_and_report_reads_it(
    marl_cli, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    steps = 3
    completed = marl_cli(
        "train",
        "agents=scripted",
        "bot=rule",
        f"train.steps={steps}",
        "train.seeds_per_step=2",
        "train.group_size=2",
        "emergence.influence_every=2",
        "logging.progress=false",
        f"hydra.run.dir={run_dir}",
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = [t for t in events.Tags()["scalars"] if t.startswith("emergence/")]
    for agent in ("speaker", "listener", "edges/speaker->listener"):
        for metric in ("message_rate", "entropy", "speaker_mi", "influence_action", "drift"):
            assert f"emergence/{agent}/{metric}" in tags, (agent, metric)
    for tag in tags:
        assert [e.step for e in events.Scalars(tag)] == list(range(1, steps + 1)), tag
    fresh = [e.value for e in events.Scalars("emergence/influence_fresh")]
    assert fresh == [1.0, 0.0, 1.0]  # step 0, skipped, last step
    # 2 seeds per step: at most 2 targets, 1 bit
    assert all(e.value > 0.5 for e in events.Scalars("emergence/speaker/speaker_mi"))

    report = marl_cli(
        "report", str(run_dir), "--tag", "emergence/edges/speaker->listener/speaker_mi", timeout=300
    )
    assert report.returncode == 0, report.stderr[-2000:]
    assert "emergence/speaker/influence_return" in report.stdout  # the emergence table
    assert list((run_dir / "report").glob("*.png"))
