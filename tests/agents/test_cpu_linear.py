"""float32 linear layers on oneDNN (``model.cpu_linear``): the same values and gradients as
``F.linear``, under LoRA adapters too, and the rule that decides which runs use them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from marl.agents.cpu_linear import (
    OneDNNLinear,
    onednn_linear_available,
    use_onednn_linears,
    wants_onednn,
)
from marl.agents.models import ModelSpec, build_tiny_model, load_model, with_lora

pytestmark = pytest.mark.skipif(
    not onednn_linear_available(), reason="this torch has no oneDNN float32 linear kernel"
)


def _pair(in_features: int, out_features: int, bias: bool) -> tuple[nn.Linear, OneDNNLinear]:
    torch.manual_seed(0)
    plain = nn.Linear(in_features, out_features, bias=bias)
    fast = nn.Linear(in_features, out_features, bias=bias)
    fast.load_state_dict(plain.state_dict())
    use_onednn_linears(fast)
    assert type(fast) is OneDNNLinear
    return plain, fast  # type: ignore[return-value]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(7, 24), (3, 5, 24), (0, 24)])
def test_the_forward_and_every_gradient_equal_f_linears(bias: bool, shape: tuple) -> None:
    plain, fast = _pair(24, 40, bias)
    x = torch.randn(*shape)
    x_plain, x_fast = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_plain, out_fast = plain(x_plain), fast(x_fast)
    assert out_fast.shape == out_plain.shape == (*shape[:-1], 40)
    torch.testing.assert_close(out_fast, out_plain, rtol=1e-5, atol=1e-5)
    weights = torch.randn_like(out_plain)
    (out_plain * weights).sum().backward()
    (out_fast * weights).sum().backward()
    torch.testing.assert_close(x_fast.grad, x_plain.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.weight.grad, plain.weight.grad, rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(fast.bias.grad, plain.bias.grad, rtol=1e-5, atol=1e-5)


def test_a_frozen_layer_gives_the_input_its_gradient_and_computes_no_weight_gradient() -> None:
    plain, fast = _pair(16, 8, True)
    for layer in (plain, fast):
        layer.requires_grad_(False)
    x = torch.randn(4, 16).t().contiguous().t()  # a non-contiguous view: (4, 16), strides (1, 4)
    x_plain, x_fast = x.clone().requires_grad_(), x.detach().requires_grad_()
    plain(x_plain).pow(2).sum().backward()
    fast(x_fast).pow(2).sum().backward()
    torch.testing.assert_close(x_fast.grad, x_plain.grad, rtol=1e-5, atol=1e-5)
    assert fast.weight.grad is None and fast.bias.grad is None


def test_other_dtypes_take_f_linear_unchanged() -> None:
    plain, fast = _pair(16, 8, True)
    plain, fast = plain.double(), fast.double()
    x = torch.randn(3, 16, dtype=torch.float64)
    assert torch.equal(fast(x), plain(x))  # the same kernel: bit for bit


def test_a_model_keeps_its_parameters_state_dict_and_tied_head() -> None:
    spec = ModelSpec(kind="tiny", cpu_linear="onednn")
    model, _ = load_model(spec)
    reference = build_tiny_model(ModelSpec(kind="tiny"))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(type(m) is OneDNNLinear for m in linears)
    assert use_onednn_linears(model) == 0  # idempotent: nothing left to turn
    assert model.state_dict().keys() == reference.state_dict().keys()
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert tied == reference.config.tie_word_embeddings


def test_the_tiny_model_under_lora_scores_and_trains_as_with_f_linear() -> None:
    from peft import LoraConfig

    from marl.agents.logprobs import response_logprobs

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    prompts = [[5, 6, 7, 8, 9], [5, 6, 7, 10]]
    replies = [[11, 12, 13], [14, 15]]
    results = []
    for choice in ("aten", "onednn"):
        model, _ = load_model(ModelSpec(kind="tiny", cpu_linear=choice))
        torch.manual_seed(1)  # the adapter's A is drawn from the global generator
        model = with_lora(model, lora, "adapter")
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.data.normal_(0, 0.1)  # a trained adapter: B is zero at initialisation
        scored = response_logprobs(model, prompts, replies, packed=True)
        total = (scored.sampling * scored.mask).sum()
        total.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((scored.sampling[scored.mask.bool()].detach(), grads))
    (logp_aten, grads_aten), (logp_fast, grads_fast) = results
    torch.testing.assert_close(logp_fast, logp_aten, rtol=1e-4, atol=1e-5)
    assert grads_aten.keys() == grads_fast.keys() and all("lora_" in n for n in grads_aten)
    for name in grads_aten:
        torch.testing.assert_close(grads_fast[name], grads_aten[name], rtol=1e-3, atol=1e-5)


def test_which_runs_use_onednn() -> None:
    avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    assert wants_onednn("auto", "embedded", torch.float32, "cpu") is avx512
    assert wants_onednn("auto", "hf", torch.float32, "cpu") is avx512
    assert not wants_onednn("auto", "tiny", torch.float32, "cpu")  # tests compare code paths
    assert wants_onednn("onednn", "tiny", torch.float32, "cpu")
    assert not wants_onednn("auto", "embedded", torch.bfloat16, "cpu")  # bf16 is oneDNN's already
    assert not wants_onednn("onednn", "embedded", torch.float32, "cuda")
    assert not wants_onednn("aten", "embedded", torch.float32, "cpu")
    with pytest.raises(ValueError, match="model.cpu_linear: 'mkl' is not one of auto, onednn"):
        ModelSpec(cpu_linear="mkl")


def test_a_run_says_when_its_linear_layers_run_on_onednn() -> None:
    from marl.config import Config
    from marl.runtime.machine import fit_machine

    fp32 = Config(model=ModelSpec(kind="embedded", dtype="float32"))
    _, _, machine = fit_machine(fp32, None, gpus=0)
    avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    assert machine.line().endswith("; linear layers on oneDNN") is avx512
    tiny = Config(model=ModelSpec(kind="tiny"))
    assert "oneDNN" not in fit_machine(tiny, None, gpus=0)[2].line()
