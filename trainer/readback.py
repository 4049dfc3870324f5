"""What a step leaves on the device, and reading it back to the host.

The host does not wait for the device inside a step: a step's loss, MLM hits and noise-scale norms stay on the
device (`StepStats`) until the loop reads back the steps since its last read in one device-to-host copy
(`read_back`): every `log.every_steps` steps, at evaluations, checkpoints and the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trainer.noise_probe import PendingNorms


@dataclass
class StepStats:
    loss_sum: torch.Tensor  # on the device: the step's loss, its micro-batches' shares summed (read back in batches)
    mlm_correct: torch.Tensor  # on the device: masked tokens predicted right
    mlm_count: int
    lr: float  # the learning rate the step ran with
    sequences: int  # this rank
    tokens: int  # this rank
    grad_sq_norms: PendingNorms | None  # (|G_small|², |G_big|²) before any clip, on the device, if measured
    sequences_per_rank: list[float] = field(default_factory=list)  # every rank's sequences this step (the loop's)
    micro_batch_sizes: list[int] = field(default_factory=list)  # this rank's micro-batches' sequences


@dataclass
class Reading:
    """A step's numbers once read back to the host (`read_back`)."""

    step: int
    loss: float  # the step's: MLM per masked token plus NSP per sequence (this rank's)
    mlm_accuracy: float  # on the step's masked tokens
    grad_sq_norms: tuple[float, float] | None  # (|G_small|², |G_big|²) of a measured step
    lr: float  # the learning rate the step ran with


def read_back(pending: list[tuple[int, StepStats]]) -> list[Reading]:
    """The loss, MLM accuracy and noise-scale norms of the steps since the last read, in one device-to-host copy:
    the loop does not wait for the device between steps, only every `log.every_steps` steps, at evaluations and
    at the end."""
    parts = []
    for _, s in pending:
        parts.append(torch.stack([s.loss_sum.double(), s.mlm_correct.double()]))
        if s.grad_sq_norms is not None:
            parts.append(s.grad_sq_norms.values.to(s.loss_sum.device))
    values = torch.cat(parts).tolist()
    readings, at = [], 0
    for step, s in pending:
        (loss, correct), at = values[at : at + 2], at + 2
        norms = None
        if s.grad_sq_norms is not None:
            width = s.grad_sq_norms.values.numel()
            norms, at = s.grad_sq_norms.finish(values[at : at + width]), at + width
        readings.append(Reading(step, loss, correct / max(s.mlm_count, 1), norms, s.lr))
    return readings
