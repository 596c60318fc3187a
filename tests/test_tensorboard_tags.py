"""Every tag a run writes is documented in docs/tensorboard.md: three tiny runs with every
tracker on (signal: warm-up, held-out evaluation, listening, emergence, checkpoints; Kuhn Poker:
the league and exploitability; relay: Shapley credit) are read back with TensorBoard's own
``EventAccumulator`` and each tag is matched against the page's table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "tensorboard.md"
PLACEHOLDER = re.compile(r"<u>-><v>|<[a-z]+>")
SUMMARY = "final/<tag>"


def documented_patterns(text: str) -> list[str]:
    """The tag patterns of the page's tables, expanded by its reading rules: a name without a
    ``/`` is a sibling of the full tag before it, a name starting with ``_`` a suffix of each
    tag before it in the row."""
    patterns: list[str] = []
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| tags") or line.startswith("|---"):
            continue
        first_cell = line.split(" | ", 1)[0]
        row: list[str] = []
        parent = ""  # a name without "/" before any full tag is a top-level tag (`config`)
        for token in re.findall(r"`([^`]+)`", first_cell):
            if token.startswith("_"):
                row += [tag + token for tag in row if not tag.endswith(("_low", "_high"))]
            elif "/" in token:
                row.append(token)
                parent = token.rsplit("/", 1)[0]
            else:
                row.append(f"{parent}/{token}" if parent else token)
        patterns += row
    return patterns


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """``policies/<id>/loss`` as a regex: each placeholder is one path segment."""
    parts, last = [], 0
    for match in PLACEHOLDER.finditer(pattern):
        parts.append(re.escape(pattern[last : match.start()]))
        parts.append(r"[^/]+->[^/]+" if match.group() == "<u>-><v>" else r"[^/]+")
        last = match.end()
    parts.append(re.escape(pattern[last:]))
    return re.compile("".join(parts) + r"\Z")


def undocumented(tags: set[str], patterns: list[str]) -> list[str]:
    """The tags no pattern matches; ``final/<tag>`` takes any documented tag after ``final/``."""
    compiled = [compile_pattern(p) for p in patterns if p != SUMMARY]

    def known(tag: str) -> bool:
        return any(c.match(tag) for c in compiled)

    summary = SUMMARY in patterns
    return sorted(
        t
        for t in tags
        if not known(t) and not (summary and t.startswith("final/") and known(t[len("final/") :]))
    )


def run_tags(log_dir: Path) -> set[str]:
    """Scalar, image and text tags of a run's event files (text tags without TensorBoard's
    ``/text_summary``; the HParams plugin's own ``_hparams_/*`` left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    kinds = events.Tags()
    tags = set(kinds["scalars"]) | set(kinds["images"])
    for tag in kinds["tensors"]:
        if not tag.startswith("_hparams_/"):
            tags.add(tag.removesuffix("/text_summary"))
    return tags


def test_the_reading_rules_expand_siblings_and_suffixes() -> None:
    text = (
        "| tags | what |\n|---|---|\n"
        "| `policies/<id>/loss`, `pg_loss` | x |\n"
        "| `eval/listening/cic`, `success`, `_low` | y |\n"
        "| `comm/edges/<u>-><v>` | z |\n"
    )
    patterns = documented_patterns(text)
    assert "policies/<id>/pg_loss" in patterns and "eval/listening/success_low" in patterns
    assert undocumented({"policies/shared/pg_loss", "comm/edges/a->b"}, patterns) == []
    assert undocumented({"policies/shared/bogus", "comm/edges/a"}, patterns) == [
        "comm/edges/a",
        "policies/shared/bogus",
    ]
    assert undocumented({"final/policies/shared/loss"}, [*patterns, SUMMARY]) == []
    assert undocumented({"final/nope"}, [*patterns, SUMMARY]) == ["final/nope"]


RUNS = {
    "signal": [
        "scenario=signal",
        "warmup.steps=1",
        "warmup.bot=rule",
        "train.eval_episodes=4",
        "train.eval_every=1",
        "emergence.listening_episodes=2",
        "emergence.counterfactuals=2",
        "emergence.influence_every=1",
        "train.checkpoint_every=1",
        "logging.transcripts_every=1",
        "sampling.max_new_tokens=6",
    ],
    "kuhn": [
        "--config-name",
        "kuhn",
        "league=pool",
        "algo=rae",
        "league.snapshot_every=1",
        "train.exploitability_every=1",
        "train.eval_episodes=2",
        "warmup.steps=0",
        "algo.minibatch_size=8",
        "algo.microbatch_tokens=512",
    ],
    "relay": ["scenario=relay", "credit=shapley", "sampling.max_new_tokens=6"],
}


@pytest.mark.slow
@pytest.mark.subprocess
def test_every_tag_a_run_writes_is_documented(marl_cli, tmp_path: Path) -> None:
    patterns = documented_patterns(PAGE.read_text())
    assert len(patterns) > 60
    seen: set[str] = set()
    for name, overrides in RUNS.items():
        named = overrides[0] == "--config-name"
        head, tail = (overrides[:2], overrides[2:]) if named else ([], overrides)
        command = [
            "train",
            *head,
            "model=tiny",
            "train.steps=2",
            "train.seeds_per_step=2",
            "train.group_size=2",
            "logging.progress=false",
            f"hydra.run.dir={tmp_path / name}",
            *tail,
        ]
        done = marl_cli(*command, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        seen |= run_tags(tmp_path / name / "tensorboard")
    for expected in ("eval/listening/cic", "league/exploitability", "credit/influence"):
        assert expected in seen  # each run really had its trackers on
    assert len(seen) > 150
    missing = undocumented(seen, patterns)
    assert missing == [], f"tags written but not in docs/tensorboard.md: {missing}"
