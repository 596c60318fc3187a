"""No file of the project names a directory of the machine that wrote it: results record paths
relative to the checkout (``bench/common.portable``), docs name commands a reader can run. Every
text file under the checkout is read (the virtualenv, runs and caches aside)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {".git", ".venv", "runs", ".gpu", "outputs", "__pycache__", ".pytest_cache",
           ".ruff_cache", "marl_llm.egg-info"}  # fmt: skip
# a home or work folder of some machine, at the root: work/<x>, root, home/<user>, Users/<user>
MACHINE_PATH = re.compile("/" + r"(work|root|home/[a-z][\w.-]*|Users/[\w.-]+)/")


def project_files() -> list[Path]:
    """The tracked files (``git ls-files``); outside a git checkout, every file but hidden
    folders and the skipped ones."""
    import subprocess

    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
        ).stdout.decode("utf-8", errors="replace")
        return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]
    except (OSError, subprocess.SubprocessError):
        pass
    files = []
    for path in ROOT.rglob("*"):
        parts = path.relative_to(ROOT).parts
        if (
            path.is_file()
            and not set(parts) & SKIPPED
            and not any(p.startswith(".") for p in parts)
        ):
            files.append(path)
    return files


def test_no_tracked_text_names_a_machine_directory() -> None:
    found = []
    for path in project_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # images, checkpoints: not text
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "machine paths:\n" + "\n".join(found[:20])
