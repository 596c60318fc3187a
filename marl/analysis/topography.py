"""What a speaker's code is: topographic similarity and a message-to-meaning table.

- **Topographic similarity** (Brighton & Kirby 2006, "Understanding linguistic evolution by
  visualizing the emergence of topographic mappings"; as used for emergent codes by Lazaridou
  et al. 2018, arXiv:1804.03984): the Spearman correlation, over every pair of samples, between
  the distance of their meanings (Hamming: how many attributes differ) and the distance of
  their messages (word-level Levenshtein on the normalised text). Near 1: similar meanings get
  similar messages (a compositional code); near 0: no such structure; undefined (None) when
  either distance is constant.
- **Message table**: for each meaning, its most frequent normalised message, that message's
  share of the meaning's samples, and how many distinct messages it got. A code is a table
  whose rows differ; a speaker that says the same thing whatever it sees has one row repeated.

Messages are normalised by :func:`marl.episodes.normalise` (case, spacing,
punctuation), the same normalisation the emergence metrics count with.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

from marl.episodes import normalise as normalise_message

__all__ = ["edit_distance", "message_table", "spearman", "topographic_similarity"]


def edit_distance(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Levenshtein distance between two sequences (insertions, deletions, substitutions)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long sequences; None when either is constant
    (or shorter than 2)."""
    if len(x) != len(y):
        raise ValueError(f"spearman: {len(x)} values against {len(y)}")
    if len(x) < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / (sxx * syy) ** 0.5


def topographic_similarity(
    meanings: Sequence[Sequence[Hashable]], messages: Sequence[str]
) -> float | None:
    """Spearman correlation between meaning (Hamming) and message (word edit) distances over
    every pair of samples; ``meanings[i]`` is sample i's attribute tuple."""
    if len(meanings) != len(messages):
        raise ValueError(
            f"topographic_similarity: {len(meanings)} meanings, {len(messages)} messages"
        )
    words = [normalise_message(m).split() for m in messages]
    meaning_d, message_d = [], []
    for i in range(len(meanings)):
        for j in range(i + 1, len(meanings)):
            meaning_d.append(float(sum(a != b for a, b in zip(meanings[i], meanings[j]))))
            message_d.append(float(edit_distance(words[i], words[j])))
    return spearman(meaning_d, message_d)


def message_table(meanings: Sequence[str], messages: Sequence[str]) -> list[dict[str, Any]]:
    """One row per meaning (sorted): ``meaning``, ``samples``, ``top`` (its most frequent
    normalised message), ``top_share`` and ``distinct`` (distinct normalised messages)."""
    if len(meanings) != len(messages):
        raise ValueError(f"message_table: {len(meanings)} meanings, {len(messages)} messages")
    by_meaning: dict[str, Counter] = defaultdict(Counter)
    for meaning, message in zip(meanings, messages):
        by_meaning[meaning][normalise_message(message)] += 1
    rows = []
    for meaning in sorted(by_meaning):
        counts = by_meaning[meaning]
        top, n = counts.most_common(1)[0]
        total = sum(counts.values())
        rows.append(
            {
                "meaning": meaning,
                "samples": total,
                "top": top,
                "top_share": n / total,
                "distinct": len(counts),
            }
        )
    return rows
