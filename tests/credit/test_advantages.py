"""Tests for marl.credit.advantages: hand-computed values, the registry, flat-list grouping."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import marl.credit.advantages as adv_mod
from marl.credit.advantages import (
    compute_advantages,
    get_advantage,
    group_advantages,
    list_advantages,
    register_advantage,
)

EPS = 1e-6


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _sample_std(xs: list[float]) -> float:
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _hand(xs: list[float], method: str) -> list[float]:
    """Plain-python reference for one column."""
    if len(set(xs)) == 1:
        return [0.0] * len(xs)
    m = _mean(xs)
    if method == "grpo":
        s = _sample_std(xs)
        return [(x - m) / (s + EPS) for x in xs]
    if method == "dr_grpo":
        return [x - m for x in xs]
    if method == "rloo":
        return [x - (sum(xs) - x) / (len(xs) - 1) for x in xs]
    raise AssertionError(method)


def test_grpo_literal_values() -> None:
    # mean 3, sample std sqrt((4 + 1 + 0 + 9) / 3) = sqrt(14/3) = 2.1602...
    out = compute_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64), "grpo")
    s = math.sqrt(14 / 3)
    expected = [-2 / (s + EPS), -1 / (s + EPS), 0.0, 3 / (s + EPS)]
    assert out.tolist() == pytest.approx(expected, abs=1e-12)
    assert out[0].item() == pytest.approx(-0.92582, abs=1e-5)


def test_dr_grpo_literal_values() -> None:
    out = compute_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0]), "dr_grpo")
    assert out.tolist() == pytest.approx([-2.0, -1.0, 0.0, 3.0])


def test_rloo_literal_values() -> None:
    # baseline of the first: (2 + 3 + 6) / 3 = 11/3 -> 1 - 11/3 = -8/3
    out = compute_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64), "rloo")
    assert out.tolist() == pytest.approx([-8 / 3, -4 / 3, 0.0, 4.0], abs=1e-12)


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo"])
def test_per_agent_columns_match_hand_computation(method: str) -> None:
    cols = [[0.0, 1.0, 1.0, 4.0, -2.0], [100.0, 300.0, 200.0, 200.0, 250.0], [7.0] * 5]
    returns = torch.tensor(cols, dtype=torch.float64).T  # (G=5, N=3)
    out = compute_advantages(returns, method)
    assert out.shape == (5, 3)
    for j, col in enumerate(cols):
        assert out[:, j].tolist() == pytest.approx(_hand(col, method), abs=1e-12)


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo"])
def test_zero_variance_group_gives_exact_zeros(method: str) -> None:
    # 0.1 * 3 / 3 != 0.1 in floating point, so a naive r - mean would not be exactly 0
    returns = torch.tensor([[0.1, -5.0], [0.1, -5.0], [0.1, -5.0]])
    out = compute_advantages(returns, method)
    assert torch.equal(out, torch.zeros(3, 2))


@pytest.mark.parametrize("method", ["grpo", "dr_grpo", "rloo"])
def test_group_of_one_gives_zero_not_nan(method: str) -> None:
    assert compute_advantages(torch.tensor([3.5]), method).tolist() == [0.0]
    assert compute_advantages(torch.tensor([[3.5, -1.0]]), method).tolist() == [[0.0, 0.0]]


def test_grpo_eps_keyword_reaches_the_estimator() -> None:
    out = compute_advantages(torch.tensor([0.0, 2.0], dtype=torch.float64), "grpo", eps=1.0)
    s = math.sqrt(2.0)  # sample std of [0, 2]
    assert out.tolist() == pytest.approx([-1 / (s + 1), 1 / (s + 1)])


def test_integer_returns_are_accepted() -> None:
    out = compute_advantages(torch.tensor([0, 1]), "dr_grpo")
    assert out.dtype == torch.get_default_dtype()
    assert out.tolist() == [-0.5, 0.5]


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="at least one episode"):
        compute_advantages(torch.zeros(0), "grpo")
    with pytest.raises(ValueError, match=r"\(G,\) or \(G, N\)"):
        compute_advantages(torch.zeros(2, 2, 2), "grpo")
    with pytest.raises(ValueError, match="finite"):
        compute_advantages(torch.tensor([1.0, float("nan")]), "grpo")


def test_registry_lists_builtins_and_refuses_duplicates() -> None:
    assert {"grpo", "dr_grpo", "rloo"} <= set(list_advantages())
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_advantage("grpo")(lambda r: r)


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(KeyError) as info:
        get_advantage("gpro")
    msg = str(info.value)
    assert "'gpro'" in msg and "grpo" in msg and "dr_grpo" in msg and "rloo" in msg
    with pytest.raises(KeyError, match="gpro"):
        compute_advantages(torch.ones(2), "gpro")
    with pytest.raises(KeyError, match="gpro"):
        group_advantages([], [], [], "gpro")


def test_registered_estimator_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adv_mod, "ADVANTAGES", adv_mod.ADVANTAGES.copy())

    @register_advantage("test_rank")
    def rank(returns: torch.Tensor) -> torch.Tensor:
        return returns.argsort(dim=0).argsort(dim=0).to(returns.dtype)  # (G, N)

    assert "test_rank" in list_advantages()
    out = compute_advantages(torch.tensor([[3.0, 0.0], [1.0, 2.0]]), "test_rank")
    assert out.tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_estimator_returning_wrong_shape_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adv_mod, "ADVANTAGES", adv_mod.ADVANTAGES.copy())
    register_advantage("test_bad")(lambda r: r.mean(dim=0))
    with pytest.raises(ValueError, match="'test_bad' returned shape"):
        compute_advantages(torch.ones(3, 2), "test_bad")


def test_group_advantages_normalises_per_group_and_agent() -> None:
    # two groups; group 0 has 3 episodes with agents a, b; group 1 has 2 episodes, agent a only
    returns = [1.0, 10.0, 2.0, 30.0, 6.0, 20.0, 5.0, 5.0]
    group_ids = [0, 0, 0, 0, 0, 0, 1, 1]
    agents = ["a", "b", "a", "b", "a", "b", "a", "a"]
    out = group_advantages(returns, group_ids, agents, "dr_grpo")
    # group 0 / a: [1, 2, 6], mean 3; group 0 / b: [10, 30, 20], mean 20; group 1 / a: constant
    assert out == pytest.approx([-2.0, -10.0, -1.0, 10.0, 3.0, 0.0, 0.0, 0.0])

    out = group_advantages(returns, group_ids, agents, "grpo")
    a = _hand([1.0, 2.0, 6.0], "grpo")
    b = _hand([10.0, 30.0, 20.0], "grpo")
    assert out == pytest.approx([a[0], b[0], a[1], b[1], a[2], b[2], 0.0, 0.0])


def test_group_advantages_pooling_agents_with_one_name() -> None:
    out = group_advantages([1.0, 3.0, 5.0, 7.0], [0] * 4, ["team"] * 4, "dr_grpo")
    assert out == pytest.approx([-3.0, -1.0, 1.0, 3.0])


def test_group_advantages_on_turn_records_counts_each_episode_once() -> None:
    # episode 0 has 3 rounds for agent a, episode 1 has 1 round: without episode_ids the
    # repeated rows would pull the mean towards episode 0.
    returns = [1.0, 1.0, 1.0, 3.0]
    out = group_advantages(returns, [0] * 4, ["a"] * 4, "dr_grpo", episode_ids=[0, 0, 0, 1])
    assert out == pytest.approx([-1.0, -1.0, -1.0, 1.0])
    naive = group_advantages(returns, [0] * 4, ["a"] * 4, "dr_grpo")
    assert naive == pytest.approx([-0.5, -0.5, -0.5, 1.5])


def test_group_advantages_errors_name_the_culprit() -> None:
    with pytest.raises(ValueError, match="same length"):
        group_advantages([1.0, 2.0], [0], ["a", "a"])
    with pytest.raises(ValueError, match="episode_ids"):
        group_advantages([1.0, 2.0], [0, 0], ["a", "a"], episode_ids=[0])
    with pytest.raises(ValueError, match="agent 'bob', group 0, episode 4: .*disagree"):
        group_advantages([1.0, 2.0], [0, 0], ["bob", "bob"], episode_ids=[4, 4])
    with pytest.raises(ValueError, match="agent 'bob' in group 3 is not finite"):
        group_advantages([1.0, float("inf")], [3, 3], ["bob", "bob"])


def test_group_advantages_empty_input() -> None:
    assert group_advantages([], [], [], "grpo") == []


_returns_2d = st.integers(1, 8).flatmap(
    lambda g: st.integers(1, 4).flatmap(
        lambda n: st.lists(
            st.lists(
                st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False),
                min_size=n,
                max_size=n,
            ),
            min_size=g,
            max_size=g,
        )
    )
)


@settings(max_examples=150, deadline=None)
@given(rows=_returns_2d, method=st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_property_finite_same_shape_zero_mean_per_column(
    rows: list[list[float]], method: str
) -> None:
    returns = torch.tensor(rows, dtype=torch.float64)  # (G, N)
    out = compute_advantages(returns, method)
    assert out.shape == returns.shape
    assert torch.isfinite(out).all()
    scale = 1.0 + float(out.abs().max())
    col_mean = out.mean(dim=0)  # (N,)
    assert torch.allclose(col_mean, torch.zeros_like(col_mean), atol=1e-9 * scale)
    # each column depends on that column only
    for j in range(returns.shape[1]):
        alone = compute_advantages(returns[:, j], method)  # (G,)
        # same formula, but a 2-D and a 1-D reduction round differently: with a near-zero
        # std (rows [0, 1], [0, 0.99999]) the 1/(std + eps) factor amplifies that to ~1e-11
        assert torch.allclose(alone, out[:, j], rtol=1e-9, atol=1e-9 * scale)


@settings(max_examples=100, deadline=None)
@given(
    xs=st.lists(st.floats(-100, 100, allow_nan=False), min_size=2, max_size=8),
    shift=st.floats(-100, 100),
    scale=st.floats(0.1, 10),
)
def test_property_grpo_is_shift_and_scale_invariant(
    xs: list[float], shift: float, scale: float
) -> None:
    r = torch.tensor(xs, dtype=torch.float64)  # (G,)
    a = compute_advantages(r, "grpo", eps=0.0)
    b = compute_advantages(r * scale + shift, "grpo", eps=0.0)
    if float(r.std()) > 1e-6:  # far from the zero-variance special case
        assert torch.allclose(a, b, atol=1e-6)
