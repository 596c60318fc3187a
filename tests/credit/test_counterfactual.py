"""The re-simulation engine: splicing, forking, modes, batching, errors.

Branches are checked against brute force: the same episode played again from scratch with the
intervened agents' SAY lines removed by a wrapper around the scripted bots.
"""

from __future__ import annotations

import random

import pytest

import marl
from marl.credit import (
    Branch,
    GenerationRequest,
    Intervention,
    RecordedEpisode,
    Resimulator,
    bot_generate,
)
from marl.credit.counterfactual import has_message, splice_message, split_message
from marl.scenarios.bots import get_bot


def strip_say(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("SAY"))


def play(env, bot, seed, absent=frozenset(), recorded=None):
    """Play from scratch. ``absent``: agents or (round, agent) turns whose SAY lines are cut.
    ``recorded``: replay these completions for turns not in ``absent`` instead of the bot."""
    obs, infos = env.reset(seed=seed)
    rng = random.Random(0)
    while env.agents:
        r = env.round
        actions = {}
        for a in env.agents:
            cut = a in absent or (r, a) in absent
            if recorded is not None:
                text = recorded[r][a]
            else:
                text = bot(a, obs[a], infos[a], rng)
            actions[a] = strip_say(text) if cut else text
        obs, _, _, _, infos = env.step(actions)
    return env.returns


def record(env, bot, seed, episode_id=0):
    play(env, bot, seed)
    return RecordedEpisode.from_env(env, episode_id=episode_id)


@pytest.fixture(scope="module")
def relay():
    return marl.make("relay-v0"), get_bot("relay", "rule")


@pytest.fixture(scope="module")
def spotlight():
    return marl.make("spotlight-v0"), get_bot("spotlight", "rule")


def test_split_and_splice_keep_the_action_line():
    text = "thinking...\nSAY: red circle\nSAY @bob: hi\nACTION: 3"
    say, rest = split_message(text)
    assert say == ["SAY: red circle", "SAY @bob: hi"]
    assert rest == ["thinking...", "ACTION: 3"]
    assert has_message(text) and not has_message("ACTION: 3")
    assert splice_message(text, "") == "thinking...\nACTION: 3"
    assert splice_message(text, "SAY: blue\nACTION: 9") == "SAY: blue\nthinking...\nACTION: 3"
    assert splice_message(text, "SAY: blue\nACTION: 9", keep_action=False) == "SAY: blue\nACTION: 9"
    assert splice_message(None, "SAY: x\nACTION: 1") == "SAY: x\nACTION: 1"


def test_record_reads_the_log_and_replays_exactly(relay):
    env, bot = relay
    ep = record(env, bot, seed=3)
    assert ep.seed == 3 and len(ep.completions) == 4
    assert set(ep.completions[0]) == set(env.possible_agents)
    engine = Resimulator(env, bot_generate(bot))
    [out] = engine.run([ep], [Branch(0)])
    assert out.returns == ep.returns and not out.diverged
    assert engine.stats.env_steps == 0 and engine.stats.replays == 1
    assert len(ep.points) == 4  # a snapshot per round


def test_prepare_refuses_a_different_scenario(relay):
    env, bot = relay
    ep = record(env, bot, seed=0)
    engine = Resimulator(marl.make("relay-v0", episode={"rounds": 3}))
    with pytest.raises(ValueError, match="does not replay"):
        engine.prepare(ep)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_regenerate_branches_match_brute_force(relay, seed):
    env, bot = relay
    ep = record(env, bot, seed)
    cases = [
        frozenset({"alice"}),
        frozenset({"bob", "carol"}),
        frozenset({(0, "alice")}),
        frozenset({(1, "bob"), (2, "carol")}),
        frozenset(env.possible_agents),
    ]
    branches = []
    for absent in cases:
        ivs = []
        for item in absent:
            if isinstance(item, tuple):
                ivs.append(Intervention(item[1], "null", frozenset({item[0]})))
            else:
                ivs.append(Intervention(item, "null"))
        branches.append(Branch(0, tuple(ivs)))
    engine = Resimulator(env, bot_generate(bot), mode="regenerate")
    outcomes = engine.run([ep], branches)
    for absent, out in zip(cases, outcomes):
        assert out.returns == play(env, bot, seed, absent), absent


def test_replay_keeps_the_others_completions(spotlight):
    env, bot = spotlight
    ep = next(
        e for s in range(20) if (e := record(env, bot, s)).completions[1]["dan"] != "ACTION: 1"
    )
    play(env, bot, ep.seed)
    scout = env.rules.scouts[0]
    branch = Branch(0, (Intervention(scout, "null"),))
    replay = Resimulator(env, mode="replay").run([ep], [branch])[0]
    assert replay.completions[1]["dan"] == ep.completions[1]["dan"]  # acts on the lost message
    assert replay.returns == ep.returns
    assert replay.returns == play(env, bot, ep.seed, {scout}, recorded=ep.completions)
    regen = Resimulator(env, bot_generate(bot), mode="regenerate").run([ep], [branch])[0]
    assert regen.completions[1]["dan"] == "ACTION: 1"  # heard nothing: the fallback guess
    assert regen.returns["dan"] == 0.0 and ep.returns["dan"] == 1.0


