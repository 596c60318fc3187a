"""Scored choice (marl.agents.scored_choice, ``policies.<id>.choice: scored``) on the tiny model:
a finite-choice turn lists its legal texts; a scored policy answers it with one of them, drawn
by the normalised scores (the draws' frequencies match them), with the tokens and logprobs the
learner recomputes; other turns and other policies are sampled as before; a backend without a
model and a vLLM run are refused naming the key; a scored listener is never malformed."""

from __future__ import annotations

import math

import pytest
import torch

from marl.agents.action_scores import action_scores
from marl.agents.backends import SamplingConfig, make_backend
from marl.agents.generation import PromptRequest, generate_by_policy
from marl.agents.logprobs import sequence_logprobs
from marl.agents.models import ModelSpec, load_model
from marl.agents.scored_choice import choices_of, choose_by_score, replies_after_head
from marl.config import ConfigError, load_config
from marl.runtime.rollout import EpisodeSlot, run_episodes
from marl.scenarios.registry import make

SAMPLING = SamplingConfig(max_new_tokens=8, temperature=1.0, response_prefix=True)


@pytest.fixture(scope="module")
def backend():  # noqa: ANN201
    model, tokenizer = load_model(ModelSpec(kind="tiny", seed=5))
    return make_backend("hf", model=model, tokenizer=tokenizer)


def listener_request(seed: int = 0, n: int = 1) -> PromptRequest:
    """The signal-code-v1 listener's turn (round 1), after the speaker said something."""
    env = make("signal-code-v1")
    env.reset(seed=seed)
    env.step({"speaker": "SAY: the blue circle", "listener": ""})
    observations, infos = env.observe()
    return PromptRequest(
        "listener", env.system_prompt("listener"), observations["listener"], infos["listener"], n
    )


def test_a_finite_choice_turn_lists_its_legal_texts() -> None:
    env = make("signal-code-v1")
    _, infos = env.reset(seed=1)
    assert choices_of(infos["speaker"]) == []  # it talks: an open-text turn
    assert choices_of(infos["listener"]) == []  # round 0: it does not act yet
    request = listener_request(1)
    choices = choices_of(request.info)
    assert choices == list(env.rules.legal_actions("listener"))
    assert {"1", "2", "3", "4"} <= set(choices)  # numbers and codes both
    assert any(c.startswith("colour") for c in choices)


def choose(backend, request: PromptRequest, temperature: float, seed: int) -> list:  # noqa: ANN001
    """The request's scored replies, drawn by :func:`choose_by_score`."""
    (replies,) = choose_by_score(
        backend, "listener", [request], temperature=temperature, response_prefix=True, seed=seed
    )
    return replies


def scored_by_hand(backend, request: PromptRequest) -> tuple[list[str], list[float]]:  # noqa: ANN001
    """Each legal reply (head included) and its normalised score, by action_scores itself."""
    ids, head, after = replies_after_head(
        backend.tokenizer,
        request,
        [f"ACTION: {c}" for c in choices_of(request.info)],
        response_prefix=True,
    )
    assert head == "ACTION:"
    scores = action_scores(backend.model, backend.tokenizer, [ids], [after])
    return [head + a for a in after], scores.probs[0].tolist()


def test_draws_follow_the_normalised_scores(backend) -> None:  # noqa: ANN001
    request = listener_request(2, n=2000)
    replies = choose(backend, request, 1.0, seed=7)
    texts, probs = scored_by_hand(backend, request)
    counts = [sum(r.text == t for r in replies) for t in texts]
    assert sum(counts) == len(replies) == 2000  # every reply is one of the legal texts
    for count, p in zip(counts, probs):  # each within 5 binomial standard deviations
        assert abs(count / 2000 - p) <= 5 * math.sqrt(p * (1 - p) / 2000) + 1e-9
    again = choose(backend, request, 1.0, seed=7)
    assert [r.text for r in again] == [r.text for r in replies]  # seeded


def test_the_learner_recomputes_the_recorded_logprobs(backend) -> None:  # noqa: ANN001
    for reply in choose(backend, listener_request(3, n=4), 0.7, seed=1):
        assert reply.response_ids[-1] == backend.tokenizer.eos_token_id  # the end is scored
        with torch.no_grad():
            logp, mask = sequence_logprobs(
                backend.model, [reply.prompt_ids], [reply.response_ids], temperature=0.7
            )
        assert int(mask.sum()) == len(reply.logprobs)
        assert logp[0, : len(reply.logprobs)].tolist() == pytest.approx(reply.logprobs, abs=1e-4)


def test_greedy_takes_the_best_scored_text(backend) -> None:  # noqa: ANN001
    request = listener_request(4, n=3)
    texts, probs = scored_by_hand(backend, request)
    best = max(range(len(texts)), key=probs.__getitem__)
    assert {r.text for r in choose(backend, request, 0.0, seed=0)} == {texts[best]}


def test_only_the_scored_policys_choice_turns_are_scored(backend) -> None:  # noqa: ANN001
    listener = listener_request(5, n=3)
    env = make("signal-code-v1")
    observations, infos = env.reset(seed=5)
    speaker = PromptRequest(
        "speaker", env.system_prompt("speaker"), observations["speaker"], infos["speaker"], 3
    )
    other = make_backend("hf", model=backend.model, tokenizer=backend.tokenizer)
    backends = {"speaker": backend, "listener": other}  # one generate call each
    replies, _ = generate_by_policy(
        backends, lambda a: a, [speaker, listener], SAMPLING, seed=3, scored={"listener"}
    )
    legal = {f"ACTION: {c}" for c in choices_of(listener.info)}
    assert all(r.text in legal for r in replies[1])
    assert all(r.text.startswith("SAY:") for r in replies[0])  # the speaker still writes
    plain, _ = generate_by_policy(backends, lambda a: a, [speaker, listener], SAMPLING, seed=3)
    assert [r.text for r in plain[0]] == [r.text for r in replies[0]]  # untouched
    assert [r.text for r in plain[1]] != [r.text for r in replies[1]]  # sampled, not chosen


def test_a_backend_without_its_model_is_refused(backend) -> None:  # noqa: ANN001
    class Served:  # a backend that serves a model it does not hold (vLLM given a directory)
        tokenizer = backend.tokenizer
        model = None

    with pytest.raises(ValueError, match=r"policies\.listener\.choice"):
        choose_by_score(
            Served(),
            "listener",
            [listener_request()],
            temperature=1.0,
            response_prefix=True,
            seed=0,
        )


def test_the_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"policies\.listener\.choice: 'best'"):
        load_config({"policies": {"listener": {"choice": "best"}}})
    with pytest.raises(ConfigError, match=r"policies\.listener\.choice: scored"):
        load_config({"backend": "vllm", "policies": {"listener": {"choice": "scored"}}})
    assert load_config({"policies": {"listener": {"choice": "scored"}}})


def test_a_scored_listener_is_never_malformed(backend) -> None:  # noqa: ANN001
    slots = [
        EpisodeSlot(env=make("signal-code-v1"), seed=s, group_id=s, episode_id=s) for s in range(6)
    ]
    result = run_episodes(slots, {"p": backend}, lambda a: "p", SAMPLING, seed=2, scored={"p"})
    listened = [t for t in result.turns if t.agent == "listener"]
    assert len(listened) == 6
    assert all(t.parse_ok for t in listened)
    assert all(e.success is not None for e in result.episodes)
    assert all(m["listener"] == 0 for m in result.malformed)
