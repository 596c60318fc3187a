"""Credit assignment: episode returns -> per-agent advantages, and the policy-gradient loss.

Everything here is a pure function on tensors or plain lists, with no model, trainer or Ray
inside, so each piece is tested on CPU against hand-computed values.

- :mod:`marl.credit.advantages`: group-relative advantage estimators registered by name
  (``"grpo"``, ``"dr_grpo"``, ``"rloo"``), normalised per agent within a group; ``"marshal"``
  (turn-level, per agent) and ``"rae"`` (SPIRAL's per-role EMA baseline, state in
  :class:`RoleBaselines`).
- :mod:`marl.credit.losses`: :func:`policy_loss`, the clipped GRPO / GSPO / Dr. GRPO loss over
  masked response tokens.
- :mod:`marl.credit.counterfactual`: the re-simulation engine that forks recorded episodes with
  messages replaced (null, default, resampled) and runs the branches batched, round by round.
- :mod:`marl.credit.registry` and :mod:`marl.credit.estimators`: credit methods registered by
  name (``"team"``, ``"difference"``, ``"coma"``, ``"shapley"``) and :func:`compute_credit`.
- :mod:`marl.credit.shapley`: exact and permutation-sampled Shapley values.
- :mod:`marl.credit.apply`: :func:`apply_credit`, credit -> group-normalised advantages.
- :mod:`marl.credit.responders`: scripted callables -> the engine's batched ``generate``.

The counterfactual code takes the environment and the generator as arguments; it imports
nothing from ``marl.scenarios`` or ``marl.agents``.
"""

from marl.credit.advantages import (
    AdvantageFn,
    RoleBaselines,
    advantage_scope,
    compute_advantages,
    dr_grpo_advantages,
    get_advantage,
    group_advantages,
    grpo_advantages,
    list_advantages,
    marshal_advantages,
    rae_advantages,
    register_advantage,
    rloo_advantages,
)
from marl.credit.apply import apply_credit, turn_credits
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
from marl.credit.losses import Aggregation, Level, policy_loss
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
    "AdvantageFn",
    "Aggregation",
    "Branch",
    "BranchOutcome",
    "CreditConfig",
    "CreditResult",
    "Generate",
    "GenerationRequest",
    "Intervention",
    "Level",
    "RecordedEpisode",
    "Resimulator",
    "RoleBaselines",
    "SimStats",
    "advantage_scope",
    "apply_credit",
    "bot_generate",
    "callables_generate",
    "coma_credit",
    "compute_advantages",
    "compute_credit",
    "difference_credit",
    "dr_grpo_advantages",
    "get_advantage",
    "get_credit",
    "group_advantages",
    "grpo_advantages",
    "is_counterfactual",
    "list_advantages",
    "list_credits",
    "marshal_advantages",
    "policy_loss",
    "rae_advantages",
    "register_advantage",
    "register_credit",
    "rloo_advantages",
    "shapley_credit",
    "shapley_plan",
    "team_credit",
    "team_value",
    "turn_credits",
]
