"""Which floating-point format a model computes in: what ``model.dtype: auto`` means.

bfloat16 halves the memory a model reads and, where the hardware has it, doubles the matmul rate.
Where the hardware lacks it, torch emulates it and pays dearly: on a 2-core AVX2-only AMD EPYC a
512x576 by 576x1536 matmul ran at 51 GFLOP/s in float32 and 1.2 GFLOP/s in bfloat16, 43x
slower, so a job tuned on a bf16 CPU took hours there. ``auto`` therefore asks the device:

- **CUDA**: bf16 when the device computes it natively (``torch.cuda.is_bf16_supported`` without
  emulation: Ampere and newer).
- **CPU**: bf16 when torch's capability checks find AVX512-BF16 or AMX; float32 when they find
  an x86 CPU with neither (AVX2 only, or AVX512 without the bf16 instructions). Where the checks
  say nothing (another architecture, or a torch without them), a short measured probe decides:
  bf16 only if a small matmul runs faster in it than in float32.

Never a list of CPU names. :func:`bf16_slowdown` measures the ratio itself (about 50 ms at most),
for the one warning a run prints when it is told ``bfloat16`` on a device that emulates it.

The tiny test model (``model.kind=tiny``) stays in float32 under ``auto``: its tests compare code
paths to float precision, and the suite must mean the same on every machine.
"""

from __future__ import annotations

import functools
import platform
import time
from dataclasses import dataclass

import torch

from marl.agents.models import MODEL_DTYPES

# The probe's matmul, (M, K) x (K, N): large enough to reach the bf16 kernels, small enough to
# cost about 15 ms where bf16 is emulated at 1.2 GFLOP/s.
PROBE_SHAPE = (128, 256, 256)


@dataclass(frozen=True)
class Bf16Support:
    """Whether a device computes bf16 fast, and how that was decided.

    fast:   bf16 is at least as fast as float32 there.
    reason: what decided it, for the line a run prints (``"AVX512-BF16"``, ``"no AVX512-BF16
            or AMX"``, ``"measured 0.45x float32's time"``...).
    """

    fast: bool
    reason: str


def bf16_support(device: str | torch.device = "cpu") -> Bf16Support:
    """Whether ``device`` (``cpu``, ``cuda`` or ``cuda:N``) computes bf16 fast; decided once per
    device type and process."""
    return _support(torch.device(device).type)


@functools.cache
def _support(device_type: str) -> Bf16Support:
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return Bf16Support(False, "no CUDA device")
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        name = torch.cuda.get_device_name()
        return Bf16Support(native, f"{name} {'computes' if native else 'emulates'} bf16")
    if device_type != "cpu":
        return Bf16Support(False, f"{device_type}: not known to compute bf16 fast")
    checks = _cpu_capabilities()
    if checks is not None:
        bf16, amx = checks
        if bf16 or amx:
            return Bf16Support(True, "AVX512-BF16" if bf16 else "AMX")
        level = torch.backends.cpu.get_cpu_capability()
        kernels = "" if level == "AVX512" else f" in torch's {level} kernels"
        return Bf16Support(False, f"no AVX512-BF16 or AMX{kernels}")
    ratio = bf16_slowdown("cpu")
    return Bf16Support(ratio < 1.0, f"measured bf16 at {ratio:.2g}x float32's time")


def _cpu_capabilities() -> tuple[bool, bool] | None:
    """(AVX512-BF16, AMX) from torch's checks on an x86 CPU, as torch's kernels may use them:
    both False when torch dispatches below AVX512 (``ATEN_CPU_CAPABILITY=avx2`` restricts it,
    and then so should ``ONEDNN_MAX_CPU_ISA``); None where the checks say nothing."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return None
    try:
        bf16 = bool(torch.cpu._is_avx512_bf16_supported())
        amx = bool(torch.cpu._is_amx_tile_supported())
    except AttributeError:  # a torch without the checks
        return None
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        return False, False
    return bf16, amx


def bf16_slowdown(device: str | torch.device = "cpu", repeats: int = 5) -> float:
    """bf16's time over float32's for one :data:`PROBE_SHAPE` matmul on ``device`` (best of
    ``repeats``, the two alternated, on one thread): below 1 where bf16 is fast, 20 or more
    where emulated."""
    device = torch.device(device)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a small matmul on several threads measures their overhead
    try:
        return _probe(device, repeats)
    finally:
        torch.set_num_threads(threads)


def _probe(device: torch.device, repeats: int) -> float:
    m, k, n = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(device)  # (M, K)
    b = torch.randn(k, n, generator=generator).to(device)  # (K, N)
    pairs = {dtype: (a.to(dtype), b.to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    best = {dtype: float("inf") for dtype in pairs}
    for round_ in range(repeats + 1):  # round 0 warms the kernels up and is not counted
        for dtype, (x, y) in pairs.items():
            began = time.perf_counter()
            x @ y  # (M, N)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if round_:
                best[dtype] = min(best[dtype], time.perf_counter() - began)
    return best[torch.bfloat16] / max(best[torch.float32], 1e-9)


def resolve_dtype(name: str, device: str | torch.device = "cpu", kind: str = "") -> str:
    """The concrete dtype (``float32`` or ``bfloat16``) that ``name`` means on ``device`` for a
    model of ``kind``: ``auto`` asks :func:`bf16_support` (the tiny model: float32); an explicit
    name stays as written."""
    if name not in MODEL_DTYPES:
        raise ValueError(f"model.dtype: {name!r} is not one of {', '.join(MODEL_DTYPES)}")
    if name != "auto":
        return name
    if kind == "tiny":
        return "float32"
    return "bfloat16" if bf16_support(device).fast else "float32"


def torch_dtype(name: str) -> torch.dtype:
    """``float32`` / ``bfloat16`` as a torch dtype (``auto`` must be resolved first)."""
    if name == "bfloat16":
        return torch.bfloat16
    if name == "float32":
        return torch.float32
    raise ValueError(f"model.dtype: {name!r} must be resolved to float32 or bfloat16 first")


__all__ = [
    "Bf16Support",
    "bf16_slowdown",
    "bf16_support",
    "resolve_dtype",
    "torch_dtype",
]
