"""Seed every random generator, capture/restore their states for exact resumption, and keep
training's scenario seeds apart from the held-out evaluation's."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

HELD_OUT_SEEDS = 2**31
"""Where held-out scenario seeds start. Training's (:func:`marl.runtime.workers.step_seeds`) and the
warm-up's scenario seeds are drawn from ``[0, 2**31)``, the held-out evaluation's
(:func:`marl.runtime.workers.eval_seeds`) from ``[2**31, 2**32)``: the two sets are disjoint by
construction, so no evaluation scenario is ever trained on."""


def held_out_seeds(key: str, count: int) -> list[int]:
    """``count`` held-out scenario seeds, a pure function of ``key`` (say ``"3:listening"``):
    each in ``[HELD_OUT_SEEDS, 2 * HELD_OUT_SEEDS)``, where no training seed lies. Every
    evaluation draws its scenarios here (tests/marl/test_held_out_seeds.py checks the callers)."""
    rng = random.Random(key)
    return [HELD_OUT_SEEDS + rng.randrange(HELD_OUT_SEEDS) for _ in range(count)]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_states() -> dict[str, Any]:
    """The states of the global generators (saved in checkpoints)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore states captured by :func:`rng_states`."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
