"""Mixed adapters in fixed shapes (marl.agents.mixed_lora, issue 37): each row under its own
LoRA adapter through stacked weights and a per-row index, equal to peft's own mixed-batch
routing, following in-place weight updates, with buffers a CUDA graph can keep reading."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from marl.agents.backends.base import BASE_ADAPTER
from marl.agents.mixed_lora import MixedAdapters, supports
from marl.agents.models import ModelSpec, load_model

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _model(dora: bool = False) -> torch.nn.Module:
    """The tiny model with three adapters of different ranks (one on fewer layers), random."""
    base, _ = load_model(ModelSpec(kind="tiny", seed=4))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS), "a")
    model.add_adapter("b", LoraConfig(r=8, lora_alpha=4, target_modules=TARGETS, use_dora=dora))
    model.add_adapter("c", LoraConfig(r=2, lora_alpha=2, target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model.eval()


ROWS = ["a", "b", BASE_ADAPTER, "c", "b", "a"]


@pytest.mark.parametrize("names", [("a", "b", "c"), ("a", "b")])
def test_stacked_routing_equals_peft_mixed_batches(names: tuple[str, ...]) -> None:
    model = _model()
    rows = [n if n in names or n == BASE_ADAPTER else BASE_ADAPTER for n in ROWS]
    ids = torch.randint(1, 90, (len(rows), 7), generator=torch.Generator().manual_seed(1))
    assert supports(model, names)
    with torch.no_grad():
        theirs = model(input_ids=ids, adapter_names=rows).logits  # (R, T, V)
        mixed = MixedAdapters(model, names, rows=8)  # 2 dummy rows: the base model
        mixed.load(rows)
        with mixed.active():
            ours = model(input_ids=torch.cat([ids, ids[:2]])).logits[: len(rows)]
        base = model(input_ids=ids, adapter_names=[BASE_ADAPTER] * len(rows)).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    adapted = [i for i, n in enumerate(rows) if n != BASE_ADAPTER]
    assert not torch.allclose(theirs[adapted], base[adapted])  # the adapters really act
    # and nothing is left behind: peft's own routing is back
    with torch.no_grad():
        again = model(input_ids=ids, adapter_names=rows).logits
    assert torch.equal(again, theirs)


def test_refresh_follows_in_place_updates_and_keeps_every_buffer() -> None:
    model = _model()
    mixed = MixedAdapters(model, ("a", "b"), rows=6)
    buffers = [mixed.row_adapter.data_ptr()] + [t.data_ptr() for s in mixed.stacks for t in s]
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B.a" in name:
                p.mul_(-2.0)  # an optimizer step, in place
    ids = torch.randint(1, 90, (6, 5), generator=torch.Generator().manual_seed(2))
    rows = ["a", "a", "b", BASE_ADAPTER, "b", "a"]
    with torch.no_grad():
        mixed.refresh()
        mixed.load(rows)
        with mixed.active():
            ours = model(input_ids=ids).logits
        theirs = model(input_ids=ids, adapter_names=rows).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    after = [mixed.row_adapter.data_ptr()] + [t.data_ptr() for s in mixed.stacks for t in s]
    assert after == buffers  # a captured graph reads the same addresses
    assert mixed.row_adapter.tolist() == [0, 0, 1, -1, 1, 0]


def test_unsupported_adapters_keep_peft_s_path() -> None:
    model = _model(dora=True)
    assert supports(model, ("a",)) and not supports(model, ("a", "b"))  # b is DoRA
    plain, _ = load_model(ModelSpec(kind="tiny"))
    assert not supports(plain, ("a",))
