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

- ``"rae"``: role-conditioned advantage estimation (RAE) of SPIRAL, Liu et al. 2025, "SPIRAL:
  Self-Play on Zero-Sum Games Incentivizes Reasoning via Multi-Agent Multi-Turn Reinforcement
  Learning" (arXiv:2506.24119): ``A = r - b_{game, role}``, where the baseline of each role
  (player slot) of each game is an exponential moving average of that role's returns across
  iterations, ``b <- alpha * b + (1 - alpha) * mean_batch(r_role)``. In a zero-sum game the
  two players' returns have opposite signs and the first mover may have an edge: one shared
  baseline (or none) would give one role a biased signal. The EMA needs state across calls, so
  the estimator is a pure function of the returns and the baseline (:func:`rae_advantages`),
  and the state is a :class:`RoleBaselines` object that the trainer owns and checkpoints.
- ``"marshal"``: turn-level advantages with per-agent normalisation of MARSHAL, Yuan et al.
  2025, "MARSHAL: Incentivizing Multi-Agent Reasoning via Self-Play with Strategic LLMs"
  (arXiv:2510.15414). Each turn t of agent i is valued by the rewards from that turn on,
  ``G_{i,t} = sum_{k >= t} r_{i,k}`` (summed before normalising), and the values are
  normalised among agent i's turns of the group: ``A_{i,t} = (G_{i,t} - mean_i) /
  (std_i + eps)``, mean and std over every turn agent i took in the G episodes of the group.
  A turn that came after the decisive reward no longer shares its credit, and roles with
  different reward scales are not normalised together.

Each estimator declares its *scope* when registered (:data:`SCOPES`): ``"group"`` estimators
see one column of episode returns per ``(group, agent)``; ``"turn"`` estimators (``marshal``)
see one column of per-turn values per ``(group, agent)``, each turn an entry; ``"role"``
estimators (``rae``) see the returns of one role over the whole batch and the role's baseline.

A column whose returns are all equal (including a group of one episode) carries no learning
signal; every group estimator gives exactly ``0.0`` there, never NaN. (``rae`` does not: a
batch where every game was lost still has a negative advantage against a baseline that
remembers wins.)

The sequence-level GSPO loss (Zheng et al. 2025) uses the ``"grpo"`` advantages; the choice
between token- and sequence-level ratios lives in the learner's policy-loss registry
(:mod:`marl.losses`).

Add an estimator with :func:`register_advantage`; names are unique.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import torch

from marl.protocols.registry import Registry

__all__ = [
    "ADVANTAGES",
    "SCOPES",
    "AdvantageFn",
    "RoleBaselines",
    "advantage_scope",
    "compute_advantages",
    "dr_grpo_advantages",
    "get_advantage",
    "group_advantages",
    "grpo_advantages",
    "list_advantages",
    "marshal_advantages",
    "rae_advantages",
    "register_advantage",
    "rloo_advantages",
]


AdvantageFn = Callable[..., torch.Tensor]
"""An advantage estimator: float returns ``(G, N)`` (plus keyword options) -> ``(G, N)``."""


ADVANTAGES: Registry[str, AdvantageFn] = Registry("advantage estimator")
SCOPES = ("group", "turn", "role")


