"""Per-agent policies in one process: the sharing presets fit any scenario, config mistakes fail
before anything is built (naming the key), each trainable policy learns only from its own agents'
turns, LoRA adapters reach the rollout side, and shared, independent, LoRA and frozen policies
mix in one run that resumes exactly."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_module

from marl.agents.logprobs import sequence_logprobs
from marl.cli import register_scenario_options
from marl.config import Config, ConfigError, load_config
from marl.loop.credit_phase import credit_phase
from marl.loop.train import train
from marl.runtime.checkpoint import load_checkpoint
from marl.runtime.local import LocalRuntime
from marl.runtime.policies import PolicyLearner, adapter_active
from marl.runtime.policy_map import assign_gpus, plan_for, resolve_policies

AGENTS = ["a", "b", "c", "d"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models run 5-10x faster on one thread when the 2 cores are shared with other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def config(**overrides: object) -> dict:
    """Unison with four agents and short prompts: a step takes about a second."""
    # Zero cooperation gives every agent's return its own spread, so that every policy soon has
    # something to learn from (see _rollout_with_signal).
    scenario = {"system_prompt": "", "agents": AGENTS, "reward": {"cooperation": 0.0}}
    base = {
        "scenario": {"name": "unison", "overrides": scenario},
        "model": {"kind": "tiny"},
        "sampling": {"max_new_tokens": 16},
        "algo": {"lr": 3e-3},
        "train": {"steps": 1, "seeds_per_step": 1, "group_size": 4},
        "logging": {"progress": False, "transcripts_every": 0, "tensorboard": False},
        "seed": 1,
    }
    base.update(overrides)
    return base


MIXED = {
    "sharing": "custom",
    # a and b share policy "team"; c has its own adapter; d plays a frozen copy
    "policy_map": {"a": "team", "b": "team", "c": "own", "d": "opponent"},
    "policies": {
        "team": {},
        "own": {"lora": {"r": 4, "alpha": 8}, "lr": 1e-2},
        "opponent": {"trainable": False},
    },
}


def _plan(**overrides: object):
    return plan_for(load_config(config(**overrides)))


# --------------------------------------------------------------------------- resolution


@pytest.mark.parametrize(
    "agents", [["speaker", "listener"], ["alice", "bob", "carol", "dave"], ["solo"]]
)
def test_presets_generate_policies_from_any_agent_list(agents: list[str]) -> None:
    shared = resolve_policies(load_config({"sharing": "shared"}), agents)
    assert list(shared.policies) == ["shared"]
    assert shared.policies["shared"].agents == tuple(agents)
    independent = resolve_policies(load_config({"sharing": "independent"}), agents)
    assert sorted(independent.policies) == sorted(agents)
    assert all(independent.policy_of(a) == a for a in agents)
    assert all(s.lora is None and s.trainable for s in independent.policies.values())
    lora = resolve_policies(load_config({"sharing": "lora"}), agents)
    assert all(s.lora is not None and s.lora.r == 8 for s in lora.policies.values())
    assert len({s.adapter for s in lora.policies.values()}) == len(agents)
    # one frozen base: every adapter sits on the same base model
    assert len({s.base_key for s in lora.policies.values()}) == 1


def test_presets_compose_through_hydra_for_a_builtin_scenario() -> None:
    register_scenario_options()
    with initialize_config_module(config_module="marl.configs", version_base=None):
        cfg = compose(
            config_name="train",
            overrides=[
                "scenario=relay",
                "sharing=lora",
                "+policy_map.dave=frozen",
                "+policies.frozen={trainable:false}",
                "ray=local",
            ],
        )
    loaded = load_config(cfg)
    plan = plan_for(loaded)
    assert loaded.ray.enabled
    assert sorted(plan.policies) == ["alice", "bob", "carol", "frozen"]
    assert plan.policy_of("dave") == "frozen" and not plan.policies["frozen"].trainable
    assert plan.policies["alice"].lora is not None


def test_mixed_map_patterns_and_per_policy_settings() -> None:
    plan = _plan(**MIXED)
    assert plan.policies["team"].agents == ("a", "b")
    assert plan.trainable == ["own", "team"]
    assert plan.policies["own"].lr == 1e-2 and plan.policies["team"].lr == 3e-3
    patterned = _plan(
        policy_map={"[ab]": "pair", "d": "solo"},
        policies={"pair": {"beta": 0.1}, "solo": {}},
    )
    assert patterned.agent_policy == {"a": "pair", "b": "pair", "c": "shared", "d": "solo"}
    assert patterned.policies["pair"].beta == 0.1


@pytest.mark.parametrize(
    "overrides, key",
    [
        (
            {
                "sharing": "custom",
                "policy_map": {"a": "p", "b": "p", "c": "p"},
                "policies": {"p": {}},
            },
            "policy_map: agent 'd' has no policy",
        ),
        ({"policies": {"ghost": {}}}, "policies.ghost: no agent plays this policy"),
        ({"policy_map": {"b": "nowhere"}}, "policy_map.b: policy 'nowhere' is not declared"),
        ({"policy_map": {"zed": "shared"}}, "policy_map.zed: the scenario has no agent 'zed'"),
        ({"policy_map": {"x*": "shared"}}, "policy_map.x*: the pattern matches no agent"),
        (
            {"policies": {"opp": {"trainable": False, "num_gpus": 1}}, "policy_map": {"d": "opp"}},
            "policies.opp.num_gpus: a frozen policy",
        ),
        (
            {"policies": {"opp": {"trainable": False, "lora": {}}}, "policy_map": {"d": "opp"}},
            "policies.opp.lora: a frozen LoRA adapter",
        ),
        ({"policy_map": {"d": "bad id"}, "policies": {"bad id": {}}}, "policy_map.d: policy id"),
    ],
)
def test_config_errors_name_the_key(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _plan(**overrides)
    assert key in str(err.value)


def test_device_requests_that_cannot_be_met_fail_naming_the_policies() -> None:
    plan = _plan(sharing="independent", policy_defaults={"num_gpus": 1})
    assert assign_gpus(plan, 4) == {a: 1.0 for a in AGENTS}
    with pytest.raises(ConfigError, match=r"policies\.a\.num_gpus.*4 GPU\(s\).*has 2"):
        assign_gpus(plan, 2, source="ray.num_gpus")
    big = _plan(policies={"shared": {"num_gpus": 2}})
    with pytest.raises(ConfigError, match="policies.shared.num_gpus: asks for 2 GPU"):
        assign_gpus(big, 4, largest_node=1, source="the Ray cluster")
    # null: packed onto the GPUs there are, none on a CPU machine; frozen: never
    mixed = _plan(**MIXED)
    assert assign_gpus(mixed, 0) == {"own": 0.0, "team": 0.0}
    assert assign_gpus(mixed, 2) == {"own": 1.0, "team": 1.0}


@pytest.mark.parametrize(
    ("policies", "gpus", "share"),
    [
        (["a", "b"], 1, 0.5),  # the demo on one GPU: two adapters share it
        (["a", "b", "c"], 1, 1 / 3),
        (["a", "b"], 2, 1.0),  # one each
        (["a", "b", "c"], 2, 0.5),  # 2/3 each would not fit: a share never spans two GPUs
        (["a", "b", "c", "d"], 2, 0.5),
        (["a", "b", "c", "d", "e"], 2, 1 / 3),
    ],
)
def test_null_requests_pack_onto_the_gpus_there_are(policies, gpus, share) -> None:
    plan = resolve_policies(load_config(config(sharing="independent")), policies)
    requests = assign_gpus(plan, gpus)
    assert requests == pytest.approx({p: share for p in policies})
    # each share lies whole on one GPU: the GPUs hold every policy, shares placed greedily
    free = [1.0] * gpus
    for pid in policies:
        fits = next(i for i, left in enumerate(free) if left >= requests[pid] - 1e-9)
        free[fits] -= requests[pid]


def test_explicit_requests_stay_and_null_ones_share_what_is_left() -> None:
    explicit = {"policies": {"a": {"num_gpus": 1}}}
    plan = resolve_policies(load_config(config(sharing="independent", **explicit)), ["a", "b", "c"])
    assert assign_gpus(plan, 2) == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.5})
    assert assign_gpus(plan, 3) == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})
    # what rollout workers reserve is not packed onto
    assert assign_gpus(plan, 3, reserved=1) == pytest.approx({"a": 1.0, "b": 0.5, "c": 0.5})
    with pytest.raises(ConfigError, match=r"policies\.a\.num_gpus: asks for 1 GPU"):
        assign_gpus(plan, 0.5)


@pytest.fixture
def ray_never_starts(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fails the test if it starts Ray: ``ray.init`` raises for its duration. This holds
    whatever ran before it in the process (a test worker may hold a shared Ray session)."""
    import ray

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("ray.init was called")

    monkeypatch.setattr(ray, "init", refuse)
    was_up = ray.is_initialized()
    yield
    assert ray.is_initialized() == was_up


