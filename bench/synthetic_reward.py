"""A synthetic reward for benches on random weights: the ``bench-synthetic`` shaping kind.

A SmolLM2 shape with random weights (a GPU machine has no SmolLM2 weights) fails every episode
alike, so GRPO would skip every update. Importing this module registers the shaping kind
``bench-synthetic`` (:mod:`marl.scenarios.shaping`): a turn scores a fixed hash of its
completion's text in [0, 1], so a group's returns differ and every step updates. The scenario's
own rules and outcome reward are unchanged; :func:`synthetic_overrides` adds the term with
weight 1.

In this process ``import synthetic_reward`` is enough (``bench/gpu.py`` does it). For runs in
other processes (a sweep's jobs, Ray's workers), :func:`site_dir` writes a ``sitecustomize.py``
that imports this module at every interpreter's start-up: put its folder first on
``PYTHONPATH`` while the runs go on, and give :data:`OVERRIDE` on the command line.
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from marl.scenarios.shaping import SHAPING_KINDS, register_shaping

SYNTHETIC_REWARD = "bench-synthetic"
TERM = {"kind": SYNTHETIC_REWARD, "weight": 1.0, "until_step": 1_000_000}
# the same term as a Hydra command-line override (``++``: added, or replacing the demo's none)
_FIELDS = ",".join(f"{key}:{value}" for key, value in TERM.items())
OVERRIDE = f"++scenario.overrides.reward.shaping=[{{{_FIELDS}}}]"

if SYNTHETIC_REWARD not in SHAPING_KINDS:

    @register_shaping(SYNTHETIC_REWARD)
    def synthetic_score(turn: Any) -> float:
        """A fixed function of the completion's text in [0, 1]: different replies score
        differently, so a group's returns differ and GRPO updates on every step."""
        return (zlib.crc32(turn.completion.encode()) % 1001) / 1000


def synthetic_overrides() -> dict[str, Any]:
    """``scenario.overrides`` that add the synthetic score to the scenario's reward."""
    return {"reward": {"shaping": [dict(TERM)]}}


@contextmanager
def site_dir() -> Iterator[Path]:
    """A temporary folder holding a ``sitecustomize.py`` that registers the kind in every Python
    process started with the folder on ``PYTHONPATH`` (a failed import leaves the process as it
    was: only runs that name the kind need it); removed on leaving."""
    bench = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix="bench-synthetic-") as tmp:
        folder = Path(tmp)
        (folder / "sitecustomize.py").write_text(
            "import sys\n"
            f"sys.path.insert(0, {str(bench)!r})\n"
            "try:\n"
            "    import synthetic_reward  # noqa: F401\n"
            "except Exception:\n"
            "    pass\n"
            "finally:\n"
            f"    sys.path.remove({str(bench)!r})\n"
        )
        yield folder
