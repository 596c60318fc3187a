"""A run whose prompts do not fit its model's context is refused in one line (issue 42 item 3).

Before the first rollout, :func:`marl.runtime.context_check.check_context` builds every agent's
first prompt with the run's seed, tokenizer and prompt builder, and refuses one whose tokens plus
``sampling.max_new_tokens`` exceed the model's context, naming the agent and the numbers (and a
``sampling.max_new_tokens`` that leaves no room at all, naming the key). Prompts that grow later
in an episode are refused by the generate call that would run them (tests/agents/test_context.py
for the call itself). The CLI cases run the real ``marl`` command on the tiny model, whose
context is 4,096 tokens of one character each: a 5,100-character system prompt validates (it is
under the scenario files' text limit) but cannot fit.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from marl.agents.backends.hf import HFBackend
from marl.agents.context import ContextLengthError
from marl.agents.models import ModelSpec
from marl.config import ConfigError, load_config
from marl.runtime.context_check import check_context
from marl.runtime.policy_map import plan_for
from marl.runtime.rollout import EpisodeSlot, run_episodes
from marl.scenarios.registry import load_document, make

LONG_PROMPT = "Think before you speak. " * 213  # 5,112 characters: over the tiny model's context
ADVICE = (
    "shorten the scenario's text (system_prompt, roles, messages.max_chars, episode.rounds) or "
    "lower sampling.max_new_tokens"
)


def config_of(**changes: Any) -> Any:
    base: dict[str, Any] = {"model": {"kind": "tiny"}, "scenario": {"name": "relay-v0"}}
    return load_config({**base, **changes})


def test_first_prompts_that_fit_pass() -> None:
    config = config_of()
    check_context(config, plan_for(config))
    check_context(config_of(agents="scripted"), None)  # bots have no prompt


def test_a_first_prompt_over_the_context_is_refused_naming_the_agent() -> None:
    config = config_of(scenario={"name": "relay-v0", "overrides": {"system_prompt": LONG_PROMPT}})
    with pytest.raises(ContextLengthError) as info:
        check_context(config, plan_for(config))
    message = str(info.value)
    assert re.fullmatch(
        r"agent 'alice' \(policy shared, first turn\): a prompt of ([\d,]+) tokens \+ 48 new "
        rf"tokens = [\d,]+, over the model's context of 4,096 tokens; {re.escape(ADVICE)}",
        message,
    ), message


def test_a_reply_budget_that_leaves_no_room_is_refused_naming_the_key() -> None:
    config = config_of(sampling={"max_new_tokens": 5_000})
    with pytest.raises(ConfigError) as info:
        check_context(config, plan_for(config))
    assert str(info.value) == (
        "sampling.max_new_tokens: 5,000 leaves no room for a prompt in the context of 4,096 "
        "tokens of policy shared's model"
    )


@pytest.mark.slow
def test_a_prompt_that_outgrows_the_context_mid_episode_is_refused_at_its_call() -> None:
    """relay-v0's prompts grow round by round as messages arrive: with a context the first
    round fits in and a later one does not, the start check passes and the episode stops at the
    call that would not fit, in one line, after the calls before it ran."""
    context = 1_000
    config = config_of(
        model={"kind": "tiny", "max_position_embeddings": context},
        sampling={"max_new_tokens": 8, "response_prefix": True},
    )
    plan = plan_for(config)
    check_context(config, plan)  # the first turn fits
    backend = HFBackend(ModelSpec(max_position_embeddings=context))
    calls: list[int] = []
    generate = backend.generate

    def counted(prompts: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(max(len(p) for p in prompts))
        return generate(prompts, *args, **kwargs)

    backend.generate = counted  # type: ignore[method-assign]
    slot = EpisodeSlot(env=make("relay-v0"), seed=config.seed, group_id=0, episode_id=0)
    with pytest.raises(ContextLengthError) as info:
        run_episodes([slot], {"shared": backend}, plan.policy_of, config.sampling, config.seed)
    assert calls and max(calls) + 8 <= context  # earlier rounds ran, every one within it
    match = re.fullmatch(
        r"agent '(\w+)' \(policy shared\): a prompt of ([\d,]+) tokens \+ 8 new tokens = "
        rf"[\d,]+, over the model's context of 1,000 tokens; {re.escape(ADVICE)}",
        str(info.value),
    )
    assert match, str(info.value)
    assert match.group(1) in slot.env.possible_agents
    assert int(match.group(2).replace(",", "")) + 8 > context


def refused_in_one_line(done: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a run refused for a reason the user can fix."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr  # and at most a load warning
    return errors[0]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("command", ["train", "play"])
def test_the_cli_refuses_a_scenario_whose_prompt_exceeds_the_tiny_model(
    marl_cli, command: str, tmp_path: Path
) -> None:
    data, _ = load_document("relay-v0")
    scenario = tmp_path / "long.yaml"
    scenario.write_text(
        yaml.safe_dump({**data, "name": "long-v0", "system_prompt": LONG_PROMPT}, sort_keys=False)
    )
    validated = marl_cli("validate", str(scenario), cwd=tmp_path, timeout=300)
    assert validated.returncode == 0, validated.stdout  # under the text limit: only the model
    run = tmp_path / "run"
    extra = ["train.steps=1", "logging.progress=false"] if command == "train" else ["agents=llm"]
    done = marl_cli(
        command,
        "model=tiny",
        f"scenario={scenario}",
        "runtime.threads=1",
        f"hydra.run.dir={run}",
        *extra,
        cwd=tmp_path,
        timeout=300,
    )
    line = refused_in_one_line(done)
    assert re.fullmatch(
        r"error: agent 'alice' \(policy shared, first turn\): a prompt of [\d,]+ tokens \+ 48 "
        rf"new tokens = [\d,]+, over the model's context of 4,096 tokens; {re.escape(ADVICE)}",
        line,
    ), line
    assert not (run / "checkpoints").exists()  # nothing trained
    assert not (run / "tensorboard").exists()  # refused before the run opened anything


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_cli_refuses_a_huge_reply_budget_in_one_line(marl_cli, tmp_path: Path) -> None:
    done = marl_cli(
        "train",
        "model=tiny",
        "sampling.max_new_tokens=100000000",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
        timeout=300,
    )
    assert refused_in_one_line(done) == (
        "error: sampling.max_new_tokens: 100,000,000, over the limit of 32,768 (a reply must fit "
        "the model's context)"
    )
