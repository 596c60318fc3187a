"""Group-relative advantage estimators: episode returns -> advantages, registered by name.

Every estimator is a pure tensor function. It takes the returns of one group of ``G`` episodes
played from the same scenario seed, shaped ``(G, N)`` for ``N`` agents (or ``(G,)`` for one),
and gives advantages of the same shape. Normalisation is **per agent**: column ``j`` is compared
only with column ``j`` of the other episodes, because agents in a mixed-motive scenario have
returns on different scales.

Estimators (``r`` is one column, ``mean``/``std`` are over the ``G`` episodes of the group):

- ``"grpo"``: ``A_i = (r_i - mean(r)) / (std(r) + eps)``. Group Relative Policy Optimization,
  Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300), section 4.1.2. ``std`` is the sample
  standard deviation (Bessel-corrected, as in TRL and verl).
- ``"dr_grpo"``: ``A_i = r_i - mean(r)``. Dr. GRPO, Liu et al. 2025, "Understanding R1-Zero-Like
  Training: A Critical Perspective" (arXiv:2503.20783): dividing by ``std`` up-weights groups
  whose rewards barely differ (too easy or too hard questions), so they drop it.
- ``"rloo"``: ``A_i = r_i - mean_{j != i}(r_j) = G / (G - 1) * (r_i - mean(r))``. REINFORCE
  leave-one-out, Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!", as used
  for LLMs by Ahmadian et al. 2024 (arXiv:2402.14740). The baseline does not depend on the
  sample it is subtracted from, so the gradient estimate stays unbiased.

A column whose returns are all equal (including a group of one episode) carries no learning
signal; every estimator gives exactly ``0.0`` there, never NaN.

The sequence-level GSPO loss (Zheng et al. 2025) uses the ``"grpo"`` advantages; the choice
between token- and sequence-level ratios lives in :func:`marl.credit.losses.policy_loss`.

Add an estimator with :func:`register_advantage`; names are unique.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from marl.protocols.registry import Registry

__all__ = [
    "ADVANTAGES",
    "AdvantageFn",
    "compute_advantages",
    "dr_grpo_advantages",
    "get_advantage",
    "group_advantages",
    "grpo_advantages",
    "list_advantages",
    "register_advantage",
    "rloo_advantages",
]


AdvantageFn = Callable[..., torch.Tensor]
"""An advantage estimator: float returns ``(G, N)`` (plus keyword options) -> ``(G, N)``."""


ADVANTAGES: Registry[str, AdvantageFn] = Registry("advantage estimator")


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an advantage estimator under ``name``; a name already taken raises ValueError.

    The decorated function receives a float tensor of returns shaped ``(G, N)`` (the caller has
    already checked the shape and finiteness) and must return advantages of the same shape.
    """
    return ADVANTAGES.register(name)


def list_advantages() -> list[str]:
    """Names of the registered advantage estimators, sorted."""
    return ADVANTAGES.names()


def get_advantage(name: str, key: str | None = None) -> AdvantageFn:
    """The estimator registered as ``name``; an unknown name raises
    :class:`~marl.protocols.registry.UnknownNameError` (a KeyError) listing the known ones,
    prefixed by ``key`` when given."""
    return ADVANTAGES.lookup(name, key)


def _constant_columns(returns: torch.Tensor) -> torch.Tensor:
    """True for each column whose returns are all equal (no signal). ``(G, N)`` -> ``(1, N)``."""
    return returns.amax(dim=0, keepdim=True) == returns.amin(dim=0, keepdim=True)  # (1, N)


