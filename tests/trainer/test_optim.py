"""trainer.optim: LAMB against an independent float64 per-parameter implementation, AdamW, the apex switch."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch import nn

from trainer.config import OptimizerConfig
from trainer.errors import BackendUnavailableError
from trainer.optim import Lamb, build_optimizer, param_groups_for

STEPS = 6


class TinyNet(nn.Module):
    """Decayed weights, undecayed bias/LayerNorm parameters and an all-zero decayed weight (‖w‖ = 0)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.dense = nn.Linear(4, 3)
        self.LayerNorm = nn.LayerNorm(3)
        self.zeros = nn.Parameter(torch.zeros(2, 5))
        with torch.no_grad():
            for p in (self.dense.weight, self.dense.bias, self.LayerNorm.weight):
                p.copy_(torch.randn(p.shape, generator=gen))


def make_grads(model: nn.Module, scale: float, steps: int = STEPS) -> list[dict[str, torch.Tensor]]:
    """Fixed random float64 gradients per step and parameter name."""
    gen = torch.Generator().manual_seed(1)
    return [
        {n: torch.randn(p.shape, generator=gen, dtype=torch.float64) * scale for n, p in model.named_parameters()}
        for _ in range(steps)
    ]


def reference_lamb(weights, decays, grads, lr, betas, eps, max_grad_norm, use_nvlamb):
    """apex FusedLAMB written out with plain float64 loops: `weights` name -> tensor, `decays` name -> λ."""
    beta1, beta2 = betas
    w = {n: t.double().clone() for n, t in weights.items()}
    m = {n: torch.zeros_like(t) for n, t in w.items()}
    v = {n: torch.zeros_like(t) for n, t in w.items()}
    for t, step_grads in enumerate(grads, start=1):
        global_norm = math.sqrt(sum(float((g * g).sum()) for g in step_grads.values()))
        divisor = max(1.0, global_norm / max_grad_norm)
        for n in w:  # in place where it reads as well, because the large test runs this on 33 M elements
            g = step_grads[n] / divisor
            m[n].mul_(beta1).add_(g, alpha=1 - beta1)
            v[n].mul_(beta2).addcmul_(g, g, value=1 - beta2)
            denominator = (v[n] / (1 - beta2**t)).sqrt_().add_(eps)
            u = (m[n] / (1 - beta1**t)).div_(denominator).add_(w[n], alpha=decays[n])
            w_norm, u_norm = float(w[n].norm()), float(u.norm())
            use_ratio = (decays[n] != 0 or use_nvlamb) and w_norm > 0 and u_norm > 0
            ratio = w_norm / u_norm if use_ratio else 1.0
            w[n].add_(u, alpha=-lr * ratio)
    return w


def run_lamb(model: nn.Module, grads, dtype=torch.float32, **kwargs) -> Lamb:
    opt = Lamb(param_groups_for(model, kwargs.pop("weight_decay")), **kwargs)
    for step_grads in grads:
        for n, p in model.named_parameters():
            p.grad = step_grads[n].to(dtype)
        opt.step()
    return opt


@pytest.mark.parametrize("use_nvlamb", [False, True])
@pytest.mark.parametrize("grad_scale", [0.01, 10.0], ids=["unclipped", "clipped"])
def test_lamb_matches_float64_reference(use_nvlamb, grad_scale):
    model = TinyNet()
    grads = make_grads(model, grad_scale)
    norms = [math.sqrt(sum(float((g * g).sum()) for g in s.values())) for s in grads]
    assert all(n > 1.0 for n in norms) if grad_scale > 1 else all(n < 1.0 for n in norms)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    decays = {n: 0.0 if "bias" in n or "LayerNorm" in n else 0.1 for n in weights}
    hp = dict(lr=0.02, betas=(0.9, 0.999), eps=1e-6, max_grad_norm=1.0, use_nvlamb=use_nvlamb)

    run_lamb(model, grads, weight_decay=0.1, **hp)
    expected = reference_lamb(weights, decays, grads, **hp)

    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double(), expected[n], atol=1e-6, rtol=0, msg=n)
        assert not torch.equal(p.detach().double(), weights[n].double()), f"{n} did not move"


def test_lamb_leaves_grads_alone_and_skips_params_without_grad():
    model = TinyNet()
    opt = Lamb(param_groups_for(model, 0.01))
    before = model.dense.bias.detach().clone()
    model.dense.weight.grad = torch.full_like(model.dense.weight, 5.0)  # global norm 19.4: clipped
    opt.step()
    assert torch.equal(model.dense.weight.grad, torch.full_like(model.dense.weight, 5.0))
    assert torch.equal(model.dense.bias, before)
    assert model.dense.bias not in opt.state


def test_lamb_state_dict_resumes_exactly():
    grads = make_grads(TinyNet(), 1.0)
    straight = TinyNet()
    run_lamb(straight, grads, weight_decay=0.01)

    resumed = TinyNet()
    first = run_lamb(resumed, grads[:3], weight_decay=0.01)
    opt = Lamb(param_groups_for(resumed, 0.01))
    opt.load_state_dict(first.state_dict())
    for step_grads in grads[3:]:
        for n, p in resumed.named_parameters():
            p.grad = step_grads[n].float()
        opt.step()
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)


