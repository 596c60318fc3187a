"""Credit assignment: episode returns -> per-agent advantages, and the policy-gradient loss.

Everything here is a pure function on tensors or plain lists, with no model, trainer or Ray
inside, so each piece is tested on CPU against hand-computed values.

- :mod:`marl.credit.advantages`: group-relative advantage estimators registered by name
  (``"grpo"``, ``"dr_grpo"``, ``"rloo"``), normalised per agent within a group.
- :mod:`marl.credit.losses`: :func:`policy_loss`, the clipped GRPO / GSPO / Dr. GRPO loss over
  masked response tokens.
"""

from marl.credit.advantages import (
    AdvantageFn,
    compute_advantages,
    dr_grpo_advantages,
    get_advantage,
    group_advantages,
    grpo_advantages,
    list_advantages,
    register_advantage,
    rloo_advantages,
)
from marl.credit.losses import Aggregation, Level, policy_loss

__all__ = [
    "AdvantageFn",
    "Aggregation",
    "Level",
    "compute_advantages",
    "dr_grpo_advantages",
    "get_advantage",
    "group_advantages",
    "grpo_advantages",
    "list_advantages",
    "policy_loss",
    "register_advantage",
    "rloo_advantages",
]
