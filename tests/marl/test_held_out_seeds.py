"""Every evaluation draws its scenario seeds from the held-out range, never from training's.

Training's scenario seeds (:func:`marl.runtime.workers.step_seeds`, the warm-up's) lie in
``[0, HELD_OUT_SEEDS)``; every evaluation's must lie in ``[HELD_OUT_SEEDS, 2 * HELD_OUT_SEEDS)``,
drawn by :func:`marl.runtime.seeding.held_out_seeds`. The held-out evaluation during training did;
the exact listening, the role cross-play and ``marl eval`` once drew from training's range. This
reads the driver's source: a draw from ``[0, 2**31)`` is allowed only where training draws, and
each evaluation entry point must draw through ``held_out_seeds``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from marl.runtime.seeding import HELD_OUT_SEEDS, held_out_seeds
from marl.runtime.workers import eval_seeds, step_seeds

DRIVER = Path(__file__).resolve().parents[2] / "marl"
# (module, function) that may draw from training's range [0, 2**31): training and the warm-up
TRAINING_DRAWS = {
    ("runtime/workers.py", "step_seeds"),
    ("loop/warmup.py", "bot_turns"),
    ("runtime/seeding.py", "held_out_seeds"),  # draws an offset, then adds HELD_OUT_SEEDS
}
# every evaluation that picks scenarios: (module, function)
EVALUATIONS = [
    ("runtime/workers.py", "eval_seeds"),  # the held-out evaluation during training
    ("competition/role_eval.py", "pair_listening"),  # exact listening of checkpoints
    ("competition/role_eval.py", "role_crossplay"),  # speaker x listener cross-play
    ("competition/crossplay.py", "crossplay"),  # marl eval
]


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def _training_range(node: ast.Call) -> bool:
    """``X.randrange(2**31)`` or ``X.randrange(HELD_OUT_SEEDS)``."""
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "randrange"):
        return False
    if len(node.args) != 1:
        return False
    arg = node.args[0]
    return ast.unparse(arg) in ("2 ** 31", "HELD_OUT_SEEDS", "1 << 31")


def test_only_training_draws_from_the_training_range() -> None:
    found = set()
    for path in DRIVER.rglob("*.py"):
        for name, fn in _functions(path).items():
            if any(isinstance(n, ast.Call) and _training_range(n) for n in ast.walk(fn)):
                found.add((path.relative_to(DRIVER).as_posix(), name))
    assert found <= TRAINING_DRAWS, f"draws from training's seed range: {found - TRAINING_DRAWS}"
    assert ("runtime/workers.py", "step_seeds") in found  # the scan sees what it should


@pytest.mark.parametrize(("module", "function"), EVALUATIONS)
def test_every_evaluation_draws_held_out_seeds(module: str, function: str) -> None:
    fn = _functions(DRIVER / module)[function]
    calls = {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    assert "held_out_seeds" in calls, f"{module}:{function} picks scenarios another way"


def test_held_out_seeds_lie_above_every_training_seed() -> None:
    seeds = held_out_seeds("7:listening", 500)
    assert len(seeds) == 500 and seeds == held_out_seeds("7:listening", 500)
    assert all(HELD_OUT_SEEDS <= s < 2 * HELD_OUT_SEEDS for s in seeds)
    assert seeds != held_out_seeds("8:listening", 500)
    training = {s for step in range(50) for s in step_seeds(7, step, 10)}
    assert max(training) < HELD_OUT_SEEDS <= min(eval_seeds(7, 200))
