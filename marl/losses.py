"""The clipped policy-gradient loss (GRPO / GSPO / Dr. GRPO / DAPO), as pure tensor functions.

:func:`policy_loss` turns per-token logprobs of a batch of ``B`` responses padded to ``T``
tokens into a scalar loss to minimise and a dict of float metrics. Only tokens with
``mask == 1`` (the agent's own generated tokens) count; padding, received messages and
environment text never receive gradient, and a fully masked row contributes nothing.

Importance ratio (``level``, the ``algo.level`` key): a name in the policy-loss registry
(:data:`POLICY_LOSSES`). Built in:

- ``"token"``: PPO/GRPO ratio per token, ``w_{i,t} = exp(logp_new - logp_old)``, with the
  clipped surrogate ``min(w A, clip(w, 1 - eps_low, 1 + eps_high) A)`` per token (Schulman et al.
  2017, arXiv:1707.06347; Shao et al. 2024, arXiv:2402.03300).
- ``"sequence"``: GSPO (Zheng et al. 2025, arXiv:2507.18071), one length-normalised ratio per
  response, ``s_i = exp(mean_t(logp_new - logp_old))`` over its masked tokens, clipped as a whole.
  GSPO's own clip range is far smaller than GRPO's (the paper uses ``3e-4`` / ``4e-4``), so set
  ``clip_eps`` and ``clip_eps_high`` explicitly with this level.

Add one with :func:`register_policy_loss`: a function of the masked, clamped log-ratios that
gives each token's loss (:data:`PolicyLossFn`); the aggregation, the KL term and the metrics
around it are shared.

``clip_eps_high`` > ``clip_eps`` is DAPO's "clip-higher" (Yu et al. 2025, arXiv:2503.14476).

Aggregation of the per-token losses ``l_{i,t}`` (:data:`Aggregation`; for ``"sequence"`` every
token of response ``i`` carries that response's loss):

- ``"seq_mean"``: mean over the tokens of each response, then over responses (GRPO).
- ``"token_mean"``: sum over all masked tokens / number of masked tokens (DAPO).
- ``"constant"``: sum over all masked tokens / ``(B * max_tokens_norm)`` (Dr. GRPO, Liu et al.
  2025, arXiv:2503.20783: a constant denominator, so no length bias).

KL regularisation to a reference policy uses the k3 estimator (Schulman 2020, "Approximating
KL Divergence"), ``exp(ref - new) - (ref - new) - 1`` per token, aggregated like the policy
loss and added with weight ``beta``.

An entropy bonus (``entropy_coef``, the ``algo.entropy`` key) subtracts ``entropy_coef`` times
the aggregated per-token entropy of the sampling distribution, computed exactly over the
vocabulary from the same logits (Williams & Peng 1991; Mnih et al. 2016, arXiv:1602.01783, the
A3C entropy regulariser; ``entropy_coeff`` in verl): it keeps a policy from collapsing onto one
answer before its partner's signal can tell the answers apart.

Both log-ratios (``new - old`` for the importance ratio, ``ref - new`` for k3) are clamped to
``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]`` before ``exp``, so an infinite logprob (a token outside
a top-p nucleus) gives a finite loss with no gradient through that token instead of
``inf - inf = NaN``; inside the bound the loss is exactly the formulas above.

``denominator`` overrides the aggregation's normaliser (see :func:`aggregation_denominator`):
the learner computes the loss of a subset of a minibatch (it skips the forward pass of turns
that carry no gradient) but normalises by the whole minibatch, so the gradient's scale does not
depend on which turns were skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, cast, get_args

import torch

from marl.protocols.registry import Registry

__all__ = [
    "AGGREGATIONS",
    "LOG_RATIO_BOUND",
    "POLICY_LOSSES",
    "RATIO_UNITS",
    "Aggregation",
    "PolicyLossFn",
    "Surrogate",
    "aggregation_denominator",
    "as_aggregation",
    "get_policy_loss",
    "list_policy_losses",
    "policy_loss",
    "policy_loss_terms",
    "ratio_unit",
    "register_policy_loss",
    "sequence_loss",
    "token_loss",
]

Aggregation = Literal["seq_mean", "token_mean", "constant"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)

# Log-ratios are clamped to +-20 before exp(): ratios in [2e-9, 5e8], finite in fp32 and bf16.
LOG_RATIO_BOUND = 20.0


class Surrogate(NamedTuple):
    """What a policy loss gives back: each token's loss and two statistics of its ratios (0-dim
    tensors, so that nothing waits for the device; a float is accepted too)."""

    per_token: torch.Tensor  # (B, T): a response-level loss repeats its value on every token
    clip_frac: torch.Tensor | float  # fraction of the ratios whose gradient the clip removed
    ratio_mean: torch.Tensor | float  # mean importance ratio


PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, float], Surrogate]
"""A policy loss: ``(log_ratio (B, T), advantages (B,), valid (B, T) bool, eps_low, eps_high)``
-> :class:`Surrogate`. ``log_ratio`` is ``logp_new - logp_old``, 0 where ``valid`` is false and
clamped to ``LOG_RATIO_BOUND``; only it carries gradient."""

POLICY_LOSSES: Registry[str, PolicyLossFn] = Registry("policy loss")
RATIO_UNITS = ("token", "sequence")


def register_policy_loss(name: str, unit: str = "token") -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Register a policy loss under ``name`` (the ``algo.level`` value); a name already taken
    raises ValueError.

    ``unit`` says what one importance ratio covers, ``"token"`` or a whole response
    (``"sequence"``): ``clip_frac`` and ``ratio_mean`` average over these, and the learner
    weighs them so when it adds up microbatches.
    """
    if unit not in RATIO_UNITS:
        raise ValueError(f"policy loss unit {unit!r} is not one of {', '.join(RATIO_UNITS)}")
    add = POLICY_LOSSES.register(name)

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        add(fn)  # refuses a taken name before anything is marked
        fn.unit = unit  # type: ignore[attr-defined]  # read back by ratio_unit
        return fn

    return decorator


