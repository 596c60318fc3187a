"""Credit methods against brute force on scripted agents, the spotlight properties, the registry
and how credit feeds the GRPO advantage.

Brute force plays every counterfactual episode again from scratch (the rule bots are
deterministic, so ``regenerate`` mode must match it exactly) and computes Shapley values by
averaging marginal contributions over all N! orders, a different formula from the engine's.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

import marl
from marl.credit import (
    CreditConfig,
    CreditResult,
    RecordedEpisode,
    bot_generate,
    compute_credit,
    list_credits,
    register_credit,
    shapley_plan,
)
from marl.credit.advantages import compute_advantages, group_advantages
from marl.credit.apply import apply_credit
from marl.credit.shapley import permutation_shapley
from marl.protocols.turn import TurnRecord
from marl.scenarios.bots import get_bot
from marl.scenarios.builtin.spotlight import WORDS


def strip_say(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("SAY"))


def play(env, bot, seed, absent=frozenset(), say=None):
    """Play from scratch; ``absent`` agents / (round, agent) turns send no SAY lines;
    ``say`` maps an agent to the SAY text that replaces its message."""
    obs, infos = env.reset(seed=seed)
    rng = random.Random(0)
    while env.agents:
        r = env.round
        actions = {}
        for a in env.agents:
            text = bot(a, obs[a], infos[a], rng)
            if a in absent or (r, a) in absent:
                text = strip_say(text)
            if say and a in say:
                text = say[a] + "\n" + strip_say(text)
            actions[a] = text
        obs, _, _, _, infos = env.step(actions)
    return env.returns


def team(returns):
    return sum(returns.values()) / len(returns)


def record(env, bot, seed, episode_id=0, group_id=0):
    play(env, bot, seed)
    return RecordedEpisode.from_env(env, episode_id=episode_id, group_id=group_id)


def brute_shapley(players, v):
    """Average marginal contribution over all n! orders."""
    phi = dict.fromkeys(players, 0.0)
    orders = list(itertools.permutations(players))
    for order in orders:
        prefix = frozenset()
        for p in order:
            phi[p] += v(prefix | {p}) - v(prefix)
            prefix = prefix | {p}
    return {p: x / len(orders) for p, x in phi.items()}


@pytest.fixture(scope="module")
def relay():
    env, bot = marl.make("relay-v0"), get_bot("relay", "rule")
    return env, bot, [record(env, bot, seed=s, episode_id=s) for s in range(3)]


@pytest.fixture(scope="module")
def spotlight():
    env, bot = marl.make("spotlight-v0"), get_bot("spotlight", "rule")
    # seeds whose answer is not option 1 (the decider's fallback guess), so the scout matters
    episodes = []
    for s in range(40):
        ep = record(env, bot, seed=s, episode_id=s)
        if env.rules.answer != 0:
            episodes.append((ep, env.rules.scouts[0]))
        if len(episodes) == 4:
            break
    return env, bot, episodes


# --- exact methods vs brute force ---------------------------------------------------------
def test_difference_matches_brute_force(relay):
    env, bot, episodes = relay
    result = compute_credit("difference", episodes, env=env, generate=bot_generate(bot))
    for ep, credit, infl in zip(episodes, result.credit, result.influence):
        for agent in env.possible_agents:
            counter = play(env, bot, ep.seed, {agent})
            assert credit[agent] == pytest.approx(team(ep.returns) - team(counter), abs=1e-12)
            for j in env.possible_agents:
                assert infl[agent][j] == pytest.approx(ep.returns[j] - counter[j], abs=1e-12)


def test_difference_per_turn_matches_brute_force(relay):
    env, bot, episodes = relay
    result = compute_credit(
        "difference", episodes[:2], env=env, generate=bot_generate(bot), per_turn=True
    )
    for ep, turns, credit in zip(episodes, result.per_turn, result.credit):
        assert set(turns) == set(ep.turns())
        for (r, agent), value in turns.items():
            counter = play(env, bot, ep.seed, {(r, agent)})
            assert value == pytest.approx(team(ep.returns) - team(counter), abs=1e-12)
        for agent in env.possible_agents:  # the episode credit is the sum of the turns'
            total = sum(v for (_, a), v in turns.items() if a == agent)
            assert credit[agent] == pytest.approx(total)


@pytest.mark.parametrize("value", ["team", "own"])
def test_exact_shapley_matches_brute_force_and_is_efficient(relay, value):
    env, bot, episodes = relay
    result = compute_credit("shapley", episodes, env=env, generate=bot_generate(bot), value=value)
    players = list(env.possible_agents)
    for ep, credit, infl in zip(episodes, result.credit, result.influence):
        cache = {}

        def returns(s, ep=ep, cache=cache):
            if s not in cache:
                cache[s] = play(env, bot, ep.seed, frozenset(players) - s)
            return cache[s]

        by_team = brute_shapley(players, lambda s: team(returns(s)))
        by_agent = {j: brute_shapley(players, lambda s, j=j: returns(s)[j]) for j in players}
        for i in players:
            expected = by_team[i] if value == "team" else by_agent[i][i]
            assert credit[i] == pytest.approx(expected, abs=1e-12)
            for j in players:
                assert infl[i][j] == pytest.approx(by_agent[j][i], abs=1e-12)
        grand, empty = returns(frozenset(players)), returns(frozenset())
        if value == "team":  # efficiency
            assert sum(credit.values()) == pytest.approx(team(grand) - team(empty), abs=1e-12)


def test_sampled_shapley_uses_its_orders_exactly_and_stays_efficient(relay):
    env, bot, episodes = relay
    config = CreditConfig(name="shapley", permutations=2, exact_threshold=1)
    result = compute_credit(config, episodes, env=env, generate=bot_generate(bot))
    for ep, credit in zip(episodes, result.credit):
        players, orders, coalitions = shapley_plan(ep, config)
        assert orders is not None and len(coalitions) < 2 ** len(players)  # really sampled
        values = {s: team(play(env, bot, ep.seed, frozenset(players) - s)) for s in coalitions}
        expected = permutation_shapley(players, orders, values)
        assert credit == pytest.approx(expected, abs=1e-12)
        empty = team(play(env, bot, ep.seed, frozenset(players)))
        assert sum(credit.values()) == pytest.approx(team(ep.returns) - empty, abs=1e-12)


def test_per_turn_shapley_is_efficient_over_turns(spotlight):
    env, bot, episodes = spotlight
    eps = [ep for ep, _ in episodes[:2]]
    result = compute_credit(
        "shapley", eps, env=env, generate=bot_generate(bot), per_turn=True, permutations=8
    )
    per_agent = compute_credit("shapley", eps, env=env, generate=bot_generate(bot))
    for ep, turns, credit, whole in zip(eps, result.per_turn, result.credit, per_agent.credit):
        assert set(turns) == set(ep.message_turns())
        empty = team(play(env, bot, ep.seed, frozenset(env.possible_agents)))
        assert sum(turns.values()) == pytest.approx(team(ep.returns) - empty, abs=1e-12)
        assert sum(credit.values()) == pytest.approx(sum(whole.values()), abs=1e-12)


# --- the sampled baseline ------------------------------------------------------------------
def chatty_bot(agent, observation, info, rng):
    """A stochastic policy: advisers name a random word (maybe not even an option)."""
    if info.get("role") == "decider":
        return "ACTION: wait"
    return f"SAY: the answer is {rng.choice(WORDS)}\nACTION: wait"


def test_coma_baseline_is_the_mean_over_its_samples(spotlight):
    env, bot, episodes = spotlight
    eps = [ep for ep, _ in episodes]
    drawn: dict[tuple[str, str], list[str]] = {}
    inner = bot_generate(bot, seed=1, resample_bots=chatty_bot)

    def generate(requests):
        out = inner(requests)
        for req, texts in zip(requests, out):
            if req.kind == "resample":
                drawn.setdefault((req.agent, req.observation), []).extend(texts)
        return out

    k = 32
    result = compute_credit("coma", eps, env=env, generate=generate, samples=k)
    assert result.stats["generate_calls"] <= 2  # one per round of the two-round episodes
    for (ep, scout), credit, baseline in zip(episodes, result.credit, result.baseline):
        scout_obs = ep.points[0].observations[scout]
        samples = drawn[(scout, scout_obs)]
        assert len(samples) == k  # the K resamples of the scout's round-0 turn
        # exact given the samples: the mean of the brute-force value of each drawn message
        # (the scout also speaks in round 1, after the decision, which cannot matter)
        mean = sum(team(play(env, bot, ep.seed, say={scout: s.splitlines()[0]})) for s in samples)
        assert baseline[scout] == pytest.approx(mean / len(samples), abs=1e-12)
        # and within tolerance of the expectation over every possible message (12 words)
        exact = sum(
            team(play(env, bot, ep.seed, say={scout: f"SAY: the answer is {w}"})) for w in WORDS
        ) / len(WORDS)
        tolerance = 4 * math.sqrt(exact * (1 - exact) / k) + 1e-9  # 4 standard errors
        assert abs(baseline[scout] - exact) <= tolerance
        assert credit[scout] == pytest.approx(1.0 - baseline[scout])
        for agent in env.possible_agents:
            if agent != scout:  # free riders' samples cannot reach the decider's choice
                assert credit[agent] == 0.0


# --- the spotlight properties --------------------------------------------------------------
@pytest.mark.parametrize("method", ["difference", "shapley"])
def test_spotlight_scout_gets_all_free_riders_nothing(spotlight, method):
    env, bot, episodes = spotlight
    eps = [ep for ep, _ in episodes]
    result = compute_credit(method, eps, env=env, generate=bot_generate(bot))
    plain = compute_credit("team", eps)
    for (ep, scout), credit, infl, ret in zip(
        episodes, result.credit, result.influence, plain.credit
    ):
        assert ret == ep.returns and set(ret.values()) == {1.0}  # the team reward hides it
        assert credit[scout] == pytest.approx(1.0)
        for agent in env.possible_agents:
            if agent != scout:
                assert credit[agent] == 0.0
                assert all(v == 0.0 for v in infl[agent].values())
        assert all(v == pytest.approx(1.0) for v in infl[scout].values())


def test_replay_mode_sees_no_effect_of_messages(spotlight):
    env, bot, episodes = spotlight
    eps = [ep for ep, _ in episodes]
    for method in ("difference", "shapley"):
        result = compute_credit(method, eps, env=env, mode="replay")
        assert all(v == 0.0 for c in result.credit for v in c.values())
        assert result.stats["generate_calls"] == 0


def test_two_redundant_scouts_difference_zero_shapley_split():
    env = marl.make("spotlight-v0", params={"n_scouts": 2})
    bot = get_bot("spotlight", "rule")
    eps, scouts = [], []
    for s in range(40):
        ep = record(env, bot, seed=s, episode_id=s)
        if env.rules.answer != 0:
            eps.append(ep)
            scouts.append(list(env.rules.scouts))
        if len(eps) == 3:
            break
    diff = compute_credit("difference", eps, env=env, generate=bot_generate(bot))
    shap = compute_credit("shapley", eps, env=env, generate=bot_generate(bot))
    for pair, d, s in zip(scouts, diff.credit, shap.credit):
        assert d[pair[0]] == d[pair[1]] == 0.0  # each is redundant given the other
        assert s[pair[0]] == s[pair[1]] == pytest.approx(0.5)  # symmetric players, equal shares
        assert sum(s.values()) == pytest.approx(1.0)


# --- registry, config, advantages ----------------------------------------------------------
def test_registry_and_config_errors():
    assert {"team", "difference", "coma", "shapley"} <= set(list_credits())
    with pytest.raises(ValueError, match="already registered"):
        register_credit("team")(lambda episodes, engine, config: None)
    with pytest.raises(ValueError, match="known: .*coma.*difference.*shapley.*team"):
        CreditConfig(name="oracle")
    with pytest.raises(ValueError, match="credit.samples"):
        CreditConfig(name="coma", samples=0)
    with pytest.raises(ValueError, match="credit.value"):
        CreditConfig(name="difference", value="selfish")
    with pytest.raises(ValueError, match="credit.per_turn: method 'team'"):
        CreditConfig(name="team", per_turn=True)
    with pytest.raises(ValueError, match="pass env="):
        compute_credit("difference", [])


def _turns(episodes_by_group):
    turns = []
    for group, episodes in enumerate(episodes_by_group):
        for ep in episodes:
            for r, agent in ep.turns():
                turns.append(TurnRecord(agent, "p", group, ep.episode_id, r, [], [], [], []))
    return turns


def test_team_credit_reproduces_plain_grpo():
    env = marl.make("signal-v0")
    bot = get_bot("signal", "random")
    groups, eid = [], 0
    for g, seed in enumerate([5, 6]):
        group = []
        for k in range(4):
            obs, infos = env.reset(seed=seed)
            rng = random.Random(k)
            while env.agents:
                obs, _, _, _, infos = env.step(
                    {a: bot(a, obs[a], infos[a], rng) for a in env.agents}
                )
            group.append(RecordedEpisode.from_env(env, episode_id=eid, group_id=g))
            eid += 1
        groups.append(group)
    episodes = [ep for group in groups for ep in group]
    turns = _turns(groups)
    result = compute_credit("team", episodes)
    advantages = apply_credit(turns, result)
    returns = [episodes[t.episode_id].returns[t.agent] for t in turns]
    expected = group_advantages(
        returns,
        [t.group_id for t in turns],
        [t.agent for t in turns],
        "grpo",
        episode_ids=[t.episode_id for t in turns],
    )
    assert advantages == expected and any(a != 0 for a in advantages)
    assert [t.advantage for t in turns] == advantages
    assert [t.extras["credit"] for t in turns] == returns


def test_per_turn_credit_is_normalised_per_round():
    eps = [
        RecordedEpisode(0, [{"a": ""}, {"a": ""}], {"a": 0.0}, ["a"], episode_id=i, group_id=0)
        for i in range(3)
    ]
    per_turn = [
        {(0, "a"): 1.0, (1, "a"): 10.0},
        {(0, "a"): 2.0, (1, "a"): 10.0},
        {(0, "a"): 6.0, (1, "a"): 40.0},
    ]
    result = CreditResult(
        "difference",
        [0, 1, 2],
        [0, 0, 0],
        [e.returns for e in eps],
        credit=[{"a": sum(t.values())} for t in per_turn],
        per_turn=per_turn,
    )
    turns = _turns([eps])
    apply_credit(turns, result, method="dr_grpo")
    by_round = {
        r: compute_advantages(torch.tensor([p[(r, "a")] for p in per_turn]), "dr_grpo").tolist()
        for r in (0, 1)
    }
    for t in turns:
        assert t.advantage == pytest.approx(by_round[t.round][t.episode_id])
    with pytest.raises(ValueError, match="episode 7"):
        apply_credit([TurnRecord("a", "p", 0, 7, 0, [], [], [], [])], result)


def test_whole_turn_credit_reaches_the_decider(spotlight):
    """With keep_action the decider, who sends no message, gets no credit; with
    keep_action=False its null turn loses its answer too, and the scout's credit is unchanged."""
    env, bot, episodes = spotlight
    eps = [ep for ep, _ in episodes]
    message_only = compute_credit("difference", eps, env=env, generate=bot_generate(bot))
    whole = compute_credit(
        "difference", eps, env=env, generate=bot_generate(bot), keep_action=False
    )
    for (_ep, scout), part, full in zip(episodes, message_only.credit, whole.credit):
        assert part["dan"] == 0.0
        # no answer: team reward 0, and dan's malformed penalty -0.1 in the team mean
        assert full["dan"] == pytest.approx(1.0 - (-0.1 / 4))
        assert full[scout] == part[scout] == pytest.approx(1.0)
