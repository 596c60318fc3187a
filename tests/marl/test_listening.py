"""Exact listening measures (marl.analysis.listening) on the real signal scenario: scripted speakers
and listeners with known answers, and the tiny model through the HF sampler and scorer."""

from __future__ import annotations

import copy
import csv
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from marl.agents.generation import SAMPLES_PER_CALL, reply_sampler
from marl.analysis.listening import LISTENING_METRICS, hf_scorer, kl_bits
from marl.analysis.listening import listening_per_scenario as measure
from marl.errors import RunError
from marl.scenarios.registry import make

SEEDS = list(range(40))


def _names(observation: str) -> list[str]:
    listing = observation.split("Candidates:")[1].split(".")[0]
    return [part.split(":", 1)[1].strip() for part in listing.split(";")]


def _heard(observation: str) -> str:
    if "Messages you received:" not in observation:
        return ""
    return observation.split("Messages you received:")[1].split("You can message")[0]


def naming_speaker(requests: Sequence[Any], k: int) -> list[list[str]]:
    """Names the target, every time."""
    out = []
    for r in requests:
        target = re.search(r"The target is the (\w+ \w+)\.", r.observation).group(1)
        out.append([f"SAY: {target}\nACTION: wait"] * k)
    return out


def listener_following(requests: Sequence[Any], texts: Sequence[Sequence[str]]):
    """All its mass on the candidate it hears (uniform when it hears none)."""
    probs = []
    for r, options in zip(requests, texts):
        heard = _heard(r.observation)
        names = _names(r.observation)
        hits = [i for i, name in enumerate(names) if name in heard]
        row = []
        for text in options:
            # every spelling the parser accepts is scored: "2.", "Red circle", "the red circle"
            answer = text.removeprefix("ACTION: ").rstrip(".").lower().removeprefix("the ")
            index = int(answer) - 1 if answer.isdigit() else names.index(answer)
            row.append((1.0 if index in hits else 0.0) if hits else 1.0 / len(options))
        total = sum(row)
        probs.append([p / total for p in row])
    return probs, [0.0] * len(requests)


def listener_deaf(requests: Sequence[Any], texts: Sequence[Sequence[str]]):
    """Always the first candidate (by number), whatever it hears."""
    return [[1.0] + [0.0] * (len(t) - 1) for t in texts], [0.25] * len(requests)


@pytest.mark.parametrize("scenario", ["signal-v0", "signal-v1"])
def test_a_speaker_that_names_and_a_listener_that_follows_score_the_maximum(
    scenario: str,
) -> None:
    result = measure(lambda: make(scenario), SEEDS, naming_speaker, listener_following)
    values = result.per_scenario
    assert set(values) == set(LISTENING_METRICS)
    for seed_index in range(len(SEEDS)):
        assert values["cic"][seed_index] == pytest.approx(2.0)  # log2(4 candidates)
        assert values["influence"][seed_index] == pytest.approx(2.0)
        assert values["cic_given_target"][seed_index] == pytest.approx(0.0)  # one message
        assert values["success"][seed_index] == pytest.approx(1.0)
        assert values["null_success"][seed_index] == pytest.approx(0.25)
    follow = [v for v in values["swap_follow"] if not math.isnan(v)]
    assert len(follow) >= len(SEEDS) - 2 and all(v == pytest.approx(1.0) for v in follow)
    assert all(v == 0.0 for v in values["swap_success"] if not math.isnan(v))
    summary = result.summary()
    assert summary["cic"]["mean"] == pytest.approx(2.0)
    assert summary["cic"]["n"] == len(SEEDS)
    scalars = result.scalars()
    assert scalars["eval/listening/cic"] == pytest.approx(2.0)


def test_a_listener_that_ignores_the_message_has_no_influence() -> None:
    result = measure(lambda: make("signal-v1"), SEEDS, naming_speaker, listener_deaf)
    assert max(result.per_scenario["cic"]) == pytest.approx(0.0)
    assert max(result.per_scenario["influence"]) == pytest.approx(0.0)
    assert result.per_scenario["off_set"][0] == 0.25
    success = result.summary()["success"]["mean"]
    assert 0.1 < success < 0.45  # the first candidate is the target a quarter of the time


