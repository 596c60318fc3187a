"""Kuhn Poker's ``params.restate_card``: the prompt starts the mover's reply with ``My card is
J.`` before the ``ACTION:`` head (the card right before the move; bench/kuhn_gradients.py). The
note is context: the rollout, the warm-up and the exact table all put it in the prompt, none
trains it, and the environment never receives it."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from marl.agents.backends import SamplingConfig
from marl.agents.heads import ACTION_HEAD, prompt_head, response_note
from marl.scenarios.problems import ScenarioError
from marl.scenarios.registry import make

ON = {"params": {"restate_card": True}}


def test_the_note_goes_before_the_head_and_only_with_a_head() -> None:
    assert prompt_head(ACTION_HEAD, "My card is K.") == "My card is K. ACTION:"
    assert prompt_head(ACTION_HEAD, "") == ACTION_HEAD
    assert prompt_head("", "My card is K.") == ""  # no head: the reply is the model's own
    assert response_note({"response_note": "My card is Q."}) == "My card is Q."
    assert response_note({}) == "" and response_note(None) == ""


def test_only_the_mover_gets_a_note_naming_its_own_card() -> None:
    env = make("kuhn-poker-v0", **ON)
    for seed in range(6):
        _, infos = env.reset(seed=seed)
        mover, idle = env.agents
        assert infos[mover]["response_note"] == f"My card is {infos[mover]['card']}."
        assert "response_note" not in infos[idle]
    _, infos = make("kuhn-poker-v0").reset(seed=0)
    assert all("response_note" not in info for info in infos.values())  # off by default


def test_a_wrong_value_is_refused_naming_the_key() -> None:
    with pytest.raises(ScenarioError, match="params.restate_card: must be true or false"):
        make("kuhn-poker-v0", params={"restate_card": "yes"})


def test_the_rollout_prompts_with_the_note_and_the_environment_never_sees_it() -> None:
    from marl.agents.generation import PromptRequest, generate_by_policy
    from marl.competition.players import build_backends, parse_players

    players = parse_players(["model:tiny", "random"])
    backend = build_backends(players)[players[0].name]
    env = make("kuhn-poker-v0", **ON)
    observations, infos = env.reset(seed=3)
    mover = env.agents[0]
    request = PromptRequest(mover, env.system_prompt(mover), observations[mover], infos[mover])
    sampling = SamplingConfig(max_new_tokens=3, response_prefix=True)
    (replies,), _ = generate_by_policy({"p": backend}, lambda a: "p", [request], sampling, 0)
    (reply,) = replies
    prompt = backend.tokenizer.decode(reply.prompt_ids)
    assert prompt.endswith(f"My card is {infos[mover]['card']}. ACTION:")
    assert reply.text.startswith(ACTION_HEAD) and "My card" not in reply.text


def test_the_warm_up_imitates_after_the_note_and_head_and_never_the_note() -> None:
    from marl.cli import register_scenario_options
    from marl.competition.players import build_backends, parse_players
    from marl.config import load_config
    from marl.loop.warmup import bot_turns, encode_turn

    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        cfg = compose(
            config_name="kuhn",
            overrides=["model=tiny", "scenario.overrides.params.restate_card=true"],
        )
    config = load_config(cfg)
    turns = bot_turns(config, 2, step=0)
    assert turns and all(t.note.startswith("My card is ") for t in turns)
    players = parse_players(["model:tiny", "random"])
    tokenizer = build_backends(players)[players[0].name].tokenizer
    for turn in turns:
        prompt, response = encode_turn(tokenizer, turn)
        assert tokenizer.decode(prompt).endswith(f"{turn.note} {ACTION_HEAD}")
        text = tokenizer.decode(response[:-1])
        assert "My card" not in text and ACTION_HEAD not in text
        assert text.strip() in ("check", "bet", "call", "fold")


def test_the_exact_table_scores_the_moves_after_the_note() -> None:
    from marl.competition.players import build_backends, parse_players
    from marl.runtime.exploitability import info_set_prompts

    players = parse_players(["model:tiny", "random"])
    tokenizer = build_backends(players)[players[0].name].tokenizer
    sampling = SamplingConfig(response_prefix=True)
    plain = info_set_prompts(tokenizer, "kuhn-poker-v0", {}, sampling=sampling)
    noted = info_set_prompts(tokenizer, "kuhn-poker-v0", ON, sampling=sampling)
    for before, after in zip(plain, noted):
        assert after.replies == before.replies  # the moves, after ACTION:
        assert tokenizer.decode(after.prompt_ids).endswith(f"My card is {after.key[0]}. ACTION:")
