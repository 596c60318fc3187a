"""The learner: one clipped policy-gradient step of a policy on its agents' turn records.

Only the agent's own generated tokens count (the turn record's mask); received messages and
environment text are in the prompt and never trained on. Turns whose advantage is exactly zero
carry no policy gradient and are skipped when there is no KL term.

The learner trains whatever parameters of its model require gradients: every weight of a full
model, only the adapter of a peft LoRA model (whose KL reference is then the same model with the
adapter switched off, not a second copy).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from marl.agents.logprobs import sequence_logprobs
from marl.agents.turn import TurnRecord
from marl.credit.losses import policy_loss


@dataclass(frozen=True)
class LearnerSettings:
    """Update hyper-parameters (documented in marl.config.AlgoConfig)."""

    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta: float = 0.0
    level: str = "token"
    aggregation: str = "seq_mean"
    epochs: int = 1
    minibatch_size: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 48


class Learner:
    """Owns a trainable model, its optimizer and (when beta > 0) a frozen reference copy."""

    def __init__(
        self, model: nn.Module, settings: LearnerSettings, pad_token_id: int = 0, seed: int = 0
    ) -> None:
        self.model = model
        self.settings = settings
        self.pad_token_id = pad_token_id
        self.rng = random.Random(seed)
        params = [p for p in model.parameters() if p.requires_grad]
        try:
            self.optimizer = torch.optim.AdamW(
                params, lr=settings.lr, weight_decay=settings.weight_decay, fused=True
            )
        except (RuntimeError, TypeError):  # fused AdamW is not available for every device/dtype
            self.optimizer = torch.optim.AdamW(
                params, lr=settings.lr, weight_decay=settings.weight_decay
            )
        self.reference: nn.Module | None = None
        # A LoRA (peft) model's reference is its own base with the adapter switched off: no copy.
        is_peft = hasattr(model, "peft_config") and hasattr(model, "disable_adapter")
        self.reference_is_base = settings.beta > 0 and is_peft
        if settings.beta > 0 and not self.reference_is_base:
            self.reference = copy.deepcopy(model).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)

    def _logprobs(
        self, model: nn.Module, turns: Sequence[TurnRecord]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return sequence_logprobs(
            model,
            [t.prompt_ids for t in turns],
            [t.response_ids for t in turns],
            temperature=self.settings.temperature,
            top_p=self.settings.top_p,
            pad_token_id=self.pad_token_id,
        )

    def update(self, turns: Sequence[TurnRecord]) -> dict[str, float]:
        """One policy-gradient update on ``turns``; returns averaged metrics."""
        s = self.settings
        trainable = [t for t in turns if t.response_ids and (s.beta > 0 or t.advantage != 0.0)]
        metrics: dict[str, float] = {
            "turns": float(len(turns)),
            "trained_turns": float(len(trainable)),
            # a step with nothing to learn from (every group had equal returns) still logs these
            "loss": 0.0,
            "pg_loss": 0.0,
            "kl": 0.0,
            "clip_frac": 0.0,
            "grad_norm": 0.0,
        }
        if not trainable:
            return metrics
        self.model.train()
        totals: dict[str, float] = {}
        grad_norm = 0.0
        for _ in range(s.epochs):
            order = list(trainable)
            self.rng.shuffle(order)
            self.optimizer.zero_grad(set_to_none=True)
            for start in range(0, len(order), s.minibatch_size):
                batch = order[start : start + s.minibatch_size]
                weight = len(batch) / len(order)
                logp_new, mask = self._logprobs(self.model, batch)  # (B, T), (B, T)
                width = logp_new.shape[1]
                logp_old = torch.zeros_like(logp_new)  # (B, T)
                for b, turn in enumerate(batch):
                    logp_old[b, : len(turn.logprobs)] = torch.tensor(turn.logprobs[:width])
                advantages = torch.tensor(
                    [t.advantage for t in batch], dtype=logp_new.dtype
                )  # (B,)
                ref_logp = None
                if self.reference is not None:
                    with torch.no_grad():
                        ref_logp, _ = self._logprobs(self.reference, batch)  # (B, T)
                elif self.reference_is_base:
                    with torch.no_grad(), self.model.disable_adapter():
                        ref_logp, _ = self._logprobs(self.model, batch)  # (B, T)
                loss, batch_metrics = policy_loss(
                    logp_new,
                    logp_old,
                    advantages,
                    mask,
                    clip_eps=s.clip_eps,
                    clip_eps_high=s.clip_eps_high,
                    level=s.level,
                    aggregation=s.aggregation,
                    ref_logp=ref_logp,
                    beta=s.beta,
                    max_tokens_norm=s.max_new_tokens,
                )
                (loss * weight).backward()
                for key, value in batch_metrics.items():
                    totals[key] = totals.get(key, 0.0) + value * weight / s.epochs
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), s.max_grad_norm)
            )
            self.optimizer.step()
        self.model.eval()
        metrics.update(totals)
        metrics["grad_norm"] = grad_norm if math.isfinite(grad_norm) else float("nan")
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        return metrics

    def state_dict(self) -> dict:
        """Optimizer and learner RNG state (the model is saved separately)."""
        return {"optimizer": self.optimizer.state_dict(), "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])
