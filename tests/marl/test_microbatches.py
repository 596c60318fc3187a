"""Microbatches (``algo.microbatch_size``): a minibatch's gradient accumulated over smaller
forward/backward passes is the gradient of the one big pass; only peak memory changes."""

from __future__ import annotations

import copy

import pytest
import torch

from marl.agents.models import ModelSpec, load_model
from marl.config import ConfigError, load_config
from marl.losses import aggregation_denominator
from marl.runtime.learner import Learner, LearnerSettings

from .test_shared_prompts import _relative, _turns


def _accumulated(
    model: torch.nn.Module, turns: list, **settings: object
) -> tuple[dict[str, float], list[torch.Tensor]]:
    """The metrics and the gradient of one minibatch of ``turns``, as ``_minibatch_step``
    accumulates them before its optimizer step."""
    learner = Learner(copy.deepcopy(model), LearnerSettings(**settings))  # type: ignore[arg-type]
    s = learner.settings
    denominator = aggregation_denominator(
        [t.mask for t in turns], learner.aggregation, s.sampling.max_new_tokens
    )
    learner._zero_grad()
    metrics = learner._accumulate_gradients(turns, denominator)
    return metrics, [p.grad for p in learner.model.parameters() if p.requires_grad]


@pytest.mark.parametrize(
    "settings",
    [{}, {"level": "sequence", "aggregation": "token_mean"}, {"aggregation": "constant"}],
    ids=["grpo", "gspo", "dr_grpo"],
)
@pytest.mark.parametrize("size", [1, 3])
def test_microbatches_give_the_minibatch_gradient(settings: dict, size: int) -> None:
    model, tok = load_model(ModelSpec(kind="tiny", seed=5))
    turns = _turns(model, tok)
    whole, grad_whole = _accumulated(model, turns, **settings)
    split, grad_split = _accumulated(model, turns, microbatch_size=size, **settings)
    assert sum(float(g.abs().sum()) for g in grad_whole) > 0  # a real gradient, not zeros
    assert _relative(grad_split, grad_whole) < 1e-5
    for key in ("loss", "pg_loss", "n_tokens", "clip_frac", "ratio_mean", "approx_kl_old"):
        assert split[key] == pytest.approx(whole[key], rel=1e-5, abs=1e-7), key


def test_a_bad_microbatch_size_names_the_key() -> None:
    with pytest.raises(ConfigError, match="algo.microbatch_size"):
        load_config({"algo": {"microbatch_size": 0}})
