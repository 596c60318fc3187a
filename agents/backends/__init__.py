"""Policy backends: batched generation with logprobs, weight pushes, adapters.

Backends register themselves by name with :func:`register_backend`; ``make_backend("hf", ...)``
builds one. Importing this package registers the built-in ones.
"""

from marl.agents.backends.base import (
    BACKENDS,
    Generation,
    PolicyBackend,
    SamplingConfig,
    make_backend,
    register_backend,
)

__all__ = [
    "BACKENDS",
    "Generation",
    "PolicyBackend",
    "SamplingConfig",
    "make_backend",
    "register_backend",
]
