"""The MLPerf BERT learning-rate schedule: linear warmup, then polynomial decay to an end learning rate.

Step indices count optimizer steps from 0: the first `optimizer.step()` runs with the learning rate of step 0,
as in the MLPerf reference, where the global step is read before the update increments it. With
`start_warmup_step` S = 0 the very first update therefore has learning rate 0; MLPerf runs use S < 0 to
start warmup part of the way up.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR

from trainer.config import ScheduleConfig


def mlperf_lr(
    step: int,
    base_lr: float,
    warmup_steps: int,
    start_warmup_step: int,
    total_steps: int,
    power: float,
    end_lr: float,
) -> float:
    """Learning rate of optimizer step `step` (0 = first update).

    If step - start_warmup_step < warmup_steps: base_lr * (step - start_warmup_step) / warmup_steps, never below 0
    (a step before a positive start offset gets 0, not a negative rate). Otherwise
    (base_lr - end_lr) * (1 - min(step / total_steps, 1)) ** power + end_lr. warmup_steps = 0 means no warmup.
    """
    warmup_progress = step - start_warmup_step
    if warmup_steps > 0 and warmup_progress < warmup_steps:
        return base_lr * max(warmup_progress, 0) / warmup_steps
    decay_progress = min(step / total_steps, 1.0)
    return (base_lr - end_lr) * (1.0 - decay_progress) ** power + end_lr


def idle_steps(cfg: ScheduleConfig, total_steps: int, run_steps: int) -> int:
    """How many of a run's first `run_steps` optimizer steps come after the schedule has reached a learning rate of 0
    for good: past the decay horizon `total_steps` and the warmup, the rate stays at `cfg.end_lr` (at the base rate
    with power 0), so with end_lr 0 these steps change no weight. 0 when there are none."""
    first = max(total_steps, cfg.start_warmup_step + cfg.warmup_steps) if cfg.warmup_steps else total_steps
    if first >= run_steps:
        return 0
    rate = mlperf_lr(first, 1.0, cfg.warmup_steps, cfg.start_warmup_step, total_steps, cfg.power, cfg.end_lr)
    return run_steps - first if rate == 0 else 0


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, base_lr: float, total_steps: int
) -> LambdaLR:
    """A LambdaLR that sets lr = mlperf_lr(s, base_lr, ...) before optimizer step s (s = 0 first).

    Call `scheduler.step()` after every `optimizer.step()`. The param groups' lr must be `base_lr` when the
    scheduler is built (the multiplier is relative to it). The decay horizon is `cfg.total_steps`, or
    `total_steps` when that is None.
    """
    horizon = cfg.total_steps if cfg.total_steps is not None else total_steps
    if horizon < 1:
        raise ValueError(f"schedule: total_steps must be >= 1, got {horizon}")

    def multiplier(step: int) -> float:
        lr = mlperf_lr(step, base_lr, cfg.warmup_steps, cfg.start_warmup_step, horizon, cfg.power, cfg.end_lr)
        return lr / base_lr

    return LambdaLR(optimizer, multiplier)
