"""pyproject.toml's package list names every folder a regular (non-editable) install needs.

setuptools installs only the listed packages: a subpackage left out is silently missing from the
wheel (``marl.protocols.tools`` once was), and a folder of YAML left out draws a warning and
will be dropped. The editable install used in development maps whole folders, so only this
check notices.
"""

from __future__ import annotations

from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _folders_with_files(root: Path) -> set[Path]:
    """``root`` and every folder under it holding a ``.py`` or ``.yaml`` file."""
    folders = {root}
    for pattern in ("*.py", "*.yaml"):
        folders |= {p.parent for p in root.rglob(pattern) if "__pycache__" not in p.parts}
    return folders


def test_every_folder_of_code_or_yaml_is_a_listed_package() -> None:
    settings = _setuptools()
    expected = set()
    for package, folder in settings["package-dir"].items():
        root = ROOT / folder
        for path in _folders_with_files(root):
            expected.add(".".join([package, *path.relative_to(root).parts]))
    assert set(settings["packages"]) == expected


def test_every_yaml_file_is_package_data() -> None:
    assert _setuptools()["package-data"] == {"*": ["*.yaml"]}
