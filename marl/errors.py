"""The errors a user can cause (bad config, bad scenario, missing model): printed, not traced."""

from __future__ import annotations

import sys

from marl.scenarios.problems import ScenarioError

INTERRUPTED_EXIT = 130  # a marl command stopped by Ctrl-C exits with this (128 + SIGINT)


class RunError(RuntimeError):
    """A run cannot go on for a reason the user can fix (a missing checkpoint, say)."""


# (module, class) pairs of user errors defined in heavy modules. They are looked up only when
# the module is already imported: an error class can only be raised once its module is loaded,
# and `marl validate` should not pay for importing torch.
_LAZY = (
    ("marl.config", "ConfigError"),
    ("marl.agents.models", "ModelFetchError"),
    ("marl.agents.memory", "ModelTooLargeError"),  # weights that cannot fit the device
    ("marl.agents.context", "ContextLengthError"),  # a prompt longer than the model's context
    ("marl.agents.backends.vllm", "VLLMSetupError"),  # vllm not installed, unsupported model
)


def remote_cause(exc: BaseException) -> BaseException:
    """The exception a remote call raised, unwrapped from Ray's wrapper.

    ``ray.get`` re-raises an actor's exception as ``RayTaskError(<its class>)``: still an
    instance of the original class, but its text is the remote traceback. Its ``cause`` is the
    original exception, whose message is the one line a user should see, the same as without
    Ray. Any other exception is returned as it is.
    """
    seen: set[int] = set()
    while type(exc).__module__.startswith("ray.") and id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException):
            break
        exc = cause
    return exc


def user_errors() -> tuple[type[BaseException], ...]:
    """Every error class that means "the user can fix this", among those loaded so far."""
    errors: list[type[BaseException]] = [ScenarioError, RunError, FileNotFoundError]
    for module, name in _LAZY:
        loaded = sys.modules.get(module)
        if loaded is not None and hasattr(loaded, name):
            errors.append(getattr(loaded, name))
    return tuple(errors)
