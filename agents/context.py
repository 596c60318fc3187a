"""A model's context, and the one-line refusal of a prompt that does not fit in it.

A causal LM reads at most ``max_position_embeddings`` positions (its Hugging Face config; a
vLLM engine's ``max_model_len`` where it is smaller): a prompt and the ``max_new_tokens`` it may
be continued by must fit in them together. Past that, a model with learned positions fails deep
inside its embedding lookup, and a rotary one goes on, slowly, with a cache sized by the whole
prompt, on positions it never saw in training (a 900 KB system prompt took over 4 minutes and
2.7 GB for one episode). A prompt is never cut to fit (cutting from the left drops the system
prompt and the chat template's start): it is refused, with :class:`ContextLengthError`, in one
line naming the agent and the numbers.

It is checked where the model is known: before a run's first rollout, on every agent's first
prompt (:func:`marl.runtime.context_check.check_context`, from :func:`spec_context` and
:func:`spec_tokenizer`, which read a model's config and tokenizer without its weights), and at
every generate call (:func:`marl.agents.generation.generate_by_policy`, from
:func:`backend_context`), since prompts grow as an episode's messages accumulate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from marl.agents.backends.base import backend_target
from marl.agents.models import (
    ModelSpec,
    build_char_tokenizer,
    fetch_embedded_model,
    prepare_tokenizer,
    transformers_model,
)

__all__ = [
    "ContextLengthError",
    "backend_context",
    "check_fits",
    "spec_context",
    "spec_tokenizer",
]

ADVICE = (
    "shorten the scenario's text (system_prompt, roles, messages.max_chars, episode.rounds) "
    "or lower sampling.max_new_tokens"
)


class ContextLengthError(RuntimeError):
    """A prompt and its reply budget do not fit in the model's context (the user can fix it:
    a shorter scenario text or a smaller ``sampling.max_new_tokens``)."""


def check_fits(
    agent: str, prompt_tokens: int, new_tokens: int, context: int | None, where: str = ""
) -> None:
    """Refuse, in one line naming ``agent``, a prompt of ``prompt_tokens`` tokens that cannot be
    continued by ``new_tokens`` tokens within ``context`` (None: unknown, nothing checked).
    ``where`` says which prompt and model, e.g. ``" (policy shared, first turn)"``."""
    if context is None or prompt_tokens + new_tokens <= context:
        return
    total = prompt_tokens + new_tokens
    raise ContextLengthError(
        f"agent {agent!r}{where}: a prompt of {prompt_tokens:,} tokens + {new_tokens:,} new "
        f"tokens = {total:,}, over the model's context of {context:,} tokens; {ADVICE}"
    )


def backend_context(backend: Any) -> int | None:
    """The positions the backend's model reads at most: a vLLM engine's ``max_model_len``,
    else the model config's ``max_position_embeddings``; None when the backend says neither
    (a scripted or recording test backend)."""
    base, _ = backend_target(backend)
    limit = getattr(base, "max_model_len", None)
    if limit is None:
        model = getattr(base, "model", None)
        config = getattr(transformers_model(model), "config", None) if model is not None else None
        limit = _positions(config)
    return limit if isinstance(limit, int) and limit > 0 else None


def spec_context(spec: ModelSpec) -> int | None:
    """The context of the model ``spec`` names, read from its config without loading weights
    (None when its config declares no ``max_position_embeddings``)."""
    if spec.kind == "tiny":
        return spec.max_position_embeddings
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(_model_dir(spec), local_files_only=True)
    return _positions(config)


def spec_tokenizer(spec: ModelSpec) -> Any:
    """The tokenizer of the model ``spec`` names, as :func:`marl.agents.models.load_model`
    returns it, without loading the weights."""
    if spec.kind == "tiny":
        return prepare_tokenizer(build_char_tokenizer())
    from transformers import AutoTokenizer

    return prepare_tokenizer(AutoTokenizer.from_pretrained(_model_dir(spec), local_files_only=True))


def _model_dir(spec: ModelSpec) -> Path:
    """The directory an ``embedded`` or ``hf`` model loads from (the embedded one fetched
    first if it is not yet, as :func:`~marl.agents.models.load_model` would)."""
    if spec.kind == "embedded":
        return fetch_embedded_model(cache_dir=Path(spec.path) if spec.path else None)
    path = Path(str(spec.path))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path: no Hugging Face model at {str(path)!r} (expected a directory with "
            "config.json, weights and tokenizer files)"
        )
    return path


def _positions(config: Any) -> int | None:
    """``max_position_embeddings`` of an HF config, or of its text model's (multimodal)."""
    if config is None:
        return None
    limit = getattr(config, "max_position_embeddings", None)
    if limit is None and hasattr(config, "get_text_config"):
        limit = getattr(config.get_text_config(), "max_position_embeddings", None)
    return int(limit) if isinstance(limit, int) else None
