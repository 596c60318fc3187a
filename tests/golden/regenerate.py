"""Regenerate the golden transcripts that ``tests/scenarios/test_golden.py`` diffs against.

One file per registered scenario and scripted bot, ``<scenario>__<bot>.txt``: the output of
``marl.play.play_scripted(scenario, bot, seed=0)``, which is what ``marl play scenario=<scenario>
agents=scripted bot=<bot> seed=0`` prints. Run it after a deliberate change to routing, prompts,
rules or bots, read the diff (``git diff tests/golden``), and commit the files with the change::

    .venv/bin/python tests/golden/regenerate.py          # rewrite every file, drop stale ones
    .venv/bin/python tests/golden/regenerate.py --check  # exit 1 if any file is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

GOLDEN_DIR = Path(__file__).resolve().parent
SEED = 0


def cases() -> list[tuple[str, str]]:
    """Every (scenario, bot) pair that has a golden transcript."""
    from marl.scenarios.bots import bot_names
    from marl.scenarios.registry import list_scenarios, make

    return [(name, bot) for name in list_scenarios() for bot in bot_names(make(name).spec.rules)]


def unavailable(path: Path) -> bool:
    """Whether ``path`` is the transcript of a scenario whose optional extra is not installed
    here (``textarena-v0`` without textarena): kept, neither checked nor stale."""
    from marl.scenarios.registry import UNAVAILABLE, list_scenarios

    list_scenarios()  # registers the built-ins, and records the unavailable ones
    return path.name.split("__")[0] in UNAVAILABLE


def golden_path(scenario: str, bot: str) -> Path:
    """Where the golden transcript of ``scenario`` played by ``bot`` lives."""
    return GOLDEN_DIR / f"{scenario}__{bot}.txt"


def render(scenario: str, bot: str) -> str:
    """The transcript as it is today (with a final newline, as the file holds it)."""
    from marl.play import play_scripted

    return play_scripted(scenario, bot, SEED) + "\n"


def main(argv: list[str]) -> int:
    """Rewrite (or with ``--check`` only compare) every golden file; remove stale ones."""
    check = "--check" in argv
    wanted = {golden_path(s, b): (s, b) for s, b in cases()}
    outdated = []
    for path, (scenario, bot) in sorted(wanted.items()):
        text = render(scenario, bot)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            outdated.append(path.name)
            if not check:
                path.write_text(text, encoding="utf-8")
    stale = sorted(p for p in GOLDEN_DIR.glob("*.txt") if p not in wanted and not unavailable(p))
    for path in stale:
        outdated.append(f"{path.name} (no such scenario/bot)")
        if not check:
            path.unlink()
    verb = "out of date" if check else "rewritten"
    print(f"{len(wanted)} golden transcripts; {verb}: {', '.join(outdated) or 'none'}")
    return 1 if check and outdated else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
