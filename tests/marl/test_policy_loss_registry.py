"""The policy-loss registry: ``algo.level`` names a registered loss, as ``algo.advantage`` names
an estimator. The built-in levels are its first entries, a taken name is refused, an unknown one
is refused naming the key and listing the known names, and a loss registered by the user is
accepted by the config and used by the learner without editing a whitelist or a branch."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from hydra import compose, initialize_config_module

from marl.agents.models import ModelSpec, load_model
from marl.cli import register_scenario_options
from marl.config import AlgoConfig, Config, ConfigError, load_config
from marl.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    Surrogate,
    list_policy_losses,
    policy_loss,
    ratio_unit,
    register_policy_loss,
)
from marl.runtime.learner import Learner, LearnerSettings

from .test_shared_prompts import _turns


def load(*overrides: str) -> Config:
    """The validated config of ``marl train <overrides>``."""
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        return load_config(compose(config_name="train", overrides=list(overrides)))


def _unclipped(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> Surrogate:
    """``-w A`` per token, no clip: the importance-weighted REINFORCE surrogate."""
    ratio = torch.exp(log_ratio)  # (B, T)
    per_token = -ratio * advantages.unsqueeze(-1)  # (B, T)
    return Surrogate(per_token, 0.0, float(ratio.detach()[valid].mean()) if valid.any() else 1.0)


@pytest.fixture
def unclipped() -> Iterator[str]:
    name = "test_unclipped"
    register_policy_loss(name)(_unclipped)
    try:
        yield name
    finally:
        POLICY_LOSSES.pop(name, None)


def test_the_builtin_levels_are_the_first_entries() -> None:
    assert {"token", "sequence"} <= set(list_policy_losses())
    assert ratio_unit("token") == "token" and ratio_unit("sequence") == "sequence"
    assert AGGREGATIONS == ("seq_mean", "token_mean", "constant")


def test_a_taken_name_is_refused() -> None:
    with pytest.raises(ValueError, match="policy loss 'token' is already registered"):
        register_policy_loss("token")(_unclipped)
    with pytest.raises(ValueError, match="unit 'word'"):
        register_policy_loss("test_word", unit="word")
    assert "test_word" not in POLICY_LOSSES


def test_unknown_level_names_the_key_and_lists_the_registry() -> None:
    with pytest.raises(ConfigError) as err:
        load("algo.level=tokens")
    message = str(err.value)
    assert message.startswith("algo.level: unknown policy loss 'tokens'"), message
    assert message.endswith("known: " + ", ".join(list_policy_losses())), message


def test_unknown_aggregation_names_the_key_and_lists_the_literal() -> None:
    with pytest.raises(ConfigError) as err:
        load("algo.aggregation=mean")
    assert str(err.value) == "algo.aggregation: 'mean' is not one of seq_mean, token_mean, constant"


def test_a_registered_loss_is_accepted_and_computed(unclipped: str) -> None:
    assert AlgoConfig(level=unclipped).level == unclipped
    assert load(f"algo.level={unclipped}").algo.level == unclipped
    new = torch.log(torch.tensor([[2.0, 0.5]])).requires_grad_()  # (1, 2): ratios 2 and 0.5
    old = torch.zeros(1, 2)
    adv = torch.tensor([1.0])
    loss, m = policy_loss(new, old, adv, torch.ones(1, 2), level=unclipped)
    assert float(loss.detach()) == pytest.approx(-(2.0 + 0.5) / 2)  # no clip: the ratio 2 counts
    clipped, _ = policy_loss(new, old, adv, torch.ones(1, 2), level="token")
    assert float(clipped.detach()) == pytest.approx(-(1.2 + 0.5) / 2)  # the token level clips it
    assert m["clip_frac"] == 0.0 and m["ratio_mean"] == pytest.approx(1.25)


def test_the_learner_uses_the_registered_loss(unclipped: str) -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=5))
    turns = _turns(model, tok)

    def loss(level: str, clip: float) -> float:
        settings = LearnerSettings(level=level, clip_eps=clip, clip_eps_high=clip)
        value, _ = Learner(copy.deepcopy(model), settings).loss(turns)
        return float(value.detach())

    # with a clip too wide to bind the token level is the unclipped loss; a tight one differs
    assert loss(unclipped, 0.9) == pytest.approx(loss("token", 0.9), rel=1e-6)
    assert loss(unclipped, 0.01) != pytest.approx(loss("token", 0.01), rel=1e-3)
