"""Masked-LM accuracy on a fixed evaluation set: correct masked tokens / all masked tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from trainer.data.batch import ShapeBudget, pack_batch
from trainer.data.shards import PretrainingSamples
from trainer.distributed import DistEnv, all_reduce_sum
from trainer.model import BertForPreTraining, pretraining_loss
from trainer.precision import autocast


@dataclass(frozen=True)
class EvalResult:
    mlm_accuracy: float
    mlm_loss: float
    nsp_accuracy: float
    masked_tokens: int
    sequences: int


@torch.no_grad()
def evaluate(
    model: BertForPreTraining,
    samples: PretrainingSamples,
    batch_size: int,
    device: torch.device,
    env: DistEnv,
    autocast_dtype: torch.dtype | None = None,
    budget: ShapeBudget | None = None,
) -> EvalResult:
    """Evaluate on all of `samples`; each rank takes every world_size-th sample and the counts are summed. With
    `budget` (`model.static_shapes`), every batch padded to it."""
    was_training = model.training
    model.eval()
    mine = np.arange(env.rank, len(samples), env.world_size)
    count = 0
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # correct, loss sum, NSP correct: read once at the end
    for start in range(0, len(mine), batch_size):
        batch = pack_batch(samples, mine[start : start + batch_size], budget).to(device)
        with autocast(device, autocast_dtype):
            out = model(batch)
        loss = pretraining_loss(out, batch)
        nsp = (out.nsp_logits.argmax(-1) == batch.next_sentence_labels).sum()
        sums += torch.stack([loss.mlm_correct, loss.mlm * loss.mlm_count, nsp]).double()
        count += loss.mlm_count
    correct, loss_sum, nsp_correct = sums.tolist()
    correct, count, loss_sum, nsp_correct = all_reduce_sum([correct, count, loss_sum, nsp_correct], device, env)
    model.train(was_training)
    return EvalResult(
        mlm_accuracy=correct / max(count, 1),
        mlm_loss=loss_sum / max(count, 1),
        nsp_accuracy=nsp_correct / max(len(samples), 1),
        masked_tokens=int(count),
        sequences=len(samples),
    )
