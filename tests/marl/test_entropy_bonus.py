"""The entropy bonus (``algo.entropy``, per policy ``policies.<id>.entropy``): the exact entropy
of the sampling distribution from the update's own forward, the same on every forward path, and
a loss term that moves a policy toward spread even where every advantage is 0."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from marl.agents.attention import use_marl_attention
from marl.agents.backends import SamplingConfig
from marl.agents.logprobs import response_logprobs, sampling_logprobs, token_entropy
from marl.agents.models import ModelSpec, load_model
from marl.agents.packing import packed_response_logprobs
from marl.config import ConfigError, load_config
from marl.losses import policy_loss_terms
from marl.protocols.turn import TurnRecord
from marl.runtime.learner import Learner, LearnerSettings
from marl.runtime.policies import learner_settings
from marl.runtime.policy_map import plan_for

PROMPTS = [[5, 6, 7, 8], [5, 6, 7, 8], [9, 3], [5, 6, 7, 8, 11, 12, 13]]
RESPONSES = [[21, 22, 23], [24], [25, 26], [27, 28, 29, 30]]
OPTIONS = {"temperature": 0.7, "top_p": 0.9}


def _model() -> torch.nn.Module:
    model, _ = load_model(ModelSpec(kind="tiny", seed=3))
    return model


def _direct_entropy(model: torch.nn.Module) -> list[list[float]]:
    """Each response token's sampling-distribution entropy, one unpadded forward per turn."""
    rows = []
    with torch.no_grad():
        for prompt, response in zip(PROMPTS, RESPONSES):
            ids = torch.tensor([prompt + response])  # (1, L)
            logits = model(input_ids=ids).logits[0]  # (L, V)
            predictors = logits[len(prompt) - 1 : len(prompt) + len(response) - 1]  # (n, V)
            rows.append(token_entropy(sampling_logprobs(predictors, **OPTIONS)).tolist())
    return rows


def test_token_entropy_is_the_distributions_entropy_in_nats() -> None:
    uniform = torch.log_softmax(torch.zeros(3, 50), dim=-1)  # (3, V)
    assert torch.allclose(token_entropy(uniform), torch.full((3,), math.log(50)))
    one_hot = torch.full((50,), float("-inf"))
    one_hot[7] = 0.0  # every other token removed (top-p): 0 log 0 counts 0, not NaN
    assert float(token_entropy(one_hot)) == 0.0
    two = torch.log(torch.tensor([0.25, 0.75]))
    assert float(token_entropy(two)) == pytest.approx(
        -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    )


@pytest.mark.parametrize("path", ["padded", "shared_prompts", "packed", "packed_unshared"])
def test_every_forward_path_gives_the_exact_entropy_of_each_response_token(path: str) -> None:
    model = _model()
    expected = _direct_entropy(model)
    if path.startswith("packed"):
        out = packed_response_logprobs(
            use_marl_attention(model),
            PROMPTS,
            RESPONSES,
            share=path == "packed",
            entropy=True,
            **OPTIONS,
        )
    else:
        out = response_logprobs(
            model,
            PROMPTS,
            RESPONSES,
            share_prompts=path == "shared_prompts",
            entropy=True,
            **OPTIONS,
        )
    assert out.entropy is not None and out.entropy.shape == out.mask.shape  # (B, T)
    for row, want in enumerate(expected):
        got = out.entropy[row, : len(want)].tolist()
        assert got == pytest.approx(want, abs=1e-4)
        assert all(v > 0 for v in got)
        assert torch.all(out.entropy[row, len(want) :] == 0)  # padding
    assert out.entropy.requires_grad  # the bonus's gradient flows through it
    plain = response_logprobs(model, PROMPTS, RESPONSES, **OPTIONS)
    assert plain.entropy is None  # computed only when asked for


