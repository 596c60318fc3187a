"""``marl eval``: players are parsed with errors that name them; pairings play seeded episodes
with the seats alternating; every model generates once per round for all pairings at once; the
competitive matrix is consistent (a's wins are b's losses) and the cooperative one has its
diagonal; Kuhn Poker is ranked by chips, so the Nash bot ranks above the random bot; the CLI
writes Markdown, CSV, PNG and JSON from real tiny-model checkpoints."""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import pytest

from marl.competition.crossplay import competitive_cells, crossplay, games_of, write_results
from marl.competition.players import Player, build_backends, parse_players
from marl.errors import RunError


def test_players_are_parsed_and_bad_ones_named(tmp_path: Path) -> None:
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    players = parse_players(
        [str(tmp_path / "run"), "base=model:tiny", "random", "bot:rule"], "matrix"
    )
    assert [(p.name, p.kind) for p in players] == [
        ("run", "checkpoint"),
        ("base", "model"),
        ("random", "bot"),
        ("rule", "bot"),
    ]
    assert players[1].model["kind"] == "tiny"
    with pytest.raises(RunError, match="checkpoint not found: nowhere/run"):
        parse_players(["nowhere/run", "random"], "matrix")
    with pytest.raises(RunError, match="unknown bot 'sneaky' for rules 'matrix'; known: random"):
        parse_players(["bot:sneaky", "random"], "matrix")
    with pytest.raises(RunError, match="unknown model preset 'huge'"):
        parse_players(["model:huge", "random"], "matrix")
    with pytest.raises(RunError, match=r"'rulee' is neither a checkpoint directory here nor a bot"):
        parse_players(["rulee", "random"], "matrix")  # a bot misspelt is not called a path


def test_the_same_bot_twice_is_numbered_and_labels_are_checked(tmp_path: Path) -> None:
    players = parse_players(["rule", "rule", "random"], "matrix")
    assert [(p.name, p.bot) for p in players] == [
        ("rule-1", "rule"),
        ("rule-2", "rule"),
        ("random", "random"),
    ]
    assert [p.name for p in parse_players(["model:tiny", "model:tiny"], "matrix")] == [
        "tiny-1",
        "tiny-2",
    ]
    assert [p.name for p in parse_players(["a=bot:rule", "b=bot:rule"], "matrix")] == ["a", "b"]
    with pytest.raises(
        RunError, match=r"two players are called 'a'; give them labels of their own"
    ):
        parse_players(["a=rule", "a=random"], "matrix")
    (tmp_path / "x" / "run").mkdir(parents=True)
    (tmp_path / "y" / "run").mkdir(parents=True)
    with pytest.raises(RunError, match="two players are called 'run'"):  # checkpoints: labels
        parse_players([str(tmp_path / "x" / "run"), str(tmp_path / "y" / "run")], "matrix")


def test_eval_help_prints_percent_signs_once(capsys: pytest.CaptureFixture) -> None:
    from marl.competition.crossplay import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "95% intervals" in text and "%%" not in text


@pytest.mark.slow
def test_bots_competitive_matrix_is_consistent(tmp_path: Path) -> None:
    players = parse_players(["random", "rule"], "matrix")
    mode, played = crossplay(players, "matching-pennies", episodes=8, seed=1)
    assert mode == "competitive" and len(played) == 8
    # seats alternate: the row player sits on alice in even episodes, on bob in odd ones
    assert [e.seats["alice"] for e in played] == ["random", "rule"] * 4
    games = games_of(played)
    cells = {(c["row"], c["col"]): c for c in competitive_cells(["random", "rule"], games)}
    ab, ba = cells[("random", "rule")], cells[("rule", "random")]
    assert ab["games"] == ba["games"] == 8
    assert (ab["wins"], ab["draws"], ab["losses"]) == (ba["losses"], ba["draws"], ba["wins"])
    assert ab["win_lo"] <= ab["win_rate"] <= ab["win_hi"]
    # zero-sum: the row's mean return is the column's negated, and lies inside its interval
    assert ab["mean_return"] == pytest.approx(-ba["mean_return"])
    assert ab["return_lo"] <= ab["mean_return"] <= ab["return_hi"]
    rows = [e.seats["alice"] == "random" for e in played]
    own = [e.returns["alice" if r else "bob"] for e, r in zip(played, rows)]
    assert ab["mean_return"] == pytest.approx(sum(own) / len(own))
    # every episode's returns decide it: the rule bot as bob plays heads until alice strays
    for e in played:
        assert sum(e.returns.values()) == pytest.approx(0.0)  # zero-sum, no malformed bots
    again = crossplay(players, "matching-pennies", episodes=8, seed=1)[1]
    assert [e.returns for e in again] == [e.returns for e in played]
    payload = write_results(tmp_path, mode, players, played, 8, bootstrap=20)
    assert payload["ratings"]["random"]["rating"] == pytest.approx(1000.0)  # the anchor
    for name in ("crossplay.md", "crossplay.csv", "crossplay.png", "crossplay.json"):
        assert (tmp_path / name).stat().st_size > 0


