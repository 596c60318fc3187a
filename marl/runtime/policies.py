"""Build policies from the config: the inference side (backends) and the learning side.

- :class:`InferencePolicies` is what a rollout worker holds: one generation backend per policy,
  built through the backend registry (``config.backend``: ``hf``, ``vllm``...). LoRA policies
  over the same base model share ONE backend, each as a named adapter; frozen full policies over
  that base use its plain rows. Trainable full policies get a backend each.
- :class:`PolicyLearner` is one trainable policy's learner: its own model (or, in one process,
  the backend's model itself, trained in place), optimizer, and the weights it publishes.
- A :class:`WeightPayload` carries a policy's new weights (a full state dict, or only the adapter
  for a LoRA policy) from its learner to the inference side.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from marl.agents.backends import (
    Generation,
    PolicyBackend,
    SamplingConfig,
    backend_options,
    make_backend,
    peft_lora_config,
)
from marl.agents.models import ModelSpec, load_model, with_lora
from marl.config import Config, UpdateSettings
from marl.errors import RunError
from marl.runtime.learner import Learner, LearnerSettings
from marl.runtime.policy_map import PolicyPlan, PolicySpec


def build_backend(
    config: Config, model: ModelSpec | None = None, device: str | None = None, **offered: Any
) -> PolicyBackend:
    """Load a model (the run's, or ``model``) on ``device`` and wrap it in the configured
    backend. The run offers ``algo.share_prompts`` and ``offered`` (the adapter slots of a
    shared base); the backend gets those its ``options`` name
    (:func:`marl.agents.backends.backend_options`)."""
    loaded, tokenizer = load_model(model or config.model, device)
    offered = {"share_prompts": config.algo.share_prompts, **offered}
    options = backend_options(config.backend, offered)
    return make_backend(config.backend, model=loaded, tokenizer=tokenizer, **options)


def learner_settings(
    config: Config,
    lr: float | None = None,
    beta: float | None = None,
    entropy: float | None = None,
    temperature: float | None = None,
) -> LearnerSettings:
    """The learner's settings: ``config.algo``'s update fields (``lr``/``beta``/``entropy`` per
    policy) and ``config.sampling`` (at the policy's own ``temperature``, where it has one: the
    ratio is taken under the distribution its rollout sampled from)."""
    update = {f.name: getattr(config.algo, f.name) for f in dataclasses.fields(UpdateSettings)}
    for name, value in (("lr", lr), ("beta", beta), ("entropy", entropy)):
        if value is not None:
            update[name] = value
    sampling = config.sampling
    if temperature is not None:
        sampling = dataclasses.replace(sampling, temperature=temperature)
    return LearnerSettings(**update, sampling=sampling)


def policy_seed(seed: int, policy_id: str) -> int:
    """A policy's own seed (its learner's minibatch order, its adapter's initial weights)."""
    digest = hashlib.sha256(f"{seed}:{policy_id}".encode()).hexdigest()
    return int(digest[:8], 16)


@dataclass
class WeightPayload:
    """A policy's weights on their way from its learner to the inference side."""

    policy_id: str
    kind: str  # "full" (every base weight) or "adapter" (peft adapter state dict)
    state: dict[str, torch.Tensor]
    version: int  # the number of updates the learner has made


class AdapterBackend:
    """One policy's view of a shared base backend: every row uses the policy's adapter (or the
    plain base, for ``adapter=None``). Weight pushes go to that adapter only."""

    options: ClassVar[frozenset[str]] = frozenset()  # no factory builds a view: its base is built

    def __init__(self, base: PolicyBackend, adapter: str | None, lora_config: Any = None) -> None:
        self.base = base
        self.adapter = adapter
        self.lora_config = lora_config
        self.tokenizer = base.tokenizer

    @property
    def model(self) -> Any:
        """The shared base backend's model."""
        return self.base.model

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        adapters: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[list[Generation]]:
        """Generate with this policy's adapter on every row (one batched call)."""
        rows = [self.adapter] * len(prompts) if adapters is None else list(adapters)
        return self.base.generate(prompts, sampling, adapters=rows, seed=seed)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace this policy's adapter weights."""
        if self.adapter is None:
            raise ValueError("a frozen base-model view takes no weight pushes")
        self.base.add_adapter(self.adapter, state_dict, config=self.lora_config)

    def add_adapter(
        self, name: str, state_dict: Mapping[str, torch.Tensor] | None = None, config: Any = None
    ) -> None:
        """Adapters are managed on the shared base backend."""
        self.base.add_adapter(name, state_dict, config=config)

    def remove_adapter(self, name: str) -> None:
        """Adapters are managed on the shared base backend."""
        self.base.remove_adapter(name)


class InferencePolicies:
    """The inference side of every policy in a plan: what a rollout worker generates with."""

    def __init__(self, plan: PolicyPlan, config: Config, device: str | None = None) -> None:
        self.plan = plan
        self.backends: dict[str, PolicyBackend] = {}
        self.versions: dict[str, int] = {}
        shared: dict[tuple, PolicyBackend] = {}  # base key -> backend shared by LoRA/frozen
        specs = plan.policies
        lora_bases = {s.base_key for s in specs.values() if s.lora is not None}
        adapters_per_base: dict[tuple, int] = {}
        for s in specs.values():
            if s.lora is not None:
                adapters_per_base[s.base_key] = adapters_per_base.get(s.base_key, 0) + 1
        for pid, spec in specs.items():
            if spec.lora is not None or (not spec.trainable and spec.base_key in lora_bases):
                base = shared.get(spec.base_key)
                if base is None:
                    slots = {  # room for every adapter in one batch (backends that need it)
                        "max_adapters": max(4, adapters_per_base.get(spec.base_key, 0)),
                        "max_lora_rank": max(
                            [16] + [s.lora.r for s in specs.values() if s.lora is not None]
                        ),
                    }
                    base = build_backend(config, spec.model, device, **slots)
                    shared[spec.base_key] = base
                lora = peft_lora_config(spec.lora) if spec.lora is not None else None
                if spec.adapter is not None:
                    base.add_adapter(spec.adapter, None, config=lora)
                self.backends[pid] = AdapterBackend(base, spec.adapter, lora)
            elif not spec.trainable:  # frozen full policies over one base share it too
                base = shared.get(spec.base_key) or build_backend(config, spec.model, device)
                shared[spec.base_key] = base
                self.backends[pid] = base
            else:
                self.backends[pid] = build_backend(config, spec.model, device)
            self.versions[pid] = 0

    def load(self, payload: WeightPayload) -> None:
        """Push a learner's new weights (or adapter) into the policy's backend."""
        backend = self.backends[payload.policy_id]
        backend.load_weights(payload.state)
        self.versions[payload.policy_id] = payload.version


@contextmanager
def adapter_active(model: Any, adapter: str | None) -> Iterator[None]:
    """Run a forward pass of a (possibly peft-wrapped) model with ``adapter`` only, or with no
    adapter at all for ``None`` (or peft's ``"__base__"``). The active adapter stays set after
    (a learner activates its own before it trains: :meth:`PolicyLearner.activate`)."""
    if not hasattr(model, "peft_config"):
        yield
    elif adapter is None or adapter == "__base__":
        with model.disable_adapter():
            yield
    else:
        model.set_adapter(adapter)
        yield


class PolicyLearner:
    """One trainable policy's learner.

    ``model``: train this model in place (a colocated backend's own model, one process; the
    inference side then needs no weight push). For a LoRA policy that is the rollout's shared
    peft model, which holds every policy's adapter: this learner trains its own adapter there
    (:meth:`activate` makes it the active one before each pass), so the base is never copied
    and the rollout samples from the very tensors the optimizer steps. Otherwise the learner
    loads its own copy of the policy's base model and, for a LoRA policy, wraps it with the
    policy's adapter (peft); only the adapter trains and only the adapter is published.
    """

    def __init__(
        self,
        spec: PolicySpec,
        config: Config,
        device: str | None = None,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        self.spec = spec
        self.colocated = model is not None
        if model is None:
            model, tokenizer = load_model(spec.model, device)
            if spec.lora is not None:
                model = _with_adapter(model, spec, config.seed)
        # where this policy trains: the device asked for, else where its (colocated) model is
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.model = model
        self.tokenizer = tokenizer
        self.activate()  # a shared peft model: only this policy's adapter requires gradients
        self.learner = Learner(
            model,
            learner_settings(
                config,
                lr=spec.lr,
                beta=spec.beta,
                entropy=spec.entropy,
                temperature=spec.temperature,
            ),
            pad_token_id=tokenizer.pad_token_id or 0,
            seed=policy_seed(config.seed, spec.id),
            name=spec.id,
        )
        self.config = config
        self.version = 0
        self.window = (0.0, 0.0)  # wall-clock start and end of the last update
        check_placement(self.learner, self.device, spec.id)

    def update(self, turns: Sequence[Any]) -> dict[str, float]:
        """One update on this policy's turns (the caller passes only its agents' turns)."""
        start = time.time()
        foreign = sorted({t.agent for t in turns if t.policy_id != self.spec.id})
        if foreign:
            raise ValueError(
                f"learner of policy {self.spec.id!r} was given turns of agents {foreign}, which "
                "play other policies"
            )
        self.activate()
        metrics = self.learner.update(turns)
        self.version += 1
        self.window = (start, time.time())
        metrics["update_time"] = self.window[1] - start
        return metrics

    def activate(self) -> None:
        """Make this policy's adapter the active one of a peft model that holds several (its
        weights then require gradients, the others' do not); nothing for a full model."""
        if self.spec.adapter is not None and len(getattr(self.model, "peft_config", {})) > 1:
            self.model.set_adapter(self.spec.adapter)

    def _tensors(self) -> tuple[str, dict[str, torch.Tensor]]:
        """(kind, live tensors): the adapter of a LoRA policy, else the whole model."""
        if self.spec.lora is not None:
            from peft import get_peft_model_state_dict

            return "adapter", get_peft_model_state_dict(self.model, adapter_name=self.spec.adapter)
        return "full", self.model.state_dict()

    def weights(self) -> WeightPayload:
        """What the inference side needs after an update: the adapter of a LoRA policy, else
        every base weight, as detached CPU copies ready to ship. A tensor tied to another (a
        tied output layer) is sent once: the receiving model ties them too."""
        kind, tensors = self._tensors()
        state: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, value in tensors.items():
            if value.data_ptr() in seen:
                continue
            seen.add(value.data_ptr())
            state[name] = value.detach().to("cpu", copy=True)
        return WeightPayload(self.spec.id, kind, state, self.version)

    def weights_nbytes(self) -> int:
        """Bytes one sync of this policy ships to each rollout worker."""
        _, tensors = self._tensors()
        unique = {v.data_ptr(): v for v in tensors.values()}
        return sum(v.numel() * v.element_size() for v in unique.values())

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizer, RNG and version: what a checkpoint keeps of this policy."""
        kind, tensors = self._tensors()
        return {
            "kind": kind,
            "weights": {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()},
            "learner": self.learner.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; nothing loads unless it fits this model
        (:func:`check_state_fits`)."""
        check_state_fits(state, self.learner, self.model, self.spec.id)
        if state.get("kind", "full") == "adapter":
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state["weights"], adapter_name=self.spec.adapter)
        else:
            self.model.load_state_dict(state["weights"])
        self.learner.load_state_dict(state["learner"])
        self.version = int(state.get("version", 0))
        check_placement(self.learner, self.device, self.spec.id)

    def info(self) -> dict[str, Any]:
        """Where this learner runs (process, device)."""
        return {
            "policy": self.spec.id,
            "pid": os.getpid(),
            "device": str(next(self.model.parameters()).device),
            "update_window": self.window,
            "version": self.version,
        }


def check_state_fits(state: Mapping[str, Any], learner: Learner, model: Any, pid: str) -> None:
    """Refuse, in one line and before anything loads, a policy state (one that
    :func:`~marl.runtime.state_check.check_state` passed) that does not fit the model built for
    it: an optimizer state or master of another shape than the parameter of its index (torch
    would load the one and fail at the first step, and broadcast the other), or two weights the
    model ties into one tensor saved with different values (loading would keep the last)."""
    from marl.runtime.state_check import learner_fit_problem, tied_weights_problem

    masters = [master for _, master in learner.masters.pairs]
    problem = learner_fit_problem(state["learner"], learner.params, masters)
    if problem:
        raise RunError(
            f"resume: policy {pid!r}: the checkpoint's learner state does not fit this model: "
            f"{problem}"
        )
    if state.get("kind", "full") == "full":
        problem = tied_weights_problem(state["weights"], model)
        if problem:
            raise RunError(f"resume: policy {pid!r}: the checkpoint's {problem}")


def learner_tensors(learner: Learner) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor a learner trains with: the model's trainable weights and
    their gradients, the fp32 masters, the optimizer's state and the frozen reference."""
    for name, p in learner.model.named_parameters():
        if p.requires_grad:
            yield f"weight {name}", p
            if p.grad is not None:
                yield f"gradient of {name}", p.grad
    for i, master in enumerate(learner.masters.params):
        yield f"master weight {i}", master
    for i, state in enumerate(learner.optimizer.state.values()):
        for key, value in state.items():
            # AdamW's 0-dim step count may sit on the CPU by design
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                yield f"optimizer state {i}.{key}", value
    if learner.reference is not None:
        for name, p in learner.reference.named_parameters():
            yield f"reference weight {name}", p


def _same_device(tensor: torch.Tensor, device: torch.device) -> bool:
    """Whether ``tensor`` lives on ``device`` (``cuda`` matches ``cuda:0``, ``cuda:1``, ...
    only by type when no index was asked for)."""
    if tensor.device.type != device.type:
        return False
    return device.index is None or tensor.device.index in (None, device.index)


def check_placement(learner: Learner, device: torch.device, policy_id: str) -> None:
    """Refuse a learner with a tensor off its policy's ``device``, in one line naming it."""
    for name, tensor in learner_tensors(learner):
        if not _same_device(tensor, device):
            raise RunError(
                f"policy {policy_id!r}: its learner's {name} is on {tensor.device}, but the "
                f"policy trains on {device}; every weight, gradient, optimizer state and batch "
                "of a learner lives on its policy's device"
            )


def rollout_learner(
    spec: PolicySpec, config: Config, backend: PolicyBackend, device: str | None = None
) -> PolicyLearner:
    """A learner that trains the rollout ``backend``'s own weights in place (one process): a
    full model itself, or a LoRA policy's adapter on the shared base, first re-initialised from
    the policy's seed as a learner's own copy would be. No weights are copied, before or after
    an update. A backend without a torch model of its own (vLLM) gets a learner with its own
    copy on ``device`` that pushes its weights after each update."""
    target = getattr(backend, "base", backend)
    model = getattr(target, "model", None)
    if not isinstance(model, torch.nn.Module):
        return PolicyLearner(spec, config, device=device)
    if spec.lora is not None:
        with _adapter_seed(spec, config.seed):
            target.add_adapter(spec.adapter, None, config=peft_lora_config(spec.lora))
        model = target.model  # re-adding the only adapter re-wraps the base
    return PolicyLearner(spec, config, model=model, tokenizer=target.tokenizer, device=device)


def _with_adapter(model: Any, spec: PolicySpec, seed: int) -> Any:
    """Wrap ``model`` with the policy's LoRA adapter; its initial weights follow the seed."""
    with _adapter_seed(spec, seed):
        return with_lora(model, peft_lora_config(spec.lora), spec.adapter)


@contextmanager
def _adapter_seed(spec: PolicySpec, seed: int) -> Iterator[None]:
    """torch's RNG seeded with the policy's own seed for one block (a new adapter's initial
    weights), the caller's RNG state restored after."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(policy_seed(seed, spec.id))
        yield
