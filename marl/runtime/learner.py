"""The learner: clipped policy-gradient steps of a policy on its agents' turn records.

One :meth:`Learner.update` on the N turns of an iteration that have a response:

- **Minibatches.** ``epochs`` passes; each shuffles the N turns and cuts them into minibatches
  of ``minibatch_size`` turns, and the optimizer steps once per minibatch, as PPO and TRL do.
  The first minibatch's ratio is 1; later ones see weights that earlier steps moved, so the
  ratio moves away from 1 and the clip binds.
- **Mask.** Only tokens with ``TurnRecord.mask == 1`` count (the agent's own generated tokens):
  a token with mask 0 gets no gradient and is not counted by the aggregation.
- **Normalisation.** A minibatch's loss is normalised over every turn in it
  (:func:`marl.losses.aggregation_denominator`: its responses for ``seq_mean``, its
  tokens for ``token_mean``, turns x ``max_new_tokens`` for ``constant``), whatever their
  advantages. A turn whose advantage is exactly 0 carries no policy gradient, so with
  ``beta == 0`` and ``entropy == 0`` its forward pass is skipped: a pure speed-up that leaves
  the gradient as it is (the same as ``beta = 1e-12`` gives, up to the KL term). The scale
  therefore depends neither on which turns are skipped nor on whether beta is 0. A minibatch
  with no turn to run has no gradient and takes no optimizer step.
- **KL.** With ``beta > 0`` the k3 KL to the frozen reference (a copy of the model RL starts
  from: taken again after the imitation warm-up, :meth:`Learner.reset_reference`, and then
  saved with the learner's state, so a resumed run keeps it; a LoRA
  model's own base, adapter off) compares the two models'
  untruncated (temperature only, no top-p) logprobs, finite for every token; the ratio uses the
  sampling distribution (temperature, then top-p) that the behaviour policy drew from. Both
  log-ratios are clamped before ``exp`` (:data:`marl.losses.LOG_RATIO_BOUND`), so a
  token outside the nucleus gives no gradient rather than NaN.
- **Entropy.** With ``entropy > 0`` the loss subtracts that times the sampling distribution's
  exact entropy at each generated token (aggregated like the policy loss), from the same
  forward pass; ``policies/<id>/entropy`` logs it.
- **Non-finite values.** Before each optimizer step the loss and the clipped gradients are
  checked, after it the weights. A NaN or inf skips the step (weights and AdamW state stay as
  before it), warns, and counts in the ``nonfinite_skips`` metric; ``max_nonfinite_updates``
  skipped steps in a row raise :class:`NonFiniteUpdateError`, which stops the run before the
  step is checkpointed. Rolling back needs a copy: measured for 135M parameters, a copy of the
  weights and AdamW moments costs 0.26 s and 1.6 GB per step (the fused AdamW step: 0.17 s). So
  the copy is taken only before a step whose lr or weight decay is non-finite or whose lr is
  above 1. Otherwise AdamW's step with finite, clipped gradients is bounded
  (``|dp| <= lr * (~10 + weight_decay * |p|)``) and cannot overflow; if the weights ever do go
  non-finite without a copy, the learner raises at the next host read (the next step's, or the
  end of the update), before anything is checkpointed.
- **Host reads.** Nothing inside a minibatch waits for the device: the loss metrics stay
  0-dim device tensors, the gradient norm and the clip run on the device, and the weight check
  is one fused norm. The host reads them together once per optimizer step (:meth:`_read`), and
  once more at the end of an update for the last step's weights.
- **Microbatches** (``microbatch_tokens``). A minibatch's turns are cut, in order, into packed
  rows of at most this many positions (:meth:`Learner.microbatches`; ``None``: sized from free
  memory, :func:`default_microbatch_tokens`), each one forward and backward whose loss is
  normalised by the whole minibatch's denominator.
- **Precision.** A model with bf16 (or fp16) weights (``model.dtype=bfloat16``) runs its forward
  and backward passes in that dtype (fast, and the rollout generates with the same weights), but
  the optimizer steps fp32 master copies of its trainable weights and rounds them into the
  model after each step, so updates far smaller than bf16's resolution accumulate in the
  masters instead of rounding away. The masters are part of :meth:`Learner.state_dict`.
- **Devices.** Every tensor lives on the model's device; index tensors are built on the host
  and moved without blocking (:func:`marl.agents.packing.host_to_device`).
- **Packed rows and shared prompts** (``share_prompts``, on by default). A microbatch runs as
  one packed row (:mod:`marl.agents.packing`): every turn's ``prompt + response`` in a token
  trie, so a prefix that several turns share (the G episodes of a GRPO group often show an
  agent the same prompt; distinct prompts share a system prompt) runs once, with no padding;
  the loss and the gradient are those of the padded forward to float rounding. So that a
  prompt's turns tend to meet in one minibatch, the shuffled order is then regrouped so that
  turns with the same prompt are adjacent (groups in shuffled order, the minibatch sizes
  unchanged); a group that straddles a cut is split between two minibatches. Off, every turn
  is a path of its own in the row and minibatches are plain shuffles. A model whose attention
  is not the platform's (:data:`marl.agents.attention.MARL_ATTENTION`; an ``eager`` model, say)
  runs the unpacked forwards of :func:`marl.agents.logprobs.response_logprobs` instead.
- **The reference's logprobs** are computed once per update, for every turn that trains, in
  the same packed microbatches (the reference does not change within an update).

The learner trains whatever parameters of its model require gradients: every weight of a full
model, only the adapter of a peft LoRA model (whose KL reference is then the same model with the
adapter switched off, not a second copy).
"""