def register_advantage(name: str, scope: str = "group") -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an advantage estimator under ``name``; a name already taken raises ValueError.

    The decorated function receives a float tensor of returns shaped ``(G, N)`` (the caller has
    already checked the shape and finiteness) and must return advantages of the same shape.
    ``scope`` says what a column holds (see the module docstring): ``"group"`` (episode returns
    of one agent in one GRPO group), ``"turn"`` (per-turn values, one row per turn) or
    ``"role"`` (one role's returns over the batch; the function also takes ``baseline``).
    """
    if scope not in SCOPES:
        raise ValueError(f"advantage scope {scope!r} is not one of {', '.join(SCOPES)}")
    add = ADVANTAGES.register(name)

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        add(fn)  # refuses a taken name before anything is marked
        fn.scope = scope  # type: ignore[attr-defined]  # read back by advantage_scope
        return fn

    return decorator


def advantage_scope(name: str) -> str:
    """The scope ``name`` was registered with (``group``, ``turn`` or ``role``)."""
    return getattr(get_advantage(name), "scope", "group")


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


@register_advantage("marshal", scope="turn")
def marshal_advantages(values: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """MARSHAL (Yuan et al. 2025): per-turn values ``G_{i,t}`` normalised per agent,
    ``(G - mean) / (std + eps)`` over the column's turns. ``(T, N)`` -> ``(T, N)``.

    The rows are turns (an agent's turns of every episode of a group), not episodes; the
    reward-to-go that fills them is summed before this normalisation (see the module
    docstring)."""
    return grpo_advantages(values, eps=eps)  # (T, N): the same standardisation, over turns


@register_advantage("rae", scope="role")
def rae_advantages(returns: torch.Tensor, baseline: torch.Tensor) -> torch.Tensor:
    """RAE (SPIRAL, Liu et al. 2025): ``A = r - b_role``. ``(E, N)`` returns of E episodes for
    N roles and the roles' baselines ``(N,)`` -> ``(E, N)``. The baselines are kept by a
    :class:`RoleBaselines`."""
    return returns - baseline.reshape(1, -1).to(returns.dtype)  # (E, N)


class RoleBaselines:
    """The state of SPIRAL's role-conditioned advantage estimation: one baseline per role.

    A role is a key such as ``(game, agent)``: player 0 and player 1 of a zero-sum game (and the
    same seat in two games) each get their own baseline. :meth:`advantages` first moves each
    role's baseline towards the batch's mean return of that role,
    ``b <- decay * b + (1 - decay) * mean(r_role)``, then gives ``A = r - b``. A role seen for
    the first time starts at its batch mean (SPIRAL starts at 0; starting at the first mean
    avoids a warm-up in which every early return counts as a surprise). ``decay = 0`` makes
    the baseline the batch mean of the role. The trainer owns the object and checkpoints
    :meth:`state_dict`.
    """

    def __init__(self, decay: float = 0.95) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"RAE baseline decay must be in [0, 1), got {decay}")
        self.decay = float(decay)
        self.baselines: dict[str, float] = {}
        self.updates: dict[str, int] = {}

    def advantages(
        self,
        returns: Sequence[float],
        roles: Sequence[Hashable],
        episode_ids: Sequence[Hashable] | None = None,
    ) -> list[float]:
        """Update the baselines with this batch and return ``r - b_role`` for every entry.

        Entry ``k`` is a return of role ``roles[k]``. With ``episode_ids``, entries of the same
        ``(role, episode)`` (turn records repeat an episode's return once per round) count once
        in the batch mean and must agree on the return."""
        n = len(returns)
        if len(roles) != n or (episode_ids is not None and len(episode_ids) != n):
            raise ValueError("returns, roles and episode_ids must have the same length")
        per_role: dict[str, dict[Hashable, float]] = {}
        for k in range(n):
            value = float(returns[k])
            if not math.isfinite(value):
                raise ValueError(f"return of role {roles[k]!r} is not finite: {value}")
            key = _role_key(roles[k])
            episode: Hashable = k if episode_ids is None else episode_ids[k]
            seen = per_role.setdefault(key, {})
            if episode in seen and seen[episode] != value:
                raise ValueError(
                    f"role {key!r}, episode {episode}: entries disagree on the return "
                    f"({seen[episode]} vs {value})"
                )
            seen[episode] = value
        keys = sorted(per_role)
        if keys:
            means = torch.tensor(
                [sum(per_role[k].values()) / len(per_role[k]) for k in keys], dtype=torch.float64
            )  # (R,)
            old = torch.tensor(
                [self.baselines.get(k, float(m)) for k, m in zip(keys, means)],
                dtype=torch.float64,
            )  # (R,)
            new = self.decay * old + (1.0 - self.decay) * means  # (R,)
            for k, value in zip(keys, new.tolist()):
                self.baselines[k] = value
                self.updates[k] = self.updates.get(k, 0) + 1
        baseline = torch.tensor([self.baselines[_role_key(r)] for r in roles], dtype=torch.float64)
        values = torch.tensor([float(r) for r in returns], dtype=torch.float64)  # (n,)
        adv = rae_advantages(values.reshape(1, -1), baseline)  # (1, n): each entry its column
        return adv.reshape(-1).tolist()

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint."""
        return {
            "decay": self.decay,
            "baselines": dict(self.baselines),
            "updates": dict(self.updates),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s result."""
        self.decay = float(state["decay"])
        self.baselines = {str(k): float(v) for k, v in state["baselines"].items()}
        self.updates = {str(k): int(v) for k, v in state["updates"].items()}


def _role_key(role: Hashable) -> str:
    """A role as a plain string key (``("matching-pennies-v0", "alice")`` -> ``"...:alice"``),
    so the state pickles as plain data."""
    if isinstance(role, tuple):
        return ":".join(str(part) for part in role)
    return str(role)


def compute_advantages(
    returns: torch.Tensor, method: str = "grpo", **kwargs: float
) -> torch.Tensor:
    """Advantages of one group with the estimator ``method``. ``(G, N)`` or ``(G,)`` -> same.

    ``kwargs`` go to the estimator (for example ``eps`` for ``"grpo"``). Integer returns are
    converted to the default float dtype. Raises ValueError for an empty group, a tensor of more
    than two dimensions or non-finite returns, and KeyError for an unknown ``method``.
    """
    fn = get_advantage(method)
    if advantage_scope(method) == "role":
        raise ValueError(
            f"advantage estimator {method!r} keeps a baseline per role across iterations: use "
            "RoleBaselines.advantages (or apply_credit with baselines=...), not a single group"
        )
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
