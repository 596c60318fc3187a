"""float32 linear layers on an AVX-512 CPU through oneDNN: what ``model.cpu_linear`` means.

torch computes a float32 ``nn.Linear`` on a CPU with MKL's sgemm. On AMD CPUs MKL takes its
AVX2 code path even where the CPU has AVX-512, so half of each vector unit sits idle; oneDNN
(which torch also ships, and already runs its bf16 matmuls) uses the CPU's widest ISA. On a
2-core AMD EPYC (family 26, AVX-512), float32, 2 threads, SmolLM2's layer shapes from 16 to 1,800
rows (``bench/cpu_linear.py`` -> ``bench/results/cpu_linear.json``): oneDNN ran at a median 1.98x
MKL's rate (0.92x to 2.7x by shape). With both libraries held to AVX2 (``MKL_ENABLE_INSTRUCTIONS=
AVX2 ONEDNN_MAX_CPU_ISA=AVX2``, simulated; ``cpu_linear_avx2.json``) the median was 1.11x, but
oneDNN lost on 16-row matmuls (a decoding step: 0.67x to 1.0x), so ``auto`` asks for AVX-512.
A real AVX2-only Zen 3 EPYC (family 25, model 1; not simulated; ``cpu_linear_zen3.json``) agrees:
oneDNN ran at a median 0.865x MKL's rate, faster only on the 49,152-word output layer at 16 and
64 rows (1.77x and 1.11x forward), a gap left unused (a rule by layer and rows).

The oneDNN kernel (``torch.ops.mkldnn._linear_pointwise``) has no autograd formula: called on
tensors that need a gradient it returns a result whose backward silently computes nothing.
:class:`OneDNNLinear` therefore wraps it in an autograd function whose backward is again a oneDNN
linear for the input's gradient (``grad @ W``) and an ordinary matmul for the weight's and bias's
gradients (only when they are trained: a frozen base under LoRA adapters computes neither).

Which runs use it (:func:`wants_onednn`):

- ``auto`` (the default): a float32 model on a CPU where torch's kernels run AVX-512
  (``torch.backends.cpu.get_cpu_capability()``) and torch has oneDNN, except the tiny test
  model, whose tests compare code paths to float precision (as ``model.dtype: auto``);
- ``onednn``: wherever the kernel exists (a CPU, float32); elsewhere ``auto``'s answer;
- ``aten``: never (torch's own ``F.linear``).

The results are float32 throughout; they differ from MKL's in the last bits (another summation
order), as two BLAS libraries do, and stay the same from run to run on one machine.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn


@functools.cache
def onednn_linear_available() -> bool:
    """Whether this torch has oneDNN's float32 linear kernel on the CPU."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        probe, weight = torch.ones(2, 3, device="cpu"), torch.ones(4, 3, device="cpu")
        out = torch.ops.mkldnn._linear_pointwise(probe, weight, None, "none", [None], "")
    except (AttributeError, RuntimeError):
        return False
    return bool(torch.equal(out, torch.full((2, 4), 3.0, device="cpu")))


def wants_onednn(choice: str, kind: str, dtype: torch.dtype, device: str | torch.device) -> bool:
    """Whether a model of ``kind`` in ``dtype`` on ``device`` computes its linear layers with
    oneDNN under ``model.cpu_linear: choice`` (module docstring;
    :class:`~marl.agents.models.ModelSpec` checks the choice)."""
    if choice == "aten" or torch.device(device).type != "cpu" or dtype != torch.float32:
        return False
    if not onednn_linear_available():
        return False
    if choice == "onednn":
        return True
    return kind != "tiny" and torch.backends.cpu.get_cpu_capability() == "AVX512"


def _onednn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` by oneDNN: x (..., in), weight (out, in) -> (..., out)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [None], "")


class _OneDNNLinearFunction(torch.autograd.Function):
    """``F.linear`` by oneDNN, with the gradients ``F.linear`` has."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        ctx.save_for_backward(x if weight.requires_grad else None, weight)
        ctx.has_bias = bias is not None
        return _onednn(x, weight, bias)  # (..., out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        out_features, in_features = weight.shape
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn(grad.contiguous(), weight.t(), None)  # (..., out) @ (out, in)
        flat = grad.reshape(-1, out_features)  # (rows, out): a view
        if ctx.needs_input_grad[1]:
            grad_w = flat.t() @ x.reshape(-1, in_features)  # (out, rows) @ (rows, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = flat.sum(0)  # (out,)
        return grad_x, grad_w, grad_b


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` whose float32 CPU forward and backward run on oneDNN (other dtypes and
    devices: ``F.linear``). Same parameters, state dict and hooks: :func:`use_onednn_linears`
    turns a model's layers into it in place."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 (nn.Linear's name)
        """``F.linear(input, weight, bias)``: (..., in) -> (..., out)."""
        if (
            input.device.type == "cpu"
            and input.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and input.shape[-1] == self.in_features
        ):
            return _OneDNNLinearFunction.apply(input, self.weight, self.bias)
        return nn.functional.linear(input, self.weight, self.bias)


def use_onednn_linears(model: nn.Module) -> int:
    """Turn every plain ``nn.Linear`` in ``model`` into :class:`OneDNNLinear`, in place (the
    tied output layer included); returns how many. Idempotent; subclasses of ``nn.Linear``
    (an adapter's own layers, other libraries') are left as they are."""
    turned = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDNNLinear
            turned += 1
    return turned