def test_intervals_stay_in_each_measures_range_and_a_mostly_off_set_listener_is_flagged() -> None:
    def mumbling(requests: Sequence[Any], texts: Sequence[Sequence[str]]):
        """Follows what it hears, but writes a scored text only 30% of the time."""
        probs, _ = listener_following(requests, texts)
        return probs, [0.7] * len(requests)

    result = measure(lambda: make("signal-v1"), SEEDS[:12], naming_speaker, mumbling)
    summary = result.summary()
    for name, s in summary.items():
        assert s["low"] <= s["mean"] <= s["high"], name
    assert summary["success"]["high"] <= 1.0 and summary["off_set"]["mean"] == pytest.approx(0.7)
    assert result.off_set_exceeded() and result.scalars()["eval/listening/off_set_flag"] == 1.0
    heard = measure(lambda: make("signal-v1"), SEEDS[:12], naming_speaker, listener_deaf)
    assert heard.scalars()["eval/listening/off_set_flag"] == 0.0  # 0.25: logged, not flagged
    # a success that is 1 on every scenario but one: its t-interval would pass 1 unclipped
    from marl.analysis.listening import ListeningResult

    nearly = ListeningResult({"success": [1.0] * 9 + [0.5], "cic": [0.0] * 9 + [0.1]}, (), 8)
    assert nearly.summary()["success"]["high"] == 1.0
    assert nearly.summary()["cic"]["low"] == 0.0
    # a CIC at its 2 bits (four candidates) on every scenario but one: the interval stops there
    assert heard.bits_ceiling == pytest.approx(2.0)  # log2 of signal-v1's four candidates
    full = ListeningResult({"cic": [2.0] * 9 + [1.2]}, (), 8, heard.bits_ceiling)
    assert full.summary()["cic"]["high"] == pytest.approx(2.0)
    assert full.summary()["cic"]["mean"] < 2.0
    unbounded = ListeningResult({"cic": [2.0] * 9 + [1.2]}, (), 8)
    assert unbounded.summary()["cic"]["high"] > 2.0  # what the ceiling clips


def test_a_silent_speaker_has_no_influence_and_the_listener_gets_chance() -> None:
    def silent(requests: Sequence[Any], k: int) -> list[list[str]]:
        return [["ACTION: wait"] * k for _ in requests]

    result = measure(lambda: make("signal-v1"), SEEDS, silent, listener_following)
    assert max(result.per_scenario["cic"]) == pytest.approx(0.0)
    assert result.summary()["success"]["mean"] == pytest.approx(0.25)


def test_a_speaker_that_names_half_the_time_gives_an_intermediate_cic() -> None:
    def half(requests: Sequence[Any], k: int) -> list[list[str]]:
        named = naming_speaker(requests, k)
        return [[m if j % 2 == 0 else "ACTION: wait" for j, m in enumerate(row)] for row in named]

    result = measure(lambda: make("signal-v1"), SEEDS[:5], half, listener_following)
    # p(m): each of 4 names 1/8, silence 1/2; q uniform. CIC = 4 * 1/8 * 2 bits + 1/2 * 0 = 1
    assert result.per_scenario["cic"][0] == pytest.approx(1.0)
    # the sent message (the first reply) names the target
    assert result.per_scenario["influence"][0] == pytest.approx(2.0)
    # given the target: its name or silence, 1/2 each; q = 5/8 on the target, 1/8 elsewhere
    given_target = 0.5 * math.log2(8 / 5) + 0.5 * (0.25 * math.log2(0.4) + 0.75 * 1.0)
    assert result.per_scenario["cic_given_target"][0] == pytest.approx(given_target)


def own_words_listener(requests: Sequence[Any], k: int) -> list[list[str]]:
    """Follows what it hears in its own words in 7 of every 10 replies ("ACTION: Red circle,
    target red circle: Red circle", as an RL-alone listener writes), and in 3 names nothing;
    picks the first candidate that way when it hears no name."""
    out = []
    for r in requests:
        heard = _heard(r.observation)
        names = _names(r.observation)
        name = next((n for n in names if n in heard), names[0]).capitalize()
        follow = f"ACTION: {name}, target {name.lower()}: {name}"
        out.append([follow if j % 10 < 7 else "ACTION: I am not sure" for j in range(k)])
    return out


