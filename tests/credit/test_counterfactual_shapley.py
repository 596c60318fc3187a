"""Shapley values from coalition values: exact, sampled, and their axioms (pure math)."""

from __future__ import annotations

import itertools
import random

import pytest

from marl.credit.shapley import (
    all_coalitions,
    exact_shapley,
    permutation_coalitions,
    permutation_shapley,
    sample_permutations,
)


def random_game(players, seed):
    rng = random.Random(seed)
    values = {s: rng.uniform(-1, 1) for s in all_coalitions(players)}
    values[frozenset()] = 0.0
    return values


def by_orders(players, v):
    orders = list(itertools.permutations(players))
    return permutation_shapley(players, orders, v)


def test_exact_equals_the_average_over_all_orders():
    players = ["a", "b", "c", "d"]
    v = random_game(players, seed=0)
    exact = exact_shapley(players, v)
    assert exact == pytest.approx(by_orders(players, v), abs=1e-12)
    assert sum(exact.values()) == pytest.approx(v[frozenset(players)] - v[frozenset()])


def test_hand_computed_glove_game():
    # one left glove (a) and two right gloves (b, c): a pair is worth 1
    players = ["a", "b", "c"]

    def v(s):
        return float("a" in s and ("b" in s or "c" in s))

    phi = exact_shapley(players, v)
    assert phi == pytest.approx({"a": 2 / 3, "b": 1 / 6, "c": 1 / 6})


def test_symmetry_and_null_player():
    players = ["a", "b", "c", "z"]

    def v(s):  # a and b are interchangeable, z never matters
        return len(s & {"a", "b"}) ** 2 + 0.5 * ("c" in s) * len(s & {"a", "b"})

    phi = exact_shapley(players, v)
    assert phi["a"] == pytest.approx(phi["b"])
    assert phi["z"] == 0.0
    orders = sample_permutations(players, 10, random.Random(1))
    sampled = permutation_shapley(players, orders, v)
    assert sampled["z"] == 0.0


def test_sampled_values_are_efficient_and_converge_at_a_fixed_seed():
    players = list(range(6))
    v = random_game(players, seed=3)
    exact = exact_shapley(players, v)
    for antithetic in (False, True):
        orders = sample_permutations(players, 3000, random.Random(7), antithetic=antithetic)
        sampled = permutation_shapley(players, orders, v)
        # efficiency holds exactly for any set of orders: the marginals telescope
        assert sum(sampled.values()) == pytest.approx(v[frozenset(players)], abs=1e-9)
        # stated tolerance: 0.05 at 3000 orders (the marginals are bounded by 2 here)
        assert max(abs(sampled[p] - exact[p]) for p in players) < 0.05


def test_antithetic_orders_come_in_reversed_pairs():
    orders = sample_permutations("abcd", 5, random.Random(0), antithetic=True)
    assert len(orders) == 6
    for first, second in zip(orders[::2], orders[1::2]):
        assert second == tuple(reversed(first))
    assert len(sample_permutations("abcd", 5, random.Random(0), antithetic=False)) == 5


def test_coalitions_needed_by_orders_are_their_prefixes():
    orders = [("a", "b", "c"), ("c", "b", "a")]
    assert permutation_coalitions(orders) == {
        frozenset(),
        frozenset("a"),
        frozenset("ab"),
        frozenset("abc"),
        frozenset("c"),
        frozenset("bc"),
    }
    assert len(all_coalitions("abcd")) == 16


def test_bad_orders_are_refused():
    with pytest.raises(ValueError, match="not a permutation"):
        permutation_shapley(["a", "b"], [("a", "a")], lambda s: 0.0)
    with pytest.raises(ValueError, match="at least one order"):
        permutation_shapley(["a"], [], lambda s: 0.0)
    with pytest.raises(ValueError, match="at least 1"):
        sample_permutations("ab", 0, random.Random(0))