def test_cooperative_mode_pairs_held_out_partners(tmp_path: Path) -> None:
    players = parse_players(["random", "rule"], "signal")
    mode, played = crossplay(players, "signal", episodes=4, seed=0)
    assert mode == "cooperative"
    pairs = {(e.row, e.col) for e in played}
    assert pairs == {("random", "random"), ("random", "rule"), ("rule", "rule")}
    payload = write_results(tmp_path, mode, players, played, 4)
    cells = {(c["row"], c["col"]): c for c in payload["cells"]}
    assert cells[("rule", "rule")]["success"] == 1.0  # rule bots solve signal together
    assert cells[("random", "rule")]["team_return"] == cells[("rule", "random")]["team_return"]
    assert payload["ratings"] is None


def _rule_chips_against_random() -> dict[int, float]:
    """The exact distribution of the rule bot's net chips a hand against the random bot in
    Kuhn Poker, both seats equally (every deal, every move weighted by its probability: the
    rule bot's equilibrium policy, the random bot uniform over the legal moves)."""
    from marl.scenarios.builtin.kuhn_poker import CARDS, equilibrium_policy, legal_moves

    chips: dict[int, float] = {}
    for rule_seat in (0, 1):
        for deal in itertools.permutations(range(3), 2):
            stack = [((), 1.0 / 12)]  # (moves so far, probability); 6 deals x 2 seats
            while stack:
                history, p = stack.pop()
                legal = legal_moves(history)
                if not legal:  # ante 1, bet 1: the winner takes half the pot net
                    pot = 2 + sum(m in ("bet", "call") for m in history)
                    if history[-1] == "fold":
                        winner = len(history) % 2  # the player after the folder
                    else:
                        winner = 0 if deal[0] > deal[1] else 1
                    won = pot // 2 * (1 if winner == rule_seat else -1)
                    chips[won] = chips.get(won, 0.0) + p
                    continue
                seat = len(history) % 2
                if seat == rule_seat:
                    policy = equilibrium_policy(CARDS[deal[seat]], history, seat == 0)
                else:
                    policy = dict.fromkeys(legal, 1 / len(legal))
                stack += [((*history, m), p * q) for m, q in policy.items() if q]
    return chips


@pytest.mark.slow
def test_kuhn_poker_is_ranked_by_chips_so_the_rule_bot_ranks_above_random(
    tmp_path: Path,
) -> None:
    """The Nash bot wins chips from the random bot (+0.139 a hand) but fewer than half of the
    hands (0.479): by hands won it is expected to rank below random; by chips, the ranking
    marl eval uses for a game that declares a payoff unit, above it. The hands played are
    computed from the exact mean and variance so that the measured mean lies within 5 standard
    errors of the exact one (all but 6e-7 of the time), which keeps it above zero."""
    from marl.scenarios.registry import make

    exact = _rule_chips_against_random()
    mean = sum(v * p for v, p in exact.items())
    sd = math.sqrt(sum((v - mean) ** 2 * p for v, p in exact.items()))
    assert mean == pytest.approx(0.1389, abs=1e-4) and sd == pytest.approx(1.377, abs=1e-3)
    assert sum(p for v, p in exact.items() if v > 0) < 0.5  # fewer than half the hands won
    hands = math.ceil((5 * sd / mean) ** 2)  # 5 standard errors = the mean
    hands += hands % 2  # whole pairs: each scenario seed played from both seats
    unit = make("kuhn-poker-v0").rules_cls.info.payoff_unit
    assert unit == "chips"
    players = parse_players(["random", "rule"], "kuhn_poker")
    mode, played = crossplay(players, "kuhn-poker-v0", episodes=hands, seed=0, backends={})
    payload = write_results(tmp_path, mode, players, played, hands, bootstrap=100, payoff_unit=unit)
    assert payload["ranked_by"] == "payoff" and payload["payoff_unit"] == "chips"
    ranking = payload["payoff_ratings"]
    rule = ranking["rule"]
    assert abs(rule["rating"] - mean) < 5 * sd / math.sqrt(hands)
    assert rule["rating"] > 0 > ranking["random"]["rating"]
    assert ranking["random"]["rating"] == pytest.approx(-rule["rating"])  # zero-sum
    assert rule["lo"] <= rule["rating"] <= rule["hi"]
    cell = next(c for c in payload["cells"] if (c["row"], c["col"]) == ("rule", "random"))
    assert cell["mean_payoff"] == pytest.approx(rule["rating"])  # one opponent: head to head
    assert 0 < cell["win_rate"] < 0.55  # the second column, kept (0.479 expected)
    text = (tmp_path / "crossplay.md").read_text()
    table = text[text.index("| player | chips per game vs the field") :]
    assert table.index("| rule |") < table.index("| random |")
    # a caller that declares no unit gets the win-based table as before
    plain = write_results(tmp_path / "plain", mode, players, played[:40], 20, bootstrap=10)
    assert plain["ranked_by"] == "elo" and plain["payoff_ratings"] is None
    assert (
        "Bradley-Terry ratings on the Elo scale"
        in (tmp_path / "plain" / "crossplay.md").read_text()
    )


