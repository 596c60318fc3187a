"""Before the first rollout: every agent's first prompt, and the reply it may get, fit its model.

:func:`check_context` resets one episode of the run's scenario with the run's seed, builds each
agent's first-turn prompt with the one prompt builder (:func:`marl.agents.prompts.turn_prompt`)
and the tokenizer of the model its policy runs on, and refuses, in one line naming the agent
and the numbers, a prompt whose tokens plus ``sampling.max_new_tokens`` exceed that model's
context (:mod:`marl.agents.context`). A ``sampling.max_new_tokens`` that leaves no room for any
prompt is refused first, naming the key. Only the models' configs and tokenizers are read, not
their weights, so a run that cannot fit fails before anything is built or started. Later turns
grow as messages accumulate; each generate call checks its own prompts
(:func:`marl.agents.generation.generate_by_policy`).
"""

from __future__ import annotations

from typing import Any

from marl.agents.context import check_fits, spec_context, spec_tokenizer
from marl.agents.prompts import turn_prompt
from marl.config import Config, ConfigError
from marl.runtime.policy_map import PolicyPlan

__all__ = ["check_context"]


def check_context(config: Config, plan: PolicyPlan | None) -> None:
    """Refuse the run if an agent's first prompt plus ``sampling.max_new_tokens`` does not fit
    the context of its policy's model (ConfigError naming ``sampling.max_new_tokens`` when that
    alone leaves no room; :class:`~marl.agents.context.ContextLengthError` naming the agent
    otherwise). Scripted agents (``plan`` None) have no prompt: nothing to check."""
    if plan is None:
        return
    from marl.scenarios.registry import make

    new_tokens = config.sampling.max_new_tokens
    env = make(config.scenario.name, **config.scenario.overrides)
    observations, infos = env.reset(seed=config.seed)
    models: dict[tuple, tuple[Any, int | None]] = {}  # one tokenizer per distinct model
    for agent in env.agents:
        policy = plan.policies[plan.policy_of(agent)]
        if policy.base_key not in models:
            models[policy.base_key] = (spec_tokenizer(policy.model), spec_context(policy.model))
        tokenizer, context = models[policy.base_key]
        if context is not None and new_tokens >= context:
            raise ConfigError(
                f"sampling.max_new_tokens: {new_tokens:,} leaves no room for a prompt in the "
                f"context of {context:,} tokens of policy {policy.id}'s model"
            )
        turn = turn_prompt(
            tokenizer,
            env.system_prompt(agent),
            observations[agent],
            infos.get(agent),
            response_prefix=config.sampling.response_prefix,
        )
        check_fits(agent, len(turn.ids), new_tokens, context, f" (policy {policy.id}, first turn)")
