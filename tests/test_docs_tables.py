"""Every Markdown table in README.md and docs/ renders: a header, a delimiter row right under it,
and rows with the header's number of cells. (A table once lost its delimiter row and gained a
stray row from another table, and rendered as a paragraph of pipes.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DELIMITER = re.compile(r"^\|(\s*:?-{3,}:?\s*\|)+$")


def cells(line: str) -> int:
    """Cells of a table row: pipes that are not escaped (``\\|``) and not inside backticks."""
    text = re.sub(r"`[^`]*`", "``", line.strip())
    return len(re.findall(r"(?<!\\)\|", text)) - 1


def tables(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each run of table lines outside code fences."""
    found, block, start, fenced = [], [], 0, False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            if not block:
                start = number
            block.append(line)
            continue
        if block:
            found.append((start, block))
            block = []
    if block:
        found.append((start, block))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_has_a_delimiter_row_and_even_rows(page: Path) -> None:
    for start, lines in tables(page.read_text(encoding="utf-8")):
        where = f"{page.relative_to(ROOT)}:{start}"
        assert len(lines) >= 2 and DELIMITER.match(lines[1].strip()), (
            f"{where}: a table's second line must be its delimiter row (|---|---|)"
        )
        width = cells(lines[0])
        assert cells(lines[1]) == width, f"{where}: the delimiter row has another width"
        for offset, row in enumerate(lines[2:], 2):
            assert cells(row) == width, f"{where}+{offset}: {cells(row)} cells, header {width}"