def test_impossible_device_requests_fail_before_anything_starts(
    tmp_path: Path, no_gpu: None, ray_never_starts: None
) -> None:
    # in one process: against torch.cuda (the no_gpu fixture hides any GPU this machine has)
    with pytest.raises(ConfigError, match="policies.shared.num_gpus"):
        train(config(policies={"shared": {"num_gpus": 1}}), run_dir=tmp_path)
    # on Ray: against the GPUs the local cluster would declare, before Ray starts
    with pytest.raises(ConfigError, match=r"policies\.a\.num_gpus.*ray\.num_gpus has 2"):
        train(
            config(
                sharing="independent",
                policy_defaults={"num_gpus": 1},
                ray={"enabled": True, "num_gpus": 2},
            ),
            run_dir=tmp_path,
        )
    assert not any(tmp_path.iterdir()), "nothing is written before the checks pass"


def test_marl_play_never_starts_ray(capsys: pytest.CaptureFixture, ray_never_starts: None) -> None:
    from omegaconf import OmegaConf

    from marl.play import play

    play(OmegaConf.create(config(agents="llm", ray={"enabled": True})))
    assert capsys.readouterr().out.strip()  # the episode was played and printed


@pytest.mark.slow
@pytest.mark.subprocess
def test_cli_reports_a_policy_mistake_without_traceback(marl_cli, tmp_path: Path) -> None:
    done = marl_cli(
        "train", "model=tiny", "+policies.ghost={}", f"hydra.run.dir={tmp_path}", timeout=120
    )
    assert done.returncode != 0
    assert "policies.ghost" in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- updates