def test_the_loss_subtracts_the_weighted_aggregated_entropy() -> None:
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.8, 0.1, 0.3]]))  # (B, T)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # (B, T)
    advantages = torch.tensor([1.0, -0.5])  # (B,)
    entropy = torch.tensor([[2.0, 4.0, 99.0], [1.0, 2.0, 3.0]])  # (B, T): 99 is padding
    base, _ = policy_loss_terms(logp, logp, advantages, mask)
    loss, metrics = policy_loss_terms(
        logp, logp, advantages, mask, entropy=entropy, entropy_coef=0.1
    )
    seq_mean = ((2.0 + 4.0) / 2 + (1.0 + 2.0 + 3.0) / 3) / 2  # GRPO's aggregation: 2.5
    assert float(metrics["entropy"]) == pytest.approx(seq_mean)
    assert float(loss) == pytest.approx(float(base) - 0.1 * seq_mean)
    logged, logged_metrics = policy_loss_terms(logp, logp, advantages, mask, entropy=entropy)
    assert float(logged) == pytest.approx(float(base))  # weight 0: logged, not in the loss
    assert float(logged_metrics["entropy"]) == pytest.approx(seq_mean)
    with pytest.raises(ValueError, match="entropy_coef must be >= 0"):
        policy_loss_terms(logp, logp, advantages, mask, entropy=entropy, entropy_coef=-1.0)
    with pytest.raises(ValueError, match="but entropy is None"):
        policy_loss_terms(logp, logp, advantages, mask, entropy_coef=0.1)
    with pytest.raises(ValueError, match="entropy must have the shape"):
        policy_loss_terms(logp, logp, advantages, mask, entropy=entropy[:, :2], entropy_coef=0.1)


def _zero_advantage_turns(model: torch.nn.Module) -> list[TurnRecord]:
    turns = []
    with torch.no_grad():
        logp = response_logprobs(model, PROMPTS, RESPONSES).sampling  # (B, T)
    for i, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES)):
        old = logp[i, : len(response)].tolist()
        turn = TurnRecord("a", "p", 0, i, 0, prompt, response, old, [1] * len(response))
        turn.advantage = 0.0  # a collapsed group: every episode scored the same
        turns.append(turn)
    return turns


def _mean_entropy(model: torch.nn.Module) -> float:
    with torch.no_grad():
        out = response_logprobs(model, PROMPTS, RESPONSES, entropy=True)
    assert out.entropy is not None
    per_turn = (out.entropy * out.mask).sum(-1) / out.mask.sum(-1)  # (B,)
    return float(per_turn.mean())  # GRPO's seq_mean, as the learner aggregates it


def test_a_policy_whose_advantages_are_all_zero_still_moves_toward_spread() -> None:
    model = _model()
    with torch.no_grad():  # a peaked policy (the tiny model's own is nearly uniform)
        model.get_output_embeddings().weight.mul_(5.0)
    turns = _zero_advantage_turns(model)
    before = _mean_entropy(model)
    # without the bonus a collapsed group carries no gradient: no step, the weights stay
    still = Learner(copy.deepcopy(model), LearnerSettings(lr=1e-2))
    metrics = still.update(copy.deepcopy(turns))
    assert metrics["optimizer_steps"] == 0.0 and metrics["trained_turns"] == 0.0
    assert _mean_entropy(still.model) == pytest.approx(before, abs=1e-6)
    # with it, every turn is run and the step raises the policy's entropy
    learner = Learner(copy.deepcopy(model), LearnerSettings(lr=1e-2, entropy=1.0))
    metrics = learner.update(copy.deepcopy(turns))
    assert metrics["optimizer_steps"] == 1.0 and metrics["trained_turns"] == len(turns)
    assert metrics["entropy"] == pytest.approx(before, rel=1e-3)  # logged: before the step
    after = _mean_entropy(learner.model)
    assert after > before + 0.05, (before, after)


def test_the_bonus_is_set_per_policy_and_refused_below_zero() -> None:
    cfg = {
        "model": {"kind": "tiny"},
        "scenario": {"name": "signal-v0"},
        "sharing": "independent",
        "algo": {"entropy": 0.002},
        "policies": {"listener": {"entropy": 0.05}},
    }
    config = load_config(cfg)
    plan = plan_for(config)
    assert plan.policies["listener"].entropy == 0.05
    assert plan.policies["speaker"].entropy == 0.002  # algo.entropy, the default
    settings = learner_settings(config, entropy=plan.policies["listener"].entropy)
    assert settings.entropy == 0.05 and settings.sampling == config.sampling
    with pytest.raises(ConfigError, match=r"algo\.entropy"):
        load_config({**cfg, "algo": {"entropy": -0.1}})
    with pytest.raises(ConfigError, match=r"policies\.listener\.entropy"):
        plan_for(load_config({**cfg, "policies": {"listener": {"entropy": -1.0}}}))
    assert SamplingConfig().temperature == config.sampling.temperature