def list_policy_losses() -> list[str]:
    """Names of the registered policy losses, sorted."""
    return POLICY_LOSSES.names()


def get_policy_loss(name: str, key: str | None = None) -> PolicyLossFn:
    """The policy loss registered as ``name``; an unknown name raises
    :class:`~marl.protocols.registry.UnknownNameError` listing the known ones, prefixed by
    ``key`` when given."""
    return POLICY_LOSSES.lookup(name, key)


def ratio_unit(name: str) -> str:
    """What one ratio of the policy loss ``name`` covers: ``token`` or ``sequence``."""
    return getattr(get_policy_loss(name), "unit", "token")


def as_aggregation(name: str, key: str = "aggregation") -> Aggregation:
    """``name`` as an :data:`Aggregation`; anything else raises ValueError naming ``key``."""
    if name not in AGGREGATIONS:
        raise ValueError(f"{key} must be one of {AGGREGATIONS}, got {name!r}")
    return cast(Aggregation, name)


def aggregation_denominator(
    masks: Sequence[Sequence[int]], aggregation: Aggregation, max_tokens_norm: float | None
) -> float:
    """The normaliser an aggregation uses for a batch whose per-row masks are ``masks``.

    ``seq_mean``: the number of responses with at least one masked-in token; ``token_mean``: the
    number of masked-in tokens; ``constant``: ``len(masks) * max_tokens_norm``. At least 1.
    """
    if aggregation == "seq_mean":
        return float(max(1, sum(1 for m in masks if any(m))))
    if aggregation == "token_mean":
        return float(max(1, sum(1 for m in masks for v in m if v)))
    assert max_tokens_norm is not None
    return float(max(1.0, len(masks) * max_tokens_norm))