from __future__ import annotations

import copy
import math
import random
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from marl.agents.attention import runs_marl_attention, use_marl_attention
from marl.agents.backends.base import SamplingConfig
from marl.agents.logprobs import response_logprobs
from marl.agents.memory import free_memory_bytes
from marl.agents.packing import PrefixCounter, host_to_device
from marl.config import UpdateSettings
from marl.errors import RunError
from marl.losses import (
    aggregation_denominator,
    as_aggregation,
    metrics_to_host,
    policy_loss_terms,
    ratio_unit,
)
from marl.protocols.turn import TurnRecord

__all__ = [
    "Learner",
    "LearnerSettings",
    "NonFiniteUpdateError",
    "default_microbatch_tokens",
    "microbatch_tokens_for",
    "finite_flag",
    "nonfinite_tensors",
    "prompts_together",
]

LOW_PRECISION = (torch.bfloat16, torch.float16)


class NonFiniteUpdateError(RunError):
    """Optimizer steps kept meeting a NaN or inf loss, gradient or weight: the run stops."""


@dataclass
class LearnerSettings(UpdateSettings):
    """What a learner needs: the update settings, and ``sampling``, the run's sampling settings
    that the behaviour policy drew with: the ratio is taken under the same temperature and
    top-p, and ``constant`` aggregation divides by its ``max_new_tokens``."""

    sampling: SamplingConfig = field(default_factory=SamplingConfig)


class MasterWeights:
    """fp32 master copies of a model's low-precision trainable weights (mixed precision).

    ``params`` is what the optimizer steps: each fp32 weight itself, and an fp32 copy in place
    of each bf16/fp16 one. :meth:`grads_in` moves the model's gradients onto the copies,
    :meth:`weights_out` rounds the copies into the model.
    """

    def __init__(self, trainable: Sequence[nn.Parameter]) -> None:
        self.params: list[torch.Tensor] = []
        self.pairs: list[tuple[torch.Tensor, torch.Tensor]] = []  # (model weight, fp32 master)
        for p in trainable:
            if p.dtype in LOW_PRECISION:
                master = p.detach().to(torch.float32, copy=True)  # on p's device
                self.params.append(master)
                self.pairs.append((p, master))
            else:
                self.params.append(p)

    def grads_in(self) -> None:
        """Move each low-precision weight's gradient, as fp32, onto its master."""
        for p, master in self.pairs:
            master.grad = None if p.grad is None else p.grad.to(torch.float32)
            p.grad = None

    @torch.no_grad()
    def weights_out(self) -> None:
        """Round the masters into the model's weights."""
        for p, master in self.pairs:
            p.copy_(master)

    @torch.no_grad()
    def reset_from_model(self) -> None:
        """Masters := the model's weights (after weights were loaded into the model)."""
        for p, master in self.pairs:
            master.copy_(p)

    def state(self) -> list[torch.Tensor]:
        """Detached copies of the masters (for a checkpoint)."""
        return [master.detach().clone() for _, master in self.pairs]

    @torch.no_grad()
    def load(self, tensors: Sequence[torch.Tensor]) -> None:
        """Restore :meth:`state`'s result, then round it into the model."""
        if len(tensors) != len(self.pairs):
            raise RunError(
                f"learner state: {len(tensors)} master weights, but the model has "
                f"{len(self.pairs)} low-precision trainable weights"
            )
        for (_, master), saved in zip(self.pairs, tensors):
            master.copy_(saved)
        self.weights_out()