def test_read_by_the_parser_every_accepted_reply_counts_and_off_set_is_what_it_rejects() -> None:
    from marl.scenarios.spellings import accepted_texts

    env = make("signal-v1")
    observations, _ = env.reset(seed=0)
    name = _names(observations["listener"])[0]
    reply = f"{name.capitalize()}, target {name}: {name.capitalize()}"
    assert reply not in accepted_texts(env.rules, "listener")  # no list of spellings holds it
    assert env.read_action("listener", f"ACTION: {reply}") == name  # but the parser reads it

    calls = []

    def recorded(requests: Sequence[Any], k: int) -> list[list[str]]:
        calls.append(len(requests) * k)
        return own_words_listener(requests, k)

    result = measure(
        lambda: make("signal-v1"), SEEDS[:12], naming_speaker, None,
        listener_replies=recorded, replies=20,
    )  # fmt: skip
    assert result.replies == 20
    # the rows are sampled a bounded batch at a time (all at once took 21 GB on SmolLM2)
    assert len(calls) > 1 and max(calls) <= SAMPLES_PER_CALL
    values = result.per_scenario
    for i in range(12):
        assert values["cic"][i] == pytest.approx(2.0)  # it follows every name it hears
        assert values["success"][i] == pytest.approx(1.0)  # among the replies the parser reads
        assert values["off_set"][i] == pytest.approx(0.3)  # the replies the parser rejects
    assert result.summary()["null_success"]["mean"] < 0.6  # no name heard: the first candidate
    assert not result.off_set_exceeded()

    def mute(requests: Sequence[Any], k: int) -> list[list[str]]:
        return [["ACTION: I am not sure"] * k for _ in requests]

    silent = measure(
        lambda: make("signal-v1"), SEEDS[:4], naming_speaker, None,
        listener_replies=mute, replies=5,
    )  # fmt: skip
    assert silent.per_scenario["off_set"] == [1.0] * 4 and silent.off_set_exceeded()
    assert silent.per_scenario["cic"] == [0.0] * 4  # nothing read: no action follows a message
    with pytest.raises(RunError, match="replies must be >= 1"):
        measure(lambda: make("signal-v1"), [0], naming_speaker, None,
                listener_replies=mute, replies=0)  # fmt: skip
    with pytest.raises(RunError, match="give a scorer"):
        measure(lambda: make("signal-v1"), [0], naming_speaker, None)


def test_read_action_is_what_a_step_reads() -> None:
    env = make("signal-v1")
    observations, _ = env.reset(seed=3)
    names = _names(observations["listener"])
    speaker_turn = {"speaker": f"SAY: {names[2]}\nACTION: wait", "listener": "ACTION: wait"}
    env.step(speaker_turn)
    for reply, expected in [
        (f"ACTION: the {names[1].title()} I think", names[1]),
        ("ACTION: 3", names[2]),
        (f"ACTION: {names[0]} or {names[1]}", None),  # two names: the parser picks neither
        ("no action line at all", None),
    ]:
        assert env.read_action("listener", reply) == expected, reply
        stepped = copy.deepcopy(env)
        stepped.step({"speaker": "ACTION: wait", "listener": reply})
        assert stepped.rules.picked() == expected, reply


def test_kl_in_bits() -> None:
    assert kl_bits({"a": 1.0}, {"a": 0.5, "b": 0.5}) == pytest.approx(1.0)
    assert kl_bits({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}) == 0.0
    assert kl_bits({"a": 1.0}, {"b": 1.0}) == math.inf


def test_open_text_listeners_and_bad_agents_are_refused_with_one_line() -> None:
    with pytest.raises(RunError, match="not an agent"):
        measure(lambda: make("signal-v1"), [0], naming_speaker, listener_following, speaker="x")
    with pytest.raises(RunError, match="no held-out scenarios"):
        measure(lambda: make("signal-v1"), [], naming_speaker, listener_following)

    def says_one(requests: Sequence[Any], k: int) -> list[list[str]]:
        return [["SAY: hello\nACTION: 1"] * k for _ in requests]

    with pytest.raises(RunError, match="listening: .* (open text|acts in round|private label)"):
        measure(lambda: make("unison"), [0], says_one, listener_following)


def test_the_tiny_model_is_measured_through_its_backend() -> None:
    from marl.agents.backends.base import SamplingConfig
    from marl.agents.backends.hf import HFBackend
    from marl.agents.models import ModelSpec, load_model

    model, tokenizer = load_model(ModelSpec(kind="tiny"))
    backend = HFBackend(model, tokenizer)
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0, response_prefix=True)
    sample = reply_sampler({"p": backend}, lambda agent: "p", sampling)
    score = hf_scorer(backend, sampling=sampling)
    result = measure(lambda: make("signal-v1"), [0, 1, 2], sample, score, counterfactuals=2)
    for name in ("cic", "influence", "success", "null_success", "off_set"):
        assert all(math.isfinite(v) for v in result.per_scenario[name]), name
    assert all(0.0 <= v <= 2.0 + 1e-9 for v in result.per_scenario["cic"])
    assert all(0.0 <= v <= 1.0 for v in result.per_scenario["success"])
    # read by the parser: the tiny model's own replies, sampled and read as a step reads them
    replies = reply_sampler({"p": backend}, lambda agent: "p", sampling, seed=1)
    parsed = measure(
        lambda: make("signal-v1"), [0, 1, 2], sample, None, counterfactuals=2,
        listener_replies=replies, replies=4,
    )  # fmt: skip
    assert parsed.replies == 4 and result.replies == 0
    for name in ("cic", "influence", "success", "null_success", "off_set"):
        assert all(math.isfinite(v) for v in parsed.per_scenario[name]), name
    # each off_set is a count of rejected replies out of 4
    assert all(v * 4 == pytest.approx(round(v * 4)) for v in parsed.per_scenario["off_set"])
    env = make("signal-v1")
    observations, infos = env.reset(seed=0)
    from marl.agents.generation import PromptRequest

    request = PromptRequest(
        "listener", env.system_prompt("listener"), observations["listener"], {"needs_action": True}
    )
    model.train()
    probs, off = score([request], [["ACTION: 1", "ACTION: 2"]])
    assert model.training  # scored in eval mode, then restored
    assert sum(probs[0]) == pytest.approx(1.0) and 0.0 <= off[0] <= 1.0


