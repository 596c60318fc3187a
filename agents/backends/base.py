"""The one interface every policy backend implements, and the backend registry."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from marl.protocols.registry import Registry

if TYPE_CHECKING:  # torch is imported where weights are copied: the config schema needs none
    import torch

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in adapter_names
# The most tokens one reply may be given, whatever the model: a reply never outgrows its model's
# context, and no preset's is over 8,192 tokens (SmolLM2's); 32,768 leaves room for an ``hf``
# model with a longer one. It refuses a typo (100000000) when the config loads, before a model is
# built and caches are sized by it; the model's own context bounds it exactly when a run starts
# (:mod:`marl.agents.context`).
MAX_NEW_TOKENS = 32_768


@dataclass
class SamplingConfig:
    """How replies are sampled: the ``sampling`` config group of a run, what a backend's
    ``generate`` takes, and the distribution the learner's importance ratio is taken under.

    max_new_tokens:  the generation budget of one reply, in tokens, at most
                     :data:`MAX_NEW_TOKENS` and, with the prompt, the model's context; also the
                     constant length of ``constant`` (Dr. GRPO) loss aggregation.
    temperature:     the softmax temperature; 0 = greedy. A greedy reply's logprobs are those of
                     temperature 1, the model's own distribution
                     (:func:`marl.agents.logprobs.sampling_logprobs`).
    top_p:           nucleus sampling: the smallest set of tokens with this much mass, in (0, 1].
    n:               completions drawn for every prompt in one ``generate`` call. A run's
                     rollout draws one (its GRPO group is ``train.group_size`` episodes), so a
                     run's config keeps 1.
    response_prefix: start every reply with the markup head its turn needs (``SAY:`` when the
                     agent can only talk, ``ACTION:`` when it can only act;
                     :mod:`marl.agents.heads`). The head is prompt, not trained. Measured
                     effect: docs/communication.md.
    """

    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    response_prefix: bool = False

    def __post_init__(self) -> None:
        """One check of each field, worded as the config's (``sampling.<field>: ...``)."""
        if not self.max_new_tokens >= 1:
            raise ValueError(f"sampling.max_new_tokens: must be > 0, got {self.max_new_tokens}")
        if self.max_new_tokens > MAX_NEW_TOKENS:
            raise ValueError(
                f"sampling.max_new_tokens: {self.max_new_tokens:,}, over the limit of "
                f"{MAX_NEW_TOKENS:,} (a reply must fit the model's context)"
            )
        if not 0 <= self.temperature < math.inf:  # NaN fails every comparison
            raise ValueError(
                f"sampling.temperature: must be a finite number >= 0, got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p: must be in (0, 1], got {self.top_p}")
        if not self.n >= 1:
            raise ValueError(f"sampling.n: must be > 0, got {self.n}")


@dataclass
class LoraSettings:
    """A LoRA adapter (Hu et al. 2021, peft) over a policy's frozen base model: a policy's
    ``lora`` settings (``policies.<id>.lora``), and what a backend adds when it is given none.

    r, alpha:       rank and scaling (the update is ``alpha / r * B @ A``).
    dropout:        dropout on the adapter's input while training.
    target_modules: names of the linear layers that get an adapter (``q_proj``, ``v_proj``...).
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])


def peft_lora_config(settings: LoraSettings | None = None) -> Any:
    """The peft ``LoraConfig`` of ``settings`` (default: :class:`LoraSettings`'s defaults)."""
    from peft import LoraConfig

    s = settings or LoraSettings()
    return LoraConfig(
        r=s.r, lora_alpha=s.alpha, lora_dropout=s.dropout, target_modules=list(s.target_modules)
    )


@dataclass
class Generation:
    """One sampled completion of one prompt."""

    prompt_ids: list[int]
    response_ids: list[int]  # generated tokens, EOS included when it was produced, no padding
    logprobs: list[float]  # logprob of each response token under the sampling distribution
    text: str  # decoded response, special tokens skipped
    finish_reason: Literal["stop", "length"]


@runtime_checkable
class PolicyBackend(Protocol):
    """Batched generation for one base model, optionally with several adapters.

    tokenizer: the model's tokenizer (prompts arrive as its ids).
    model:     the torch model that generates, or ``None`` for a backend that serves a model
               it does not hold in this process (vLLM given a model directory).
    options:   the build options a run may offer that this backend's factory takes, by name
               (:func:`backend_options`): ``share_prompts`` (``algo.share_prompts``: one
               prefill per distinct prompt), ``max_adapters`` and ``max_lora_rank`` (room for
               every LoRA adapter of a shared base in one batch). Other offers are not passed.
    """

    tokenizer: Any
    model: Any
    options: ClassVar[frozenset[str]]

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        adapters: Sequence[str | None] | None = None,
        seed: int | None = None,
    ) -> list[list[Generation]]:
        """Generate ``sampling.n`` completions for every prompt in ONE batched call.

        ``adapters`` names, per prompt, the adapter to use (``None`` = the base model).
        Returns one list of ``n`` generations per prompt, in prompt order.
        """
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Replace the base model's weights (after a learner update)."""
        ...

    def add_adapter(
        self, name: str, state_dict: Mapping[str, torch.Tensor] | None = None, config: Any = None
    ) -> None:
        """Add (or overwrite) an adapter under ``name`` (``state_dict`` None: a fresh one;
        ``config``: its peft ``LoraConfig``, None for the backend's default)."""
        ...

    def remove_adapter(self, name: str) -> None:
        """Drop an adapter."""
        ...


