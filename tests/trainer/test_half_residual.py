"""`model.half_residual`: under autocast every LayerNorm reads and writes the half dtype, so the residual stream between
layers is half precision; in fp32 nothing changes. Checked on the CPU's bf16 autocast against LayerNorm computed in
float64 from its definition, and against the same model with the fp32 residual stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.trainer.conftest import make_model_config, make_samples
from trainer.data.batch import pack_batch
from trainer.layer_norm import LayerNorm
from trainer.model import BertForPreTraining, pretraining_loss

LENGTHS = [64, 17, 40, 64, 9, 33]


def reference_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight.double() + bias.double()


def test_under_autocast_it_reads_and_writes_the_half_dtype_and_matches_the_definition():
    torch.manual_seed(0)
    norm = LayerNorm(32, eps=1e-12, half_io=True)
    with torch.no_grad():
        norm.weight.add_(0.3 * torch.randn(32))
        norm.bias.add_(0.3 * torch.randn(32))
    x = torch.randn(50, 32) * 3 + 1  # fp32, as the embeddings' sum is
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(x)
    assert out.dtype == torch.bfloat16
    expected = reference_layer_norm(x.bfloat16(), norm.weight.bfloat16(), norm.bias.bfloat16(), 1e-12)
    torch.testing.assert_close(out.double(), expected, rtol=2e-2, atol=2e-2)
    # Its parameters stay fp32 and get fp32 gradients, those of the definition up to bf16 rounding
    out.float().square().sum().backward()
    assert norm.weight.grad.dtype == torch.float32 and norm.bias.grad.dtype == torch.float32
    weight = norm.weight.detach().double().requires_grad_()
    bias = norm.bias.detach().double().requires_grad_()
    reference_layer_norm(x.bfloat16(), weight, bias, 1e-12).square().sum().backward()
    torch.testing.assert_close(norm.weight.grad.double(), weight.grad, rtol=3e-2, atol=0.5)
    torch.testing.assert_close(norm.bias.grad.double(), bias.grad, rtol=3e-2, atol=0.5)


def test_without_autocast_it_is_torchs_layer_norm():
    torch.manual_seed(1)
    half, plain = LayerNorm(16, eps=1e-5, half_io=True), torch.nn.LayerNorm(16, eps=1e-5)
    with torch.no_grad():
        half.weight.copy_(torch.randn(16))
        plain.weight.copy_(half.weight)
    x = torch.randn(8, 16)
    assert torch.equal(half(x), plain(x))


def models(seed: int = 0):
    """The same weights with the fp32 residual stream and with the half one; hidden dropout off, so they compare."""
    cfg = make_model_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    off = BertForPreTraining(cfg).train()
    on = BertForPreTraining(cfg.model_copy(update={"half_residual": True})).train()
    on.load_state_dict(off.state_dict())
    assert list(on.state_dict()) == list(off.state_dict())  # the same names: checkpoints load either way
    return off, on


def layer_output_dtypes(model, batch) -> list[torch.dtype]:
    dtypes = []
    hooks = [layer.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype)) for layer in model.bert.encoder.layer]
    model(batch)
    for hook in hooks:
        hook.remove()
    return dtypes


def test_the_residual_stream_is_half_precision_under_autocast_and_the_loss_that_of_fp32():
    off, on = models()
    samples = make_samples(LENGTHS)
    batch = pack_batch(samples, np.arange(len(LENGTHS)))
    exact = pretraining_loss(off(batch), batch).total.item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer_output_dtypes(off, batch) == [torch.float32] * 2
        assert layer_output_dtypes(on, batch) == [torch.bfloat16] * 2
        losses = [pretraining_loss(m(batch), batch).total for m in (off, on)]
    for loss in losses:
        assert abs(loss.item() - exact) < 2e-2 * abs(exact)
    losses[1].backward()  # every parameter gets an fp32 gradient
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in on.parameters())


def test_in_fp32_half_residual_changes_nothing():
    off, on = models(seed=3)
    samples = make_samples(LENGTHS, seed=2)
    batch = pack_batch(samples, np.arange(len(LENGTHS)))
    a, b = (pretraining_loss(m(batch), batch).total for m in (off, on))
    assert torch.equal(a, b)
    a.backward()
    b.backward()
    for p, q in zip(off.parameters(), on.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)


def test_the_kernel_is_called_with_autocast_off_on_half_tensors(monkeypatch):
    """CUDA's autocast would run layer_norm in fp32 whatever its input (the CPU's does not): the call must be made with
    autocast off, on the half input and half parameters, or the switch does nothing on a GPU."""
    calls = []
    real = torch.nn.functional.layer_norm

    def spy(x, shape, weight=None, bias=None, eps=1e-5):
        calls.append((torch.is_autocast_enabled("cpu"), x.dtype, weight.dtype, bias.dtype))
        return real(x, shape, weight, bias, eps)

    monkeypatch.setattr(torch.nn.functional, "layer_norm", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        LayerNorm(8, eps=1e-12, half_io=True)(torch.randn(3, 8))
    assert calls == [(False, torch.bfloat16, torch.bfloat16, torch.bfloat16)]


@pytest.mark.slow  # compiles the layers in bf16 (make test-all); test_fused_paths.py checks the compiled layers
def test_compiled_layers_with_the_half_residual_stream_match_the_eager_model():
    """`model.compile` with `model.half_residual` under bf16 autocast: the compiled per-token parts keep the stream in
    bf16 and give the eager model's loss and gradients (to bf16 rounding)."""
    _, eager = models(seed=5)
    compiled = BertForPreTraining(eager.config.model_copy(update={"compile": True})).train()
    compiled.load_state_dict(eager.state_dict())
    samples = make_samples(LENGTHS, seed=4)
    batch = pack_batch(samples, np.arange(len(LENGTHS)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer_output_dtypes(compiled, batch) == [torch.bfloat16] * 2
        losses = [pretraining_loss(m(batch), batch).total for m in (eager, compiled)]
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=1e-2)
    for loss in losses:
        loss.backward()
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        assert q.grad.dtype == torch.float32, name
        torch.testing.assert_close(q.grad, p.grad, rtol=5e-2, atol=5e-3, msg=name)
