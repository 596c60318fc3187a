"""The imitation warm-up: it lowers the loss on bot transcripts, trains only trainable policies,
teaches the protocol without the answer when asked to, and refuses bad input by key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from marl.config import ConfigError, load_config
from marl.loop.warmup import Imitator, bot_turns, encode_turn, read_transcripts, run_warmup
from marl.runtime.local import LocalRuntime
from marl.runtime.policy_map import plan_for

BASE = {
    "model": {"kind": "tiny"},
    "scenario": {"name": "signal-v1"},
    "sampling": {"response_prefix": True, "max_new_tokens": 8},
    "warmup": {"steps": 6, "bot": "rule", "episodes": 8, "lr": 3e-3},
    "logging": {"progress": False, "tensorboard": False},
}


def _runtime(extra: dict | None = None) -> tuple:
    config = load_config({**BASE, **(extra or {})})
    plan = plan_for(config)
    return config, plan, LocalRuntime(config, plan)


@pytest.mark.slow
def test_warmup_lowers_the_loss_on_bot_transcripts() -> None:
    config, plan, runtime = _runtime()
    held_out = bot_turns(config, 8, step=10_000)  # episodes the warm-up never sees
    learner = runtime.learners["shared"]
    probe = Imitator(learner.model, learner.tokenizer, lr=1e-9, batch_size=16, autocast=False)
    before = probe.evaluate(held_out)
    metrics = run_warmup(config, runtime.learners, plan.policy_of, progress=False)
    after = probe.evaluate(held_out)
    assert metrics["warmup/shared/tokens"] > 0
    assert after < before - 0.3, (before, after)


def test_warmup_changes_only_the_trainable_policy() -> None:
    extra = {
        "policies": {"A": {}, "F": {"trainable": False}},
        "policy_map": {"speaker": "A", "listener": "F"},
    }
    config, plan, runtime = _runtime(extra)
    backends = runtime.worker.policies.backends
    frozen = {k: v.clone() for k, v in backends["F"].model.state_dict().items()}
    trained = {k: v.clone() for k, v in backends["A"].model.state_dict().items()}
    run_warmup(config, runtime.learners, plan.policy_of, progress=False)
    assert set(runtime.learners) == {"A"}
    for name, value in backends["F"].model.state_dict().items():
        assert torch.equal(value, frozen[name]), name
    changed = [
        n for n, v in backends["A"].model.state_dict().items() if not torch.equal(v, trained[n])
    ]
    assert changed


def test_format_bot_teaches_the_markup_not_the_answer() -> None:
    config = load_config({**BASE, "warmup": {**BASE["warmup"], "bot": "format"}})
    turns = bot_turns(config, 64, step=0)
    speaker = [t for t in turns if t.agent == "speaker"]
    listener = [t for t in turns if t.agent == "listener"]
    assert all(t.head == "SAY:" and t.completion.startswith("SAY: ") for t in speaker)
    assert all(t.head == "ACTION:" and t.completion.startswith("ACTION: ") for t in listener)
    # the speaker's message names its target no more often than a random object would (1/16)
    named = sum(t.completion[5:] in t.observation for t in speaker) / len(speaker)
    assert named < 0.25
    rule = bot_turns(load_config(BASE), 16, step=0)
    assert all(t.completion[5:] in t.observation for t in rule if t.agent == "speaker")


def test_the_response_is_the_completion_after_the_head_plus_end_of_turn() -> None:
    config, _, runtime = _runtime()
    tok = runtime.learners["shared"].tokenizer
    turn = bot_turns(config, 1, step=0)[0]
    prompt, response = encode_turn(tok, turn)
    assert tok.decode(prompt).endswith(turn.head)
    assert response[-1] == tok.eos_token_id
    assert tok.decode(response[:-1]).strip() == turn.completion[len(turn.head) :].strip()


def test_transcript_file(tmp_path: Path) -> None:
    good = tmp_path / "t.jsonl"
    rows = [{"agent": "listener", "system": "s", "observation": "o", "completion": "ACTION: 1"}]
    good.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_transcripts(good)[0].completion == "ACTION: 1"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"agent": "a", "observation": "o", "completion": 3}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: 'completion' must be a string"):
        read_transcripts(bad)
    with pytest.raises(ConfigError, match="not a regular file"):
        read_transcripts(tmp_path)
    with pytest.raises(ConfigError, match="warmup.data: cannot read"):
        read_transcripts(tmp_path / "missing.jsonl")


def test_bad_warmup_settings_name_the_key() -> None:
    from marl.loop.train import check_config

    with pytest.raises(ConfigError, match="warmup.lr"):
        load_config({**BASE, "warmup": {"steps": 1, "lr": float("nan")}})
    with pytest.raises(ConfigError, match="warmup.steps"):
        load_config({**BASE, "warmup": {"steps": -1}})
    with pytest.raises(ConfigError, match="warmup.bot: no scripted bot 'oracle'"):
        check_config(load_config({**BASE, "warmup": {"steps": 1, "bot": "oracle"}}))
    with pytest.raises(
        ConfigError, match="warmup.steps: the imitation warm-up runs in one process"
    ):
        check_config(load_config({**BASE, "ray": {"enabled": True}}))


def test_only_the_named_agents_are_imitated() -> None:
    config = load_config({**BASE, "warmup": {**BASE["warmup"], "agents": ["listener"]}})
    turns = bot_turns(config, 16, step=0)
    assert turns and {t.agent for t in turns} == {"listener"}
    # the rule speaker still played: the listener heard the target and its answer names it
    assert all(
        t.completion[len("ACTION: ") :] in t.observation.split("received:")[-1] for t in turns
    )


def test_unknown_warmup_agents_name_the_key() -> None:
    from marl.loop.train import check_config

    with pytest.raises(ConfigError, match="warmup.agents: no agent 'lisener'"):
        check_config(load_config({**BASE, "warmup": {"steps": 1, "agents": ["lisener"]}}))
    with pytest.raises(ConfigError, match="warmup.bots.listener: no scripted bot 'x'"):
        check_config(load_config({**BASE, "warmup": {"steps": 1, "bots": {"listener": "x"}}}))


def test_the_kl_reference_is_the_warmed_up_model() -> None:
    """With ``algo.beta`` > 0 the KL anchors RL to the policy it starts from: the reference is
    taken again after the warm-up (the base model would pull RL back off the move format)."""
    config, plan, runtime = _runtime(
        {"algo": {"beta": 0.1}, "warmup": {**BASE["warmup"], "steps": 2}}
    )
    learner = runtime.learners["shared"].learner
    assert learner.reference is not None
    base = {k: v.clone() for k, v in learner.reference.state_dict().items()}
    run_warmup(config, runtime.learners, plan.policy_of, progress=False)
    live = learner.model.state_dict()
    moved = [k for k, v in base.items() if not torch.equal(v, live[k])]
    assert moved  # the warm-up changed the model...
    for name, value in learner.reference.state_dict().items():  # ...and the reference with it
        assert torch.equal(value, live[name]), name
    assert not any(p.requires_grad for p in learner.reference.parameters())


def test_a_resumed_run_keeps_the_warmed_up_reference() -> None:
    """A checkpoint taken after the warm-up carries the KL reference (the resumed run does not
    warm up again, and its weights have moved on); one taken without a warm-up carries none,
    and the reference stays the base model."""
    extra = {"algo": {"beta": 0.1}, "warmup": {**BASE["warmup"], "steps": 2}}
    config, plan, runtime = _runtime(extra)
    policy = runtime.learners["shared"]
    assert "reference" not in policy.state_dict()["learner"]  # before the warm-up: the base
    run_warmup(config, runtime.learners, plan.policy_of, progress=False)
    warmed = {k: v.clone() for k, v in policy.model.state_dict().items()}
    with torch.no_grad():  # RL moves the weights on after the warm-up
        for p in policy.model.parameters():
            p.add_(0.01)
    state = policy.state_dict()
    assert "reference" in state["learner"]

    _, _, fresh = _runtime(extra)  # a resumed run: a new runtime, then the checkpoint's state
    resumed = fresh.learners["shared"]
    base = {k: v.clone() for k, v in resumed.learner.reference.state_dict().items()}
    resumed.load_state_dict(state)
    reference = resumed.learner.reference.state_dict()
    live = resumed.model.state_dict()
    moved = [k for k in warmed if not torch.equal(warmed[k], base[k])]
    assert moved  # the warm-up had changed weights the base holds otherwise
    for name in warmed:
        assert torch.equal(reference[name], warmed[name]), name  # the warmed-up model...
    assert any(not torch.equal(reference[k], live[k]) for k in live)  # ...not the resumed one
    assert "reference" in resumed.state_dict()["learner"]  # and the next checkpoint keeps it