def _aggregate(
    per_token: torch.Tensor,
    maskf: torch.Tensor,
    aggregation: Aggregation,
    max_tokens_norm: float | None,
    denominator: float | None = None,
) -> torch.Tensor:
    """Reduce masked per-token values ``(B, T)`` to a scalar with the given aggregation,
    divided by ``denominator`` when given (else by this batch's own normaliser)."""
    masked = per_token * maskf  # (B, T)
    if aggregation == "seq_mean":
        lengths = maskf.sum(dim=-1)  # (B,)
        numerator = (masked.sum(dim=-1) / lengths.clamp(min=1.0)).sum()  # (): 0 for empty rows
        own = (lengths > 0).sum().clamp(min=1)  # (): non-empty responses
    elif aggregation == "token_mean":
        numerator = masked.sum()  # ()
        own = maskf.sum().clamp(min=1.0)  # ()
    else:
        assert max_tokens_norm is not None  # checked by policy_loss
        numerator = masked.sum()  # ()
        own = per_token.shape[0] * max_tokens_norm
    return numerator / (own if denominator is None else denominator)  # ()


def _masked_mean(values: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``()`` mean of ``values`` where ``valid`` is true, 0 when nothing is valid (any shape);
    computed on the device, with no host read."""
    picked = torch.where(valid, values.float(), torch.zeros((), device=values.device))
    return picked.sum() / valid.sum().clamp(min=1)  # ()


@register_policy_loss("token")
def token_loss(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> Surrogate:
    """PPO/GRPO: one clipped ratio per token (Schulman et al. 2017; Shao et al. 2024)."""
    ratio = torch.exp(log_ratio)  # (B, T)
    adv_t = advantages.unsqueeze(-1)  # (B, 1)
    surr = ratio * adv_t  # (B, T)
    surr_clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv_t  # (B, T)
    per_token = -torch.minimum(surr, surr_clipped)  # (B, T)
    clipped = ((ratio > 1.0 + eps_high) & (adv_t > 0)) | (
        (ratio < 1.0 - eps_low) & (adv_t < 0)
    )  # (B, T): clip removed this token's gradient
    return Surrogate(per_token, _masked_mean(clipped, valid), _masked_mean(ratio.detach(), valid))


@register_policy_loss("sequence", unit="sequence")
def sequence_loss(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    valid: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> Surrogate:
    """GSPO: one length-normalised ratio per response, clipped as a whole (Zheng et al. 2025)."""
    lengths = valid.to(log_ratio.dtype).sum(dim=-1)  # (B,)
    seq_log_ratio = log_ratio.sum(dim=-1) / lengths.clamp(min=1.0)  # (B,)
    s = torch.exp(seq_log_ratio)  # (B,): GSPO's length-normalised sequence ratio
    surr = s * advantages  # (B,)
    surr_clipped = torch.clamp(s, 1.0 - eps_low, 1.0 + eps_high) * advantages  # (B,)
    per_seq = -torch.minimum(surr, surr_clipped)  # (B,)
    per_token = per_seq.unsqueeze(-1).expand_as(log_ratio)  # (B, T)
    nonempty = lengths > 0  # (B,)
    clipped = ((s > 1.0 + eps_high) & (advantages > 0)) | (
        (s < 1.0 - eps_low) & (advantages < 0)
    )  # (B,)
    return Surrogate(per_token, _masked_mean(clipped, nonempty), _masked_mean(s.detach(), nonempty))


def policy_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    **options: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """:func:`policy_loss_terms` with its metrics read to the host as floats (one read)."""
    loss, terms = policy_loss_terms(logp_new, logp_old, advantages, mask, **options)
    return loss, metrics_to_host(terms)


def metrics_to_host(terms: dict[str, torch.Tensor]) -> dict[str, float]:
    """0-dim metric tensors as floats, read from their device in one transfer."""
    if not terms:
        return {}
    values = torch.stack([t.detach().double().reshape(()) for t in terms.values()]).tolist()
    return dict(zip(terms, values))


def policy_loss_terms(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    level: str = "token",
    aggregation: Aggregation = "seq_mean",
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    max_tokens_norm: float | None = None,
    denominator: float | None = None,
    kl_logp_new: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss to minimise, and its metrics as 0-dim tensors on the loss's
    device (nothing here waits for the device; :func:`policy_loss` reads them as floats).

    Args:
        logp_new: ``(B, T)`` logprobs of the response tokens under the policy being trained;
            the only input that carries gradient.
        logp_old: ``(B, T)`` logprobs under the behaviour policy that sampled them.
        advantages: ``(B,)`` one advantage per response, shared by all its tokens.
        mask: ``(B, T)`` 1 (or True) where the token was generated by the agent, else 0.
            Values at masked-out positions of the other tensors are ignored, even if infinite.
        clip_eps: lower clip range, the ratio is kept above ``1 - clip_eps``.
        clip_eps_high: upper clip range (ratio below ``1 + clip_eps_high``); ``None`` means
            ``clip_eps``. Larger than ``clip_eps`` gives DAPO's clip-higher.
        level: a registered policy loss: ``"token"`` for the GRPO/PPO per-token ratio,
            ``"sequence"`` for GSPO.
        aggregation: ``"seq_mean"`` (GRPO), ``"token_mean"`` (DAPO) or ``"constant"``
            (Dr. GRPO, needs ``max_tokens_norm``).
        ref_logp: ``(B, T)`` logprobs under a frozen reference policy, for the KL term.
        beta: weight of the k3 KL to ``ref_logp``; needs ``ref_logp`` when positive.
        max_tokens_norm: the constant length of ``"constant"`` aggregation, normally the
            generation budget (``max_new_tokens``).
        denominator: the aggregation's normaliser, when this batch is part of a larger one
            that the loss is normalised over (:func:`aggregation_denominator` of the larger
            batch's masks); ``None`` = this batch's own.
        kl_logp_new: ``(B, T)`` the policy's logprobs for the KL term when they are not
            ``logp_new`` (with gradient): the learner passes logprobs without top-p here, on the
            same distribution as ``ref_logp``, while the ratio uses the sampling distribution.
        entropy: ``(B, T)`` the sampling distribution's entropy at each response token's
            position (with gradient; :func:`marl.agents.logprobs.token_entropy`).
        entropy_coef: weight of the entropy bonus; needs ``entropy`` when positive.

    Returns:
        ``(loss, metrics)``: the scalar loss ``pg_loss + beta * kl - entropy_coef * entropy``
        (each aggregated like the policy loss), and ``loss``,
        ``pg_loss``, ``kl`` (0.0 without ``ref_logp``), ``clip_frac`` (fraction of masked tokens,
        or of non-empty responses for a ``"sequence"``-unit loss, whose gradient the clip removed),
        ``ratio_mean`` (mean ``w`` over masked tokens, or mean ``s_i``), ``approx_kl_old`` (k3
        estimate of KL(old || new) per masked token), ``entropy_proxy`` (``-mean`` masked
        ``logp_new``, the sampled-token entropy estimate), ``entropy`` (the exact aggregated
        entropy, only when ``entropy`` is given) and ``n_tokens``.
    """
    _check_inputs(
        logp_new,
        logp_old,
        advantages,
        mask,
        ref_logp,
        kl_logp_new,
        clip_eps,
        clip_eps_high,
        level,
        aggregation,
        beta,
        max_tokens_norm,
        denominator,
        entropy,
        entropy_coef,
    )
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high

    valid = mask.bool()  # (B, T)
    maskf = valid.to(logp_new.dtype)  # (B, T)
    adv = advantages.detach().to(logp_new.dtype)  # (B,)
    zero = torch.zeros_like(logp_new)  # (B, T)
    # where() rather than a product, so inf/NaN at masked positions never reach the loss
    log_ratio = torch.where(valid, logp_new - logp_old.detach(), zero)  # (B, T)
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T): exp stays finite

    surrogate = POLICY_LOSSES[level](log_ratio, adv, valid, eps_low, eps_high)
    per_token = surrogate.per_token  # (B, T)

    pg_loss = _aggregate(per_token, maskf, aggregation, max_tokens_norm, denominator)  # ()

    kl_value = torch.zeros((), device=logp_new.device)  # ()
    loss = pg_loss  # ()
    if ref_logp is not None:
        kl_new = logp_new if kl_logp_new is None else kl_logp_new  # (B, T)
        d = torch.where(valid, ref_logp.detach() - kl_new, zero)  # (B, T)
        d = d.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # (B, T)
        kl_tok = torch.exp(d) - d - 1.0  # (B, T): k3, >= 0, exactly 0 where masked
        kl = _aggregate(kl_tok, maskf, aggregation, max_tokens_norm, denominator)  # ()
        kl_value = kl.detach().clamp(min=0.0)  # () k3 is >= 0; rounding can leave -1e-17
        if beta > 0:
            loss = pg_loss + beta * kl  # ()
    spread = None
    if entropy is not None:
        ent_tok = torch.where(valid, entropy, zero)  # (B, T)
        spread = _aggregate(ent_tok, maskf, aggregation, max_tokens_norm, denominator)  # ()
        if entropy_coef > 0:
            loss = loss - entropy_coef * spread  # ()

    with torch.no_grad():
        lr = log_ratio.detach()  # (B, T)
        # k3 of KL(old || new), >= 0: exp(x) - 1 rounds below x for |x| near 1e-8, so clamp
        approx_kl_old = _masked_mean((torch.exp(lr) - 1.0 - lr).clamp(min=0.0), valid)
        entropy_proxy = -_masked_mean(logp_new.detach(), valid & logp_new.detach().isfinite())

    device = logp_new.device
    metrics = {
        "loss": loss.detach(),
        "pg_loss": pg_loss.detach(),
        "kl": kl_value,
        "clip_frac": torch.as_tensor(surrogate.clip_frac, device=device),
        "ratio_mean": torch.as_tensor(surrogate.ratio_mean, device=device),
        "approx_kl_old": approx_kl_old,
        "entropy_proxy": entropy_proxy,
        "n_tokens": maskf.sum().detach(),
    }
    if spread is not None:
        metrics["entropy"] = spread.detach()
    return loss, metrics


