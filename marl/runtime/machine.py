"""The machine a run lands on, decided once at start: devices, GPU shares and the dtype.

Every config we ship runs unchanged on 0, 1 or 2 GPUs and on any CPU. At start :func:`fit_machine`
reads what the machine has, and fills in what the config left to it:

- **GPUs.** ``num_gpus: null`` policies are packed onto the GPUs there are
  (:func:`marl.runtime.policy_map.gpu_requests`): one each when there are enough, equal shares when
  there are fewer. An explicit request stays as written; an impossible one is refused, naming
  its key. In one process (``ray.enabled=false``) the rollout and every learner that asked for a
  GPU share ``cuda``.
- **dtype.** ``model.dtype: auto`` becomes ``bfloat16`` where the run's device computes it fast,
  ``float32`` elsewhere (:mod:`marl.agents.precision`), in the run's model and in every policy's.
  The resolved value is what ``config.yaml`` and the checkpoints record. An explicit
  ``bfloat16`` on a CPU that emulates it warns once, with the slowdown measured there.

:meth:`Machine.line` is the one line a run prints, for example
``devices: 1 GPU (NVIDIA H100 80GB HBM3): 2 policies and the rollout share cuda:0; learners:
listener, speaker on cuda:0; dtype bfloat16 (auto: NVIDIA H100 80GB HBM3 computes bf16)``. A
learner whose tensors are not on its policy's device is refused when it is built
(:func:`marl.runtime.policies.check_placement`).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field, replace
from typing import Any

from marl.agents.models import ModelSpec
from marl.config import Config, PolicyConfig
from marl.runtime.policy_map import PolicyPlan, gpu_requests, packed_shares

__all__ = [
    "Machine",
    "cpu_name",
    "fit_machine",
    "local_gpu_count",
    "local_gpu_name",
    "memory_metrics",
    "one_process_device",
]


def local_gpu_count() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_gpu_name() -> str:
    """The first CUDA device's name ("" without one)."""
    import torch

    return torch.cuda.get_device_name(0) if local_gpu_count() else ""


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as lines:
            for line in lines:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def one_process_device(requests: dict[str, float], gpus: int) -> str:
    """Where a one-process run puts its rollout and learners: ``cuda`` when it has GPUs and a
    learner asked for a share of one (``requests``: policy id -> GPUs), else ``cpu``."""
    return "cuda" if gpus and max(requests.values(), default=0.0) > 0 else "cpu"