class Learner:
    """Owns a trainable model, its optimizer and (when beta > 0) a frozen reference copy.

    ``name`` (the policy id) only appears in warnings and errors.
    """

    def __init__(
        self,
        model: nn.Module,
        settings: LearnerSettings,
        pad_token_id: int = 0,
        seed: int = 0,
        name: str = "policy",
    ) -> None:
        self.model = use_marl_attention(model)  # packed rows need the platform's attention
        self.settings = settings
        self.packed = runs_marl_attention(model)  # else padded forwards (an eager model, say)
        self.microbatch_tokens = settings.microbatch_tokens or default_microbatch_tokens(model)
        self.pad_token_id = pad_token_id
        self.name = name
        self.aggregation = as_aggregation(settings.aggregation, "algo.aggregation")
        self.rng = random.Random(seed)
        self.masters = MasterWeights([p for p in model.parameters() if p.requires_grad])
        self.params = self.masters.params  # what the optimizer steps (fp32)
        self.optimizer = _adamw(self.params, settings)
        self.nonfinite_in_a_row = 0  # optimizer steps skipped in a row, across updates
        self.unchecked: torch.Tensor | None = None  # () the last step's weights all finite
        self.reference: nn.Module | None = None
        self.reference_reset = False  # reset_reference ran: the reference is not the base
        # A LoRA (peft) model's reference is its own base with the adapter switched off: no copy.
        is_peft = hasattr(model, "peft_config") and hasattr(model, "disable_adapter")
        self.reference_is_base = settings.beta > 0 and is_peft
        if settings.beta > 0 and not self.reference_is_base:
            self.reference = copy.deepcopy(model).eval()
            for p in self.reference.parameters():
                p.requires_grad_(False)

    def reset_reference(self) -> bool:
        """Make the frozen reference a copy of the model as it is now: called after the
        imitation warm-up, so the KL anchors RL to the policy it starts from (the warmed-up
        model, as TRL's reference is the SFT model), not to the base model the warm-up left.
        A LoRA model's reference stays its base (adapter off). Returns whether it was reset."""
        if self.reference is None:
            return False
        with torch.no_grad():
            for ref, live in zip(self.reference.parameters(), self.model.parameters()):
                ref.copy_(live)  # same module tree: deepcopy of this model
        self.reference_reset = True
        return True

    def update(self, turns: Sequence[TurnRecord]) -> dict[str, float]:
        """``epochs`` passes of minibatch steps on ``turns``; returns averaged metrics.

        Raises :class:`NonFiniteUpdateError` once ``max_nonfinite_updates`` optimizer steps in
        a row were skipped for a non-finite loss, gradient or weight.
        """
        s = self.settings
        usable = [t for t in turns if t.response_ids]
        metrics: dict[str, float] = {
            "turns": float(len(turns)),
            "trained_turns": float(sum(1 for t in usable if self._carries_gradient(t))),
            # a step with nothing to learn from (every group had equal returns) still logs these
            "loss": 0.0,
            "pg_loss": 0.0,
            "kl": 0.0,
            "clip_frac": 0.0,
            "ratio_mean": 1.0,
            "approx_kl_old": 0.0,
            "n_tokens": 0.0,
            "grad_norm": 0.0,
            "optimizer_steps": 0.0,
            "nonfinite_skips": 0.0,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
        }
        if not metrics["trained_turns"]:
            return metrics
        sums: dict[str, float] = {}
        weight = 0.0  # turns in the minibatches that ran
        counts = {"optimizer_steps": 0.0, "nonfinite_skips": 0.0}
        self.model.train()
        try:
            reference = self._reference_table([t for t in usable if self._carries_gradient(t)])
            for _ in range(s.epochs):
                order = list(usable)
                self.rng.shuffle(order)
                if s.share_prompts:
                    order = prompts_together(order)
                for start in range(0, len(order), s.minibatch_size):
                    batch = order[start : start + s.minibatch_size]
                    step = self._minibatch_step(batch, reference)
                    if step is None:
                        continue
                    counts["optimizer_steps" if step.pop("stepped") else "nonfinite_skips"] += 1
                    weight += len(batch)
                    for key, value in step.items():
                        sums[key] = sums.get(key, 0.0) + value * len(batch)
            self._check_last_step()
        finally:
            self._zero_grad()
            self.model.eval()
        metrics.update({key: value / weight for key, value in sums.items()})
        metrics.update(counts)
        return metrics

    def _carries_gradient(self, turn: TurnRecord) -> bool:
        """Whether ``turn`` can contribute a gradient (a policy term, the KL term or the entropy
        bonus)."""
        return self.settings.beta > 0 or self.settings.entropy > 0 or turn.advantage != 0.0

    def _minibatch_step(
        self, batch: Sequence[TurnRecord], reference: Mapping[int, torch.Tensor] | None = None
    ) -> dict[str, float] | None:
        """One optimizer step on ``batch``: its loss metrics and ``stepped`` (1.0, or 0.0 when a
        non-finite value skipped it), or None when the batch has no gradient.

        The host reads the device once: after every microbatch's backward pass and the clip,
        the loss, the gradient norm, the metrics and the previous step's weight check come over
        together (:meth:`_read`), and only then does the optimizer step or skip."""
        live = [t for t in batch if self._carries_gradient(t)]
        if not live:
            return None
        s = self.settings
        self._zero_grad()
        denominator = aggregation_denominator(
            [t.mask for t in batch], self.aggregation, s.sampling.max_new_tokens
        )
        terms = self._accumulate_gradients(live, denominator, reference)
        self.masters.grads_in()
        terms["grad_norm"] = self._clip_gradients()
        metrics = self._read(terms)
        norm = metrics["grad_norm"]
        problem: str | None
        if not math.isfinite(metrics["loss"]):
            metrics["grad_norm"], problem = float("nan"), "loss"
        elif not math.isfinite(norm):
            problem = "gradient"
        elif math.isnan(s.max_grad_norm / (norm + 1e-6)):
            metrics["grad_norm"], problem = float("nan"), "gradient"
        else:
            problem = self._step()
        if problem is None:
            self.nonfinite_in_a_row = 0
        else:
            self._skip(problem)
        metrics["stepped"] = float(problem is None)
        return metrics

    def _read(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """The one host read of an optimizer step: ``terms`` as floats, and the check of the
        previous step's weights that came with them (raises if they went non-finite)."""
        pending = self.unchecked
        if pending is not None:
            terms = {**terms, "_weights_finite": pending}
        values = metrics_to_host(terms)
        if pending is not None:
            self.unchecked = None
            self._weights_checked(bool(values.pop("_weights_finite")))
        return values

    def _check_last_step(self) -> None:
        """Read the last optimizer step's weight check (one host read per update)."""
        if self.unchecked is not None:
            finite = bool(self.unchecked)
            self.unchecked = None
            self._weights_checked(finite)

    def _weights_checked(self, finite: bool) -> None:
        """Raise if a step without a rollback copy left non-finite weights (the summed check
        can overflow on finite weights: then the exact one decides)."""
        if finite or all_finite(self.params):
            return
        lr = self.optimizer.param_groups[0]["lr"]
        raise NonFiniteUpdateError(
            f"policy {self.name!r}: the weights became non-finite in an optimizer step with "
            f"finite gradients (algo.lr={lr}); stopping before anything is checkpointed"
        )

    def microbatches(self, turns: Sequence[TurnRecord]) -> list[list[TurnRecord]]:
        """``turns`` cut, in order, into microbatches of at most ``microbatch_tokens``
        positions (a packed row's positions: a prompt shared by adjacent turns counts once); a
        turn longer than the budget is a microbatch of its own."""
        chunks: list[list[TurnRecord]] = []
        counter = PrefixCounter(self.settings.share_prompts)
        for turn in turns:
            path = [*turn.prompt_ids, *turn.response_ids]
            if chunks and counter.nodes + counter.cost(path) > self.microbatch_tokens:
                counter = PrefixCounter(self.settings.share_prompts)
                chunks.append([])
            if not chunks:
                chunks.append([])
            chunks[-1].append(turn)
            counter.add(path)
        return chunks

    def _accumulate_gradients(
        self,
        live: Sequence[TurnRecord],
        denominator: float | None,
        reference: Mapping[int, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Backward the loss of ``live`` in :meth:`microbatches`, each normalised by the
        minibatch's ``denominator`` so that the gradients add up to the minibatch's. Returns the
        minibatch's metrics as 0-dim tensors on the device (no host read): loss terms summed,
        the per-token statistics averaged weighted by tokens (a non-finite loss shows in
        ``loss``; the caller then skips the step)."""
        total: dict[str, torch.Tensor] = {}
        counts: dict[str, float] = {}
        for chunk in self.microbatches(live):
            loss, metrics = self.loss_terms(chunk, denominator, reference)
            loss.backward()
            weights = self._metric_weights(chunk)
            for key, value in metrics.items():
                w = weights.get(key, weights["*"])
                total[key] = total[key] + value * w if key in total else value * w
                counts[key] = counts.get(key, 0.0) + w
        for key in total:
            if key not in _ADDITIVE_METRICS:
                total[key] = total[key] / counts[key] if counts[key] else total[key] * 0.0
        return total

    def _metric_weights(self, chunk: Sequence[TurnRecord]) -> dict[str, float]:
        """How much one microbatch's metrics weigh in the minibatch's: sums for the additive
        ones, sequences for the ratio statistics of a sequence-unit loss (GSPO), tokens for the
        rest (counted on the host, from the turns' masks)."""
        tokens = float(sum(sum(1 for m in t.mask[: len(t.response_ids)] if m) for t in chunk))
        weights = dict.fromkeys(_ADDITIVE_METRICS, 1.0) | {"*": tokens}
        if ratio_unit(self.settings.level) == "sequence":
            sequences = float(sum(1 for t in chunk if any(t.mask)))
            weights |= {"clip_frac": sequences, "ratio_mean": sequences}
        return weights

    def loss(
        self, turns: Sequence[TurnRecord], denominator: float | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped policy-gradient loss of ``turns`` (with gradient) and its metrics as
        floats, normalised by ``denominator`` (default: these turns' own normaliser)."""
        loss, terms = self.loss_terms(turns, denominator)
        return loss, metrics_to_host(terms)

    def loss_terms(
        self,
        turns: Sequence[TurnRecord],
        denominator: float | None = None,
        reference: Mapping[int, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`loss` with its metrics left on the device. ``reference``: the turns' reference
        logprobs by ``id(turn)`` (:meth:`_reference_table`); computed here when not given."""
        s = self.settings
        new = response_logprobs(
            self.model,
            [t.prompt_ids for t in turns],
            [t.response_ids for t in turns],
            temperature=s.sampling.temperature,
            top_p=s.sampling.top_p,
            pad_token_id=self.pad_token_id,
            untruncated=s.beta > 0,
            share_prompts=s.share_prompts,
            packed=self.packed,
            entropy=s.entropy > 0,
        )
        logp_new = new.sampling  # (B, T)
        device, dtype, width = logp_new.device, logp_new.dtype, logp_new.shape[1]
        logp_old = _padded([t.logprobs for t in turns], width, dtype, device)  # (B, T)
        turn_mask = _padded([t.mask for t in turns], width, dtype, device)  # (B, T)
        advantages = host_to_device(
            torch.tensor([t.advantage for t in turns], dtype=dtype, device="cpu"), device
        )  # (B,)
        if reference is None:
            ref_logp = self._reference_logprobs(turns)
        else:
            rows = [reference[id(t)] for t in turns]  # each (T_i,)
            ref_logp = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # (B, T)
        return policy_loss_terms(
            logp_new,
            logp_old,
            advantages,
            new.mask * turn_mask,  # (B, T): response tokens the agent generated
            clip_eps=s.clip_eps,
            clip_eps_high=s.clip_eps_high,
            level=s.level,
            aggregation=self.aggregation,
            ref_logp=ref_logp,
            beta=s.beta,
            max_tokens_norm=s.sampling.max_new_tokens,
            denominator=denominator,
            kl_logp_new=new.untruncated,
            entropy=new.entropy,
            entropy_coef=s.entropy,
        )

    def _reference_table(self, turns: Sequence[TurnRecord]) -> dict[int, torch.Tensor] | None:
        """Every turn's reference logprobs, computed once per update in :meth:`microbatches`
        (the reference never changes within one), by ``id(turn)``: ``(T_i,)`` tensors on the
        device. None without a reference."""
        if self.reference is None and not self.reference_is_base:
            return None
        table: dict[int, torch.Tensor] = {}
        ordered = prompts_together(turns) if self.settings.share_prompts else list(turns)
        for chunk in self.microbatches(ordered):
            logp = self._reference_logprobs(chunk)  # (b, T)
            assert logp is not None
            for row, turn in zip(logp, chunk):
                table[id(turn)] = row[: len(turn.response_ids)]
        return table

    def _reference_logprobs(self, turns: Sequence[TurnRecord]) -> torch.Tensor | None:
        """``(B, T)`` untruncated logprobs under the frozen reference; None without one."""
        if self.reference is not None:
            model, switch = self.reference, nullcontext()
        elif self.reference_is_base:
            model, switch = self.model, self.model.disable_adapter()  # type: ignore[operator]
        else:
            return None
        with torch.no_grad(), switch:
            return response_logprobs(
                model,
                [t.prompt_ids for t in turns],
                [t.response_ids for t in turns],
                temperature=self.settings.sampling.temperature,
                top_p=1.0,
                pad_token_id=self.pad_token_id,
                share_prompts=self.settings.share_prompts,
                packed=self.packed,
            ).sampling

    def _clip_gradients(self) -> torch.Tensor:
        """Clip the gradients to ``max_grad_norm`` on the device; returns their ``()`` norm
        before clipping (NaN or inf if any gradient is not finite; the caller reads it)."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return torch.zeros((), device=self.params[0].device if self.params else "cpu")
        norm = torch.nn.utils.get_total_norm(grads)  # ()
        torch.nn.utils.clip_grads_with_norm_(self.params, self.settings.max_grad_norm, norm)
        return norm

    def _step(self) -> str | None:
        """The optimizer step; ``"weights"`` if it made them non-finite (then undone). Without
        a rollback copy the weights are checked on the device and read with the next step's
        metrics (:meth:`_read`) or at the end of the update."""
        if self._needs_snapshot():
            saved = self._snapshot()
            self.optimizer.step()
            if all_finite(self.params):
                self.masters.weights_out()
                return None
            self._restore(saved)
            return "weights"
        self.optimizer.step()
        self.masters.weights_out()
        self.unchecked = finite_flag(self.params)
        return None

    def _needs_snapshot(self) -> bool:
        """Whether a step could overflow the weights: a non-finite or huge lr / weight decay."""
        for group in self.optimizer.param_groups:
            lr, wd = float(group["lr"]), float(group["weight_decay"])
            if not (math.isfinite(lr) and math.isfinite(wd)) or lr > 1.0 or lr * wd > 1.0:
                return True
        return False

    def _snapshot(self) -> tuple[list[torch.Tensor], dict]:
        """Copies of the stepped weights and the optimizer state."""
        weights = [p.detach().clone() for p in self.params]
        return weights, copy.deepcopy(self.optimizer.state_dict())

    @torch.no_grad()
    def _restore(self, saved: tuple[list[torch.Tensor], dict]) -> None:
        """Undo a step: put back :meth:`_snapshot`'s copies."""
        weights, optimizer_state = saved
        for p, w in zip(self.params, weights):
            p.copy_(w)
        self.optimizer.load_state_dict(optimizer_state)
        self.masters.weights_out()

    def _skip(self, problem: str) -> None:
        """Count a skipped step; warn, or stop once too many were skipped in a row."""
        self._zero_grad()
        self.nonfinite_in_a_row += 1
        n, limit = self.nonfinite_in_a_row, self.settings.max_nonfinite_updates
        if n >= limit:
            raise NonFiniteUpdateError(
                f"policy {self.name!r}: {n} optimizer steps in a row had a non-finite {problem} "
                f"and were skipped (algo.max_nonfinite_updates={limit}); stopping the run. The "
                "weights are the last finite ones, as is every checkpoint; check algo.lr, "
                "algo.weight_decay, algo.max_grad_norm and the sampling settings"
            )
        warnings.warn(
            f"policy {self.name!r}: non-finite {problem}, optimizer step skipped ({n} in a row; "
            f"the run stops at algo.max_nonfinite_updates={limit})",
            RuntimeWarning,
            stacklevel=3,
        )

    def _zero_grad(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.optimizer.zero_grad(set_to_none=True)

    def state_dict(self) -> dict:
        """Optimizer, learner RNG, fp32 master weights (mixed precision only), the count of
        non-finite skips in a row and, once :meth:`reset_reference` ran, the KL reference's
        weights (a resumed run starts from later weights, and the warm-up does not run again;
        the model is saved separately)."""
        state: dict[str, Any] = {
            "optimizer": self.optimizer.state_dict(),
            "rng": self.rng.getstate(),
            "nonfinite_in_a_row": self.nonfinite_in_a_row,
        }
        if self.masters.pairs:
            state["master"] = self.masters.state()
        if self.reference is not None and self.reference_reset:
            state["reference"] = {
                k: v.detach().cpu() for k, v in self.reference.state_dict().items()
            }
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned; call it after loading the model's weights
        (without saved masters, the masters restart from the model's weights)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.rng.setstate(state["rng"])
        self.nonfinite_in_a_row = int(state.get("nonfinite_in_a_row", 0))
        if "master" in state:
            self.masters.load(state["master"])
        else:
            self.masters.reset_from_model()
        if self.reference is not None:
            if "reference" in state:  # the warmed-up model the run anchored to
                self.reference.load_state_dict(state["reference"])
                self.reference_reset = True
            else:  # none saved (no warm-up before it): the reference stays the model this
                # learner was built from, the base, which the checkpoint's weights do not touch
                self.reference_reset = False


# A packed row's positions: at least this many (a smaller row wastes the device on overhead), at
# most this many (the row's index tensors and chunked keys grow with it)
MIN_MICROBATCH_TOKENS = 256
MAX_MICROBATCH_TOKENS = 32768
# the share of the free memory one microbatch's activations may take: a GPU's own memory, or the
# RAM a CPU run shares with its rollout model, Ray and everything else
MICROBATCH_MEMORY_SHARE = {"cuda": 0.25, "cpu": 0.05}


def activation_bytes_per_position(model: nn.Module) -> int:
    """Bytes one position of a packed row keeps for the backward pass, estimated from the
    model's shape: per layer 10 hidden-sized and 4 MLP-sized activations in the compute dtype;
    for every LoRA layer whose adapter trains in another dtype (fp32 adapters on a bf16 base),
    the copy of its input cast to that dtype; plus the fp32 logits, log-softmax and their
    gradient as if every position predicted a response token. Measured on SmolLM2-135M with
    the demo's LoRA (rank 16 on every linear layer, adapters in fp32) on a bf16 base, 2-core
    EPYC: an update's peak RSS grew by 0.69 GB with packed rows of 512 positions and 1.44 GB
    with 1,024 (1.4 MB a position); this estimates 1.9 MB."""
    config = getattr(model, "config", None)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    if not hidden:
        return 1 << 20
    layers = int(getattr(config, "num_hidden_layers", 1))
    mlp = int(getattr(config, "intermediate_size", 4 * hidden))
    vocab = int(getattr(config, "vocab_size", 0))
    dtype = next(model.parameters()).dtype
    size = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4
    casts = 0
    for module in model.modules():
        adapters = getattr(module, "lora_A", None)
        if isinstance(adapters, nn.ModuleDict) and adapters:
            weight = next(iter(adapters.values())).weight  # (r, in)
            if weight.dtype != dtype:
                casts += weight.shape[1] * (torch.finfo(weight.dtype).bits // 8)
    return layers * (10 * hidden + 4 * mlp) * size + casts + 3 * vocab * 4


def default_microbatch_tokens(model: nn.Module) -> int:
    """``algo.microbatch_tokens: null``: the positions whose activations fill
    :data:`MICROBATCH_MEMORY_SHARE` of the free memory, rounded down to a power of two (so that
    a little more or less free memory at a resume gives the same microbatches), within
    [:data:`MIN_MICROBATCH_TOKENS`, :data:`MAX_MICROBATCH_TOKENS`]."""
    device = next(model.parameters()).device
    return microbatch_tokens_for(
        free_memory_bytes(device), activation_bytes_per_position(model), device.type
    )


def microbatch_tokens_for(free_bytes: int, bytes_per_position: int, device_type: str) -> int:
    """:func:`default_microbatch_tokens` for given free memory and per-position bytes."""
    share = MICROBATCH_MEMORY_SHARE["cuda" if device_type == "cuda" else "cpu"]
    fits = int(share * free_bytes) // max(1, bytes_per_position)
    power = 1 << max(0, fits.bit_length() - 1)  # the largest power of two <= fits
    return max(MIN_MICROBATCH_TOKENS, min(MAX_MICROBATCH_TOKENS, power))


# loss terms that are already shares of the minibatch's normaliser, and counts: a minibatch's
# value is the sum over its microbatches (the other metrics are per-token means)
_ADDITIVE_METRICS = frozenset({"loss", "pg_loss", "kl", "entropy", "n_tokens"})


def prompts_together(turns: Sequence[TurnRecord]) -> list[TurnRecord]:
    """``turns`` regrouped so that turns with identical prompt ids are adjacent: the groups in
    the order of their first turn, each group's turns in their given order."""
    groups: dict[tuple[int, ...], list[TurnRecord]] = {}
    for turn in turns:
        groups.setdefault(tuple(turn.prompt_ids), []).append(turn)
    return [turn for group in groups.values() for turn in group]


def _adamw(params: list[torch.Tensor], settings: LearnerSettings) -> torch.optim.Optimizer:
    """AdamW over ``params``, fused where the device and dtype allow it."""
    try:
        return torch.optim.AdamW(
            params, lr=settings.lr, weight_decay=settings.weight_decay, fused=True
        )
    except (RuntimeError, TypeError):  # fused AdamW is not available for every device/dtype
        return torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)


def _padded(
    rows: Sequence[Sequence[float]], width: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """``(B, width)`` tensor of ``rows``, cut or right-padded with 0, moved to ``device``."""
    data = [list(r[:width]) + [0] * (width - len(r[:width])) for r in rows]
    return host_to_device(torch.tensor(data, dtype=dtype, device="cpu"), device)  # (B, width)


def finite_flag(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``()`` bool on the tensors' device: whether every floating-point element is finite, by
    one fused norm over all of them (``torch._foreach_norm``: one kernel on a GPU, not one per
    tensor). False also when a norm of finite values overflows: read it, then check exactly
    (:func:`all_finite`). Nothing is read to the host."""
    floats = [t.detach() for t in tensors if t.is_floating_point() and t.numel()]
    if not floats:
        return torch.ones((), dtype=torch.bool, device="cpu")
    norms = torch._foreach_norm(floats)  # one () norm per tensor; NaN/inf if any element is
    return torch.isfinite(torch.stack(norms)).all()  # ()


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite (one sum per tensor; an exact check only
    when a sum overflows)."""
    floats = [t.detach() for t in tensors if t.is_floating_point() and t.numel()]
    if bool(finite_flag(floats)):
        return True
    return all(bool(torch.isfinite(t).all()) for t in floats)


def nonfinite_tensors(state: Any, prefix: str = "") -> list[str]:
    """Dotted names of the floating-point tensors in a nested dict/list/tuple ``state`` that
    hold a NaN or an inf (a checkpoint must never carry one)."""
    if isinstance(state, torch.Tensor):
        return [] if all_finite([state]) else [prefix or "<tensor>"]
    if isinstance(state, Mapping):
        items: Iterator[tuple[Any, Any]] = iter(state.items())
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return []
    found: list[str] = []
    for key, value in items:
        found += nonfinite_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    return found
