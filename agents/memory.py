"""Memory a model needs against memory a device has: checked before a model is built, so a size
that cannot fit (``model.hidden_size=65536``: 34 billion parameters) is one line naming the
settings, not minutes of swapping and the allocator's traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from marl.agents.models import ModelSpec

GB = 1e9


class ModelTooLargeError(ValueError):
    """The model a spec names cannot fit the memory of the device it would be built on."""


def free_memory_bytes(device: torch.device | str) -> int:
    """Free memory where ``device``'s tensors live: the GPU's (CUDA), else the machine's
    available RAM (``/proc/meminfo``; 4 GiB where it cannot be read)."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 << 30


def build_bytes(spec: ModelSpec, dtype: torch.dtype) -> int | None:
    """Bytes the weights of ``spec``'s model take while it is built in ``dtype`` (None when its
    size cannot be told before loading). The tiny model is built in float32 and then cast, so
    it needs float32's 4 bytes a parameter whatever ``dtype`` is."""
    from marl.agents.models import estimate_parameters

    count = estimate_parameters(spec)
    if count is None:
        return None
    width = 4 if spec.kind == "tiny" else torch.finfo(dtype).bits // 8
    return count * width


def check_model_fits(
    spec: ModelSpec, device: torch.device | str | None, dtype: torch.dtype
) -> None:
    """Raise :class:`ModelTooLargeError` when the weights alone of ``spec``'s model would take
    more than the free memory of ``device`` (the CPU's available RAM when None). Training needs
    more (gradients, optimizer state, activations): this refuses only what cannot even load."""
    needed = build_bytes(spec, dtype)
    if needed is None:
        return
    where = torch.device(device or "cpu")
    free = free_memory_bytes(where)
    if needed <= free:
        return
    from marl.agents.models import estimate_parameters

    count = estimate_parameters(spec) or 0
    shape = ("hidden_size", "num_layers", "intermediate_size")
    sizes = (
        ", ".join(f"model.{k}={getattr(spec, k)}" for k in shape)
        if spec.kind == "tiny"
        else f"model.kind={spec.kind}, model.path={spec.path}"
    )
    raise ModelTooLargeError(
        f"model: about {count / 1e9:.1f} billion parameters ({sizes}) need {needed / GB:.1f} GB "
        f"for their weights alone, more than the {free / GB:.1f} GB free on {where.type}"
    )