@register_advantage("grpo")
def grpo_advantages(returns: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """GRPO (Shao et al. 2024): ``(r - mean) / (std + eps)`` per column.

    ``(G, N)`` -> ``(G, N)``.
    """
    if returns.shape[0] < 2:
        return torch.zeros_like(returns)  # (G, N): one episode has no group to compare with
    centered = returns - returns.mean(dim=0, keepdim=True)  # (G, N)
    std = returns.std(dim=0, keepdim=True, correction=1)  # (1, N)
    adv = centered / (std + eps)  # (G, N)
    return torch.where(_constant_columns(returns), torch.zeros_like(adv), adv)  # (G, N)


@register_advantage("dr_grpo")
def dr_grpo_advantages(returns: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): ``r - mean`` per column, no std. ``(G, N)`` -> ``(G, N)``."""
    adv = returns - returns.mean(dim=0, keepdim=True)  # (G, N)
    return torch.where(_constant_columns(returns), torch.zeros_like(adv), adv)  # (G, N)


@register_advantage("rloo")
def rloo_advantages(returns: torch.Tensor) -> torch.Tensor:
    """RLOO (Kool et al. 2019): ``r_i - mean_{j != i} r_j`` per column. ``(G, N)`` -> ``(G, N)``."""
    g = returns.shape[0]
    if g < 2:
        return torch.zeros_like(returns)  # (G, N): no other sample to form the baseline
    total = returns.sum(dim=0, keepdim=True)  # (1, N)
    baseline = (total - returns) / (g - 1)  # (G, N): mean of the other G-1 episodes
    adv = returns - baseline  # (G, N)
    return torch.where(_constant_columns(returns), torch.zeros_like(adv), adv)  # (G, N)


def compute_advantages(
    returns: torch.Tensor, method: str = "grpo", **kwargs: float
) -> torch.Tensor:
    """Advantages of one group with the estimator ``method``. ``(G, N)`` or ``(G,)`` -> same.

    ``kwargs`` go to the estimator (for example ``eps`` for ``"grpo"``). Integer returns are
    converted to the default float dtype. Raises ValueError for an empty group, a tensor of more
    than two dimensions or non-finite returns, and KeyError for an unknown ``method``.
    """
    fn = get_advantage(method)
    if returns.ndim not in (1, 2):
        raise ValueError(f"returns must be shaped (G,) or (G, N), got {tuple(returns.shape)}")
    if returns.shape[0] == 0:
        raise ValueError("returns: a group needs at least one episode, got G=0")
    if not returns.is_floating_point():
        returns = returns.to(torch.get_default_dtype())
    if not bool(torch.isfinite(returns).all()):
        raise ValueError(f"returns must be finite, got {returns.tolist()}")
    squeeze = returns.ndim == 1
    r2 = returns.unsqueeze(-1) if squeeze else returns  # (G, N)
    adv = fn(r2, **kwargs)  # (G, N)
    if adv.shape != r2.shape:
        raise ValueError(
            f"advantage estimator {method!r} returned shape {tuple(adv.shape)} "
            f"for returns of shape {tuple(r2.shape)}"
        )
    return adv.squeeze(-1) if squeeze else adv  # (G,) or (G, N)


def group_advantages(
    returns: Sequence[float],
    group_ids: Sequence[int],
    agents: Sequence[str],
    method: str = "grpo",
    *,
    episode_ids: Sequence[int] | None = None,
    **kwargs: float,
) -> list[float]:
    """Advantages for flat per-episode lists, normalised within each ``(group_id, agent)``.

    Entry ``k`` is agent ``agents[k]``'s return in an episode of group ``group_ids[k]``. Entries
    sharing a group id and an agent form one column of :func:`compute_advantages`; the result is
    in the input order. Groups may hold different numbers of episodes, and an agent may be
    missing from some episodes. Pass the same string for every agent to pool all agents of a
    group into one column instead (for example symmetric agents under a shared reward).

    ``episode_ids`` makes the function safe to call on turn records, which repeat an episode's
    return once per round: entries with the same ``(group_id, agent, episode_id)`` count once,
    must carry the same return, and all receive that episode's advantage. Without it every
    entry counts as its own episode.
    """
    n = len(returns)
    if len(group_ids) != n or len(agents) != n:
        raise ValueError(
            f"returns ({n}), group_ids ({len(group_ids)}) and agents ({len(agents)}) "
            "must have the same length"
        )
    if episode_ids is not None and len(episode_ids) != n:
        raise ValueError(f"episode_ids ({len(episode_ids)}) must have the length of returns ({n})")
    get_advantage(method)  # fail on an unknown name even for empty input

    # column key -> episode key -> (return, indices into the flat lists)
    columns: dict[tuple[int, str], dict[object, tuple[float, list[int]]]] = {}
    for k in range(n):
        col = columns.setdefault((group_ids[k], agents[k]), {})
        ep: object = k if episode_ids is None else episode_ids[k]
        r = float(returns[k])
        if not math.isfinite(r):
            raise ValueError(
                f"return of agent {agents[k]!r} in group {group_ids[k]} is not finite: {r}"
            )
        if ep in col:
            seen, idx = col[ep]
            if seen != r:
                raise ValueError(
                    f"agent {agents[k]!r}, group {group_ids[k]}, episode {ep}: "
                    f"entries disagree on the return ({seen} vs {r})"
                )
            idx.append(k)
        else:
            col[ep] = (r, [k])

    out = [0.0] * n
    for col in columns.values():
        episodes = list(col.values())
        r = torch.tensor([ret for ret, _ in episodes], dtype=torch.float64)  # (G,)
        adv = compute_advantages(r, method, **kwargs).tolist()  # (G,)
        for a, (_, idx) in zip(adv, episodes):
            for k in idx:
                out[k] = float(a)
    return out