def test_lamb_bf16_params_keep_fp32_moments_and_follow_fp32():
    grads = make_grads(TinyNet(), 1.0)
    fp32, bf16 = TinyNet(), TinyNet().to(torch.bfloat16)
    run_lamb(fp32, grads, weight_decay=0.01, lr=0.01)
    opt = run_lamb(bf16, grads, dtype=torch.bfloat16, weight_decay=0.01, lr=0.01)
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
    for a, b in zip(fp32.parameters(), bf16.parameters(), strict=True):
        assert b.dtype == torch.bfloat16
        torch.testing.assert_close(b.float(), a.detach(), atol=2e-2, rtol=2e-2)


def test_lamb_load_state_dict_keeps_fp32_moments_of_bf16_params():
    model = TinyNet().to(torch.bfloat16)
    saved = run_lamb(model, make_grads(model, 1.0, steps=2), dtype=torch.bfloat16, weight_decay=0.01).state_dict()
    opt = Lamb(param_groups_for(model, 0.01))
    opt.load_state_dict(saved)
    saved_ids = [i for g in saved["param_groups"] for i in g["params"]]
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in zip(saved_ids, params, strict=True):
        state = opt.state[p]
        assert state["exp_avg"].dtype == torch.float32 and state["step"].item() == 2.0
        assert torch.equal(state["exp_avg_sq"], saved["state"][i]["exp_avg_sq"])  # no round trip through bf16


def test_param_groups_for_exempts_bias_and_layernorm():
    model = TinyNet()
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups_for(model, 0.05)
    by_decay = {g["weight_decay"]: sorted(names[id(p)] for p in g["params"]) for g in groups}
    assert by_decay == {0.05: ["dense.weight", "zeros"], 0.0: ["LayerNorm.bias", "LayerNorm.weight", "dense.bias"]}


def test_build_optimizer_lamb_takes_config_values():
    cfg = OptimizerConfig(name="lamb", lr=2e-3, beta1=0.8, beta2=0.99, eps=1e-8, max_grad_norm=2.0, use_nvlamb=True)
    opt = build_optimizer(TinyNet(), cfg)
    assert isinstance(opt, Lamb)
    assert opt.max_grad_norm == 2.0
    assert opt.param_groups[0]["betas"] == (0.8, 0.99)
    assert {(g["lr"], g["eps"], g["use_nvlamb"]) for g in opt.param_groups} == {(2e-3, 1e-8, True)}


def test_build_optimizer_adamw_matches_torch_adamw():
    cfg = OptimizerConfig(name="adamw", lr=1e-2, beta1=0.85, beta2=0.98, eps=1e-7, weight_decay=0.1)
    ours_model, ref_model = TinyNet(), TinyNet()
    ours = build_optimizer(ours_model, cfg)
    ref = torch.optim.AdamW(param_groups_for(ref_model, 0.1), lr=1e-2, betas=(0.85, 0.98), eps=1e-7, foreach=False)
    assert isinstance(ours, torch.optim.AdamW)
    for step_grads in make_grads(ours_model, 1.0):
        for model, opt in ((ours_model, ours), (ref_model, ref)):
            for n, p in model.named_parameters():
                p.grad = step_grads[n].float()
            opt.step()
    for (n, a), b in zip(ours_model.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=n)
        assert not torch.equal(a, TinyNet().get_parameter(n)), f"{n} did not move"


@pytest.mark.parametrize("name", ["lamb", "adamw"])
def test_apex_without_apex_says_what_to_do(monkeypatch, name):
    monkeypatch.setitem(sys.modules, "apex", None)  # makes `import apex` raise ImportError
    with pytest.raises(BackendUnavailableError, match="optimizer.impl"):
        build_optimizer(TinyNet(), OptimizerConfig(name=name, impl="apex"))


class LargeNet(nn.Module):
    """A BERT-large word-embedding-sized weight (33 M elements), a square weight and a bias."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.word_embeddings = nn.Parameter(torch.randn(32320, 1024, generator=gen))
        self.dense = nn.Parameter(torch.randn(1024, 1024, generator=gen))
        self.bias = nn.Parameter(torch.randn(1024, generator=gen))


@pytest.mark.slow  # 22 s: BERT-large-sized tensors; the same update on small ones is tested above
def test_lamb_on_bert_large_sized_tensors_matches_float64_reference():
    # torch's float32 CPU norm of the 33 M-element tensor is ~0.1 % off; through the trust ratio that moves every
    # weight by ~lr * |w| * 1e-3 = 2e-5, twenty times the tolerance. Clipped: the global norm matters too.
    model = LargeNet()
    grads = make_grads(model, 1.0, steps=2)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    decays = {n: 0.0 if "bias" in n else 0.01 for n in weights}
    hp = dict(lr=0.02, betas=(0.9, 0.999), eps=1e-6, max_grad_norm=1.0, use_nvlamb=False)

    run_lamb(model, grads, weight_decay=0.01, **hp)
    expected = reference_lamb(weights, decays, grads, **hp)

    for n, p in model.named_parameters():
        assert (p.detach().double() - expected[n]).abs().max().item() < 1e-6, n
