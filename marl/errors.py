"""The errors a user can cause (bad config, bad scenario, missing model): printed, not traced."""

from __future__ import annotations

import sys

from marl.scenarios.spec import ScenarioError


class RunError(RuntimeError):
    """A run cannot go on for a reason the user can fix (a missing checkpoint, say)."""


# (module, class) pairs of user errors defined in heavy modules. They are looked up only when
# the module is already imported: an error class can only be raised once its module is loaded,
# and `marl validate` should not pay for importing torch.
_LAZY = (
    ("marl.config", "ConfigError"),
    ("marl.agents.models", "ModelFetchError"),
    ("marl.agents.backends.vllm", "VLLMSetupError"),  # vllm not installed, unsupported model
)


def user_errors() -> tuple[type[BaseException], ...]:
    """Every error class that means "the user can fix this", among those loaded so far."""
    errors: list[type[BaseException]] = [ScenarioError, RunError, FileNotFoundError]
    for module, name in _LAZY:
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, name):
            errors.append(getattr(loaded, name))
    return tuple(errors)
