"""The Kuhn Poker job of issue 27 (``configs/kuhn.yaml``, trained three ways by bench/kuhn.py)
composes and resolves: SmolLM2 self-play with the league, GRPO groups of hands on one deal and a
KL anchor to the warmed-up model; ``league=bot_rule``
and ``league=bot_random`` train the same job against one scripted bot; the warm-up teaches the
move format with uniformly random moves, whatever the card (never the Nash strategy); and the
job trains one step against the Nash bot with the tiny model (the league's own tests check that
only the learner's turns train: tests/marl/test_league.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from marl.cli import register_scenario_options
from marl.config import Config, load_config
from marl.runtime.policy_map import plan_for


def load(*overrides: str) -> Config:
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return load_config(compose(config_name="kuhn", overrides=list(overrides)))


def test_kuhn_is_smollm2_self_play_with_grpo_groups_and_exploitability_every_5_updates() -> None:
    config = load()
    assert config.scenario.name == "kuhn-poker-v0" and config.model.kind == "embedded"
    assert config.algo.advantage == "grpo" and config.train.group_size > 1
    hands = config.train.seeds_per_step * config.train.group_size
    assert hands == 256  # hands an iteration (docs/competition.md: 16 and 64 fell short)
    assert config.algo.minibatch_size >= 3 * hands  # every turn in one optimizer step
    assert config.algo.beta > 0  # the anchor to the warmed-up policy (configs/kuhn.yaml)
    assert config.league.enabled and config.league.mix == {"self": 1.0}
    plan = plan_for(config)
    assert plan.trainable == ["shared"]  # one full-model policy on both seats (the league's)
    assert plan.policies["shared"].lora is None
    assert config.train.steps >= 30 and config.train.exploitability_every == 5
    assert config.sampling.response_prefix and config.sampling.temperature == 1.0


def test_a_group_replays_one_deal() -> None:
    """GRPO compares the hands of a group: they are played from one scenario seed, so they
    share the deal, and the advantage compares moves, not cards."""
    from marl.scenarios.registry import make

    config = load("model=tiny")
    hands = []
    for seed in (11, 11, 12, 13, 14, 15):
        env = make(config.scenario.name, **dict(config.scenario.overrides))
        observations, _ = env.reset(seed=seed)
        hands.append(tuple(o.split("Your card is ")[1][0] for o in observations.values()))
    assert hands[0] == hands[1]
    assert len(set(hands[1:])) > 1  # other seeds, other deals


@pytest.mark.parametrize("bot", ["rule", "random"])
def test_the_bot_presets_change_only_the_opponent(bot: str) -> None:
    selfplay, against = load(), load(f"league=bot_{bot}")
    assert against.league.enabled and against.league.mix == {f"bot_{bot}": 1.0}
    assert against.league.snapshot_every == selfplay.league.snapshot_every  # kuhn.yaml's
    for field in ("scenario", "model", "algo", "sampling", "train", "warmup", "seed"):
        assert getattr(against, field) == getattr(selfplay, field), field


def test_the_warmup_teaches_the_format_with_uniform_moves_whatever_the_card() -> None:
    """Kuhn Poker's ``format`` bot is the random bot: over many warm-up turns the aggressive
    move (bet, call) is taken about half the time with every card, so no card tells it more."""
    from marl.loop.warmup import bot_turns

    config = load("model=tiny")
    assert config.warmup.steps > 0 and config.warmup.bot == "format"
    counts: Counter[tuple[str, str]] = Counter()
    for step in range(40):
        for turn in bot_turns(config, 10, step):
            card = turn.observation.split("Your card is ")[1][0]
            move = turn.completion.removeprefix("ACTION:").strip()
            assert turn.completion == f"ACTION: {move}" and turn.head == "ACTION:"
            counts[card, "aggressive" if move in ("bet", "call") else "passive"] += 1
    for card in "JQK":
        total = counts[card, "aggressive"] + counts[card, "passive"]
        assert total > 150
        share = counts[card, "aggressive"] / total
        assert abs(share - 0.5) < 0.1, (card, share)  # the Nash bot folds J to a bet: 0


@pytest.mark.slow
def test_one_step_against_the_nash_bot_with_the_tiny_model(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from marl.loop.train import train

    register_scenario_options()
    overrides = [
        "league=bot_rule",
        "model=tiny",
        "train.steps=1",
        "train.seeds_per_step=4",
        "train.group_size=1",  # 4 hands
        "warmup.steps=1",
        "warmup.episodes=2",
        "logging.progress=false",
    ]
    with initialize_config_module(config_module="marl.configs", version_base=None):
        cfg = compose(config_name="kuhn", overrides=overrides)
    metrics = train(cfg, run_dir=tmp_path)
    assert metrics["league/bot_rule/games"] == 4.0 and metrics["league/bot_rule/drawn"] == 1.0
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    steps = [e.step for e in events.Scalars("league/exploitability")]
    assert steps == [0, 1]
    assert 0.0 <= metrics["league/exploitability"] <= 1.5
    # the learner moves at least once in each of its 4 hands; the bot's moves are no turns
    assert 4 <= metrics["policies/shared/turns"] <= 8


def test_the_card_is_restated_and_a_malformed_reply_costs_more_than_a_chip() -> None:
    """Issue 40's defaults: the card on the move's line (``params.restate_card``, which needs the
    response head) and a malformed reply costing more than one chip (returns are twice the
    chips, so below -2); ``restate_card=false`` is the card-blind control."""
    from marl.scenarios.registry import make

    config = load("model=tiny")
    overrides = dict(config.scenario.overrides)
    assert overrides["params"]["restate_card"] is True and config.sampling.response_prefix
    assert overrides["reward"]["malformed_penalty"] < -2.0
    env = make(config.scenario.name, **overrides)
    assert env.spec.malformed_penalty == overrides["reward"]["malformed_penalty"]
    blind = load("model=tiny", "scenario.overrides.params.restate_card=false")
    assert blind.scenario.overrides["params"]["restate_card"] is False
    for field in ("model", "algo", "sampling", "train", "warmup", "league"):
        assert getattr(blind, field) == getattr(config, field), field