def test_keep_action_false_drops_the_action_too(spotlight):
    env, bot = spotlight
    ep = record(env, bot, seed=0)
    branch = Branch(0, (Intervention("dan", "null", frozenset({1})),))
    out = Resimulator(env, mode="replay", keep_action=False).run([ep], [branch])[0]
    assert out.completions[1]["dan"] == ""
    assert out.returns["dan"] == pytest.approx(-0.1)  # no answer: team 0 plus the penalty
    kept = Resimulator(env, mode="replay").run([ep], [branch])[0]
    assert kept.returns == ep.returns and not kept.diverged


def test_default_replacement_sends_the_default_text(spotlight):
    env, bot = spotlight
    ep = record(env, bot, seed=2)
    scout = env.rules.scouts[0]
    engine = Resimulator(env, bot_generate(bot), default_text="SAY: nothing to report")
    out = engine.run([ep], [Branch(0, (Intervention(scout, "default", frozenset({0})),))])[0]
    assert out.completions[0][scout] == "SAY: nothing to report\nACTION: wait"
    assert out.diverged


def test_one_generate_call_per_round_and_merged_prompts(spotlight):
    env, bot = spotlight
    episodes = [record(env, bot, seed=s, episode_id=s) for s in range(3)]
    calls: list[list[GenerationRequest]] = []
    inner = bot_generate(bot)

    def generate(requests):
        calls.append(list(requests))
        return inner(requests)

    k = 5
    branches = [
        Branch(e, (Intervention(a, "sample"),))
        for e in range(3)
        for a in env.possible_agents
        for _ in range(k)
    ]
    engine = Resimulator(env, generate, mode="regenerate")
    engine.run(episodes, branches)
    assert len(calls) <= 2  # the episodes have two rounds
    first = calls[0]
    # the k samples of a turn share one request; identical prompts (a free rider's, in two
    # episodes) merge further; the decider is idle in round 0 (no edge out, no action) and is
    # never prompted, as in the rollout
    resamples = [r for r in first if r.kind == "resample"]
    assert "dan" not in {r.agent for r in resamples}
    assert all(r.n % k == 0 for r in resamples)
    assert sum(r.n for r in resamples) == 3 * 3 * k
    assert len(resamples) < 3 * 3
    assert engine.stats.generate_calls == len(calls)


def test_regenerate_asks_only_for_turns_whose_prompt_changed(spotlight):
    env, bot = spotlight
    ep = record(env, bot, seed=2)
    scout = env.rules.scouts[0]
    seen: list[GenerationRequest] = []
    inner = bot_generate(bot)

    def generate(requests):
        seen.extend(requests)
        return inner(requests)

    Resimulator(env, generate).run(
        [ep], [Branch(0, (Intervention(scout, "null", frozenset({0})),))]
    )
    # round 1: dan heard less, the scout's own outbox changed; free riders saw the same prompt
    assert {r.agent for r in seen} == {scout, "dan"}


def test_max_concurrent_gives_the_same_outcomes(relay):
    env, bot = relay
    episodes = [record(env, bot, seed=s, episode_id=s) for s in range(2)]
    branches = [
        Branch(e, (Intervention(a, "null"),)) for e in range(2) for a in env.possible_agents
    ]
    together = Resimulator(env, bot_generate(bot)).run(episodes, branches)
    chunked = Resimulator(env, bot_generate(bot), max_concurrent=3).run(episodes, branches)
    assert [o.returns for o in together] == [o.returns for o in chunked]


def test_keep_messages_resends_recorded_say_lines(relay):
    env, bot = relay
    ep = record(env, bot, seed=1)
    branch = Branch(0, (Intervention("alice", "null", frozenset({0})),))
    out = Resimulator(env, bot_generate(bot), mode="keep_messages").run([ep], [branch])[0]
    for r in range(1, 4):
        for a in ("bob", "carol"):
            assert split_message(out.completions[r][a])[0] == split_message(ep.completions[r][a])[0]


def test_errors_are_clear(relay):
    env, bot = relay
    ep = record(env, bot, seed=0)
    with pytest.raises(ValueError, match="credit.mode"):
        Resimulator(env, mode="sometimes")
    with pytest.raises(ValueError, match="unknown replacement"):
        Intervention("alice", "silence")
    with pytest.raises(ValueError, match="unknown agent 'zed'"):
        Resimulator(env).run([ep], [Branch(0, (Intervention("zed"),))])
    with pytest.raises(IndexError, match="out of range"):
        Resimulator(env).run([ep], [Branch(4)])
    with pytest.raises(ValueError, match="no generate callable"):
        Resimulator(env).run([ep], [Branch(0, (Intervention("alice", "sample"),))])
    with pytest.raises(ValueError, match="asked for n=1"):
        Resimulator(env, lambda reqs: [[] for _ in reqs]).run(
            [ep], [Branch(0, (Intervention("alice", "sample"),))]
        )
