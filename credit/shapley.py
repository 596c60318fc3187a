"""Shapley values from coalition values: exact enumeration and Monte-Carlo permutation sampling.

Pure functions on plain Python data; the re-simulation that produces the coalition values lives
in :mod:`marl.credit.counterfactual`, and the credit method that ties them together in
:mod:`marl.credit.estimators`.

For players ``P`` (``n = |P|``) and a value function ``v`` on coalitions ``S ⊆ P``, the Shapley
value of player ``i`` (Shapley 1953) is the mean marginal contribution of ``i`` over all ``n!``
orders in which the players can join::

    phi_i = 1/n! * sum_{orders} [ v(pre_i ∪ {i}) - v(pre_i) ]
          = sum_{S ⊆ P \\ {i}} |S|! (n - |S| - 1)! / n! * [ v(S ∪ {i}) - v(S) ]

where ``pre_i`` is the set of players before ``i`` in the order. The second form needs the
``2^n`` coalition values (:func:`exact_shapley`). When ``n!`` is too large, ``M`` orders are
sampled uniformly (Castro, Gómez and Tejada 2009, "Polynomial calculation of the Shapley value
based on sampling") and the marginals averaged (:func:`permutation_shapley`); each sampled order
needs the ``n + 1`` coalitions of its prefixes. With ``antithetic=True`` every sampled order is
followed by its reverse (Mitchell et al. 2022, "Sampling Permutations for Shapley Value
Estimation"), which cancels much of the variance in near-additive games.

Both estimators satisfy efficiency exactly, ``sum_i phi_i = v(P) - v(∅)``: along each order the
marginals telescope. Symmetric players get equal exact values, and a null player (``v(S ∪ {i})
= v(S)`` for every ``S``) gets exactly 0 from both.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Hashable, Mapping, Sequence

__all__ = [
    "all_coalitions",
    "exact_shapley",
    "permutation_coalitions",
    "permutation_shapley",
    "sample_permutations",
]

Coalition = frozenset
ValueFn = Callable[[frozenset], float] | Mapping[frozenset, float]


def _lookup(value: ValueFn) -> Callable[[frozenset], float]:
    if isinstance(value, Mapping):
        return lambda s: float(value[s])
    return lambda s: float(value(s))


def all_coalitions(players: Sequence[Hashable]) -> list[frozenset]:
    """Every subset of ``players`` (``2^n`` of them), smallest first."""
    return [
        frozenset(c)
        for size in range(len(players) + 1)
        for c in itertools.combinations(players, size)
    ]


def exact_shapley(players: Sequence[Hashable], value: ValueFn) -> dict[Hashable, float]:
    """Exact Shapley values from all ``2^n`` coalition values (a mapping or a callable)."""
    v = _lookup(value)
    n = len(players)
    weights = [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)]
    phi = {}
    for i in players:
        others = [p for p in players if p != i]
        total = 0.0
        for size in range(n):
            for c in itertools.combinations(others, size):
                s = frozenset(c)
                total += weights[size] * (v(s | {i}) - v(s))
        phi[i] = total
    return phi


def sample_permutations(
    players: Sequence[Hashable], m: int, rng: random.Random, antithetic: bool = True
) -> list[tuple[Hashable, ...]]:
    """``m`` uniformly random orders of ``players``; with ``antithetic`` each followed by its
    reverse (``m`` is then rounded up to an even number)."""
    if m < 1:
        raise ValueError(f"permutations: need at least 1, got {m}")
    orders: list[tuple[Hashable, ...]] = []
    while len(orders) < m:
        order = list(players)
        rng.shuffle(order)
        orders.append(tuple(order))
        if antithetic:
            orders.append(tuple(reversed(order)))
    return orders


def permutation_coalitions(orders: Sequence[Sequence[Hashable]]) -> set[frozenset]:
    """The coalitions (every prefix of every order) that :func:`permutation_shapley` needs."""
    needed: set[frozenset] = set()
    for order in orders:
        for k in range(len(order) + 1):
            needed.add(frozenset(order[:k]))
    return needed


def permutation_shapley(
    players: Sequence[Hashable], orders: Sequence[Sequence[Hashable]], value: ValueFn
) -> dict[Hashable, float]:
    """Monte-Carlo Shapley values: the marginal contributions averaged over ``orders``."""
    if not orders:
        raise ValueError("permutation_shapley needs at least one order")
    v = _lookup(value)
    phi = dict.fromkeys(players, 0.0)
    for order in orders:
        if sorted(map(repr, order)) != sorted(map(repr, players)):
            raise ValueError(f"order {order!r} is not a permutation of the players {players!r}")
        prefix: frozenset = frozenset()
        before = v(prefix)
        for player in order:
            prefix = prefix | {player}
            after = v(prefix)
            phi[player] += after - before
            before = after
    return {p: total / len(orders) for p, total in phi.items()}