@pytest.fixture(scope="module")
def mixed_runtime(no_gpu_module):
    # on the CPU: the tests compare it with fresh learners built on the CPU, bit for bit
    loaded = load_config(config(**MIXED))
    runtime = LocalRuntime(loaded, plan_for(loaded))
    yield loaded, runtime
    runtime.close()


def _rollout_with_signal(loaded, runtime):
    """The first rollout (of steps 0-7) in which agents a, b and c each have a turn with a
    nonzero advantage, so that every trained policy has something to learn from."""
    for step in range(8):
        rollout = runtime.rollout(step)
        credit_phase(loaded.credit, rollout, None, loaded.algo.advantage)
        if all(any(t.advantage != 0 for t in rollout.turns if t.agent == a) for a in "abc"):
            return rollout
    raise AssertionError("nothing to learn in 8 rollouts")


def test_each_policy_learns_only_from_its_agents(mixed_runtime) -> None:
    loaded, runtime = mixed_runtime
    backends = runtime.worker.policies.backends
    before = {
        pid: {k: v.clone() for k, v in backends[pid].model.state_dict().items()}
        for pid in ("team", "opponent")
    }
    rollout = _rollout_with_signal(loaded, runtime)
    by_agent = {a: [t for t in rollout.turns if t.agent == a] for a in AGENTS}
    assert {t.policy_id for t in by_agent["a"] + by_agent["b"]} == {"team"}
    # a fresh learner given exactly the team's agents' turns must end where the runtime's does
    team = runtime.plan.policies["team"]
    reference = PolicyLearner(team, loaded)
    reference.model.load_state_dict(before["team"])
    metrics = runtime.update(rollout.turns)
    assert set(metrics) == {"team", "own"}  # the frozen opponent has no learner
    assert metrics["team"]["turns"] == len(by_agent["a"]) + len(by_agent["b"])
    assert metrics["own"]["turns"] == len(by_agent["c"])
    assert math.isfinite(metrics["team"]["loss"]) and metrics["team"]["trained_turns"] > 0
    reference.update([t for t in rollout.turns if t.agent in ("a", "b")])  # same order
    trained = backends["team"].model.state_dict()
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, trained[name]), name
    assert any(not torch.equal(before["team"][k], trained[k]) for k in trained)
    # the frozen opponent plays the base that "own"'s adapter sits on (its rows switch every
    # adapter off): "own" trains its adapter there in place, the base weights never change
    frozen = backends["opponent"].model.state_dict()
    assert all(torch.equal(before["opponent"][k], frozen[k]) for k in frozen if "lora_" not in k)
    assert any("lora_" in k for k in frozen)
    with pytest.raises(ValueError, match="other policies"):
        PolicyLearner(team, loaded).update(by_agent["d"])


