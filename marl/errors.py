"""The errors a user can cause (bad config, bad scenario, missing model): printed, not traced."""

from __future__ import annotations

from marl.config import ConfigError
from marl.scenarios.spec import ScenarioError


class RunError(RuntimeError):
    """A run cannot go on for a reason the user can fix (a missing checkpoint, say)."""


def _user_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ConfigError, ScenarioError, RunError, FileNotFoundError]
    try:
        from marl.agents.models import ModelFetchError

        errors.append(ModelFetchError)
    except ImportError:  # pragma: no cover - the models module is part of the package
        pass
    return tuple(errors)


USER_ERRORS = _user_errors()
