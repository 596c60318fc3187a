"""Exact action distributions (marl.agents.action_scores) on the tiny model: each row is a
distribution, it equals the brute force (each reply scored alone with sequence_logprobs, then
normalised), a batch scores as its prompts alone, the end-of-turn token is scored, and a model
trained a few steps toward one reply puts more mass on it."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from marl.agents.action_scores import action_scores, reply_ids
from marl.agents.attention import runs_marl_attention, use_marl_attention
from marl.agents.logprobs import sequence_logprobs
from marl.agents.models import ModelSpec, load_model
from marl.agents.prompts import prompt_ids

CHATS = [
    ("You play Kuhn Poker.", "Your card is K. Reply with one line: `ACTION:` check or bet."),
    ("You name a candidate.", "Candidates: red, blue, green."),
    ("", "Say bet."),
]
ACTIONS = [
    ["ACTION: check", "ACTION: bet"],
    [" red", " blue", " green"],
    ["bet", "betting"],
]


@pytest.fixture(scope="module")
def tiny():  # noqa: ANN201
    return load_model(ModelSpec(kind="tiny", seed=3))


def prompts_of(tokenizer) -> list[list[int]]:  # noqa: ANN001
    return [prompt_ids(tokenizer, system, obs) for system, obs in CHATS]


def brute_force(model, tokenizer, prompt, texts, temperature=1.0):  # noqa: ANN001, ANN201
    """Each reply scored alone (one row per forward), then normalised by hand."""
    sums = []
    for text in texts:
        ids = reply_ids(tokenizer, text, tokenizer.eos_token_id)
        with torch.no_grad():
            logp, mask = sequence_logprobs(model, [prompt], [ids], temperature=temperature)
        assert mask.sum() == len(ids)
        sums.append(float(logp.sum()))
    total = math.fsum(math.exp(s) for s in sums)
    return sums, [math.exp(s) / total for s in sums], total


def test_rows_are_distributions_with_their_mass(tiny) -> None:  # noqa: ANN001
    model, tokenizer = tiny
    scores = action_scores(model, tokenizer, prompts_of(tokenizer), ACTIONS)
    assert scores.logprobs.shape == scores.probs.shape == (3, 3)
    assert scores.mass.shape == (3,)
    for i, legal in enumerate(ACTIONS):
        row = scores.probs[i, : len(legal)]
        assert float(row.sum()) == pytest.approx(1.0, abs=1e-12)
        assert bool((row >= 0).all())
        assert bool((scores.probs[i, len(legal) :] == 0).all())  # padding
        assert bool(torch.isinf(scores.logprobs[i, len(legal) :]).all())
        assert 0.0 < float(scores.mass[i]) <= 1.0
        assert float(scores.off_set[i]) == pytest.approx(1.0 - float(scores.mass[i]))
        assert list(scores.distribution(i)) == legal


@pytest.fixture(scope="module")
def tiny_packed():  # noqa: ANN201
    """The same weights on the platform's attention, as an HF backend runs them: scored in one
    packed row (the prompts' shared prefixes once)."""
    model, tokenizer = load_model(ModelSpec(kind="tiny", seed=3))
    use_marl_attention(model)
    assert runs_marl_attention(model)
    return model, tokenizer


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_equal_to_brute_force(tiny, tiny_packed, temperature: float, packed: bool) -> None:  # noqa: ANN001
    model, tokenizer = tiny  # the brute force runs here, one row per forward
    scorer = tiny_packed[0] if packed else model
    prompts = prompts_of(tokenizer)
    scores = action_scores(scorer, tokenizer, prompts, ACTIONS, temperature=temperature)
    for i, (prompt, legal) in enumerate(zip(prompts, ACTIONS)):
        sums, probs, total = brute_force(model, tokenizer, prompt, legal, temperature)
        assert scores.logprobs[i, : len(legal)].tolist() == pytest.approx(sums, abs=1e-4)
        assert scores.probs[i, : len(legal)].tolist() == pytest.approx(probs, abs=1e-5)
        assert float(scores.mass[i]) == pytest.approx(total, rel=1e-4)


def test_a_batch_scores_as_its_prompts_alone(tiny) -> None:  # noqa: ANN001
    model, tokenizer = tiny
    prompts = prompts_of(tokenizer)
    batch = action_scores(model, tokenizer, prompts, ACTIONS)
    for i, (prompt, legal) in enumerate(zip(prompts, ACTIONS)):
        alone = action_scores(model, tokenizer, [prompt], [legal])
        n = len(legal)
        assert alone.probs[0, :n].tolist() == pytest.approx(batch.probs[i, :n].tolist(), abs=1e-5)
        assert alone.logprobs[0, :n].tolist() == pytest.approx(
            batch.logprobs[i, :n].tolist(), abs=1e-4
        )


def test_the_end_of_turn_token_is_scored(tiny) -> None:  # noqa: ANN001
    model, tokenizer = tiny
    prompt = prompts_of(tokenizer)[2]
    assert reply_ids(tokenizer, "bet", tokenizer.eos_token_id)[-1] == tokenizer.eos_token_id
    with_end = action_scores(model, tokenizer, [prompt], [["bet", "betting"]])
    text_only = action_scores(model, tokenizer, [prompt], [["bet", "betting"]], end_id=None)
    # without the end token "bet" is a prefix of "betting", so it can only be likelier
    assert float(text_only.logprobs[0, 0]) >= float(text_only.logprobs[0, 1])
    # with it, each score is the text's plus log p(eos | prompt + text) < 0
    assert bool((with_end.logprobs[0] < text_only.logprobs[0]).all())


def test_bad_action_sets_are_refused(tiny) -> None:  # noqa: ANN001
    model, tokenizer = tiny
    prompt = prompts_of(tokenizer)[0]
    with pytest.raises(ValueError, match="1 prompts but 2 action sets"):
        action_scores(model, tokenizer, [prompt], [["a"], ["b"]])
    with pytest.raises(ValueError, match="no legal actions"):
        action_scores(model, tokenizer, [prompt], [[]])
    with pytest.raises(ValueError, match="lists an action twice"):
        action_scores(model, tokenizer, [prompt], [["bet", "bet"]])


def test_training_toward_one_reply_moves_mass_onto_it(tiny) -> None:  # noqa: ANN001
    base, tokenizer = tiny
    model = copy.deepcopy(base)
    prompt = prompts_of(tokenizer)[0]
    legal = ACTIONS[0]
    before = action_scores(model, tokenizer, [prompt], [legal])
    j = int(before.probs[0, : len(legal)].argmin())  # train toward the less likely reply
    target = reply_ids(tokenizer, legal[j], tokenizer.eos_token_id)
    weight = next(model.parameters())
    start = weight.detach().clone()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(5):
        logp, mask = sequence_logprobs(model, [prompt], [target])
        loss = -(logp * mask).sum()
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    assert not torch.equal(weight.detach(), start)  # the parameters really changed
    after = action_scores(model, tokenizer, [prompt], [legal])
    assert float(before.probs[0, j]) < 0.5
    assert float(after.probs[0, j]) > 0.5  # now the likelier of the two
    assert float(after.logprobs[0, j]) > float(before.logprobs[0, j])  # more absolute mass too
