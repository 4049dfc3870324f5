"""trainer.norms against float64 (the clip coefficients on large buckets are tested in test_clipping.py)."""

from __future__ import annotations

import pytest
import torch

from trainer.norms import CPU_CHUNK, global_norm, tensor_norms

FLOAT32_ROUNDING = 3e-7  # a few units in the last place of float32


@pytest.mark.parametrize(
    "shape",
    # BERT-large's embedding (7 s) is slow
    [(1,), (CPU_CHUNK - 1,), (CPU_CHUNK + 1,), (1000, 1000), pytest.param((32320, 1024), marks=pytest.mark.slow)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_tensor_norms_are_exact_to_float32_rounding(shape):
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.rand(shape, generator=gen), torch.randn(shape, generator=gen) * 3]
    expected = torch.stack([t.double().square().sum().sqrt() for t in tensors])
    got = tensor_norms(tensors)
    assert got.dtype == torch.float32
    assert ((got.double() - expected) / expected).abs().max().item() < FLOAT32_ROUNDING
    total = expected.square().sum().sqrt()
    assert abs(global_norm(tensors).double().item() - total.item()) / total.item() < FLOAT32_ROUNDING


def test_norms_of_16_bit_and_non_contiguous_tensors():
    gen = torch.Generator().manual_seed(1)
    big = torch.randn(3000, 700, generator=gen)
    tensors = [big.bfloat16(), big.t(), big[:, ::3], torch.zeros(5)]
    expected = torch.stack([t.double().square().sum().sqrt() for t in tensors])
    got = tensor_norms(tensors)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=FLOAT32_ROUNDING, atol=0)
    assert tensor_norms([torch.ones(4, dtype=torch.float64)]).dtype == torch.float64
