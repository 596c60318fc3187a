"""Build a policy's model, backend and learner from the config."""

from __future__ import annotations

from marl.agents.backends import PolicyBackend, SamplingConfig, make_backend
from marl.agents.models import ModelSpec, load_model
from marl.config import Config
from marl.learner import Learner, LearnerSettings


def model_spec(config: Config) -> ModelSpec:
    """The agents-layer model spec of a config."""
    m = config.model
    return ModelSpec(
        kind=m.kind,
        path=m.path,
        dtype=m.dtype,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        intermediate_size=m.intermediate_size,
        seed=m.seed,
    )


def sampling_config(config: Config) -> SamplingConfig:
    """The backend sampling settings of a config."""
    s = config.sampling
    return SamplingConfig(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p)


def build_backend(config: Config) -> PolicyBackend:
    """Load the model and wrap it in the configured generation backend."""
    model, tokenizer = load_model(model_spec(config))
    return make_backend(config.backend, model=model, tokenizer=tokenizer)


def build_learner(config: Config, backend: PolicyBackend) -> Learner:
    """A learner that trains the backend's own model in place (colocated, one process)."""
    a, s = config.algo, config.sampling
    settings = LearnerSettings(
        lr=a.lr,
        weight_decay=a.weight_decay,
        max_grad_norm=a.max_grad_norm,
        clip_eps=a.clip_eps,
        clip_eps_high=a.clip_eps_high,
        beta=a.beta,
        level=a.level,
        aggregation=a.aggregation,
        epochs=a.epochs,
        minibatch_size=a.minibatch_size,
        temperature=s.temperature or 1.0,
        top_p=s.top_p,
        max_new_tokens=s.max_new_tokens,
    )
    pad = backend.tokenizer.pad_token_id or 0
    return Learner(backend.model, settings, pad_token_id=pad, seed=config.seed)
