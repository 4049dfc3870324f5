"""A trial launch of the fused kernels: where they cannot compile or launch, the trainer says so before any work."""

from __future__ import annotations

import torch

from trainer.config import ModelConfig
from trainer.fused.gelu import bias_gelu
from trainer.fused.norm import bias_dropout_add_norm


def try_kernels(device: torch.device, cfg: ModelConfig, autocast: torch.dtype | None) -> None:
    """The kernels `cfg` switches on, forward and backward, on two rows of the model's widths in the dtypes training
    gives them (the product in autocast's dtype, the residual stream in it too with `model.half_residual`), waiting for
    the device: Triton compiles what training will run and fails here, not in a training step, where it cannot build
    its launcher (no C compiler) or compile for the GPU. The run's random state is left as it was."""
    product = autocast or torch.float32
    stream = product if cfg.half_residual else torch.float32
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if cfg.fused_norm:
            mm = torch.ones(2, cfg.hidden_size, device=device, dtype=product, requires_grad=True)
            ones = torch.ones(cfg.hidden_size, device=device)
            residual = torch.zeros(2, cfg.hidden_size, device=device, dtype=stream)
            bias_dropout_add_norm(mm, ones, residual, ones, ones, 0.1, cfg.layer_norm_eps, True).sum().backward()
        if cfg.fused_gelu:
            mm = torch.ones(2, cfg.intermediate_size, device=device, dtype=product, requires_grad=True)
            bias_gelu(mm, torch.ones(cfg.intermediate_size, device=device)).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # a kernel's fault surfaces here
