"""Policy backends: batched generation with logprobs, weight pushes, adapters.

Backends register themselves by name with :func:`register_backend`; ``make_backend("hf", ...)``
builds one. Importing this package registers nothing: a built-in backend
(``marl.agents.backends.hf``, ``marl.agents.backends.vllm``) registers itself when its module is
first imported, which ``make_backend`` does on first use, so naming the backends does not import
vLLM.
"""

from marl.agents.backends.base import (
    BACKENDS,
    BASE_ADAPTER,
    Generation,
    LoraSettings,
    PolicyBackend,
    SamplingConfig,
    backend_options,
    backend_target,
    check_adapter_name,
    make_backend,
    peft_lora_config,
    register_backend,
)

__all__ = [
    "BACKENDS",
    "BASE_ADAPTER",
    "Generation",
    "LoraSettings",
    "PolicyBackend",
    "SamplingConfig",
    "backend_options",
    "backend_target",
    "check_adapter_name",
    "make_backend",
    "peft_lora_config",
    "register_backend",
]
