"""The README's scenario table lists every registered scenario, and a scenario's name means the
same thing on the command line (``scenario=<file>``) as in ``marl.make(<name>)``."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from scenarios.registry import UNAVAILABLE, list_scenarios, load_builtins, resolve_name

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = {"textarena-v0"}  # registered only where its optional extra is installed


def readme_scenarios() -> set[str]:
    """The first-column names of the README's ``## Scenarios`` table."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Scenarios", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z0-9-]+-v\d+)` \|", section, flags=re.MULTILINE))


def test_the_readme_table_lists_every_registered_scenario_and_no_other() -> None:
    load_builtins()
    registered = set(list_scenarios()) | set(UNAVAILABLE)
    listed = readme_scenarios()
    assert registered - listed == set(), f"registered but not in the README: {registered - listed}"
    assert listed - registered - OPTIONAL == set(), f"in the README only: {listed - registered}"


def test_a_config_named_after_a_scenario_means_what_marl_make_means() -> None:
    """``configs/scenario/signal.yaml`` is what ``marl.make("signal")`` makes (the latest
    version); ``signal_v0.yaml`` is signal-v0. A config file's stem, with ``_`` read as ``-``,
    resolves to the scenario that file names."""
    checked = 0
    for path in sorted((ROOT / "configs" / "scenario").glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["name"]
        if name in OPTIONAL and name not in list_scenarios():
            continue
        bare = path.stem.replace("_", "-")
        meant = resolve_name(bare)
        assert meant == name, f"{path.name}: names {name}, but marl.make({bare!r}) makes {meant}"
        checked += 1
    assert checked >= 10
    assert resolve_name("signal") == "signal-v1"
