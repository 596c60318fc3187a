"""Every relative Markdown link in README.md and docs/ points at a file that exists, and a link
to a heading of a Markdown page (``scenarios.md#rewards``) names a heading that page has. (Text
moved from the README into docs/ once; a link left pointing at the old place would 404.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# [text](target) and ![alt](target); the target stops at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def prose(text: str) -> str:
    """The page without fenced code blocks and inline code, where brackets are not links."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "``", line))
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading anchor of a Markdown page (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(page.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor.lower() not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def test_the_link_pattern_reads_what_a_page_holds() -> None:
    """The checker itself: links, images, anchors and code are told apart."""
    text = "See [a](docs/a.md#b-c), ![i](img.png) and `[not](x.md)`.\n```\n[no](y.md)\n```\n"
    assert LINK.findall(prose(text)) == ["docs/a.md#b-c", "img.png"]
    assert slug("Any CPU (issue 38)") == "any-cpu-issue-38"
    assert slug("`marl eval`: cross-play and ratings") == "marl-eval-cross-play-and-ratings"
