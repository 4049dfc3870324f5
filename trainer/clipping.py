"""Gradient clipping strategies, relative to the data-parallel all-reduce.

- `none`: no clipping by the trainer.
- `after_allreduce`: the reference; clip the averaged gradient by its global norm after synchronization.
  With LAMB this *is* LAMB's own global-norm pre-normalization, so the trainer does not clip a second time:
  LAMB's `max_grad_norm` is set to `clipping.max_norm` instead (see `effective_optimizer_config`).

Thresholds are in unscaled gradient units: under fp16 loss scaling the gradients are unscaled first.
"""

from __future__ import annotations

import torch

from trainer.config import ClippingConfig, OptimizerConfig
from trainer.distributed import DistEnv
from trainer.errors import ConfigError


def effective_optimizer_config(optimizer: OptimizerConfig, clipping: ClippingConfig) -> OptimizerConfig:
    """With LAMB and after_allreduce, LAMB's pre-normalization is the clip: one threshold, applied once."""
    if optimizer.name == "lamb" and clipping.strategy == "after_allreduce":
        return optimizer.model_copy(update={"max_grad_norm": clipping.max_norm})
    return optimizer


class GradientClipper:
    """Applies `clipping.strategy` between backward and the optimizer step."""

    def __init__(self, cfg: ClippingConfig, optimizer_name: str, model, ddp, scaler: torch.amp.GradScaler,
                 env: DistEnv):
        if cfg.strategy in ("before_allreduce", "bucketwise"):
            raise ConfigError(f"clipping.strategy: {cfg.strategy} is not implemented yet; use none or after_allreduce")
        self.cfg = cfg
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.scaler = scaler
        # LAMB clips inside its step (effective_optimizer_config); clipping again here would clip twice.
        self.clip_here = cfg.strategy == "after_allreduce" and optimizer_name != "lamb"

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.clip_here:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_norm)