def copy_weights(
    targets: Mapping[str, torch.Tensor], state_dict: Mapping[str, torch.Tensor]
) -> None:
    """Copy ``state_dict`` into the ``targets`` tensors in place (``load_weights`` of a backend).

    Keys not given keep their values; an unknown name or a wrong shape is an error that names it.
    """
    import torch

    unknown = [k for k in state_dict if k not in targets]
    if unknown:
        raise KeyError(
            f"load_weights: {len(unknown)} unknown weight name(s), e.g. {unknown[:3]}; "
            f"the model has e.g. {list(targets)[:3]}"
        )
    with torch.no_grad():
        for name, value in state_dict.items():
            target = targets[name]
            if target.shape != value.shape:
                raise ValueError(
                    f"load_weights: {name!r} has shape {tuple(value.shape)}, the model "
                    f"expects {tuple(target.shape)}"
                )
            target.copy_(value)


def check_adapter_name(name: str) -> None:
    """Refuse names peft would mishandle: the reserved base name, dotted or ``lora_`` substrings."""
    if not name or name == BASE_ADAPTER or "." in name or name in "lora_":
        raise ValueError(
            f"adapter name {name!r} cannot be used: it must be non-empty, not {BASE_ADAPTER!r}, "
            "without '.', and not a substring of 'lora_' (peft would re-initialise it)"
        )


def backend_target(backend: PolicyBackend) -> tuple[PolicyBackend, str | None]:
    """The backend that really generates for ``backend``, and the adapter its rows use: a view
    of a shared base (``base`` and ``adapter`` attributes) names its base; any other backend is
    its own target (adapter ``None``: its rows as it routes them)."""
    base = getattr(backend, "base", None)
    if base is not None and hasattr(backend, "adapter"):
        return base, backend.adapter  # type: ignore[attr-defined]
    return backend, None


# Built-in backends live in ``marl.agents.backends.<name>`` and register themselves when that
# module is first imported: the registry knows their names without importing vLLM.
BACKENDS: Registry[str, Callable[..., PolicyBackend]] = Registry(
    "backend", lazy={"hf": "marl.agents.backends.hf", "vllm": "marl.agents.backends.vllm"}
)
BUILTIN_BACKENDS = tuple(BACKENDS.lazy)


def backend_names() -> list[str]:
    """Every backend name ``make_backend`` accepts: the built-in ones and those registered."""
    return BACKENDS.names()


def register_backend(
    name: str,
) -> Callable[[Callable[..., PolicyBackend]], Callable[..., PolicyBackend]]:
    """Register a backend factory under ``name``; duplicate names are refused."""
    return BACKENDS.register(name)


def backend_options(name: str, offered: Mapping[str, Any]) -> dict[str, Any]:
    """The build options among ``offered`` that backend ``name`` takes (its factory's
    ``options``; none for a factory that declares none), so the driver offers what the run
    asks of any backend and names none of them."""
    takes = getattr(BACKENDS.lookup(name, key="backend"), "options", frozenset())
    return {key: value for key, value in offered.items() if key in takes}


def make_backend(name: str, **kwargs: Any) -> PolicyBackend:
    """Build the backend registered as ``name`` (an unknown name raises a KeyError that lists
    the known ones). A built-in backend's module is imported on first use, so that importing
    the package never pays for (or requires) vLLM."""
    return BACKENDS.lookup(name, key="backend")(**kwargs)
