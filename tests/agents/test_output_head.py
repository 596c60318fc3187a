"""The output layer of a frozen model never copies its weight once per row.

``logits_to_keep`` hands the output layer a ``(B, k, H)`` slice that cannot be flattened; with a
weight that needs no gradient (a frozen LoRA base, an opponent, evaluation) torch's matmul then
expands the ``(V, H)`` weight to ``(B, H, V)`` and copies it: 3.4 GB for one 64-row SmolLM2
prefill. :func:`marl.agents.models.contiguous_head_input` makes the slice contiguous first.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from marl.agents.backends.hf import HFBackend
from marl.agents.models import ModelSpec, build_tiny_model, load_model

ROWS, LENGTH = 8, 12


def batched_head_matmuls(model: torch.nn.Module) -> int:
    """How many batched matmuls against a ``(B, H, V)`` expansion of the output weight one
    forward of the frozen ``model`` runs (in bf16 on SmolLM2 each one copies the weight)."""
    for p in model.parameters():
        p.requires_grad_(False)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab, (ROWS, LENGTH), generator=torch.Generator().manual_seed(0))
    activities = [ProfilerActivity.CPU]
    with torch.inference_mode(), profile(activities=activities, record_shapes=True) as prof:
        out = model(input_ids=ids, logits_to_keep=1)
    assert out.logits.shape == (ROWS, 1, vocab)
    return sum(
        1
        for e in prof.events()
        if e.name == "aten::bmm" and len(e.input_shapes) == 2 and e.input_shapes[1][-1:] == [vocab]
    )


def test_a_bare_frozen_model_takes_the_batched_path() -> None:
    """The control: a bare frozen model takes the batched path (torch 2.13's matmul rule), so
    the next tests would see it if the fix stopped working."""
    assert batched_head_matmuls(build_tiny_model(ModelSpec(kind="tiny"))) >= 1


def test_loaded_models_fold_the_matmul_and_keep_the_logits() -> None:
    bare = build_tiny_model(ModelSpec(kind="tiny")).eval()
    loaded, _ = load_model(ModelSpec(kind="tiny"))
    assert batched_head_matmuls(loaded) == 0
    ids = torch.randint(3, bare.config.vocab_size, (ROWS, LENGTH))
    with torch.inference_mode():
        assert torch.equal(
            bare(input_ids=ids, logits_to_keep=1).logits,
            loaded(input_ids=ids, logits_to_keep=1).logits,
        )


def test_a_model_handed_to_the_backend_gets_the_fix_once() -> None:
    model = build_tiny_model(ModelSpec(kind="tiny"))
    tokenizer = load_model(ModelSpec(kind="tiny"))[1]
    HFBackend(model, tokenizer)
    HFBackend(model, tokenizer)  # a second backend over the same model adds no second hook
    assert len(model.get_output_embeddings()._forward_pre_hooks) == 1
    assert batched_head_matmuls(model) == 0
