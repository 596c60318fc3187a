"""Credit assignment: episode returns -> per-agent credit and advantages.

Everything here is a pure function on tensors or plain lists, with no model, trainer or Ray
inside, so each piece is tested on CPU against hand-computed values. The policy-gradient loss
that consumes the advantages is the learner's (:mod:`marl.losses`), not credit's.

- :mod:`marl.credit.counterfactual`: the re-simulation engine that forks recorded episodes with
  messages replaced (null, default, resampled) and runs the branches batched, round by round.
- :mod:`marl.credit.registry` and :mod:`marl.credit.estimators`: credit methods registered by
  name (``"team"``, ``"difference"``, ``"coma"``, ``"shapley"``) and :func:`compute_credit`.
- :mod:`marl.credit.shapley`: exact and permutation-sampled Shapley values.
- :mod:`marl.credit.responders`: scripted callables -> the engine's batched ``generate``.
- :mod:`marl.credit.advantages`: group-relative advantage estimators registered by name
  (``"grpo"``, ``"dr_grpo"``, ``"rloo"``), normalised per agent within a group; ``"marshal"``
  (turn-level, per agent) and ``"rae"`` (SPIRAL's per-role EMA baseline, state in
  ``RoleBaselines``). Tensor functions: import them from their module.
- :mod:`marl.credit.apply`: ``apply_credit``, credit -> group-normalised advantages (through
  the estimators, so also imported from its module).

This package re-exports the credit methods and the engine, which need no torch: importing
``marl.credit`` or one of those modules loads neither torch nor the advantage code
(tests/test_layering.py checks it). The counterfactual code takes the environment and the
generator as arguments; it imports nothing from ``marl.scenarios`` or ``marl.agents``.
"""

from marl.credit.counterfactual import (
    Branch,
    BranchOutcome,
    Generate,
    GenerationRequest,
    Intervention,
    RecordedEpisode,
    Resimulator,
    SimStats,
)
from marl.credit.estimators import (
    coma_credit,
    difference_credit,
    shapley_credit,
    shapley_plan,
    team_credit,
    team_value,
)
from marl.credit.registry import (
    CreditConfig,
    CreditResult,
    compute_credit,
    get_credit,
    is_counterfactual,
    list_credits,
    register_credit,
)
from marl.credit.responders import bot_generate, callables_generate

__all__ = [
    "Branch",
    "BranchOutcome",
    "CreditConfig",
    "CreditResult",
    "Generate",
    "GenerationRequest",
    "Intervention",
    "RecordedEpisode",
    "Resimulator",
    "SimStats",
    "bot_generate",
    "callables_generate",
    "coma_credit",
    "compute_credit",
    "difference_credit",
    "get_credit",
    "is_counterfactual",
    "list_credits",
    "register_credit",
    "shapley_credit",
    "shapley_plan",
    "team_credit",
    "team_value",
]
