"""marl.analysis.stats against hand-derived values, published t tables and exact enumeration."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from marl.analysis.stats import mcnemar, mean_ci, mean_interval, seed_clustered, t_quantile, wilson

Z95 = 1.959963984540054  # the two-sided 95% normal quantile


def wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    """Wilson (1927) solved directly: the roots in p of (p_hat - p)^2 = z^2 p (1 - p) / n,
    i.e. (1 + z^2/n) p^2 - (2 p_hat + z^2/n) p + p_hat^2 = 0."""
    p_hat, q = k / n, Z95 * Z95 / n
    a, b, c = 1 + q, -(2 * p_hat + q), p_hat * p_hat
    root = math.sqrt(b * b - 4 * a * c)
    return (-b - root) / (2 * a), (-b + root) / (2 * a)


def test_wilson_at_the_edges_and_the_middle() -> None:
    # 0/10: one root is 0, the other z^2/n / (1 + z^2/n) = z^2 / (n + z^2)
    low, high = wilson(0, 10)
    assert low == 0.0
    assert high == pytest.approx(Z95**2 / (10 + Z95**2), rel=1e-12)
    assert high == pytest.approx(0.2775, abs=1e-4)
    # 10/10 mirrors 0/10
    low, high = wilson(10, 10)
    assert high == 1.0
    assert low == pytest.approx(10 / (10 + Z95**2), rel=1e-12)
    # 5/10: symmetric about 1/2, half-width z sqrt(1/40 + z^2/400) / (1 + z^2/10)
    low, high = wilson(5, 10)
    half = Z95 * math.sqrt(0.25 / 10 + Z95**2 / 400) / (1 + Z95**2 / 10)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), rel=1e-12)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    for k, n in ((0, 10), (10, 10), (5, 10), (3, 7), (1, 100)):
        assert wilson(k, n) == pytest.approx(wilson_by_hand(k, n), abs=1e-12)


def test_wilson_confidence_and_bad_input() -> None:
    wide, narrow = wilson(5, 10, 0.99), wilson(5, 10, 0.80)
    assert wide[0] < narrow[0] and wide[1] > narrow[1]
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes <= n"):
        wilson(11, 10)
    with pytest.raises(ValueError, match="confidence"):
        wilson(1, 10, 1.0)


# two-sided 95% quantiles from standard t tables (e.g. Abramowitz & Stegun, table 26.10)
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 8: 2.306, 9: 2.262, 10: 2.228, 15: 2.131, 30: 2.042}
T_TABLE.update({60: 2.000, 120: 1.980})


@pytest.mark.parametrize(("df", "expected"), sorted(T_TABLE.items()))
def test_t_quantile_matches_the_table(df: int, expected: float) -> None:
    assert t_quantile(df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_closed_forms_and_limits() -> None:
    # df 1 is the Cauchy distribution: t = tan(pi * confidence / 2)
    for confidence in (0.5, 0.9, 0.95, 0.99):
        assert t_quantile(1, confidence) == pytest.approx(
            math.tan(math.pi * confidence / 2), rel=1e-12
        )
    # df 2 has F(t) = 1/2 + t / (2 sqrt(2 + t^2)), so t = c sqrt(2 / (1 - c^2))
    for confidence in (0.5, 0.9, 0.95, 0.99):
        assert t_quantile(2, confidence) == pytest.approx(
            confidence * math.sqrt(2 / (1 - confidence**2)), rel=1e-12
        )
    assert t_quantile(99) == pytest.approx(1.984217, abs=1e-6)
    assert t_quantile(10**6) == pytest.approx(Z95, abs=1e-5)
    assert t_quantile(math.inf) == pytest.approx(Z95, rel=1e-15)
    # the beta route and the large-df expansion agree where they meet
    assert t_quantile(99_999) == pytest.approx(t_quantile(100_000), abs=1e-9)
    with pytest.raises(ValueError, match="positive"):
        t_quantile(0)


def test_mean_interval() -> None:
    mean, low, high = mean_interval([1.0, 2.0, 3.0])
    # sample sd 1, n 3, df 2: half-width t_2 / sqrt(3)
    assert mean == 2.0
    assert high - mean == pytest.approx(4.302652729749464 / math.sqrt(3), rel=1e-12)
    assert mean - low == pytest.approx(high - mean, rel=1e-12)
    one = mean_interval([5.0])
    assert one[0] == 5.0 and math.isnan(one[1]) and math.isnan(one[2])
    with pytest.raises(ValueError, match="no values"):
        mean_interval([])


def test_mean_ci_is_the_mean_and_half_width_of_the_t_interval() -> None:
    mean, low, high = mean_interval([0.5, 2.0, 4.0, 4.5])
    assert mean_ci([0.5, 2.0, 4.0, 4.5]) == (mean, high - mean)
    one = mean_ci([5.0])
    assert one[0] == 5.0 and math.isnan(one[1])  # one value: no spread to estimate
    assert all(math.isnan(v) for v in mean_ci([]))


def test_seed_clustered_is_the_t_interval_over_seed_means() -> None:
    per_seed = [[1, 0, 1, 1], [0, 0, 1, 0, 0, 0], [1, 1, 1]]
    means = [0.75, 1 / 6, 1.0]
    assert seed_clustered(per_seed) == pytest.approx(mean_interval(means), rel=1e-12)
    # pooling the 13 episodes as if independent gives a narrower, over-confident interval
    pooled = mean_interval([v for seed in per_seed for v in seed])
    clustered = seed_clustered(per_seed)
    assert pooled[2] - pooled[1] < clustered[2] - clustered[1]
    with pytest.raises(ValueError, match="seed 1 has no values"):
        seed_clustered([[1.0], []])
    with pytest.raises(ValueError, match="no seeds"):
        seed_clustered([])


def exact_mcnemar_by_enumeration(b: int, c: int) -> float:
    """Two-sided exact p-value: the probability, under Binomial(b + c, 1/2), of every split
    at least as unbalanced as (b, c), summed over the enumerated outcomes."""
    n = b + c
    probability = [Fraction(math.comb(n, k), 2**n) for k in range(n + 1)]
    extreme = abs(b - n / 2)
    return float(sum(p for k, p in enumerate(probability) if abs(k - n / 2) >= extreme))


def pairs(b: int, c: int, agree: int = 3) -> tuple[list[bool], list[bool]]:
    before = [True] * b + [False] * c + [True] * agree + [False] * agree
    after = [False] * b + [True] * c + [True] * agree + [False] * agree
    return before, after


def test_mcnemar_small_cases() -> None:
    # b = 0, c = 5: P = 2 * (1/2)^5 = 1/16
    assert mcnemar(*pairs(0, 5)) == (0, 5, 0.0625)
    # b = 1, c = 4: P(X <= 1) = (1 + 5) / 32, doubled = 0.375
    assert mcnemar(*pairs(1, 4)) == (1, 4, 0.375)
    # balanced: the doubled tail exceeds 1, so p = 1
    assert mcnemar(*pairs(3, 3)) == (3, 3, 1.0)
    assert mcnemar(*pairs(0, 0)) == (0, 0, 1.0)
    for b in range(8):
        for c in range(8):
            got = mcnemar(*pairs(b, c))
            assert got[:2] == (b, c)
            if b + c:
                assert got[2] == pytest.approx(exact_mcnemar_by_enumeration(b, c), rel=1e-12)
    with pytest.raises(ValueError, match="3 outcomes before but 2 after"):
        mcnemar([True, False, True], [True, False])


@given(n=st.integers(1, 2000), data=st.data())
def test_wilson_contains_the_rate_and_stays_in_the_unit_interval(n: int, data) -> None:
    k = data.draw(st.integers(0, n))
    low, high = wilson(k, n)
    assert 0.0 <= low <= k / n <= high <= 1.0
    # the same rate over twice the trials gives a narrower interval
    low2, high2 = wilson(2 * k, 2 * n)
    assert high2 - low2 < high - low


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), min_size=2, max_size=50)
)
def test_mean_interval_contains_the_mean_and_shrinks_with_n(values: list[float]) -> None:
    mean, low, high = mean_interval(values)
    assert low <= mean <= high
    # the same spread over twice the values: a smaller t quantile, a larger sqrt(n)
    mean2, low2, high2 = mean_interval(values * 2)
    assert high2 - low2 <= (high - low) * (1 + 1e-9)


@given(st.integers(1, 400), st.floats(0.5, 0.999))
def test_t_quantile_falls_with_df_toward_the_normal(df: int, confidence: float) -> None:
    assert t_quantile(df + 1, confidence) < t_quantile(df, confidence)
    assert t_quantile(df, confidence) > t_quantile(math.inf, confidence)
