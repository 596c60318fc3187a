"""Tests for marl.losses.policy_loss: hand-computed values, masking, clipping, GSPO, KL."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from marl.losses import Aggregation, policy_loss

AGGS: list[Aggregation] = ["seq_mean", "token_mean", "constant"]
LEVELS: list[str] = ["token", "sequence"]


def _t(rows: list[list[float]], grad: bool = False) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64, requires_grad=grad)


def _hand_loss(
    new: list[list[float]],
    old: list[list[float]],
    adv: list[float],
    mask: list[list[int]],
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    level: str = "token",
    aggregation: str = "seq_mean",
    max_tokens: float | None = None,
) -> float:
    """Plain-python reference of the clipped surrogate, loops only."""
    per_tok: list[list[float]] = []
    for i in range(len(new)):
        idx = [t for t in range(len(new[i])) if mask[i][t]]
        if level == "token":
            row = []
            for t in range(len(new[i])):
                w = math.exp(new[i][t] - old[i][t]) if mask[i][t] else 1.0
                wc = min(max(w, 1 - eps_low), 1 + eps_high)
                row.append(-min(w * adv[i], wc * adv[i]))
        else:
            if idx:
                s = math.exp(sum(new[i][t] - old[i][t] for t in idx) / len(idx))
            else:
                s = 1.0
            sc = min(max(s, 1 - eps_low), 1 + eps_high)
            row = [-min(s * adv[i], sc * adv[i])] * len(new[i])
        per_tok.append(row)
    if aggregation == "seq_mean":
        seqs = []
        for i, row in enumerate(per_tok):
            idx = [t for t in range(len(row)) if mask[i][t]]
            if idx:
                seqs.append(sum(row[t] for t in idx) / len(idx))
        return sum(seqs) / len(seqs) if seqs else 0.0
    total = sum(per_tok[i][t] for i in range(len(new)) for t in range(len(new[i])) if mask[i][t])
    if aggregation == "token_mean":
        n = sum(sum(r) for r in mask)
        return total / n if n else 0.0
    assert max_tokens is not None
    return total / (len(new) * max_tokens)


# A small batch: 3 responses padded to 4 tokens, one with clipped tokens, one fully masked.
NEW = [
    [math.log(0.7), math.log(0.3), math.log(0.5), 0.0],
    [math.log(0.4), math.log(0.9), -1.0, -2.0],
    [-0.5, -0.5, -0.5, -0.5],
    [-0.3, -0.2, -0.7, -0.1],
]
OLD = [
    [math.log(0.5), math.log(0.5), math.log(0.5), -9.0],
    [math.log(0.5), math.log(0.6), -1.2, -2.0],
    [-0.1, -0.9, -0.5, -0.5],
    [-0.3, -0.2, -0.7, -0.1],
]
ADV = [1.0, -0.5, 2.0, 1.5]
MASK = [[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0], [0, 1, 1, 0]]


def test_literal_token_level_value() -> None:
    # ratios 1.4 (clipped to 1.2 since A > 0) and 0.6 (unclipped, min picks 0.6):
    # loss = -(1.2 + 0.6) / 2 = -0.9
    new = _t([[math.log(0.7), math.log(0.3)]])
    old = _t([[math.log(0.5), math.log(0.5)]])
    loss, m = policy_loss(new, old, torch.tensor([1.0]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-0.9)
    assert m["clip_frac"] == pytest.approx(0.5)
    assert m["ratio_mean"] == pytest.approx(1.0)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("aggregation", AGGS)
def test_matches_hand_computation(level: str, aggregation: Aggregation) -> None:
    loss, m = policy_loss(
        _t(NEW, grad=True),
        _t(OLD),
        torch.tensor(ADV, dtype=torch.float64),
        torch.tensor(MASK),
        level=level,
        aggregation=aggregation,
        max_tokens_norm=8,
    )
    expected = _hand_loss(NEW, OLD, ADV, MASK, level=level, aggregation=aggregation, max_tokens=8)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert m["pg_loss"] == m["loss"] == pytest.approx(expected, abs=1e-12)


def test_clip_eps_high_is_asymmetric() -> None:
    # ratio 1.25: clipped with eps 0.2, not with clip-higher 0.28 (DAPO)
    new = _t([[math.log(1.25)]], grad=True)
    old = _t([[0.0]])
    adv = torch.tensor([1.0])
    loss, m = policy_loss(new, old, adv, torch.ones(1, 1), clip_eps=0.2)
    assert loss.item() == pytest.approx(-1.2) and m["clip_frac"] == 1.0
    loss, m = policy_loss(new, old, adv, torch.ones(1, 1), clip_eps=0.2, clip_eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and m["clip_frac"] == 0.0
    # the low side still uses clip_eps: ratio 0.75 with A < 0 is clipped at 0.8
    new = _t([[math.log(0.75)]])
    loss, m = policy_loss(new, old, -adv, torch.ones(1, 1), clip_eps=0.2, clip_eps_high=0.28)
    assert loss.item() == pytest.approx(0.8) and m["clip_frac"] == 1.0


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("aggregation", AGGS)
def test_gradient_only_flows_through_masked_tokens(level: str, aggregation: Aggregation) -> None:
    torch.manual_seed(0)
    new = (torch.randn(4, 6, dtype=torch.float64) * 0.05 - 1.0).requires_grad_()  # (B, T)
    old = new.detach() + torch.randn(4, 6, dtype=torch.float64) * 0.01  # (B, T)
    mask = torch.tensor(
        [[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0]]
    )
    old[mask == 0] = -float("inf")  # garbage at padding must not leak
    ref = old.clone()
    ref[mask == 0] = float("nan")
    loss, m = policy_loss(
        new,
        old,
        torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64),
        mask,
        level=level,
        aggregation=aggregation,
        max_tokens_norm=6,
        ref_logp=ref,
        beta=0.1,
    )
    loss.backward()
    assert torch.isfinite(loss)
    assert all(math.isfinite(v) for v in m.values())
    grad = new.grad
    assert grad is not None and torch.isfinite(grad).all()
    assert torch.equal(grad[mask == 0], torch.zeros_like(grad[mask == 0]))
    assert (grad[mask == 1] != 0).all()  # nothing is clipped at these small ratios


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("aggregation", AGGS)
def test_fully_masked_row_contributes_nothing(level: str, aggregation: Aggregation) -> None:
    new, old = _t(NEW), _t(OLD)
    adv = torch.tensor(ADV, dtype=torch.float64)
    mask = torch.tensor(MASK)
    keep = [0, 1, 3]  # row 2 is fully masked
    full, _ = policy_loss(
        new, old, adv, mask, level=level, aggregation=aggregation, max_tokens_norm=8
    )
    part, _ = policy_loss(
        new[keep],
        old[keep],
        adv[keep],
        mask[keep],
        level=level,
        aggregation=aggregation,
        max_tokens_norm=8,
    )
    if aggregation == "constant":  # the denominator counts B rows by definition
        assert full.item() * 4 == pytest.approx(part.item() * 3)
    else:
        assert full.item() == pytest.approx(part.item())


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("aggregation", AGGS)
def test_all_masked_batch_gives_zero_not_nan(level: str, aggregation: Aggregation) -> None:
    new = torch.full((2, 3), -1.0, requires_grad=True)  # (B, T)
    loss, m = policy_loss(
        new,
        torch.zeros(2, 3),
        torch.ones(2),
        torch.zeros(2, 3),
        level=level,
        aggregation=aggregation,
        max_tokens_norm=3,
    )
    loss.backward()
    assert loss.item() == 0.0
    assert all(v == 0.0 for v in m.values())
    assert new.grad is not None and torch.equal(new.grad, torch.zeros(2, 3))


def test_clipped_token_gets_zero_gradient() -> None:
    # token 0: ratio 1.5 > 1.2 with A > 0 -> clipped; token 1: ratio 1.05 -> gradient A * w / 2
    new = _t([[math.log(1.5), math.log(1.05)]], grad=True)
    old = _t([[0.0, 0.0]])
    loss, m = policy_loss(new, old, torch.tensor([2.0]), torch.ones(1, 2))
    loss.backward()
    assert new.grad is not None
    assert new.grad[0, 0].item() == 0.0
    assert new.grad[0, 1].item() == pytest.approx(-2.0 * 1.05 / 2)
    assert m["clip_frac"] == pytest.approx(0.5)


def test_pessimistic_side_is_not_clipped() -> None:
    # ratio 1.5 with A < 0: min(w A, clip(w) A) = w A, so the gradient stays (PPO's pessimism)
    new = _t([[math.log(1.5)]], grad=True)
    loss, m = policy_loss(new, _t([[0.0]]), torch.tensor([-1.0]), torch.ones(1, 1))
    loss.backward()
    assert loss.item() == pytest.approx(1.5)
    assert new.grad is not None and new.grad.item() == pytest.approx(1.5)
    assert m["clip_frac"] == 0.0
    # ratio 0.5 with A < 0 is clipped at 0.8 and gets no gradient
    new = _t([[math.log(0.5)]], grad=True)
    loss, m = policy_loss(new, _t([[0.0]]), torch.tensor([-1.0]), torch.ones(1, 1))
    loss.backward()
    assert loss.item() == pytest.approx(0.8)
    assert new.grad is not None and new.grad.item() == 0.0
    assert m["clip_frac"] == 1.0


def test_gspo_hand_value_and_gradient() -> None:
    # row 0: 2 tokens, log ratios 0.1 and -0.06 -> s = exp(0.02); row 1: 3 tokens, s = exp(-0.01)
    new = _t([[0.1, -0.06, 0.0], [-0.01, -0.02, 0.0]], grad=True)
    old = _t([[0.0, 0.0, 0.0], [0.0, -0.02, 0.02]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, m = policy_loss(new, old, adv, mask, level="sequence", clip_eps=0.05)
    s0, s1 = math.exp(0.02), math.exp(-0.01)
    assert loss.item() == pytest.approx(-(s0 * 1.0 + s1 * -2.0) / 2)
    assert m["ratio_mean"] == pytest.approx((s0 + s1) / 2)
    loss.backward()
    # d(-A s_i / B) / d logp_t = -A s_i / (|y_i| B) for every masked token of response i
    expected = [[-s0 / 4, -s0 / 4, 0.0], [2 * s1 / 6, 2 * s1 / 6, 2 * s1 / 6]]
    assert new.grad is not None
    assert new.grad.tolist() == [pytest.approx(r) for r in expected]


def test_gspo_clips_whole_sequence_where_token_level_clips_one_token() -> None:
    # log ratios +0.3 and -0.28: the first token is outside [0.8, 1.2], the sequence is not
    new = _t([[0.3, -0.28]], grad=True)
    old = _t([[0.0, 0.0]])
    adv = torch.tensor([1.0])
    loss_tok, m_tok = policy_loss(new, old, adv, torch.ones(1, 2), level="token")
    (g_tok,) = torch.autograd.grad(loss_tok, new)
    loss_seq, m_seq = policy_loss(new, old, adv, torch.ones(1, 2), level="sequence")
    (g_seq,) = torch.autograd.grad(loss_seq, new)
    assert g_tok[0, 0].item() == 0.0 and g_tok[0, 1].item() != 0.0
    assert (g_seq != 0).all()
    assert m_tok["clip_frac"] == 0.5 and m_seq["clip_frac"] == 0.0
    # both tokens at +0.3: now the sequence ratio exp(0.3) > 1.2 and every token is cut off
    new = _t([[0.3, 0.3]], grad=True)
    loss_seq, m_seq = policy_loss(new, old, adv, torch.ones(1, 2), level="sequence")
    (g_seq,) = torch.autograd.grad(loss_seq, new)
    assert torch.equal(g_seq, torch.zeros_like(g_seq))
    assert m_seq["clip_frac"] == 1.0


@pytest.mark.parametrize("aggregation", AGGS)
def test_gspo_equals_token_level_for_one_token_sequences(aggregation: Aggregation) -> None:
    torch.manual_seed(1)
    base = torch.randn(5, 4, dtype=torch.float64) * 0.3 - 1.0  # (B, T)
    old = base + torch.randn(5, 4, dtype=torch.float64) * 0.3  # (B, T)
    mask = torch.zeros(5, 4)
    mask[torch.arange(5), torch.tensor([0, 3, 1, 2, 0])] = 1  # one token per response
    adv = torch.randn(5, dtype=torch.float64)
    out = {}
    for level in LEVELS:
        new = base.clone().requires_grad_()
        loss, m = policy_loss(
            new,
            old,
            adv,
            mask,
            level=level,
            aggregation=aggregation,
            max_tokens_norm=4,
        )
        loss.backward()
        out[level] = (loss.item(), new.grad, m)
    assert out["token"][0] == pytest.approx(out["sequence"][0], abs=1e-12)
    assert torch.allclose(out["token"][1], out["sequence"][1], atol=1e-12)
    for key in ("clip_frac", "ratio_mean", "approx_kl_old", "entropy_proxy"):
        assert out["token"][2][key] == pytest.approx(out["sequence"][2][key], abs=1e-12)


def test_dr_grpo_constant_normalisation() -> None:
    # sum of per-token losses / (B * max_tokens_norm), whatever the lengths; ratios all 1
    new = _t([[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, _ = policy_loss(new, new, adv, mask, aggregation="constant", max_tokens_norm=10)
    assert loss.item() == pytest.approx(-(4 + 1) / (2 * 10))
    # GRPO's seq_mean gives each response weight 1 regardless of its length ...
    loss, _ = policy_loss(new, new, adv, mask, aggregation="seq_mean")
    assert loss.item() == pytest.approx(-(4 / 4 + 1 / 1) / 2)
    # ... and DAPO's token_mean divides by the 5 tokens present
    loss, _ = policy_loss(new, new, adv, mask, aggregation="token_mean")
    assert loss.item() == pytest.approx(-5 / 5)


def test_dr_grpo_per_token_gradient_does_not_depend_on_length() -> None:
    new = _t([[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]], grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, _ = policy_loss(new, new.detach(), adv, mask, aggregation="constant", max_tokens_norm=10)
    loss.backward()
    assert new.grad is not None
    assert new.grad[mask == 1].tolist() == pytest.approx([-1 / 20] * 5)


def test_constant_aggregation_needs_max_tokens_norm() -> None:
    with pytest.raises(ValueError, match="max_tokens_norm"):
        policy_loss(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.ones(1),
            torch.ones(1, 2),
            aggregation="constant",
        )


def test_kl_is_zero_when_reference_equals_policy() -> None:
    new = _t(NEW, grad=True)
    adv = torch.tensor(ADV, dtype=torch.float64)
    loss_kl, m_kl = policy_loss(new, _t(OLD), adv, torch.tensor(MASK), ref_logp=_t(NEW), beta=0.5)
    (g_kl,) = torch.autograd.grad(loss_kl, new)
    loss, m = policy_loss(new, _t(OLD), adv, torch.tensor(MASK))
    (g,) = torch.autograd.grad(loss, new)
    assert m_kl["kl"] == 0.0 and m["kl"] == 0.0
    assert loss_kl.item() == loss.item()
    assert torch.equal(g_kl, g)


def test_k3_kl_hand_value_and_weighting() -> None:
    # ref - new = 0.5 and -0.5 on two tokens of one response; ratios to old are 1
    new = _t([[-1.0, -2.0]], grad=True)
    ref = _t([[-0.5, -2.5]])
    adv = torch.tensor([0.0], dtype=torch.float64)
    k3 = [math.exp(d) - d - 1 for d in (0.5, -0.5)]
    loss, m = policy_loss(new, new.detach(), adv, torch.ones(1, 2), ref_logp=ref, beta=0.1)
    assert m["kl"] == pytest.approx(sum(k3) / 2)
    assert loss.item() == pytest.approx(0.1 * sum(k3) / 2)
    assert m["pg_loss"] == 0.0
    loss.backward()
    # d k3 / d new = 1 - exp(ref - new); seq_mean over 2 tokens; weight beta
    assert new.grad is not None
    assert new.grad.tolist()[0] == pytest.approx([0.1 * (1 - math.exp(d)) / 2 for d in (0.5, -0.5)])
    # beta == 0 with a reference: the KL is reported but not added
    loss0, m0 = policy_loss(new, new.detach(), adv, torch.ones(1, 2), ref_logp=ref)
    assert loss0.item() == 0.0 and m0["kl"] == pytest.approx(sum(k3) / 2)


def test_beta_without_reference_is_refused() -> None:
    with pytest.raises(ValueError, match="ref_logp is None"):
        policy_loss(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), beta=0.1)


def test_metrics_on_hand_values() -> None:
    new = _t([[math.log(0.5), math.log(0.25), 0.0]])
    old = _t([[math.log(0.5), math.log(0.5), 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    _, m = policy_loss(new, old, torch.tensor([1.0]), mask)
    assert set(m) == {
        "loss",
        "pg_loss",
        "kl",
        "clip_frac",
        "ratio_mean",
        "approx_kl_old",
        "entropy_proxy",
        "n_tokens",
    }
    assert all(isinstance(v, float) for v in m.values())
    assert m["entropy_proxy"] == pytest.approx(-(math.log(0.5) + math.log(0.25)) / 2)
    assert m["ratio_mean"] == pytest.approx((1.0 + 0.5) / 2)
    lr = math.log(0.5)  # second token's log ratio
    assert m["approx_kl_old"] == pytest.approx((0.0 + (math.exp(lr) - 1 - lr)) / 2)
    assert m["clip_frac"] == 0.0  # ratio 0.5 < 0.8 but A > 0: the min keeps the gradient
    assert m["n_tokens"] == 2.0
    _, m = policy_loss(old, old, torch.tensor([1.0]), mask)
    assert m["approx_kl_old"] == 0.0 and m["ratio_mean"] == 1.0


def test_bad_arguments_name_the_argument() -> None:
    z, o = torch.zeros(2, 3), torch.ones(2)
    with pytest.raises(ValueError, match="logp_old must have the shape"):
        policy_loss(z, torch.zeros(2, 4), o, z)
    with pytest.raises(ValueError, match="advantages must be shaped"):
        policy_loss(z, z, torch.ones(2, 1), z)
    with pytest.raises(ValueError, match="level must be one of"):
        policy_loss(z, z, o, z, level="tokens")
    with pytest.raises(ValueError, match="aggregation must be one of"):
        policy_loss(z, z, o, z, aggregation="mean")
    with pytest.raises(ValueError, match="clip_eps"):
        policy_loss(z, z, o, z, clip_eps=-0.1)
    with pytest.raises(ValueError, match="logp_new must be shaped"):
        policy_loss(torch.zeros(3), torch.zeros(3), o, torch.zeros(3))


@st.composite
def _batch(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    b = draw(st.integers(1, 4))
    t = draw(st.integers(1, 6))
    lp = st.floats(-20.0, 0.0, allow_nan=False)

    def mat(elems: st.SearchStrategy) -> torch.Tensor:
        rows = draw(st.lists(st.lists(elems, min_size=t, max_size=t), min_size=b, max_size=b))
        return torch.tensor(rows, dtype=torch.float64)

    new, old, ref = mat(lp), mat(lp), mat(lp)  # (B, T) each
    mask = mat(st.integers(0, 1))  # (B, T)
    adv = torch.tensor(
        draw(st.lists(st.floats(-5, 5), min_size=b, max_size=b)), dtype=torch.float64
    )  # (B,)
    return new, old, ref, mask, adv


@settings(max_examples=120, deadline=None)
@given(
    batch=_batch(),
    level=st.sampled_from(LEVELS),
    aggregation=st.sampled_from(AGGS),
    beta=st.sampled_from([0.0, 0.04]),
)
def test_property_finite_outputs_and_masked_gradients(
    batch: tuple[torch.Tensor, ...], level: str, aggregation: Aggregation, beta: float
) -> None:
    new, old, ref, mask, adv = batch
    new = new.clone().requires_grad_()
    loss, m = policy_loss(
        new,
        old,
        adv,
        mask,
        level=level,
        aggregation=aggregation,
        ref_logp=ref,
        beta=beta,
        max_tokens_norm=new.shape[1],
        clip_eps_high=0.28,
    )
    loss.backward()
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert all(math.isfinite(v) for v in m.values())
    assert 0.0 <= m["clip_frac"] <= 1.0
    assert m["kl"] >= 0.0 and m["approx_kl_old"] >= 0.0
    assert new.grad is not None and torch.isfinite(new.grad).all()
    assert (new.grad[mask == 0] == 0).all()


def test_the_kl_estimates_are_never_below_zero_from_rounding() -> None:
    """k3 (``exp(x) - 1 - x``) is >= 0, but in float32 ``exp(3e-8)`` is exactly 1, so for such
    small log ratios the raw expression is -3e-8 (the property test above once drew one)."""
    old = torch.full((2, 4), -1e-3)
    new = (old + 3e-8).requires_grad_()
    x = (new - old).detach()
    assert bool(((torch.exp(x) - 1.0 - x) < 0).all())  # the rounding this test is about
    mask = torch.ones(2, 4)
    _, m = policy_loss(new, old, torch.ones(2), mask, ref_logp=old - 3e-8, beta=0.1)
    assert m["approx_kl_old"] >= 0.0
    assert m["kl"] >= 0.0