class _Counting:
    """A real backend that counts its generate calls."""

    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner, self.calls, self.rows = inner, 0, 0
        self.tokenizer = inner.tokenizer

    def generate(self, prompts, sampling, adapters=None, seed=None):  # noqa: ANN001, ANN201
        self.calls += 1
        self.rows += len(prompts)
        return self.inner.generate(prompts, sampling, adapters=adapters, seed=seed)


def test_a_league_snapshot_is_the_runs_initial_model(tmp_path: Path) -> None:
    import torch
    import yaml

    from marl.agents.models import ModelSpec, load_model

    model, _ = load_model(ModelSpec(kind="tiny", seed=4))
    (tmp_path / "run" / "league").mkdir(parents=True)
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump({"model": {"kind": "tiny"}}))
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied
    torch.save(state, tmp_path / "run" / "league" / "snapshot_0.pt")
    (player,) = parse_players([str(tmp_path / "run" / "league" / "snapshot_0.pt"), "random"])[:1]
    assert (player.name, player.kind) == ("run@0", "snapshot")
    loaded = build_backends([player])["run@0"].model  # built with seed 0, then loaded
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    (tmp_path / "run" / "config.yaml").unlink()
    with pytest.raises(RunError, match="no .*config.yaml"):
        build_backends([player])


@pytest.mark.slow
def test_generation_is_batched_over_every_pairing() -> None:
    from marl.agents.backends import SamplingConfig

    players = [
        Player("a", "model", model={"kind": "tiny", "seed": 1}),
        Player("b", "model", model={"kind": "tiny", "seed": 2}),
        Player("random", "bot", bot="random"),
    ]
    backends = {k: _Counting(v) for k, v in build_backends(players).items()}
    _, played = crossplay(
        players,
        "matching-pennies",
        episodes=4,
        seed=0,
        sampling=SamplingConfig(max_new_tokens=6),
        backends=backends,  # type: ignore[arg-type]
    )
    assert len(played) == 3 * 4  # three pairings
    rounds = 3  # matching-pennies: three stages, one action round each
    assert backends["a"].calls == backends["b"].calls == rounds  # one call per model per round
    # a plays 8 episodes (vs b, vs random), one seat each, every round
    assert backends["a"].rows == 8 * rounds


@pytest.mark.slow
@pytest.mark.subprocess
def test_cli_eval_on_trained_checkpoints(marl_cli, tmp_path: Path) -> None:
    for seed in (0, 1):
        done = marl_cli(
            "train",
            "model=tiny",
            "scenario=matching_pennies",
            "league=pool",
            "train.steps=2",
            "train.group_size=2",
            "sampling.max_new_tokens=6",
            "logging.progress=false",
            f"seed={seed}",
            f"hydra.run.dir={tmp_path / f'seed{seed}'}",
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "eval"
    done = marl_cli(
        "eval",
        str(tmp_path / "seed0"),
        f"late={tmp_path / 'seed1' / 'checkpoints'}",
        "model:tiny",
        f"init={tmp_path / 'seed0' / 'league' / 'snapshot_0.pt'}",
        "random",
        "rule",
        "--episodes",
        "4",
        "--bootstrap",
        "20",
        "--out",
        str(out),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| seed0 |" in done.stdout and "Bradley-Terry" in done.stdout
    with open(out / "crossplay.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 * 5  # ordered pairs of distinct players
    payload = json.loads((out / "crossplay.json").read_text())
    assert set(payload["ratings"]) == {"seed0", "late", "tiny", "init", "random", "rule"}
    assert len(payload["episodes"]) == 15 * 4
    assert (out / "crossplay.png").read_bytes()[:4] == b"\x89PNG"
    bad = marl_cli("eval", str(tmp_path / "seed0"), str(tmp_path / "missing"), timeout=300)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert f"checkpoint not found: {tmp_path / 'missing'}" in bad.stderr


def test_eval_reads_the_checkpoints_sampling_through_the_config_schema() -> None:
    """No second set of defaults: what a checkpoint's config leaves out is the sampling
    group's default, and ``--max-new-tokens`` / ``--temperature`` override what it says."""
    from argparse import Namespace

    from marl.agents.backends import SamplingConfig
    from marl.competition.crossplay import _sampling

    no_flags = Namespace(max_new_tokens=None, temperature=None)
    assert _sampling({}, no_flags) == SamplingConfig()
    saved = {"sampling": {"max_new_tokens": 7, "response_prefix": True}}
    assert _sampling(saved, no_flags) == SamplingConfig(max_new_tokens=7, response_prefix=True)
    flags = Namespace(max_new_tokens=9, temperature=0.5)
    assert _sampling(saved, flags) == SamplingConfig(9, 0.5, response_prefix=True)