def memory_metrics() -> dict[str, float]:
    """This process's memory now, for every step's ``perf/`` tags: its resident set
    (``perf/rss_gb``, from /proc; its peak where /proc is missing) and, with CUDA, the peak
    allocated since the last call (``perf/gpu_peak_gb``), so that growth from step to step
    shows."""
    import resource

    metrics = {"perf/rss_gb": _rss_bytes() / 1e9}
    if not metrics["perf/rss_gb"]:
        peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        metrics["perf/rss_gb"] = peak_kb * 1024 / 1e9
    if local_gpu_count():
        import torch

        metrics["perf/gpu_peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        torch.cuda.reset_peak_memory_stats()
    return metrics


def _rss_bytes() -> int:
    """Resident set size from /proc/self/statm (0 where it cannot be read)."""
    import os

    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class Machine:
    """What a run was given: the GPUs, each trainable policy's share, its device and dtype.

    gpus:      CUDA devices of this process (or, under Ray with ``ray.num_gpus``, declared).
    gpu_name:  the first one's name.
    requests:  trainable policy id -> GPUs its learner takes (0 = the CPU).
    device:    where the policies of a one-process run compute: ``cuda`` or ``cpu``.
    dtype:     the run's model dtype after ``auto`` is resolved.
    reason:    why ``auto`` chose it ("" when the config named the dtype).
    warning:   one line when the config's explicit dtype is slow on this device, else "".
    one_process: the run keeps its rollout and learners in this process (``ray.enabled=false``).
    workers:   rollout worker actors (Ray), and ``worker_gpus`` the GPUs each one takes.
    linear:    what computes the model's float32 linear layers on a CPU when it is not torch's
               ``F.linear`` (``"oneDNN"``: :mod:`marl.agents.cpu_linear`), else "".
    """

    gpus: int
    gpu_name: str
    requests: dict[str, float] = field(default_factory=dict)
    device: str = "cpu"
    dtype: str = "float32"
    reason: str = ""
    warning: str = ""
    one_process: bool = True
    workers: int = 0
    worker_gpus: float = 0.0
    linear: str = ""

    def line(self) -> str:
        """The one line a run prints about where it runs: the devices, where each learner
        trains, and the dtype."""
        placed = "; ".join(f"{', '.join(p)} on {d}" for d, p in self.learners().items())
        learners = f"learners: {placed}; " if placed else ""
        reason = f" (auto: {self.reason})" if self.reason else ""
        linear = f"; linear layers on {self.linear}" if self.linear else ""
        return f"devices: {self._devices()}; {learners}dtype {self.dtype}{reason}{linear}"

    def learners(self) -> dict[str, list[str]]:
        """Where each trainable policy's learner trains -> the policies there, sorted: in one
        process every learner on the run's device (``cuda:0`` or ``cpu``); under Ray a learner
        with a GPU share on its actor's GPU, the others on their actor's CPU."""
        where: dict[str, list[str]] = {}
        for pid, share in sorted(self.requests.items()):
            if self.one_process:
                device = "cuda:0" if self.device == "cuda" else "cpu"
            else:
                device = "its Ray actor's GPU" if share > 0 else "its Ray actor's CPU"
            where.setdefault(device, []).append(pid)
        return where

    def _devices(self) -> str:
        if not self.gpus:
            return f"CPU ({cpu_name()})"
        gpus = f"{self.gpus} GPU{'s' if self.gpus > 1 else ''} ({self.gpu_name})"
        on_gpu = {pid: g for pid, g in self.requests.items() if g > 0}
        if not on_gpu:
            return f"{gpus} unused: every learner asked for num_gpus 0; CPU ({cpu_name()})"
        shares = ", ".join(f"{pid} {g:g}" for pid, g in sorted(on_gpu.items()))
        n = len(on_gpu)
        policies = f"{n} polic{'ies' if n > 1 else 'y'}"
        if self.one_process:  # the rollout and every learner in this process, on one device
            spread = " (ray=local places each learner on its own)" if self.gpus > 1 else ""
            return f"{gpus}: {policies} and the rollout share cuda:0{spread}"
        workers = ""
        if self.worker_gpus > 0:
            w = self.workers
            workers = f", and {w} rollout worker{'s' if w > 1 else ''} {self.worker_gpus:g} each"
        if n > 1 and all(g >= 1 for g in on_gpu.values()):
            return f"{gpus}: {policies}, one GPU each ({shares}){workers}"
        return f"{gpus}: {policies} share {'them' if self.gpus > 1 else 'it'} ({shares}){workers}"


def fit_machine(
    config: Config, plan: PolicyPlan | None, gpus: int | None = None, gpu_name: str | None = None
) -> tuple[Config, PolicyPlan | None, Machine]:
    """``config`` and ``plan`` with ``auto`` dtypes resolved for this machine, and the
    :class:`Machine` they run on. ``gpus`` / ``gpu_name``: what to assume instead of asking
    CUDA (tests; ``ray.num_gpus`` declares a local Ray cluster's)."""
    if gpus is None:
        declared = config.ray.enabled and config.ray.num_gpus is not None and not config.ray.address
        gpus = int(config.ray.num_gpus) if declared else local_gpu_count()  # type: ignore[arg-type]
    gpu_name = gpu_name if gpu_name is not None else (local_gpu_name() or "CUDA")
    workers, worker_gpus = 0, 0.0
    if config.ray.enabled:  # rollout workers are actors too: null packs them with the learners
        workers = min(config.ray.num_rollout_workers, config.train.seeds_per_step)
        requests, worker_gpus = packed_shares(plan, gpus, workers, config.ray.worker_num_gpus)
    else:
        requests = gpu_requests(plan, gpus) if plan is not None else {}
    device = one_process_device(requests, gpus) if plan is not None else ("cuda" if gpus else "cpu")
    chosen, reason, warning = _dtype_for(config.model, device)
    config = _with_dtypes(config, device)
    if plan is not None:
        specs = {
            pid: replace(spec, model=_resolved(spec.model, device))
            for pid, spec in plan.policies.items()
        }
        plan = replace(plan, policies=specs)
    name = gpu_name if gpus else ""
    linear = "oneDNN" if _onednn_linears(config.model, chosen, device) else ""
    machine = Machine(
        gpus,
        name,
        requests,
        device,
        chosen,
        reason,
        warning,
        not config.ray.enabled,
        workers,
        worker_gpus,
        linear,
    )
    return config, plan, machine


def _onednn_linears(model: ModelSpec, dtype: str, device: str) -> bool:
    """Whether the run's model computes its linear layers on oneDNN
    (:mod:`marl.agents.cpu_linear`)."""
    from marl.agents.cpu_linear import wants_onednn
    from marl.agents.precision import torch_dtype

    return wants_onednn(model.cpu_linear, model.kind, torch_dtype(dtype), device)


def _dtype_for(model: ModelSpec, device: str) -> tuple[str, str, str]:
    """(the dtype ``model`` runs in on ``device``, why auto chose it, a warning or "")."""
    from marl.agents.precision import bf16_slowdown, bf16_support

    chosen = _resolved(model, device).dtype
    if model.dtype == "auto":
        if model.kind == "tiny":
            return chosen, "the tiny test model stays float32", ""
        return chosen, bf16_support(device).reason, ""
    if chosen == "bfloat16" and not bf16_support(device).fast:
        ratio = bf16_slowdown(device)
        warning = (
            f"marl: warning: model.dtype=bfloat16, but this {device.upper()} emulates bf16 "
            f"({bf16_support(device).reason}): a matmul ran {ratio:.1f}x slower than in float32 "
            "here; model.dtype=auto picks the fast one"
        )
        return chosen, "", warning
    return chosen, "", ""


def _resolved(model: ModelSpec, device: str) -> ModelSpec:
    """``model`` with its dtype resolved for ``device`` (unchanged when it names one)."""
    from marl.agents.precision import resolve_dtype

    if model.dtype != "auto":
        return model
    return replace(model, dtype=resolve_dtype(model.dtype, device, model.kind))


def _with_dtypes(config: Config, device: str) -> Config:
    """``config`` with every model spec's ``auto`` resolved: the run's, the policy defaults'
    and each declared policy's."""

    def policy(p: PolicyConfig) -> PolicyConfig:
        return p if p.model is None else replace(p, model=_resolved(p.model, device))

    policies: dict[str, Any] = {pid: policy(p) for pid, p in config.policies.items()}
    return replace(
        config,
        model=_resolved(config.model, device),
        policy_defaults=policy(config.policy_defaults),
        policies=policies,
    )
