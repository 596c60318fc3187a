"""``marl validate`` answers hostile values with one line naming the key (issue 29, item 4).

- A list where the rules declare ``list[str]`` (spotlight's ``scouts: [[ann]]``, the audit's
  ``TypeError: unhashable type: 'list'``) is refused by the schema's type check, naming the key.
- A rules ``check_params`` that raises anyway is one problem under ``params``.
- A ``rules_module`` that exits when imported (``unittest.__main__``) is one problem naming
  ``rules_module``; it neither ends ``marl validate`` nor prints its own output.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marl.cli import main
from marl.scenarios.registry import load_document
from marl.scenarios.rules import RULES


def scenario_file(folder: Path, base: str, name: str, **changes: object) -> Path:
    document, _ = load_document(base)
    params = {**(document.get("params") or {}), **changes.pop("params", {})}  # type: ignore[dict-item]
    document = {**document, "name": f"{name}-v0", "params": params, **changes}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("base", "params", "problem"),
    [
        ("spotlight", {"scouts": [["ann"]]}, "params.scouts: must be a list of strings or null"),
        ("spotlight", {"scouts": ["ann", 3]}, "params.scouts: must be a list of strings or null"),
        ("spotlight", {"scouts": "ann"}, "params.scouts: must be a list of strings or null"),
        ("bargain", {"items": [{"a": 1}]}, "params.items: must be a list of strings"),
        (
            "unison",
            {"scored_agents": [[1]]},
            "params.scored_agents: must be a list of strings or null",
        ),
    ],
)
def test_a_nested_list_where_strings_belong_is_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture, base: str, params: dict, problem: str
) -> None:
    path = scenario_file(tmp_path, base, "bad", params=params)
    assert main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{path}: {problem}, got {params[next(iter(params))]!r}"]
    assert err == ""


def test_lists_of_strings_still_validate(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = scenario_file(tmp_path, "spotlight", "good", params={"scouts": ["ann", "bob"]})
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{path}: ok"]


def test_a_check_params_that_raises_is_one_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(cls, params, agents):  # noqa: ANN001, ANN202 - a rules check with a bug
        return [problem for problem in params["no such key"]]

    monkeypatch.setattr(RULES["spotlight"], "check_params", classmethod(crash))
    path = scenario_file(tmp_path, "spotlight", "crash", params={"scouts": ["ann"]})
    assert main(["validate", str(path)]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: params: rules 'spotlight' could not check these params (KeyError: 'no such key')"
    ]


@pytest.mark.subprocess
def test_a_rules_module_that_exits_is_one_problem_not_the_end_of_validate(
    marl_cli, tmp_path: Path
) -> None:
    exits = tmp_path / "exits.yaml"
    exits.write_text("name: exits-v0\nrules: matrix\nrules_module: unittest.__main__\n")
    scouts = scenario_file(tmp_path, "spotlight", "scouts", params={"scouts": [["ann"]]})
    done = marl_cli("validate", str(exits), str(scouts), timeout=300)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"{exits}: rules_module: cannot import 'unittest.__main__': it exits when imported "
        "(SystemExit: True); name a module that only defines and registers rules"
    )
    # validate went on to the next problem of that file, and to the next file
    assert all(line.startswith(f"{exits}: ") for line in lines[:-1])
    assert lines[-1] == (
        f"{scouts}: params.scouts: must be a list of strings or null, got [['ann']]"
    )
    assert "Traceback" not in done.stderr and "Ran 0 tests" not in done.stderr + done.stdout
    assert done.stderr == ""


HUGE = "x" * 500_000


def _scenarios_with_params() -> list[tuple[str, str]]:
    from marl.scenarios.registry import list_scenarios, load_builtins

    load_builtins()
    found = []
    for name in list_scenarios():
        document, _ = load_document(name)
        for key in sorted(document.get("params") or {}):
            found.append((name, key))
    return found


@pytest.mark.parametrize(("name", "key"), _scenarios_with_params())
def test_a_huge_value_in_any_param_gives_short_lines(name: str, key: str) -> None:
    """Every registered scenario, every param set to a 500,000-character string (and a huge
    list of them): each problem is one line of bounded length, never the value itself."""
    from marl.scenarios.problems import MAX_MESSAGE, ScenarioError
    from marl.scenarios.validation import validate_scenario

    document, _ = load_document(name)
    for value in (HUGE, [HUGE] * 3):
        data = {**document, "params": {**document["params"], key: value}}
        try:
            problems = validate_scenario(data)
        except ScenarioError as exc:
            problems = exc.problems
        for problem in problems:
            line = str(problem)
            assert "\n" not in line and len(line) <= MAX_MESSAGE + len(problem.path) + 2, (
                f"{name} params.{key}: a {len(line)}-character line"
            )


def test_a_long_message_is_cut_in_the_middle() -> None:
    from marl.scenarios.problems import MAX_MESSAGE, Problem

    problem = Problem("params.target", "must be one character, got " + HUGE + " (the end)")
    assert len(problem.message) <= MAX_MESSAGE
    assert problem.message.startswith("must be one character, got xxx")
    assert problem.message.endswith(" (the end)") and "characters)..." in problem.message
    assert Problem("k", "short").message == "short"


def test_a_hundred_thousand_agents_are_refused_at_once_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Sizes that scale the work have a bound checked first: 100,000 names took 3 minutes
    (quadratic duplicate checks), and a graph over them would hold 10^10 edges."""
    import time

    from marl.scenarios.validation import MAX_AGENTS

    names = [f"a{i}" for i in range(100_000)]
    path = scenario_file(tmp_path, "majority-vote", "crowd", agents=names, roles={})
    start = time.monotonic()
    assert main(["validate", str(path)]) == 1
    assert time.monotonic() - start < 30
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{path}: agents: 100,000 agents, over the limit of {MAX_AGENTS:,}"]
    assert err == ""


def test_a_thousand_agents_are_checked_in_linear_time() -> None:
    """At the bound every name is still checked (duplicates and look-alikes by set and dict
    lookups, not list scans): the duplicate is found, and the rules' agent count is told."""
    import time

    from marl.scenarios.validation import MAX_AGENTS, validate_scenario

    names = [f"a{i}" for i in range(MAX_AGENTS - 1)] + ["a7"]
    document, _ = load_document("majority-vote")
    start = time.monotonic()
    problems = validate_scenario({**document, "agents": names, "roles": {}})
    assert time.monotonic() - start < 5
    keys = [p.path for p in problems]
    assert f"agents[{MAX_AGENTS - 1}]" in keys and "agents" in keys, keys


def test_the_shaping_and_round_bounds_hold_at_their_edges() -> None:
    """``reward.shaping`` takes at most MAX_TERMS terms and ``episode.rounds`` at most 1,000
    (docs/security.md, Limits): the bound itself validates, one past it is one problem naming
    the key."""
    from marl.scenarios.shaping import MAX_TERMS
    from marl.scenarios.validation import validate_scenario

    document, _ = load_document("signal")
    term = {"kind": "format", "weight": 0.1, "until_step": 3}

    def problems(**changes: object) -> list[str]:
        return [f"{p.path}: {p.message}" for p in validate_scenario({**document, **changes})]

    assert problems(reward={"shaping": [term] * MAX_TERMS}) == []
    assert problems(reward={"shaping": [term] * (MAX_TERMS + 1)}) == [
        f"reward.shaping: at most {MAX_TERMS} terms, got {MAX_TERMS + 1}"
    ]
    assert problems(episode={"rounds": 1000}) == []
    assert problems(episode={"rounds": 1001}) == [
        "episode.rounds: must be an integer between 1 and 1000"
    ]
