"""Placement that cannot drift (issue 37): a learner whose tensors are not on its policy's
device is refused in one line naming the tensor, checked again after a checkpoint loads, and the
devices line says where each learner trains (fake device counts: no GPU is needed)."""

from __future__ import annotations

import pytest
import torch

from marl.config import load_config
from marl.errors import RunError
from marl.runtime.policies import PolicyLearner, check_placement, learner_tensors
from marl.runtime.policy_map import plan_for

from .test_policies import MIXED, config


def _learner(policy: str = "team", **kwargs: object) -> PolicyLearner:
    loaded = load_config(config(**MIXED))
    return PolicyLearner(plan_for(loaded).policies[policy], loaded, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["team", "own"])  # a full model, a LoRA adapter
def test_a_learner_on_its_device_passes_and_lists_every_tensor(policy: str) -> None:
    learner = _learner(policy, device="cpu")
    names = [name for name, _ in learner_tensors(learner.learner)]
    assert any(n.startswith("weight ") for n in names)
    assert any(n.startswith("master weight") for n in names)
    if policy == "own":  # only the adapter trains
        assert all("lora_" in n for n in names if n.startswith("weight "))
    check_placement(learner.learner, torch.device("cpu"), policy)


def test_a_model_off_the_policys_device_is_refused_in_one_line() -> None:
    loaded = load_config(config(**MIXED))
    spec = plan_for(loaded).policies["team"]
    colocated = _learner().model  # a CPU model handed to a policy that trains on cuda
    with pytest.raises(RunError) as refused:
        PolicyLearner(spec, loaded, model=colocated, tokenizer=_learner().tokenizer, device="cuda")
    message = str(refused.value)
    assert "\n" not in message
    assert "policy 'team'" in message and "is on cpu" in message and "trains on cuda" in message
    assert "weight model." in message


@pytest.mark.parametrize("where", ["optimizer", "reference"])  # torch refuses a moved .grad
def test_any_misplaced_tensor_is_named(where: str) -> None:
    learner = _learner("team", device="cpu")
    inner = learner.learner
    first = inner.masters.params[0]
    if where == "optimizer":
        inner.optimizer.state[first] = {"exp_avg": torch.zeros(3, device="meta")}
    else:
        inner.reference = torch.nn.Linear(2, 2, device="meta")
    expected = {"optimizer": "optimizer state 0.exp_avg", "reference": "reference weight"}[where]
    with pytest.raises(RunError, match=f"{expected}.* is on meta, but the policy trains on cpu"):
        check_placement(inner, torch.device("cpu"), "team")