@pytest.mark.parametrize("replies", [0, 4])
def test_marl_train_logs_the_listening_measures_at_each_held_out_evaluation(
    tmp_path: Path, replies: int
) -> None:
    """Exact (``emergence.listening_replies`` 0) or read by the parser from 4 sampled replies a
    distribution; ``eval/listening/replies`` says which."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from marl.loop.train import train

    config = {
        "scenario": {"name": "signal-v1", "overrides": {}},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 8, "response_prefix": True},
        "train": {"steps": 2, "seeds_per_step": 1, "group_size": 2, "eval_episodes": 4},
        "emergence": {
            "counterfactuals": 2,
            "listening_episodes": 3,
            "listening_replies": replies,
        },
        "logging": {"progress": False},
        "seed": 0,
    }
    train(config, run_dir=tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for name in LISTENING_METRICS:
        if name.startswith("swap"):
            continue  # 3 scenarios may offer no donor
        assert f"eval/listening/{name}" in tags, name
    steps = [e.step for e in events.Scalars("eval/listening/cic")]
    assert steps == [0, 2]  # before the first update and after the last
    assert all(0.0 <= e.value <= 2.0 + 1e-9 for e in events.Scalars("eval/listening/cic"))
    assert [e.value for e in events.Scalars("eval/listening/cic_low")][0] <= (
        events.Scalars("eval/listening/cic")[0].value
    )
    assert [e.value for e in events.Scalars("eval/listening/replies")] == [replies, replies]
    assert all(0.0 <= e.value <= 1.0 for e in events.Scalars("eval/listening/off_set"))


def test_a_negative_listening_replies_is_one_line_naming_the_key() -> None:
    from marl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="emergence.listening_replies"):
        load_config({"model": {"kind": "tiny"}, "emergence": {"listening_replies": -1}})


def test_the_listening_measures_stay_off_where_they_do_not_apply(tmp_path: Path) -> None:
    from marl.analysis.listening_log import listening_tracker, measurable
    from marl.config import load_config
    from marl.runtime.policy_map import plan_for

    assert measurable("signal-v1", {}) and measurable("signal-v0", {})
    assert not measurable("unison", {}) and not measurable("kuhn-poker-v0", {})
    config = load_config({"scenario": {"name": "unison"}, "model": {"kind": "tiny"}})
    assert listening_tracker(config, plan_for(config), runtime=None)(0) == {}


def test_marl_eval_listening_on_lora_runs_writes_the_role_matrix_and_the_measures(
    tmp_path: Path,
) -> None:
    from marl.cli import main
    from marl.loop.train import train

    config = {
        "scenario": {"name": "signal-v1", "overrides": {}},
        "model": {"kind": "tiny"},
        "sharing": "lora",
        "policy_defaults": {"lora": {"r": 4, "alpha": 8}},
        "sampling": {"max_new_tokens": 8, "response_prefix": True},
        "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2, "eval_episodes": 0},
        "logging": {"progress": False},
        "seed": 0,
    }
    train(config, run_dir=tmp_path / "a")
    train({**config, "seed": 1}, run_dir=tmp_path / "b")
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            "--listening",
            f"a={tmp_path / 'a' / 'checkpoints'}",
            f"b={tmp_path / 'b' / 'checkpoints'}",
            "base=model:tiny",
            "--episodes",
            "4",
            "--listening-episodes",
            "3",
            "--counterfactuals",
            "2",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    rows = list(csv.DictReader(open(out / "crossplay_roles.csv")))
    assert [(r["speaker"], r["listener"]) for r in rows] == [
        (s, x) for s in ("a", "b", "base") for x in ("a", "b", "base")
    ]
    assert all(
        0.0 <= float(r["success_lo"]) <= float(r["success"]) <= float(r["success_hi"]) <= 1.0
        for r in rows
    )
    measures = json.loads((out / "listening.json").read_text())
    assert set(measures) == {"a", "b", "base"}
    assert 0.0 <= measures["a"]["summary"]["cic"]["mean"] <= 2.0 + 1e-9
    assert (out / "crossplay_roles.png").stat().st_size > 0
