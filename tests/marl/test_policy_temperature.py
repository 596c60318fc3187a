"""A policy's own sampling temperature (``policies.<id>.temperature``): it is resolved (else
``sampling.temperature``) and checked naming its key; adapters of one base that sample at
different temperatures go to the base in one call per temperature, each at its own; and a run's
rollout records the logprobs of each policy's own temperature, the ones its learner's ratio is
taken under (the first update's ratio is 1, and the run's temperature would not give it)."""

from __future__ import annotations

import math

import pytest
import torch

from marl.agents.backends import SamplingConfig
from marl.agents.generation import PromptRequest, generate_by_policy
from marl.agents.logprobs import sequence_logprobs
from marl.config import ConfigError, load_config
from marl.runtime.local import LocalRuntime
from marl.runtime.policies import InferencePolicies, adapter_active
from marl.runtime.policy_map import plan_for

AGENTS = ["a", "b", "c", "d"]


def config(**overrides: object) -> dict:
    """Unison with four agents, each with an adapter on one tiny base (``sharing=lora``)."""
    base = {
        "scenario": {
            "name": "unison",
            "overrides": {"system_prompt": "", "agents": AGENTS, "reward": {"cooperation": 0.0}},
        },
        "model": {"kind": "tiny"},
        "sharing": "lora",
        "sampling": {"max_new_tokens": 8, "temperature": 1.0},
        "algo": {"lr": 1e-3, "minibatch_size": 256},
        "train": {"steps": 1, "seeds_per_step": 1, "group_size": 2},
        "logging": {"progress": False, "transcripts_every": 0, "tensorboard": False},
        "seed": 3,
    }
    base.update(overrides)
    return base


def _distinct_adapters(policies: InferencePolicies) -> None:
    """Fresh adapters are no-ops (lora_B = 0): give each its own weights, so the four policies
    really differ and the tiny model's logits are far from uniform."""
    (base,) = {id(b.base): b.base for b in policies.backends.values()}.values()
    generator = torch.Generator().manual_seed(0)
    for name, param in base.model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0.0, 0.5, generator=generator)


def test_a_policy_temperature_is_resolved_and_checked() -> None:
    plan = plan_for(
        load_config(config(policies={"a": {"temperature": 0.0}, "b": {"temperature": 1.5}}))
    )
    assert plan.temperatures == {"a": 0.0, "b": 1.5, "c": 1.0, "d": 1.0}
    assert plan.policies["a"].lora is not None  # declaring it keeps the preset's adapter
    for bad in (-0.5, math.nan, math.inf):
        with pytest.raises(ConfigError, match=r"^policies\.a\.temperature: must be"):
            plan_for(load_config(config(policies={"a": {"temperature": bad}})))


def test_adapters_at_different_temperatures_share_the_base_one_call_per_temperature() -> None:
    loaded = load_config(config(policies={"a": {"temperature": 0.0}, "b": {"temperature": 0.0}}))
    plan = plan_for(loaded)
    policies = InferencePolicies(plan, loaded)
    _distinct_adapters(policies)
    backends = policies.backends
    (base,) = {id(b.base): b.base for b in backends.values()}.values()
    calls: list[tuple[float, list[str | None]]] = []
    real = base.generate

    def spy(prompts, sampling, adapters=None, seed=None):  # noqa: ANN001, ANN202
        calls.append((sampling.temperature, sorted(adapters or [])))
        return real(prompts, sampling, adapters=adapters, seed=seed)

    base.generate = spy
    requests = [
        PromptRequest(x, "Play.", f"You are {x}. Reply with ACTION: and a word.") for x in AGENTS
    ]
    sampling = SamplingConfig(max_new_tokens=8, temperature=1.0)
    runs = []
    for seed in (5, 6, 7):
        calls.clear()
        replies, count = generate_by_policy(
            backends, plan.policy_of, requests, sampling, seed, temperatures=plan.temperatures
        )
        # one call at 0 (a and b's adapters), one at 1 (c and d's)
        assert count == 2 and sorted(t for t, _ in calls) == [0.0, 1.0]
        by_temperature = dict(calls)
        assert by_temperature[0.0] == sorted([backends["a"].adapter, backends["b"].adapter])
        assert by_temperature[1.0] == sorted([backends["c"].adapter, backends["d"].adapter])
        runs.append({r.agent: reply[0].response_ids for r, reply in zip(requests, replies)})
    # the greedy policies answer the same whatever the seed, the ones at 1 do not
    assert runs[0]["a"] == runs[1]["a"] == runs[2]["a"]
    assert runs[0]["b"] == runs[1]["b"] == runs[2]["b"]
    assert len({tuple(run["c"]) for run in runs} | {tuple(run["d"]) for run in runs}) > 2
    # and greedy is what the run's own greedy sampling gives a alone
    greedy = SamplingConfig(max_new_tokens=8, temperature=0.0)
    (alone,), _ = generate_by_policy(backends, plan.policy_of, [requests[0]], greedy, 9)
    assert alone[0].response_ids == runs[0]["a"]


def test_the_rollout_records_each_policy_temperature_and_its_learner_takes_the_ratio_there() -> (
    None
):
    temperatures = {"a": 0.5, "b": 2.0}
    loaded = load_config(
        config(policies={pid: {"temperature": t} for pid, t in temperatures.items()})
    )
    runtime = LocalRuntime(loaded, plan_for(loaded))
    try:
        assert runtime.worker.policies is not None
        _distinct_adapters(runtime.worker.policies)
        rollout = runtime.rollout(0)
        model = runtime.learners["a"].model  # the shared base, every adapter on it
        for pid, temperature in temperatures.items():
            turns = [t for t in rollout.turns if t.policy_id == pid]
            assert turns and runtime.learners[pid].spec.temperature == temperature
            assert runtime.learners[pid].learner.settings.sampling.temperature == temperature
            with torch.no_grad(), adapter_active(model, runtime.learners[pid].spec.adapter):
                own, mask = sequence_logprobs(
                    model,
                    [t.prompt_ids for t in turns],
                    [t.response_ids for t in turns],
                    temperature,
                )  # (B, T), (B, T)
                run, _ = sequence_logprobs(
                    model, [t.prompt_ids for t in turns], [t.response_ids for t in turns], 1.0
                )
            recorded = torch.zeros_like(own)
            for i, t in enumerate(turns):
                recorded[i, : len(t.logprobs)] = torch.tensor(t.logprobs)
            on = mask.bool()
            # what the rollout recorded is the policy's own temperature's, not the run's
            assert torch.allclose(own[on], recorded[on], atol=1e-4), pid
            assert (run[on] - recorded[on]).abs().max() > 0.05, pid
        for k, turn in enumerate(rollout.turns):  # a spread of advantages: every turn trains
            turn.advantage = 1.0 if k % 2 else -1.0
        metrics = runtime.update(rollout.turns)
        for pid in AGENTS:  # one minibatch: its ratio is taken before the step, so it is 1
            assert metrics[pid]["approx_kl_old"] < 1e-5, (pid, metrics[pid])
            assert metrics[pid]["clip_frac"] == 0.0
    finally:
        runtime.close()
