"""`build_optimizer` on the real tiny BERT, with real gradients, against float64 references written from the papers.

LAMB: You et al. (2019, Algorithm 2) with apex FusedLAMB's additions (global gradient-norm pre-normalization by
max(1, ‖g‖ / max_grad_norm), bias-corrected moments, weight decay inside the trust ratio, ratio 1 where ‖w‖ or ‖u‖
is 0 and, without `use_nvlamb`, where weight decay is 0). AdamW: Loshchilov & Hutter, w ← w − lr·λ·w − lr·m̂/(√v̂ + ε).
Which parameters decay is decided here independently of the trainer's name rule: in BERT exactly the matrices
(ndim ≥ 2: embeddings and dense weights) decay; the vectors are biases and LayerNorm parameters.

Each step takes the gradient of the trainer's model at its current weights and feeds the same gradient to the
reference, so the comparison holds the optimizers' arithmetic, over several steps, to float32 rounding.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.trainer.conftest import make_model_config, make_samples
from trainer.config import OptimizerConfig
from trainer.data.batch import pack_batch
from trainer.model import BertForPreTraining, pretraining_loss
from trainer.optim import build_optimizer

STEPS = 5
BATCH = 4
LR = 5e-3


def lamb_reference(w, g, m, v, t, decays, cfg: OptimizerConfig) -> None:
    """One apex-FusedLAMB step in float64, in place on the dicts name -> tensor `w`, `m`, `v`; `t` counts from 1."""
    b1, b2 = cfg.beta1, cfg.beta2
    grad_norm = math.sqrt(sum(float((x * x).sum()) for x in g.values()))
    divisor = grad_norm / cfg.max_grad_norm if grad_norm > cfg.max_grad_norm else 1.0
    for n in w:
        gn = g[n] / divisor
        m[n] = b1 * m[n] + (1 - b1) * gn
        v[n] = b2 * v[n] + (1 - b2) * gn * gn
        u = (m[n] / (1 - b1**t)) / (torch.sqrt(v[n] / (1 - b2**t)) + cfg.eps) + decays[n] * w[n]
        ratio = 1.0
        if decays[n] != 0 or cfg.use_nvlamb:
            w_norm, u_norm = math.sqrt(float((w[n] * w[n]).sum())), math.sqrt(float((u * u).sum()))
            if w_norm > 0 and u_norm > 0:
                ratio = w_norm / u_norm
        w[n] = w[n] - cfg.lr * ratio * u


def adamw_reference(w, g, m, v, t, decays, cfg: OptimizerConfig) -> None:
    """One decoupled-weight-decay Adam step in float64 (no gradient clipping: the trainer's clipper does that)."""
    b1, b2 = cfg.beta1, cfg.beta2
    for n in w:
        m[n] = b1 * m[n] + (1 - b1) * g[n]
        v[n] = b2 * v[n] + (1 - b2) * g[n] * g[n]
        step = (m[n] / (1 - b1**t)) / (torch.sqrt(v[n] / (1 - b2**t)) + cfg.eps)
        w[n] = w[n] - cfg.lr * decays[n] * w[n] - cfg.lr * step


CASES = {
    # BERT's gradient norm at init is ~10: max_grad_norm 1 pre-normalizes every step, 1e4 none
    "lamb-clipped": OptimizerConfig(name="lamb", lr=LR, weight_decay=0.01, max_grad_norm=1.0),
    "lamb-unclipped-nvlamb": OptimizerConfig(name="lamb", lr=LR, weight_decay=0.1, max_grad_norm=1e4, use_nvlamb=True),
    "lamb-no-decay": OptimizerConfig(name="lamb", lr=LR, weight_decay=0.0, beta1=0.8, beta2=0.99, eps=1e-8),
    "adamw": OptimizerConfig(name="adamw", lr=LR, weight_decay=0.1, beta1=0.85, beta2=0.98, eps=1e-7),
}


@pytest.mark.parametrize("case", list(CASES))
def test_build_optimizer_on_bert_matches_float64_reference(case):
    cfg = CASES[case]
    torch.manual_seed(0)
    model = BertForPreTraining(make_model_config(num_hidden_layers=1))
    samples = make_samples(np.random.default_rng(3).integers(8, 65, STEPS * BATCH), seed=4)
    optimizer = build_optimizer(model, cfg)
    reference = lamb_reference if cfg.name == "lamb" else adamw_reference
    params = dict(model.named_parameters())
    start = {n: p.detach().double().clone() for n, p in params.items()}
    w = {n: x.clone() for n, x in start.items()}
    m = {n: torch.zeros_like(x) for n, x in w.items()}
    v = {n: torch.zeros_like(x) for n, x in w.items()}
    decays = {n: cfg.weight_decay if p.ndim >= 2 else 0.0 for n, p in params.items()}
    assert sum(d == 0.0 for d in decays.values()) > 10  # biases and LayerNorm exist and are left alone
    grad_norms, worst = [], 0.0  # worst: the largest |ours - reference| / lr over weights and steps
    for t in range(1, STEPS + 1):
        batch = pack_batch(samples, np.arange((t - 1) * BATCH, t * BATCH))
        pretraining_loss(model(batch), batch).total.backward()
        g = {n: p.grad.detach().double() for n, p in params.items()}
        grad_norms.append(math.sqrt(sum(float((x * x).sum()) for x in g.values())))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reference(w, g, m, v, t, decays, cfg)
        for n, p in params.items():
            # relative to the step size: every weight moves by about lr per step
            worst = max(worst, (p.detach().double() - w[n]).abs().max().item() / LR)
        assert worst < 1e-4, (case, t, worst)
    print(f"{case}: max |w - w_ref| = {worst * LR:.2e} ({worst:.1e} lr)")
    if cfg.name == "lamb":
        assert all(n > cfg.max_grad_norm for n in grad_norms) == (cfg.max_grad_norm == 1.0)
    unmoved = [n for n, p in params.items() if (p.detach().double() - start[n]).abs().max().item() < LR / 10]
    # every parameter moved by about lr per step, so the comparison covers them all; except the attention's key
    # bias, whose gradient is 0 (softmax does not change when a query's scores all shift by <q, b_k>)
    assert unmoved == ["bert.encoder.layer.0.attention.self.key.bias"]
