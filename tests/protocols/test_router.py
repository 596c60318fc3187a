"""The router: delivery only along edges, named recipients, violations, budgets, channel noise,
counters; and, through a real environment, what the sender is shown next round."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import marl
from marl.protocols.graphs import GraphSpec, build_graph
from marl.protocols.markup import OutgoingMessage
from marl.protocols.router import TRUNCATION_MARK, ChannelNoise, MessageBudget, Router

ABCD = ["a", "b", "c", "d"]
LINE = build_graph(ABCD, GraphSpec(topology="line", directed=False))  # a - b - c - d
DIRECTED_LINE = build_graph(ABCD, GraphSpec(topology="line", directed=True))  # a -> b -> c -> d


def out(text: str, *to: str) -> OutgoingMessage:
    return OutgoingMessage(to=tuple(to) or None, text=text)


def route(router: Router, sender: str, *messages: OutgoingMessage, graph=LINE, seed: int = 0):
    return router.route(graph, sender, list(messages), 3, random.Random(seed))


def test_broadcast_goes_to_every_out_neighbour_and_nobody_else() -> None:
    router = Router(MessageBudget(max_chars=50, max_per_round=2))
    delivered, violations = route(router, "b", out("hello"))
    assert violations == []
    assert [(m.sender, m.receivers, m.round, m.text) for m in delivered] == [
        ("b", ("a", "c"), 3, "hello")
    ]
    # directed: b only reaches c; d reaches nobody and nothing is delivered
    delivered, _ = route(router, "b", out("hi"), graph=DIRECTED_LINE)
    assert delivered[0].receivers == ("c",)
    delivered, violations = route(router, "d", out("hi"), graph=DIRECTED_LINE)
    assert delivered == [] and violations == []


def test_named_recipients_unknown_agents_and_non_neighbours() -> None:
    router = Router(MessageBudget(max_chars=50, max_per_round=3))
    delivered, violations = route(router, "b", out("psst", "c", "d", "zed", "a"))
    assert [m.receivers for m in delivered] == [("c", "a")]
    kinds = [(v.kind, v.sender, v.round) for v in violations]
    assert kinds == [("not_neighbour", "b", 3), ("unknown_agent", "b", 3)]
    assert "d is not one of your neighbours (a, c)" in violations[0].detail
    assert "'zed'" in violations[1].detail
    assert violations[0].notice().startswith("[round 4] ")  # shown from 1
    assert router.counts["not_neighbour"] == 1 and router.counts["unknown_agent"] == 1
    # addressed only to a non-neighbour: nothing is delivered at all
    delivered, violations = route(router, "a", out("far away", "d"))
    assert delivered == [] and [v.kind for v in violations] == ["not_neighbour"]
    # naming yourself is not an edge either
    delivered, violations = route(router, "a", out("me", "a"))
    assert delivered == [] and [v.kind for v in violations] == ["not_neighbour"]


def test_over_budget_message_is_truncated_delivered_and_counted() -> None:
    router = Router(MessageBudget(max_chars=10, max_per_round=2))
    delivered, violations = route(router, "a", out("x" * 25))
    assert delivered[0].text == "x" * 7 + TRUNCATION_MARK
    assert len(delivered[0].text) == 10
    assert [v.kind for v in violations] == ["over_budget"]
    assert "25 characters" in violations[0].detail and "10" in violations[0].detail
    assert router.counts["over_budget"] == 1 and router.counts["delivered"] == 1
    exact, violations = route(router, "a", out("y" * 10))
    assert exact[0].text == "y" * 10 and violations == []


@pytest.mark.parametrize("max_chars", [1, 2, 3, 4])
def test_truncation_never_exceeds_a_tiny_budget(max_chars: int) -> None:
    router = Router(MessageBudget(max_chars=max_chars, max_per_round=1))
    delivered, violations = route(router, "a", out("abcdefgh"))
    assert len(delivered[0].text) <= max_chars
    assert delivered[0].text
    assert [v.kind for v in violations] == ["over_budget"]


def test_too_many_messages_in_one_round_are_dropped_and_counted() -> None:
    router = Router(MessageBudget(max_chars=50, max_per_round=2))
    delivered, violations = route(router, "b", out("one"), out("two", "a"), out("three"))
    assert [m.text for m in delivered] == ["one", "two"]
    assert [v.kind for v in violations] == ["too_many"]
    assert "'three'" in violations[0].detail
    assert router.counts["sent"] == 3 and router.counts["too_many"] == 1


def test_drop_probability_one_drops_everything_and_zero_drops_nothing() -> None:
    router = Router(MessageBudget(max_per_round=5), ChannelNoise(drop=1.0))
    delivered, violations = route(router, "b", out("one"), out("two"), out("three", "c"))
    assert delivered == [] and violations == []
    assert router.counts["noise_dropped"] == 5  # 2 + 2 + 1 receivers
    assert router.counts["delivered"] == 0 and not router.edge_counts
    clean = Router(MessageBudget(max_per_round=5), ChannelNoise(drop=0.0))
    assert not clean.noise.active
    delivered, _ = route(clean, "b", out("one"), out("two"))
    assert [m.receivers for m in delivered] == [("a", "c"), ("a", "c")]


def test_partial_drop_is_per_receiver_and_seeded() -> None:
    def run(seed: int) -> list[tuple[str, ...]]:
        router = Router(MessageBudget(max_per_round=50), ChannelNoise(drop=0.5))
        graph = build_graph([f"x{i}" for i in range(10)], GraphSpec(topology="star"))
        many = [out(str(i)) for i in range(20)]
        delivered, _ = route(router, "x0", *many, graph=graph, seed=seed)
        return [m.receivers for m in delivered]

    assert run(1) == run(1)
    assert run(1) != run(2)
    sizes = [len(r) for r in run(1)]
    assert 0 < sum(sizes) < 20 * 9 and len(set(sizes)) > 1


def test_corruption_is_deterministic_per_seed_and_keeps_the_length() -> None:
    text = "the target is the red circle " * 3

    def run(seed: int, corrupt: float) -> str:
        router = Router(MessageBudget(max_chars=500), ChannelNoise(corrupt=corrupt))
        delivered, _ = route(router, "a", out(text), seed=seed)
        assert router.counts["noise_corrupted"] == (delivered[0].text != text)
        return delivered[0].text

    assert run(5, 0.3) == run(5, 0.3)
    assert run(5, 0.3) != run(6, 0.3)
    assert run(5, 0.3) != text and len(run(5, 0.3)) == len(text)
    assert run(5, 0.0) == text
    flipped = sum(a != b for a, b in zip(run(5, 1.0), text))
    assert flipped > len(text) // 2 and run(5, 1.0).isalpha()


def test_a_cut_edge_stays_a_neighbour_but_delivers_nothing() -> None:
    """``graph.cut``: b is still told it can message a and c (no violation, no notice), what it
    sends to a is dropped and counted ``cut_dropped``, and the channel's random stream is the
    one the uncut graph gives (the cut is applied after the noise has drawn)."""
    cut = build_graph(ABCD, GraphSpec(topology="line", cut=(("b", "a"), ("a", "d"))))
    assert set(cut.edges()) == set(LINE.edges())  # a cut of an edge that is not there: nothing
    assert cut.edges["b", "a"]["deliver"] is False and "deliver" not in cut.edges["a", "b"]
    router = Router(MessageBudget(max_per_round=3))
    delivered, violations = route(router, "b", out("x"), out("y", "a"), graph=cut)
    assert violations == [] and [m.receivers for m in delivered] == [("c",)]
    assert router.counts["cut_dropped"] == 2 and router.counts["delivered"] == 1
    assert router.counts["sent"] == 2 and dict(router.edge_counts) == {("b", "c"): 1}
    noise = ChannelNoise(drop=0.3, corrupt=0.2)
    for seed in range(20):
        rng_cut, rng_full = random.Random(seed), random.Random(seed)
        Router(MessageBudget(), noise).route(cut, "b", [out("hello there")], 0, rng_cut)
        Router(MessageBudget(), noise).route(LINE, "b", [out("hello there")], 0, rng_full)
        assert rng_cut.random() == rng_full.random()


def test_per_edge_counters_accumulate() -> None:
    router = Router(MessageBudget(max_per_round=3))
    route(router, "b", out("x"), out("y", "c"))
    route(router, "c", out("z", "d"))
    assert dict(router.edge_counts) == {("b", "a"): 1, ("b", "c"): 2, ("c", "d"): 1}
    assert router.counts["delivered"] == 4 and router.counts["sent"] == 3


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 6),
    p=st.floats(0, 1),
    directed=st.booleans(),
    max_chars=st.integers(1, 30),
    max_per_round=st.integers(1, 4),
    seed=st.integers(0, 2**16),
    messages=st.lists(
        st.tuples(
            st.one_of(st.none(), st.lists(st.sampled_from(["x0", "x1", "x2", "zed"]), max_size=3)),
            st.text(min_size=1, max_size=60),
        ),
        max_size=6,
    ),
)
def test_property_deliveries_respect_edges_and_budgets(
    n, p, directed, max_chars, max_per_round, seed, messages
) -> None:
    agents = [f"x{i}" for i in range(n)]
    graph = build_graph(agents, GraphSpec(topology="random", p=p, directed=directed), seed)
    router = Router(MessageBudget(max_chars, max_per_round), ChannelNoise(drop=0.2, corrupt=0.2))
    outgoing = [out(text, *(to or [])) for to, text in messages]
    delivered, violations = route(router, "x0", *outgoing, graph=graph, seed=seed)
    assert len(delivered) <= max_per_round
    for message in delivered:
        assert message.sender == "x0" and message.receivers
        assert all(graph.has_edge("x0", r) for r in message.receivers)
        assert len(message.text) <= max_chars
    assert sum(router.edge_counts.values()) == router.counts["delivered"]
    assert router.counts["sent"] == len(outgoing)
    kinds = Counter(v.kind for v in violations)
    assert kinds == {k: router.counts[k] for k in kinds}
    assert kinds["too_many"] == max(len(outgoing) - max_per_round, 0)


# --- through a real environment: what the sender and the receiver see -------------------------


def test_violations_are_shown_to_the_sender_in_its_next_observation_and_counted() -> None:
    env = marl.make("relay", messages={"max_chars": 12, "max_per_round": 1})
    observations, _ = env.reset(seed=0)
    assert "Notices:" not in observations["alice"]
    actions = {a: "ACTION: wait" for a in env.agents}
    actions["alice"] = "SAY: 1=5 and a lot more words\nSAY: second\nACTION: wait"
    actions["bob"] = "SAY @dave @zed @carol: 2=3\nACTION: wait"
    actions["dave"] = "ACTION: 0000"
    observations, rewards, *_ = env.step(actions)
    alice, bob, carol = observations["alice"], observations["bob"], observations["carol"]
    assert "Notices:" in alice and "the limit is 12, so it was truncated" in alice
    assert "Only 1 messages per round are allowed" in alice
    assert "dave is not one of your neighbours (alice, carol)" in bob
    assert "There is no agent called 'zed'" in bob
    assert "Notices:" not in carol
    # the receiver got the truncated text; carol got bob's message, dave got nothing from bob
    assert "alice: 1=5 and a..." in bob
    assert "bob: 2=3" in carol and "bob: 2=3" not in observations["dave"]
    # the sender sees what was delivered, to whom
    assert "to bob: 1=5 and a..." in alice
    assert env.router.counts["over_budget"] == 1 and env.router.counts["too_many"] == 1
    assert env.router.counts["not_neighbour"] == 1 and env.router.counts["unknown_agent"] == 1
    # protocol violations are counted and shown, not penalised as malformed output
    assert env.malformed == dict.fromkeys(env.possible_agents, 0)
    assert set(rewards.values()) == {0.0}


def test_a_look_alike_name_is_told_with_the_name_it_resembles() -> None:
    router = Router(MessageBudget(max_chars=50, max_per_round=3))
    delivered, violations = route(router, "b", out("psst", "C"))
    assert delivered == [] and [v.kind for v in violations] == ["unknown_agent"]
    assert "There is no agent called 'C' (names are exact: did you mean c?)" in (
        violations[0].detail
    )