def _check_inputs(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
    kl_logp_new: torch.Tensor | None,
    clip_eps: float,
    clip_eps_high: float | None,
    level: str,
    aggregation: str,
    beta: float,
    max_tokens_norm: float | None,
    denominator: float | None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> None:
    """Raise ValueError naming the offending argument when the inputs do not fit together."""
    if logp_new.ndim != 2:
        raise ValueError(f"logp_new must be shaped (B, T), got {tuple(logp_new.shape)}")
    shape = tuple(logp_new.shape)
    others = (("logp_old", logp_old), ("mask", mask), ("ref_logp", ref_logp))
    for name, t in (*others, ("kl_logp_new", kl_logp_new), ("entropy", entropy)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(
                f"{name} must have the shape of logp_new {shape}, got {tuple(t.shape)}"
            )
    if tuple(advantages.shape) != shape[:1]:
        raise ValueError(
            f"advantages must be shaped (B,) = {shape[:1]}, got {tuple(advantages.shape)}"
        )
    if not logp_new.is_floating_point():
        raise ValueError(f"logp_new must be a float tensor, got {logp_new.dtype}")
    if level not in POLICY_LOSSES:
        raise ValueError(f"level must be one of {tuple(list_policy_losses())}, got {level!r}")
    as_aggregation(aggregation)
    if not 0.0 <= clip_eps < 1.0:
        raise ValueError(f"clip_eps must be in [0, 1), got {clip_eps}")
    if clip_eps_high is not None and clip_eps_high < 0.0:
        raise ValueError(f"clip_eps_high must be >= 0, got {clip_eps_high}")
    if beta < 0.0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0.0 and ref_logp is None:
        raise ValueError(f"beta={beta} weights a KL to the reference policy, but ref_logp is None")
    if entropy_coef < 0.0:
        raise ValueError(f"entropy_coef must be >= 0, got {entropy_coef}")
    if entropy_coef > 0.0 and entropy is None:
        raise ValueError(
            f"entropy_coef={entropy_coef} weights an entropy bonus, but entropy is None"
        )
    if aggregation == "constant" and (max_tokens_norm is None or max_tokens_norm <= 0):
        raise ValueError(
            "aggregation='constant' (Dr. GRPO) needs max_tokens_norm > 0, normally the "
            f"generation budget max_new_tokens; got {max_tokens_norm}"
        )
    if denominator is not None and not denominator > 0:
        raise ValueError(f"denominator must be > 0, got {denominator}")
