"""Tool output in a reply trains nothing: the learner honours ``TurnRecord.mask`` end to end.

The turns come from a real rollout of ``ledger-v0`` (tool calls inside replies, behaviour
logprobs of the real tiny model, tests/agents/tool_policy.py). Checked on the learner's own
loss: the gradient reaching the logprobs of tool-output positions is exactly zero; whatever is
recorded at those positions changes nothing; the loss equals the same replies cut into their
generated segments, each with the tool output moved into its context (what "removed from the
response but still read" means: removing it from the context too would change what every later
token was conditioned on); and the aggregation counts generated tokens only.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import marl
import marl.runtime.learner as learner_module
from marl.agents.backends import SamplingConfig
from marl.agents.models import ModelSpec, load_model
from marl.protocols.turn import TurnRecord
from marl.runtime.learner import Learner, LearnerSettings
from marl.runtime.rollout import EpisodeSlot, run_episodes

_spec = importlib.util.spec_from_file_location(
    "tool_policy", Path(__file__).resolve().parents[1] / "agents" / "tool_policy.py"
)
tool_policy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool_policy)


@pytest.fixture(scope="module")
def turns() -> list[TurnRecord]:
    backend = tool_policy.ScriptedTextBackend(tool_policy.ledger_script)
    slots = [EpisodeSlot(marl.make("ledger-v0"), seed=s, group_id=0, episode_id=s) for s in (0, 1)]
    result = run_episodes(slots, {"p": backend}, lambda a: "p", SamplingConfig(200), seed=0)
    out = [t for t in result.turns if 0 in t.mask]
    assert len(out) == 4  # the clerk's round-1 and the auditor's round-2 turn, twice
    for k, turn in enumerate(out):
        turn.advantage = 1.0 if k % 2 == 0 else -0.5
    return out


def _learner(aggregation: str = "seq_mean", share_prompts: bool = False, **kw) -> Learner:
    model, tokenizer = load_model(ModelSpec(kind="tiny", seed=0))
    settings = LearnerSettings(
        aggregation=aggregation,
        share_prompts=share_prompts,
        sampling=SamplingConfig(max_new_tokens=200),
        **kw,
    )
    return Learner(model, settings, pad_token_id=tokenizer.pad_token_id)


def _grads(learner: Learner, turns: list[TurnRecord]) -> tuple[float, dict[str, torch.Tensor]]:
    learner.model.zero_grad(set_to_none=True)
    loss, _ = learner.loss(turns)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


@pytest.mark.parametrize("share_prompts", [False, True])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_tool_output_positions_get_exactly_zero_gradient(
    turns, monkeypatch, share_prompts: bool, level: str
) -> None:
    seen = []
    real = learner_module.response_logprobs

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        out.sampling.retain_grad()
        seen.append(out)
        return out

    monkeypatch.setattr(learner_module, "response_logprobs", spy)
    learner = _learner(share_prompts=share_prompts, level=level)
    loss, _ = learner.loss(turns)
    loss.backward()
    grad = seen[0].sampling.grad  # (B, T): d loss / d logprob of each response token
    for b, turn in enumerate(turns):
        for t, m in enumerate(turn.mask):
            if m == 0:
                assert grad[b, t].item() == 0.0, (b, t)
        generated = [grad[b, t].item() for t, m in enumerate(turn.mask) if m]
        assert all(g != 0.0 for g in generated)  # every generated token carries the gradient
    assert torch.all(grad[:, max(len(t.mask) for t in turns) :] == 0)


@pytest.mark.slow
def test_what_is_recorded_at_tool_positions_changes_nothing(turns) -> None:
    baseline = _grads(_learner(), turns)
    for junk in (float("nan"), float("inf"), -1e9, 3.0):
        perturbed = [
            replace(t, logprobs=[lp if m else junk for lp, m in zip(t.logprobs, t.mask)])
            for t in turns
        ]
        loss, grads = _grads(_learner(), perturbed)
        assert loss == baseline[0]
        assert all(torch.equal(grads[n], g) for n, g in baseline[1].items())


def _segments(turn: TurnRecord) -> list[TurnRecord]:
    """The turn cut into its generated runs, each with everything before it as its prompt."""
    out, start = [], None
    for t, m in enumerate([*turn.mask, 0]):
        if m and start is None:
            start = t
        if not m and start is not None:
            out.append(
                replace(
                    turn,
                    prompt_ids=turn.prompt_ids + turn.response_ids[:start],
                    response_ids=turn.response_ids[start:t],
                    logprobs=turn.logprobs[start:t],
                    mask=[1] * (t - start),
                )
            )
            start = None
    return out


@pytest.mark.slow
@pytest.mark.parametrize("level", ["token"])
def test_the_loss_equals_the_generated_segments_with_tool_output_as_context(turns, level) -> None:
    split = [s for t in turns for s in _segments(t)]
    assert len(split) > len(turns)
    whole_loss, whole = _grads(_learner("token_mean", level=level), turns)
    split_loss, parts = _grads(_learner("token_mean", level=level), split)
    assert math.isclose(whole_loss, split_loss, rel_tol=1e-5, abs_tol=1e-7)
    for name, g in whole.items():
        torch.testing.assert_close(g, parts[name], rtol=1e-4, atol=1e-7)


def test_the_aggregation_counts_generated_tokens_only(turns) -> None:
    learner = _learner("token_mean")
    _, metrics = learner.loss(turns)
    assert metrics["n_tokens"] == sum(sum(t.mask) for t in turns)
    # seq_mean: each reply's loss is the mean over its generated tokens: a reply with the tool
    # output appended again (mask 0) has the same loss
    longer = [
        replace(
            t,
            response_ids=t.response_ids + t.response_ids[: t.mask.index(0) + 1],
            logprobs=t.logprobs + [0.0] * (t.mask.index(0) + 1),
            mask=t.mask + [0] * (t.mask.index(0) + 1),
        )
        for t in turns
    ]
    a, _ = _learner("seq_mean").loss(turns)
    b, _ = _learner("seq_mean").loss(longer)
    assert math.isclose(float(a.detach()), float(b.detach()), rel_tol=1e-5)


def test_an_update_on_tool_turns_trains_and_is_finite(turns) -> None:
    learner = _learner(lr=1e-2)
    before = copy.deepcopy(learner.model.state_dict())
    metrics = learner.update(turns)
    assert math.isfinite(metrics["loss"]) and metrics["optimizer_steps"] == 1
    assert 0 < metrics["n_tokens"] <= sum(sum(t.mask) for t in turns)
    after = learner.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
