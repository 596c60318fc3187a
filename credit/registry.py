"""The credit-method registry, its config (the ``credit=NAME`` group) and its result type.

A credit method turns recorded episodes into per-agent credit that replaces the return in the
GRPO advantage (see :mod:`marl.credit.apply`). Methods register by name with
:func:`register_credit` (duplicates are refused) and are run with :func:`compute_credit`, which
builds the re-simulation engine for the counterfactual ones. The built-in methods (``team``,
``difference``, ``coma``, ``shapley``) live in :mod:`marl.credit.estimators`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marl.credit.counterfactual import MODES, Generate, RecordedEpisode, Resimulator
from marl.protocols.registry import Registry

if TYPE_CHECKING:
    from marl.credit.counterfactual import ForkableEnv

__all__ = [
    "CREDITS",
    "CreditConfig",
    "CreditFn",
    "CreditResult",
    "compute_credit",
    "get_credit",
    "list_credits",
    "register_credit",
]

VALUES = ("team", "own")
ABSENT = ("null", "default")


@dataclass
class CreditConfig:
    """How credit is assigned (the ``credit=NAME`` Hydra group).

    name:            the registered method: ``team``, ``difference``, ``coma`` or ``shapley``.
    per_turn:        credit every turn separately (counterfactual methods only): fork at that
                     turn alone. The agent's episode credit is then the sum of its turns'.
    value:           what a branch is worth to agent i: ``team`` (mean of all agents' returns)
                     or ``own`` (agent i's own return, for mixed-motive scenarios).
    mode:            what the turns after the change do: ``regenerate`` (write anew wherever
                     the prompt changed), ``keep_messages`` (as regenerate, but send the
                     recorded SAY lines) or ``replay`` (recorded completions verbatim: no
                     generation, but with ``keep_action`` every message then has zero effect).
    absent:          what replaces a removed message in ``difference`` and ``shapley``:
                     ``null`` (no message) or ``default`` (the SAY lines of ``default_text``).
    default_text:    the default message, as completion text with SAY lines.
    keep_action:     replace only the SAY lines of a turn and keep its ACTION line; ``false``
                     replaces the whole completion (resamples then bring their own action).
    samples:         K, the resampled messages per agent (or per turn) for ``coma``.
    permutations:    sampled agent orders per episode for ``shapley`` (Monte Carlo).
    exact_threshold: ``shapley`` enumerates every coalition exactly when n! <= this (and also
                     whenever the 2^n coalitions are no more than the sampled orders need).
    antithetic:      ``shapley`` pairs every sampled order with its reverse.
    max_concurrent:  at most this many counterfactual branches at once (null: all at once).
    seed:            seeds the sampled Shapley orders.
    """

    name: str = "team"
    per_turn: bool = False
    value: str = "team"
    mode: str = "regenerate"
    absent: str = "null"
    default_text: str = "SAY: I have nothing to report."
    keep_action: bool = True
    samples: int = 4
    permutations: int = 16
    exact_threshold: int = 120
    antithetic: bool = True
    max_concurrent: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        CREDITS.lookup(self.name, key="credit.name")
        for key, value, choices in (
            ("value", self.value, VALUES),
            ("mode", self.mode, MODES),
            ("absent", self.absent, ABSENT),
        ):
            if value not in choices:
                raise ValueError(f"credit.{key}: {value!r} is not one of {', '.join(choices)}")
        for key in ("samples", "permutations", "exact_threshold"):
            if getattr(self, key) < 1:
                raise ValueError(f"credit.{key}: must be >= 1, got {getattr(self, key)}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ValueError(
                f"credit.max_concurrent: must be >= 1 or null, got {self.max_concurrent}"
            )
        if self.per_turn and not CREDITS[self.name].counterfactual:
            counterfactual = [n for n, e in sorted(CREDITS.items()) if e.counterfactual]
            raise ValueError(
                f"credit.per_turn: method {self.name!r} has no per-turn credit; only the "
                f"counterfactual ones do ({', '.join(counterfactual)})"
            )


@dataclass
class CreditResult:
    """Credit for a list of episodes, in the order they were given.

    credit[e][i]:          agent i's credit in episode e; it replaces the return in GRPO.
    returns[e][i]:         the recorded return.
    per_turn[e][(r, i)]:   agent i's credit for its turn in round r (``per_turn`` only).
    baseline[e][i]:        the counterfactual value credit is measured against (``difference``
                           and ``coma``: ``credit = V_i(factual) - baseline``).
    influence[e][i][j]:    how much agent i's messages move agent j's return (see the method).
    stats:                 re-simulation counters for this call (:class:`SimStats` fields).
    """

    method: str
    episode_ids: list[int]
    group_ids: list[int]
    returns: list[dict[str, float]]
    credit: list[dict[str, float]]
    per_turn: list[dict[tuple[int, str], float]] | None = None
    baseline: list[dict[str, float]] | None = None
    influence: list[dict[str, dict[str, float]]] | None = None
    stats: dict[str, int] = field(default_factory=dict)


CreditFn = Callable[[Sequence[RecordedEpisode], "Resimulator | None", CreditConfig], CreditResult]
"""A credit method: ``(episodes, engine, config) -> CreditResult``; ``engine`` is None for
methods registered with ``counterfactual=False``."""


@dataclass(frozen=True)
class CreditMethod:
    """A registered credit method and whether it re-simulates episodes."""

    fn: CreditFn
    counterfactual: bool


CREDITS: Registry[str, CreditMethod] = Registry("credit method")


def register_credit(name: str, counterfactual: bool = True) -> Callable[[CreditFn], CreditFn]:
    """Register a credit method under ``name``; a name already taken raises ValueError.

    ``counterfactual``: the method re-simulates episodes and receives a :class:`Resimulator`.
    """

    def decorator(fn: CreditFn) -> CreditFn:
        CREDITS.add(name, CreditMethod(fn, counterfactual))
        return fn

    return decorator


def list_credits() -> list[str]:
    """Names of the registered credit methods, sorted."""
    return CREDITS.names()


def get_credit(name: str) -> CreditFn:
    """The method registered as ``name``; an unknown name raises KeyError listing the known."""
    return CREDITS.lookup(name).fn


def is_counterfactual(name: str) -> bool:
    """Whether the method ``name`` re-simulates episodes (and so needs an environment)."""
    return CREDITS.lookup(name).counterfactual


def engine_for(
    config: CreditConfig,
    env: ForkableEnv | None,
    generate: Generate | None = None,
    env_factory: Callable[[], ForkableEnv] | None = None,
) -> Resimulator:
    """The re-simulation engine a credit config asks for (reuse it across iterations)."""
    return Resimulator(
        env,
        generate,
        mode=config.mode,
        keep_action=config.keep_action,
        default_text=config.default_text,
        max_concurrent=config.max_concurrent,
        env_factory=env_factory,
    )


def compute_credit(
    config: CreditConfig | str,
    episodes: Sequence[RecordedEpisode],
    env: ForkableEnv | None = None,
    generate: Generate | None = None,
    *,
    engine: Resimulator | None = None,
    **overrides: Any,
) -> CreditResult:
    """Credit for ``episodes`` with the configured method.

    ``config`` is a :class:`CreditConfig` or a method name (then ``overrides`` set its fields).
    Counterfactual methods need ``env`` (an environment of the episodes' scenario, only copied)
    and, for resamples or turns written anew, ``generate``; or a ready ``engine``.
    """
    if isinstance(config, str):
        config = CreditConfig(name=config, **overrides)
    elif overrides:
        raise TypeError("pass field overrides only with a method name, not with a CreditConfig")
    entry = CREDITS.lookup(config.name)
    if entry.counterfactual and engine is None:
        if env is None:
            raise ValueError(
                f"credit method {config.name!r} re-simulates episodes: pass env= (an environment "
                "of the episodes' scenario) or engine="
            )
        engine = engine_for(config, env, generate)
    if entry.counterfactual and engine is not None:
        for key in ("mode", "keep_action", "default_text"):
            if getattr(engine, key) != getattr(config, key):
                raise ValueError(
                    f"credit.{key}: the config says {getattr(config, key)!r} but the engine "
                    f"given was built with {getattr(engine, key)!r}"
                )
    before = copy.copy(engine.stats) if engine is not None else None
    result = entry.fn(episodes, engine if entry.counterfactual else None, config)
    if engine is not None and before is not None:
        after = engine.stats.as_dict()
        result.stats = {k: after[k] - v for k, v in before.as_dict().items()}
    return result
