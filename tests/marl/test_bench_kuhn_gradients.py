"""bench/kuhn_gradients.py: the transfer between information sets computed from gradients given
as data, and on the tiny model the first-order claim itself: a small step along one set's
log-odds gradient moves another set's log-odds by ``transfer`` times as much."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import kuhn_gradients as kg  # noqa: E402  (bench/kuhn_gradients.py: bench/ is not a package)

KEYS = [c + h for h in kg.HISTORIES for c in kg.CARDS]


def test_identical_card_gradients_transfer_fully_and_orthogonal_histories_not_at_all() -> None:
    # each history its own axis; the three cards of a history share it, with different lengths
    grads = {}
    for i, h in enumerate(kg.HISTORIES):
        for scale, c in zip((1.0, 2.0, 3.0), kg.CARDS):
            g = torch.zeros(8)
            g[i] = scale
            grads[c + h] = g
    summary = kg.transfer_summary(grads)
    cards = summary["same_history_other_card"]
    assert cards["cosine"] == pytest.approx(1.0)
    # transfer is not symmetric: J (length 1) -> K (length 3) moves K three times as far
    assert cards["pairs"]["J->K"]["transfer"] == pytest.approx(3.0)
    assert cards["pairs"]["K->J"]["transfer"] == pytest.approx(1 / 3)
    histories = summary["same_card_other_history"]
    assert histories["transfer"] == pytest.approx(0.0) and histories["cosine"] == pytest.approx(0)
    assert summary["gradient_norm"]["Qb"] == pytest.approx(2.0)


def test_a_step_along_one_sets_gradient_moves_another_by_the_transfer_on_the_tiny_model() -> None:
    from marl.runtime.exploitability import info_set_prompts

    model, tokenizer, sampling, overrides = kg.load("base", "tiny")
    model.float()
    grads = kg.log_odds_gradients(model, tokenizer, sampling, overrides)
    assert sorted(grads) == sorted(KEYS)
    assert all(bool(torch.isfinite(g).all()) and float(g.norm()) > 0 for g in grads.values())
    summary = kg.transfer_summary(grads)
    pairs = summary["same_history_other_card"]["pairs"]
    assert all(-1.0 - 1e-6 <= p["cosine"] <= 1.0 + 1e-6 for p in pairs.values())

    scored = info_set_prompts(tokenizer, kg.SCENARIO, overrides, sampling=sampling)
    sets = {s.key: s for s in scored}

    def log_odds(key: str) -> float:
        from marl.agents.action_scores import action_scores

        s = sets[key]
        scores = action_scores(model, tokenizer, [s.prompt_ids], [s.replies])
        return float(scores.logprobs[0, 1] - scores.logprobs[0, 0])

    before = {k: log_odds(k) for k in ("Jb", "Kb", "Jp")}
    weights = [p for p in model.parameters() if p.requires_grad]
    step = 1e-3 / float(grads["Jb"] @ grads["Jb"])  # raises Jb's log-odds by ~1e-3
    with torch.no_grad():
        start = 0
        for w in weights:
            w += step * grads["Jb"][start : start + w.numel()].view_as(w)
            start += w.numel()
    moved = {k: log_odds(k) - before[k] for k in before}
    assert moved["Jb"] == pytest.approx(1e-3, rel=0.05)
    assert moved["Kb"] / moved["Jb"] == pytest.approx(pairs["Jb->Kb"]["transfer"], abs=0.05)
    other = summary["same_card_other_history"]["pairs"]["Jb->Jp"]["transfer"]
    assert moved["Jp"] / moved["Jb"] == pytest.approx(other, abs=0.05)


def test_restating_the_card_puts_it_right_before_the_move_and_changes_nothing_else() -> None:
    from marl.agents.heads import ACTION_HEAD, head_ids
    from marl.runtime.exploitability import info_set_prompts

    model, tokenizer, sampling, overrides = kg.load("base", "tiny")
    sets = info_set_prompts(tokenizer, kg.SCENARIO, overrides, sampling=sampling)
    restated = kg.restate_card(sets, tokenizer)
    n = len(head_ids(tokenizer, ACTION_HEAD))
    for before, after in zip(sets, restated):
        assert after.key == before.key and after.replies == before.replies
        assert after.prompt_ids[: len(before.prompt_ids) - n] == before.prompt_ids[:-n]
        tail = tokenizer.decode(after.prompt_ids[len(before.prompt_ids) - n :])
        assert tail == f"My card is {before.key[0]}.\n{ACTION_HEAD}"
