"""``marl validate``, ``marl play`` and ``marl list``: the failure paths and ``play`` run as real
subprocesses, the rest in-process through the same ``marl.cli.main`` the console script calls.

Each subprocess pays about 7 CPU-seconds of imports (``marl.errors`` imports
``marl.agents.models``, hence torch and transformers, even for ``validate``), so the module
starts its three commands at once in one fixture and the tests read their results.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marl.cli import main
from marl.scenarios.bots import bot_names
from marl.scenarios.registry import BUILTIN_DIR, list_scenarios, load_document

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
BUILTIN_FILES = sorted(str(p) for p in BUILTIN_DIR.glob("*.yaml"))


def marl_command() -> list[str]:
    """The venv's ``marl`` script beside this interpreter, else ``python -m marl.cli``."""
    script = Path(sys.executable).with_name("marl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "marl.cli"]


BROKEN = {
    "name": "broken-v0",
    "rules": "relay",
    "agents": ["alice", "bob", "dave"],
    "colour": "red",
    "graph": {
        "topology": "explicit",
        "edges": [["alice", "bob"], ["bob", "dave"], ["dave", "alice"], ["alice", "carol"]],
    },
    "reward": {"cooperation": 2},
}
BROKEN_LINES = [
    "colour: unknown key (allowed: agents, description, episode, graph, messages, name, params, "
    "reward, roles, rules, rules_module, system_prompt, tools)",
    "graph.edges[3]: unknown agent 'carol'",
    "reward.cooperation: must be between 0 (zero-sum) and 1 (fully cooperative)",
]


def write_bad_files(folder: Path) -> dict[str, Path]:
    files = {
        "broken": folder / "broken.yaml",
        "syntax": folder / "syntax.yaml",
        "binary": folder / "binary.yaml",
        "deep": folder / "deep.yaml",
        "missing": folder / "missing.yaml",
    }
    files["broken"].write_text(yaml.safe_dump(BROKEN, sort_keys=False))
    files["syntax"].write_text("name: x\nagents: [a, b\nrules: relay\n")
    files["binary"].write_bytes(bytes(range(256)) * 8)
    files["deep"].write_text("[" * 600)
    return files


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Start every command at once; wait for all; map name -> (returncode, stdout, stderr)."""
    folder = tmp_path_factory.mktemp("cli")
    bad = write_bad_files(folder)
    commands = {
        "validate_bad": ["validate", *(str(p) for p in bad.values())],
        "play": ["play", "scenario=relay", "agents=scripted", "bot=rule", "seed=0"],
        "play_unknown": ["play", "scenario=nope"],
    }
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONWARNINGS": "ignore"}
    procs = {
        name: subprocess.Popen(
            marl_command() + args,
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        )
        for name, args in commands.items()
    }
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=180)
        results[name] = (proc.returncode, out, err)
    results["files"] = bad
    return results


def no_traceback(result: tuple[int, str, str]) -> None:
    _, out, err = result
    assert "Traceback" not in out + err, out + err


def test_validate_accepts_every_builtin_file(capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", *BUILTIN_FILES]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [f"{path}: ok" for path in BUILTIN_FILES]


def test_validate_fails_on_each_bad_file_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    for path in write_bad_files(tmp_path).values():
        assert main(["validate", str(path)]) == 1, path
        out = capsys.readouterr().out
        assert out and all(line.startswith(f"{path}: ") for line in out.splitlines())


@pytest.mark.slow
@pytest.mark.subprocess
def test_validate_prints_one_line_per_problem_and_never_a_traceback(runs: dict) -> None:
    code, out, err = runs["validate_bad"]
    files = runs["files"]
    assert code == 1, out + err
    no_traceback(runs["validate_bad"])
    lines = out.splitlines()
    broken = [line for line in lines if line.startswith(str(files["broken"]) + ": ")]
    assert broken == [f"{files['broken']}: {line}" for line in BROKEN_LINES]
    expected = {
        "syntax": "YAML syntax error at line 3, column 6: expected ',' or ']'",
        "binary": "cannot read",
        "deep": "YAML nested too deeply",
        "missing": "file not found",
    }
    for key, text in expected.items():
        mine = [line for line in lines if line.startswith(str(files[key]) + ": ")]
        assert len(mine) == 1 and text in mine[0], (key, mine)
    assert len(lines) == len(BROKEN_LINES) + len(expected), "one line per problem, nothing else"


@pytest.mark.slow
@pytest.mark.subprocess
def test_play_prints_the_golden_transcript(runs: dict) -> None:
    code, out, err = runs["play"]
    assert code == 0, err
    assert out == (GOLDEN_DIR / "relay-v0__rule.txt").read_text(encoding="utf-8")
    no_traceback(runs["play"])


@pytest.mark.slow
@pytest.mark.subprocess
def test_play_with_an_unknown_scenario_fails_cleanly(runs: dict) -> None:
    code, out, err = runs["play_unknown"]
    assert code != 0
    assert err.strip().splitlines() == [
        "error: scenario=nope: no scenario is registered under that name and there is no file "
        "'nope' here; `marl list` shows the registered ones, and a YAML file is given by its "
        "path (scenario=./nope.yaml)"
    ]  # one line, not Hydra's "In 'train': Could not find 'scenario/nope'" and its list
    no_traceback(runs["play_unknown"])


def test_list_shows_every_scenario_with_its_bots(capsys: pytest.CaptureFixture) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = list_scenarios()
    assert [line.split()[0] for line in lines] == names
    for line, name in zip(lines, names):
        data, _ = load_document(name)
        assert ", ".join(bot_names(data["rules"])) in line
        assert data.get("description", "") in line


def test_a_scenario_given_as_a_path_becomes_a_file_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``scenario=./my_game.yaml`` (docs/scenarios.md, "Write your own scenario", step 3) is
    not a Hydra option: it becomes ``scenario=file scenario.name=./my_game.yaml``; names and
    Hydra's own syntax pass as they are; a value that is neither a scenario nor a file is one
    line naming it."""
    from marl.cli import FILE_OPTION, ScenarioArgError, register_scenario_options, scenario_args

    options = register_scenario_options()
    assert {"relay", "stag-hunt", FILE_OPTION} <= options
    monkeypatch.chdir(tmp_path)
    (tmp_path / "guess").write_text("name: guess-v0\n")
    plain = ["scenario=relay", "seed=3", "scenario=relay,signal", "scenario=choice(relay,unison)"]
    assert scenario_args(plain, options) == plain
    assert scenario_args(["scenario=./my_game.yaml", "seed=1"], options) == [
        "scenario=file",
        "scenario.name=./my_game.yaml",
        "seed=1",
    ]
    assert scenario_args(["+scenario=games/a.yml,games/b.yml"], options) == [
        "+scenario=file",
        "scenario.name=games/a.yml,games/b.yml",
    ]
    assert scenario_args(["scenario=guess"], options)[1] == "scenario.name=guess"  # a file here
    with pytest.raises(ScenarioArgError, match=r"^scenario=nope: no scenario is registered"):
        scenario_args(["scenario=nope"], options)
    with pytest.raises(ScenarioArgError, match="either registered scenarios or files"):
        scenario_args(["scenario=relay,./x.yaml"], options)
