"""``bench/gpu.py --profile``: one update and one rollout call under ``torch.profiler``.

For each it keeps what says where the time goes and what the device waits on:

- **by operator**: the top operators by self time on the device (CUDA) or on the host (a CPU),
  each with its calls, host self time and device self time;
- **kernel launches**: the CUDA runtime's launch calls (``cudaLaunchKernel`` and kin); on a CPU,
  where nothing is launched, the aten ops that would each launch one;
- **synchronisations**: the calls that make the host wait for the device (``cudaDeviceSynchronize``,
  ``cudaStreamSynchronize``, ``cudaEventSynchronize``, blocking ``cudaMemcpy``, and
  ``aten::_local_scalar_dense``: an ``.item()``, ``float()`` or ``bool()`` of a tensor);
- **placement** (the update): the devices of the learner's weights, gradients, fp32 masters,
  optimizer state and reference, and of every tensor the model's forward calls were given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
SYNCS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "aten::_local_scalar_dense",
)
VIEWS = (
    "aten::view",
    "aten::t",
    "aten::transpose",
    "aten::expand",
    "aten::detach",
    "aten::as_strided",
    "aten::slice",
    "aten::select",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::reshape",
    "aten::permute",
    "aten::_unsafe_view",
    "aten::alias",
    "aten::empty",
    "aten::empty_strided",
    "aten::lift_fresh",
    "aten::_reshape_alias",
)


def profile_call(fn: Callable[[], Any], device: str, top: int = 25) -> tuple[Any, dict[str, Any]]:
    """Run ``fn`` once under the profiler; returns its result and the summary."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        result = fn()
        if device == "cuda":
            torch.cuda.synchronize()
    return result, summarize(prof.key_averages(), device, top)


def _device_us(event: Any) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0


def summarize(events: Any, device: str, top: int = 25) -> dict[str, Any]:
    """The by-operator table, launches and synchronisations of a profiler's key averages."""
    rows = [
        {
            "name": e.key,
            "calls": int(e.count),
            "host_self_ms": e.self_cpu_time_total / 1e3,
            "device_self_ms": _device_us(e) / 1e3,
        }
        for e in events
    ]
    key = "device_self_ms" if device == "cuda" else "host_self_ms"
    rows.sort(key=lambda r: -r[key])
    counts = {e.key: int(e.count) for e in events}
    aten = {k: n for k, n in counts.items() if k.startswith("aten::")}
    syncs = {k: n for k, n in counts.items() if any(k.startswith(s) for s in SYNCS)}
    syncs = {k: n for k, n in syncs.items() if "Async" not in k}  # cudaMemcpyAsync is not one
    return {
        "device": device,
        "sorted_by": key,
        "by_operator": rows[:top],
        "host_total_ms": sum(r["host_self_ms"] for r in rows),
        "device_total_ms": sum(r["device_self_ms"] for r in rows),
        "kernel_launches": sum(counts.get(k, 0) for k in LAUNCHES) if device == "cuda" else None,
        "aten_ops": sum(aten.values()),
        "aten_compute_ops": sum(n for k, n in aten.items() if k not in VIEWS),
        "synchronisations": syncs,
        "synchronisations_total": sum(syncs.values()),
    }


def placement(learner: Any, batch_devices: Counter[str]) -> dict[str, Any]:
    """Devices of a policy learner's tensors by kind, and of its forward calls' inputs."""
    from marl.runtime.policies import learner_tensors

    kinds: dict[str, Counter[str]] = {}
    for name, tensor in learner_tensors(learner):
        kind = name.split(" ", 1)[0] if not name.startswith("optimizer") else "optimizer state"
        kind = {"master": "fp32 masters", "gradient": "gradients"}.get(kind, kind)
        kinds.setdefault(kind, Counter())[str(tensor.device)] += 1
    return {
        **{kind: dict(devices) for kind, devices in kinds.items()},
        "batch": dict(batch_devices),
    }


def record_batch_devices(model: Any) -> tuple[Counter[str], Callable[[], None]]:
    """Count the devices of the tensors every forward call of ``model`` is given; returns the
    counter and the function that stops counting."""
    import torch

    seen: Counter[str] = Counter()

    def hook(_module: Any, args: tuple, kwargs: dict) -> None:
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor):
                seen[str(value.device)] += 1

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen, handle.remove
