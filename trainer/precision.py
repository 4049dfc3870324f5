"""Numeric precision: which dtype a run computes in (`precision.dtype`), and the autocast region around its passes.

Weights, gradients and optimizer state stay float32; a half-precision run casts inside `autocast` (PyTorch's
automatic mixed precision). Float32 runs enter no autocast region at all, so the same code runs on any device
PyTorch has, the meta device included (where `torch.autocast` refuses the device type).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from trainer.config import TrainerConfig
from trainer.errors import ConfigError


def resolve_autocast(cfg: TrainerConfig, device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes in; None means float32 (no autocast). `auto`: bf16 on a GPU, float32 elsewhere."""
    dtype = cfg.precision.dtype
    if dtype == "auto":
        dtype = "bf16" if device.type == "cuda" else "fp32"
    if dtype == "fp16" and device.type != "cuda":
        raise ConfigError("precision.dtype: fp16 needs a CUDA device (use fp32 or bf16 on CPU)")
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


def autocast(device: torch.device, dtype: torch.dtype | None):
    """The autocast region of a forward pass in `dtype` on `device`; for float32 (None), no region."""
    return nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


def precision_name(autocast: torch.dtype | None) -> str:
    """fp32, bf16 or fp16: the training precision, as the start-up line and the refusals say it."""
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(autocast, "fp32")
