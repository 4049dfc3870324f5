"""A trial launch of the fused kernels: where they cannot compile or launch, the trainer says so before any work."""

from __future__ import annotations

import torch

from trainer.fused.gelu import bias_gelu
from trainer.fused.norm import bias_dropout_add_norm


def try_kernels(device: torch.device) -> None:
    """Each kernel once, forward and backward, on a few values on `device`: compiling and launching fails here, not in
    a training step, where Triton cannot build its launcher (no C compiler) or compile for the GPU."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the run's draws stay as they are
        mm = torch.ones(2, 16, device=device, requires_grad=True)
        ones = torch.ones(16, device=device)
        out = bias_dropout_add_norm(mm, ones, torch.zeros(2, 16, device=device), ones, ones, 0.1, 1e-12, True)
        (out.sum() + bias_gelu(mm, ones).sum()).backward()
