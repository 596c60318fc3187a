"""Several LoRA adapters in one batch, each row under its own, in fixed shapes a graph captures.

peft routes a mixed batch (``adapter_names=[...]``, one name per row) by grouping the rows in
Python and indexing with host lists: new shapes and host-to-device copies every call, so a CUDA
graph cannot capture it, and the demo's two adapters decoded eagerly. punica's BGMV kernel
instead applies, for every row, the adapter weights that row's index selects, inside one launch.

:class:`MixedAdapters` does the same in plain torch, with every tensor fixed for the life of the
object, so that a decoding step that uses it can be captured once and replayed:

- each LoRA linear layer's adapters are **stacked**: ``A (K, in)``, the ranks of the adapters
  one after another (``K = r_1 + ... + r_n``), and ``B (out, K)``, each adapter's block already
  multiplied by its scaling;
- each row's adapter is an index in a device buffer, ``(R,)`` (``-1``: no adapter, the base);
- a layer's output is the base layer's plus ``((x @ A^T) * select) @ B^T``, where ``select
  (R, 1, K)`` keeps, for each row, the columns of its own adapter's block. Every row computes
  all ``K`` rank columns (``n`` adapters' worth: a few dozen multiply-adds per input feature)
  instead of gathering per-row copies of the weights (``R x r x in`` values read per layer and
  step), which on a GPU would cost more memory traffic than the matmul it saves.

Equal to peft's mixed-batch forward up to float rounding (the scaling is folded into ``B``),
tested on the CPU. Supported: peft's plain LoRA on ``nn.Linear`` layers, dropout off (eval);
:func:`supports` says no otherwise (DoRA and other variants, LoRA biases), and the caller then
keeps peft's own path. The stacked copies follow the live adapters through :meth:`refresh`
(called before every use: an update changes the weights in place).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

__all__ = ["MixedAdapters", "supports"]


def _lora_layers(model: nn.Module, names: Sequence[str]) -> list[Any]:
    """The peft LoRA layers of ``model`` that hold at least one of ``names``."""
    found = []
    for module in model.modules():
        adapters = getattr(module, "lora_A", None)
        if isinstance(adapters, nn.ModuleDict) and any(n in adapters for n in names):
            found.append(module)
    return found


def supports(model: nn.Module, names: Sequence[str]) -> bool:
    """Whether every layer carrying ``names`` is a plain LoRA linear layer this module can
    route (no DoRA or other variant, no LoRA bias, a linear base layer)."""
    if not hasattr(model, "disable_adapter"):
        return False
    layers = _lora_layers(model, names)
    if not layers:
        return False
    for layer in layers:
        if not isinstance(getattr(layer, "base_layer", None), nn.Linear):
            return False
        for name in names:
            if name not in layer.lora_A:
                continue
            if name in getattr(layer, "lora_variant", {}) or getattr(layer, "use_dora", {}).get(
                name, False
            ):
                return False
            if getattr(layer.lora_B[name], "bias", None) is not None:
                return False
    return True


class MixedAdapters:
    """The adapters ``names`` of a peft ``model``, stacked per layer, for ``rows`` rows."""

    def __init__(self, model: nn.Module, names: Sequence[str], rows: int) -> None:
        self.model = model
        self.names = list(names)
        self.layers = _lora_layers(model, self.names)
        device = next(model.parameters()).device
        self.row_adapter = torch.full((rows,), -1, dtype=torch.long, device=device)  # (R,)
        self.stacks: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        for layer in self.layers:
            present = [(i, n) for i, n in enumerate(self.names) if n in layer.lora_A]
            weight = layer.lora_A[present[0][1]].weight
            rank = sum(layer.lora_A[n].weight.shape[0] for _, n in present)
            a = torch.zeros(rank, weight.shape[1], dtype=weight.dtype, device=device)  # (K, in)
            out = layer.lora_B[present[0][1]].weight.shape[0]
            b = torch.zeros(out, rank, dtype=weight.dtype, device=device)  # (out, K)
            owner = torch.cat(
                [torch.full((layer.lora_A[n].weight.shape[0],), i) for i, n in present]
            ).to(device)  # (K,) the adapter of each rank column
            self.stacks.append((a, b, owner))
        self.refresh()

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the live adapter weights (and scalings) into the stacks, in place."""
        for layer, (a, b, _) in zip(self.layers, self.stacks):
            start = 0
            for name in self.names:
                if name not in layer.lora_A:
                    continue
                weight_a = layer.lora_A[name].weight  # (r, in)
                r = weight_a.shape[0]
                a[start : start + r].copy_(weight_a)
                b[:, start : start + r].copy_(layer.lora_B[name].weight * layer.scaling[name])
                start += r

    def load(self, row_names: Sequence[str | None]) -> None:
        """Route the rows: ``row_names[i]`` (an adapter of :attr:`names`, or anything else for
        the base model) for row ``i``; rows past the list take the base model."""
        index = [self.names.index(n) if n in self.names else -1 for n in row_names]
        index += [-1] * (self.row_adapter.shape[0] - len(index))
        self.row_adapter.copy_(torch.tensor(index, dtype=torch.long))

    @contextmanager
    def active(self) -> Iterator[None]:
        """peft's adapters off, each LoRA layer adding its rows' own adapter instead."""
        handles = [
            layer.register_forward_hook(self._hook(a, b, owner))
            for layer, (a, b, owner) in zip(self.layers, self.stacks)
        ]
        try:
            with self.model.disable_adapter():  # type: ignore[operator]
                yield
        finally:
            for handle in handles:
                handle.remove()

    def _hook(self, a: torch.Tensor, b: torch.Tensor, owner: torch.Tensor) -> Any:
        rows = self.row_adapter

        def add_adapters(_module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
            x = args[0].to(a.dtype)  # (R, T, in)
            select = (rows[:, None] == owner[None, :]).to(a.dtype)  # (R, K)
            low = (x @ a.T) * select.view(rows.shape[0], *([1] * (x.dim() - 2)), -1)  # (R, T, K)
            return output + (low @ b.T).to(output.dtype)  # (R, T, out)

        return add_adapters
