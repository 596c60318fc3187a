"""Golden transcripts: every scenario played by each of its scripted bots at seed 0, diffed
against the committed ``tests/golden/<scenario>__<bot>.txt``.

A change in routing, prompts, rules or bots shows up here as a readable unified diff. When the
change is intended, regenerate the files and commit them with it::

    .venv/bin/python tests/golden/regenerate.py
"""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

import pytest

GOLDEN_SCRIPT = Path(__file__).resolve().parents[1] / "golden" / "regenerate.py"
_spec = importlib.util.spec_from_file_location("golden_regenerate", GOLDEN_SCRIPT)
golden = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(golden)

CASES = golden.cases()


@pytest.mark.parametrize(("scenario", "bot"), CASES, ids=[f"{s}__{b}" for s, b in CASES])
def test_transcript_matches_the_golden_file(scenario: str, bot: str) -> None:
    path = golden.golden_path(scenario, bot)
    if not path.exists():
        pytest.fail(f"no golden transcript {path.name}; run: python {GOLDEN_SCRIPT}")
    expected = path.read_text(encoding="utf-8")
    actual = golden.render(scenario, bot)
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"golden/{path.name}",
                tofile="now",
            )
        )
        pytest.fail(
            f"transcript of {scenario} with bot {bot!r} changed; if intended, run "
            f"python {GOLDEN_SCRIPT} and commit the files\n{diff}",
            pytrace=False,
        )


def test_a_replay_is_identical() -> None:
    scenario, bot = CASES[0]
    assert golden.render(scenario, bot) == golden.render(scenario, bot)


def test_every_golden_file_belongs_to_a_registered_scenario_and_bot() -> None:
    wanted = {golden.golden_path(s, b).name for s, b in CASES}
    stale = sorted(
        p.name
        for p in golden.GOLDEN_DIR.glob("*.txt")
        if p.name not in wanted and not golden.unavailable(p)
    )
    assert not stale, f"stale golden files {stale}; run: python {GOLDEN_SCRIPT}"


def test_the_rule_bots_solve_their_cooperative_scenarios() -> None:
    for name in ("relay-v0", "signal-v0"):
        text = golden.golden_path(name, "rule").read_text(encoding="utf-8")
        returns = text.split("returns: ")[-1].splitlines()[0]
        assert all(part.endswith("=+1.000") for part in returns.split(", ")), (name, returns)
