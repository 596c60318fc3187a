"""The statistics every report and bench script uses: one definition of each interval and test.

Small pure functions on plain numbers (no scipy, no numpy), each citing where its method comes
from:

- :func:`wilson`: the Wilson score interval of a proportion (Wilson 1927).
- :func:`t_quantile`: the two-sided quantile of Student's t for any degrees of freedom, computed
  from the t distribution's CDF (the regularized incomplete beta function) rather than read off a
  table, so no degrees of freedom fall back to the normal value.
- :func:`mean_interval`: the mean of independent values with its Student-t interval, and
  :func:`mean_ci`, the same as a mean and a half-width (tables print ``mean ± half``).
- :func:`seed_clustered`: the mean over seeds of per-seed means, with a t-interval over seeds:
  the interval to report for a training recipe.
- :func:`mcnemar`: the exact McNemar test for paired binary outcomes (the same held-out
  scenarios before and after training).

All intervals are two-sided at ``confidence`` (0.95 by default).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist, fmean, stdev

__all__ = ["mcnemar", "mean_ci", "mean_interval", "seed_clustered", "t_quantile", "wilson"]


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")


def _normal_quantile(confidence: float) -> float:
    """The two-sided standard normal quantile: 1.959964 at 0.95."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson(successes: float, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a proportion: ``successes`` out of ``n`` trials.

    Wilson (1927), "Probable inference, the law of succession, and statistical inference",
    JASA 22: the set of ``p`` for which ``|p_hat - p| <= z sqrt(p (1 - p) / n)``, which is

        centre = (p_hat + z^2 / 2n) / (1 + z^2 / n)
        half   = z sqrt(p_hat (1 - p_hat) / n + z^2 / 4n^2) / (1 + z^2 / n)

    with ``z`` the two-sided normal quantile. Unlike the normal (Wald) interval it stays inside
    [0, 1] and is not empty at 0 or ``n`` successes. ``successes`` may be fractional (a mean
    rate times ``n``). With ``n == 0`` there is no information: the interval is (0, 1).
    The bounds are clipped to [0, 1] and to contain ``p_hat`` against rounding.
    """
    _check_confidence(confidence)
    if n == 0:
        return 0.0, 1.0
    if not 0 <= successes <= n:
        raise ValueError(f"wilson: need 0 <= successes <= n, got {successes} of {n}")
    z = _normal_quantile(confidence)
    p = successes / n
    scale = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / scale
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / scale
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function, evaluated by the modified Lentz
    method (Press et al., Numerical Recipes, 3rd ed., section 6.4, ``betacf``). Converges fast
    for ``x < (a + 1) / (a + b + 2)``; its cost grows like ``sqrt(max(a, b))`` iterations."""
    tiny, eps = 1e-300, 1e-15
    max_iter = 1000 + int(10 * math.sqrt(max(a, b)))
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, max_iter + 1):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),  # even step
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),  # odd step
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def _regularized_beta(a: float, b: float, x: float, y: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function, with ``y = 1 - x`` passed in
    exactly (Numerical Recipes' ``betai``: the continued fraction on whichever side converges)."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, y) / b


def _t_two_sided_tail(t: float, df: float) -> float:
    """``P(|T| > t)`` for Student's t with ``df`` degrees of freedom:
    ``I_{df / (df + t^2)}(df / 2, 1 / 2)`` (Abramowitz & Stegun 26.7.1 and 26.5.27)."""
    t2 = t * t
    return _regularized_beta(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


# Above this many degrees of freedom the beta function's log-gamma terms lose digits to
# cancellation, and the expansion in 1 / df is exact to double precision instead.
_LARGE_DF = 1e5


def _t_quantile_expansion(df: float, confidence: float) -> float:
    """The t quantile as the normal quantile ``x`` plus its expansion in ``1 / df``
    (Abramowitz & Stegun 26.7.5, after Fisher & Cornish); its first omitted term is of order
    ``df^-5``, below double precision for ``df >= 1e5``. ``df = inf`` gives ``x`` itself."""
    x = _normal_quantile(confidence)
    g = (
        (x**3 + x) / 4,
        (5 * x**5 + 16 * x**3 + 3 * x) / 96,
        (3 * x**7 + 19 * x**5 + 17 * x**3 - 15 * x) / 384,
        (79 * x**9 + 776 * x**7 + 1482 * x**5 - 1920 * x**3 - 945 * x) / 92160,
    )
    return x + sum(gk / df ** (k + 1) for k, gk in enumerate(g))


@lru_cache(maxsize=512)
def t_quantile(df: float, confidence: float = 0.95) -> float:
    """The two-sided Student-t quantile: the ``t`` with ``P(|T| <= t) = confidence`` for ``df``
    degrees of freedom (Student 1908); the multiplier of a t-interval's standard error.

    Computed, not tabulated: the t distribution's two-sided tail is the regularized incomplete
    beta function ``I_{df/(df+t^2)}(df/2, 1/2)`` (Abramowitz & Stegun 26.7.1), evaluated with
    Numerical Recipes' continued fraction, and inverted by bisection on ``t`` to double
    precision; for ``df >= 1e5`` the expansion of Abramowitz & Stegun 26.7.5 takes over.
    At 0.95: 12.706 (df 1), 4.303 (2), 2.306 (8), 2.228 (10), 2.042 (30), 1.980 (120), and the
    normal 1.960 as ``df`` grows (``df = math.inf`` gives it exactly). ``df`` may be fractional
    (Welch-Satterthwaite); it must be positive.
    """
    _check_confidence(confidence)
    if not df > 0:
        raise ValueError(f"t_quantile: degrees of freedom must be positive, got {df}")
    if df >= _LARGE_DF:
        return _t_quantile_expansion(df, confidence)
    alpha = 1.0 - confidence
    low, high = 0.0, 1.0
    while _t_two_sided_tail(high, df) > alpha:  # the tail falls as t grows: bracket, then halve
        low, high = high, 2.0 * high
    for _ in range(200):
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        if _t_two_sided_tail(mid, df) > alpha:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of independent values and its Student-t interval,
    ``mean ± t_quantile(n - 1) * s / sqrt(n)`` with ``s`` the sample standard deviation
    (Student 1908).

    One value gives its mean with a NaN interval (no spread can be estimated from it); no
    values raise ``ValueError``. The values must be independent draws: for episodes grouped
    by training seed, use :func:`seed_clustered`.
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_interval: no values (the mean of nothing is undefined)")
    mean = fmean(values)
    if n == 1:
        return mean, math.nan, math.nan
    half = t_quantile(n - 1, confidence) * stdev(values, mean) / math.sqrt(n)
    return mean, mean - half, mean + half


def mean_ci(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """``(mean, half)``: the mean of independent values and the half-width of its Student-t
    interval (:func:`mean_interval`), for a table's ``mean ± half``. No values give
    ``(nan, nan)``, one value its mean and a NaN half-width (no spread can be estimated from
    one). Over per-seed values this is the seed-clustered interval (:func:`seed_clustered`)."""
    if not values:
        return math.nan, math.nan
    mean, _, high = mean_interval(values, confidence)
    return mean, high - mean


def seed_clustered(
    per_seed_values: Sequence[Sequence[float]], confidence: float = 0.95
) -> tuple[float, float, float]:
    """``(mean, low, high)`` for a training recipe: each seed's values (its episodes' successes
    or returns) are averaged to one number per seed, and the interval is the t-interval over
    those per-seed means (:func:`mean_interval`, ``n_seeds - 1`` degrees of freedom).

    Why not pool the episodes: the episodes of one seed share that seed's trained weights, so
    they are not independent draws of what the recipe produces. Pooling 3 seeds x 64 episodes
    as 192 independent trials measures only the episode noise around these 3 particular
    models and leaves out the seed-to-seed spread, the larger part of the uncertainty about
    the recipe; its interval is too narrow. The seed is the unit of replication (a clustered
    design: Donner & Klar 2000; for RL, Agarwal et al. 2021, "Deep RL at the edge of the
    statistical precipice"). With one seed the interval is NaN.
    """
    if not per_seed_values:
        raise ValueError("seed_clustered: no seeds")
    means = []
    for index, values in enumerate(per_seed_values):
        if len(values) == 0:
            raise ValueError(f"seed_clustered: seed {index} has no values")
        means.append(fmean(values))
    return mean_interval(means, confidence)


def mcnemar(before: Sequence[bool], after: Sequence[bool]) -> tuple[int, int, float]:
    """``(b, c, p_value)``: the exact McNemar test for paired binary outcomes, such as success on
    the same held-out scenarios before and after training (McNemar 1947, "Note on the sampling
    error of the difference between correlated proportions or percentages", Psychometrika 12).

    ``b`` counts the pairs that succeeded before and failed after, ``c`` those that failed
    before and succeeded after; pairs that agree carry no information about a change. Under
    no change each discordant pair is ``b`` or ``c`` with probability 1/2, so the exact
    (binomial) two-sided p-value is ``min(1, 2 * P(Binomial(b + c, 1/2) <= min(b, c)))``
    (1 when there are no discordant pairs). Computed with integer arithmetic.
    """
    if len(before) != len(after):
        raise ValueError(f"mcnemar: {len(before)} outcomes before but {len(after)} after")
    b = sum(1 for x, y in zip(before, after) if x and not y)
    c = sum(1 for x, y in zip(before, after) if not x and y)
    n = b + c
    if n == 0:
        return b, c, 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1))
    return b, c, min(1.0, 2 * tail / 2**n)
