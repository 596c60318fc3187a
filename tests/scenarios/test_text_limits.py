"""No text of a scenario file may be longer than ``MAX_TEXT_CHARS`` (issue 42 item 3): a 900 KB
``system_prompt`` fitted the 1 MB file bound and validated ``ok``, then one episode took over 4
minutes and 2.7 GB. Every string, a value or a key at any depth, is bounded by the one constant,
and each one over it is one line naming its key path, from ``marl validate`` and from every
loader (a run's ``scenario.overrides`` too)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marl.scenarios.problems import ScenarioError
from marl.scenarios.registry import load_document, make
from marl.scenarios.validation import MAX_TEXT_CHARS, validate_scenario

WHY = f"over the limit of {MAX_TEXT_CHARS:,} (a prompt must fit the model's context)"


def document(base: str, **changes: object) -> dict:
    data, _ = load_document(base)
    return {**data, **changes}


@pytest.mark.parametrize(
    ("base", "changes", "path", "size"),
    [
        ("relay-v0", {"system_prompt": "x" * 900_000}, "system_prompt", 900_000),
        ("relay-v0", {"description": "x" * 40_000}, "description", 40_000),
        ("relay-v0", {"roles": {"alice": "x" * 40_000}}, "roles.alice", 40_000),
        ("bargain-v0", {"params": {"items": ["book", "x" * 33_000]}}, "params.items[1]", 33_000),
    ],
    ids=["system_prompt", "description", "role", "params-list"],
)
def test_a_text_over_the_limit_is_one_problem_naming_its_key(
    base: str, changes: dict, path: str, size: int
) -> None:
    problems = validate_scenario(document(base, **changes))
    assert [str(p) for p in problems] == [f"{path}: {size:,} characters, {WHY}"]


def test_a_key_over_the_limit_is_refused_too_and_the_limit_itself_is_allowed() -> None:
    problems = validate_scenario(document("relay-v0", roles={"k" * 40_000: "a role"}))
    assert f"a key of 40,000 characters, {WHY}" in [p.message for p in problems]
    assert validate_scenario(document("relay-v0", system_prompt="x" * MAX_TEXT_CHARS)) == []


def test_a_run_s_scenario_overrides_are_bounded_like_a_file() -> None:
    with pytest.raises(ScenarioError) as info:
        make("relay-v0", system_prompt="x" * (MAX_TEXT_CHARS + 1))
    assert [str(p) for p in info.value.problems] == [
        f"system_prompt: {MAX_TEXT_CHARS + 1:,} characters, {WHY}"
    ]


@pytest.mark.subprocess
def test_marl_validate_refuses_a_900_kb_system_prompt_in_one_line(marl_cli, tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    data = document("relay-v0", name="huge-v0", system_prompt="x" * 900_000)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert 900_000 < path.stat().st_size < 1_000_000  # within the reader's 1 MB file bound
    done = marl_cli("validate", str(path), timeout=120)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"{path}: system_prompt: 900,000 characters, {WHY}"]
    assert done.stderr == ""