def _logprobs(model: torch.nn.Module, adapter: str | None, turn, config: Config) -> list[float]:
    """Logprob of each response token of ``turn`` under ``model`` with only ``adapter`` on
    (None: no adapter), sampled as ``config.sampling`` says."""
    s = config.sampling
    with torch.no_grad(), adapter_active(model, adapter):
        values, _ = sequence_logprobs(
            model,
            [list(turn.prompt_ids)],
            [list(turn.response_ids)],
            temperature=s.temperature or 1.0,
            top_p=s.top_p,
        )
    return values[0].tolist()


def test_lora_adapter_reaches_the_rollout_side(mixed_runtime) -> None:
    loaded, runtime = mixed_runtime
    learner = runtime.learners["own"]
    assert all(p.requires_grad == ("lora_" in k) for k, p in learner.model.named_parameters())
    rollout = _rollout_with_signal(loaded, runtime)
    turn = next(t for t in rollout.turns if t.agent == "c" and t.advantage != 0)
    backends = runtime.worker.policies.backends

    def worker(policy_id: str) -> list[float]:  # under the weights the rollout side holds
        backend = backends[policy_id]
        return _logprobs(backend.model, getattr(backend, "adapter", None), turn, loaded)

    stale = worker("own")
    runtime.update(rollout.turns)
    learned = _logprobs(learner.model, learner.spec.adapter, turn, loaded)
    assert max(abs(x - y) for x, y in zip(stale, learned)) > 1e-3  # the adapter learned
    # in one process the learner trains the rollout's own adapter: there before any sync
    assert learner.colocated
    synced = worker("own")
    assert synced == pytest.approx(learned, abs=1e-5)
    runtime.sync()
    assert worker("own") == synced
    # the frozen opponent shares the base model but never sees the adapter
    opponent = worker("opponent")
    base = _logprobs(learner.model, None, turn, loaded)
    assert opponent == pytest.approx(base, abs=1e-5)
    assert max(abs(x - y) for x, y in zip(opponent, synced)) > 1e-3


@pytest.mark.slow
def test_mixed_run_checkpoints_every_policy_and_resumes_exactly(tmp_path: Path) -> None:
    straight = train(
        config(**MIXED, train={"steps": 2, "seeds_per_step": 1, "group_size": 4}),
        run_dir=tmp_path / "straight",
    )
    train(config(**MIXED), run_dir=tmp_path / "first")
    state = load_checkpoint(tmp_path / "first" / "checkpoints")
    assert {p: s["kind"] for p, s in state["policies"].items()} == {
        "team": "full",
        "own": "adapter",
    }
    assert all("lora_" in k for k in state["policies"]["own"]["weights"])
    resumed = train(
        config(
            **MIXED,
            train={"steps": 2, "seeds_per_step": 1, "group_size": 4},
            resume=str(tmp_path / "first"),
        ),
        run_dir=tmp_path / "resumed",
    )

    def comparable(m: dict) -> dict:
        return {k: v for k, v in m.items() if not k.startswith("perf/")}

    assert comparable(straight) == comparable(resumed)
    assert "policies/own/loss" in straight and "policies/opponent/loss" not in straight


def test_scripted_agents_train_loop_plays_without_a_model(tmp_path: Path) -> None:
    metrics = train(
        config(agents="scripted", bot="random", scenario={"name": "signal", "overrides": {}}),
        run_dir=tmp_path,
    )
    assert "agents/speaker/reward" in metrics and not any(
        k.startswith("policies/") for k in metrics
    )
    with pytest.raises(ConfigError, match="credit.name"):
        train(config(agents="scripted", credit={"name": "difference"}), run_dir=tmp_path)


def test_schema_defaults_keep_a_single_shared_policy() -> None:
    plan = plan_for(Config())
    assert list(plan.policies) == ["shared"] and plan.trainable == ["shared"]


# --------------------------------------------------------------------------- batched adapters


def test_lora_agents_on_one_base_generate_in_one_call_with_their_own_adapters() -> None:
    """Four agents with an adapter each (sharing=lora) reach the base model in ONE generate call
    per round, each row under its agent's adapter, and get what a call of their own gives."""
    from marl.agents.backends import SamplingConfig
    from marl.agents.generation import PromptRequest, generate_by_policy
    from marl.runtime.policies import InferencePolicies

    loaded = load_config(config(sharing="lora"))
    plan = plan_for(loaded)
    policies = InferencePolicies(plan, loaded)
    backends = policies.backends
    assert len(backends) == 4
    (base,) = {id(b.base): b.base for b in backends.values()}.values()
    generator = torch.Generator().manual_seed(0)
    for name, param in base.model.named_parameters():  # distinct adapters (fresh ones are no-ops)
        if "lora_B" in name:
            param.data.normal_(0.0, 0.5, generator=generator)
    calls: list[list[str | None]] = []
    real = base.generate

    def spy(prompts, sampling, adapters=None, seed=None):  # noqa: ANN001, ANN202
        calls.append(list(adapters) if adapters is not None else [None] * len(prompts))
        return real(prompts, sampling, adapters=adapters, seed=seed)

    base.generate = spy
    policy_of = {a: pid for pid, spec in plan.policies.items() for a in spec.agents}.__getitem__
    first = "Round 1. Reply with ACTION: and a word."
    requests = [PromptRequest(a, "Play.", first) for a in AGENTS]
    requests += [PromptRequest(a, "Play.", f"You are {a}. Round 2.") for a in AGENTS]
    greedy = SamplingConfig(max_new_tokens=6, temperature=0.0)
    together, count = generate_by_policy(backends, policy_of, requests, greedy, seed=5)
    assert count == 1 and len(calls) == 1
    adapters = {backends[policy_of(a)].adapter for a in AGENTS}
    assert len(adapters) == 4 and sorted(calls[0]) == sorted(
        backends[policy_of(r.agent)].adapter for r in requests
    )
    calls.clear()
    for k, request in enumerate(requests):  # each request alone, through its policy's view
        (alone,), _ = generate_by_policy(backends, policy_of, [request], greedy, seed=5)
        assert alone[0].policy_id == together[k][0].policy_id == policy_of(request.agent)
        assert alone[0].response_ids == together[k][0].response_ids, request
        assert alone[0].prompt_ids == together[k][0].prompt_ids
    assert len(calls) == len(requests)
    # the adapters really differ: one prompt, four agents, more than one answer
    assert len({tuple(together[k][0].response_ids) for k in range(len(AGENTS))}) > 1


def test_rollout_workers_pack_onto_the_gpus_with_the_learners() -> None:
    from marl.runtime.policy_map import assign_shares, packed_shares

    plan = _plan(sharing="independent")  # 4 learners, num_gpus null
    assert packed_shares(plan, 0, 2, None) == ({a: 0.0 for a in AGENTS}, 0.0)
    requests, per_worker = packed_shares(plan, 1, 2, None)  # 6 actors on one GPU
    assert per_worker == pytest.approx(1 / 6) and set(requests.values()) == {per_worker}
    requests, per_worker = packed_shares(plan, 8, 2, None)  # enough: one each
    assert per_worker == 1.0 and set(requests.values()) == {1.0}
    requests, per_worker = packed_shares(plan, 2, 2, None)  # 6 on 2: thirds, none spans two
    assert per_worker == pytest.approx(1 / 3) and sum(requests.values()) + 2 / 3 <= 2 + 1e-9
    # an explicit worker request stays as written; the learners pack onto the rest
    requests, per_worker = packed_shares(plan, 3, 2, 1.0)
    assert per_worker == 1.0 and sum(requests.values()) == pytest.approx(1.0)
    assert packed_shares(None, 4, 3, None) == ({}, 0.0)  # scripted agents run no model
    with pytest.raises(ConfigError, match="ray.worker_num_gpus"):
        assign_shares(plan, 1, workers=2, worker_request=1.0, source="ray.num_gpus")


def test_declaring_a_generated_policy_sets_only_the_fields_it_names() -> None:
    """Under a preset, ``policies.<generated id>`` changes the fields it sets and keeps the
    preset's others: an entropy bonus on the listener keeps its adapter."""
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj"]}
    base = {"scenario": {"name": "signal-v0"}, "sharing": "lora", "policy_defaults": {"lora": lora}}
    plan = plan_for(load_config({**base, "policies": {"listener": {"entropy": 0.01, "lr": 1e-3}}}))
    listener, speaker = plan.policies["listener"], plan.policies["speaker"]
    assert listener.lora == speaker.lora and listener.lora is not None and listener.lora.r == 4
    assert (listener.entropy, listener.lr) == (0.01, 1e-3)
    assert (speaker.entropy, speaker.lr) == (0.0, load_config(base).algo.lr)
    frozen = plan_for(load_config({**base, "policies": {"listener": {"trainable": False}}}))
    assert frozen.policies["listener"].lora is None  # a frozen generated policy: the base model
    assert not frozen.policies["listener"].trainable
