"""Collects, during one optimizer step, the gradient norms that `trainer.noise_scale` turns into B_simple.

The clipping code calls it where the gradients pass anyway, so it costs no extra pass over communication:
- with DDP, per gradient bucket (the whole gradient for `before_allreduce`): this rank's local norm and clip
  coefficient before the all-reduce, and the norm of the all-reduced bucket after it;
- with gradient accumulation (on any number of processes), a hook on every parameter sees each micro-batch's
  gradient before it is accumulated (one squared norm per tensor and micro-batch); the small batch is then a
  micro-batch and the big one this rank's accumulated batch, both before any clip and before the all-reduce,
  so the measurement is exact under every clipping strategy and any number of ranks.
Norms are divided by the loss scale (fp16) and by the micro-batch's loss weight (its MLM loss's: its share of the
step's masked tokens; MLM's gradient dominates, and the weight is exact when every micro-batch has the same masked
tokens a sequence), so they are in the units of a plain mean gradient. At the end of the step one all-reduce of a
few scalars (4 per bucket, or 3 when accumulating) sums the ranks' numbers; they stay on the device (`PendingNorms`)
until the trainer reads them back with the step's loss, so a measured step does not make the host wait for the
device either.
The probe measures only the steps it is switched on for (`measure`, every `log.noise_scale_every` steps): on the
others it records nothing, its per-parameter hooks are removed, and the host reads nothing back.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainer.noise_scale import BucketSums, two_batch_norms
from trainer.norms import squared_norm


@dataclass
class PendingNorms:
    """A measured step's norms, still on the device: `values` is read back with the step's loss (one copy for all
    the steps since the last read), and `finish` turns the numbers read into (|G_small|², |G_big|²), or None."""

    values: torch.Tensor  # float64, 1-D
    finish: Callable[[list[float]], tuple[float, float] | None]

    def read(self) -> tuple[float, float] | None:
        """Read back now (the host waits for the device)."""
        return self.finish(self.values.tolist())


class NormProbe:
    """Per-step records of local and averaged gradient norms; `take()` returns (|G_small|², |G_big|²)."""

    def __init__(self, world_size: int, process_group=None, device: torch.device | str = "cpu"):
        self.world_size = world_size
        self.process_group = process_group
        self.device = device  # where the scalars of the all-reduce go (the backend's device: cuda for NCCL)
        self.watching = False  # micro-batches are the small batches (gradient accumulation)
        # Per bucket index, as the hooks saw them: the work on them waits for `take`, a few operations for all the
        # buckets together instead of several in each bucket's hook (on a GPU each is a launch the host pays for)
        self.local: dict[int, tuple[torch.Tensor, object]] = {}  # this rank's (loss-scaled norm, clip coefficient)
        self.mean: dict[int, torch.Tensor] = {}  # loss-scaled norm of the all-reduced bucket
        self.scale: object = 1.0  # the loss scale of this step's records (one for all of them)
        self.micro_sq: list[torch.Tensor] = []  # one process: |g_i|² of each micro-batch
        self.big_sq: torch.Tensor | None = None  # one process: |accumulated gradient|² before any clip
        self._micro_grads: list[torch.Tensor] = []  # this micro-batch's incoming gradients, until it ends
        self.active = True  # this step is measured (`measure`)
        self._watched: list[torch.nn.Parameter] = []
        self._hooks: list = []  # the per-parameter hooks' handles while the step is measured

    def measure(self, active: bool) -> None:
        """Measure the coming step or not; an unmeasured step runs no hook of the probe's and records nothing."""
        self.active = active
        if self.watching and active and not self._hooks:
            self._hooks = [p.register_hook(self._add_micro) for p in self._watched]
        elif not active and self._hooks:
            for handle in self._hooks:
                handle.remove()
            self._hooks = []

    def record_local(self, index: int, norm: torch.Tensor, coef, scale) -> None:
        """This rank's bucket `index` before the all-reduce: its norm (loss-scaled) and its clip coefficient (a tensor,
        or a number where nothing was clipped)."""
        self.local[index] = (norm, coef)
        self.scale = scale

    def record_mean(self, index: int, norm: torch.Tensor, scale) -> None:
        """Bucket `index` after the all-reduce (the mean of the ranks' possibly clipped buckets)."""
        self.mean[index] = norm
        self.scale = scale

    def _local_rows(self, indices: list[int]) -> torch.Tensor:
        """[c, c², c²M, M] of each bucket in `indices` (M = |this rank's bucket|², unscaled), float64 [n, 4]."""
        norms = torch.stack([self.local[i][0] for i in indices]).double()
        local_sq = (norms / self.scale) ** 2
        coefs = [self.local[i][1] for i in indices]
        if not any(isinstance(c, torch.Tensor) for c in coefs) and len(set(coefs)) == 1:  # nothing clipped
            coef = local_sq.new_full(local_sq.shape, float(coefs[0]))  # filled on the device: no copy to wait for
        else:
            coef = torch.stack([c if isinstance(c, torch.Tensor) else local_sq.new_full((), float(c)) for c in coefs])
            coef = coef.double().reshape(-1)
        coef_sq = coef * coef
        return torch.stack([coef, coef_sq, coef_sq * local_sq, local_sq], dim=1)

    def record_big(self, norm: torch.Tensor, scale) -> None:
        """One process: the accumulated gradient's norm (loss-scaled) before any clip."""
        self.big_sq = (norm.double() / scale) ** 2

    def watch_micro_batches(self, params: list[torch.nn.Parameter]) -> None:
        """Sum each parameter's incoming gradient norm² per backward (one process, gradient accumulation)."""
        self.watching = True
        self._watched = list(params)
        self.measure(self.active)

    def _add_micro(self, grad: torch.Tensor) -> None:
        # Kept, not reduced here: one norm launch per parameter cost a 340 M-parameter BERT-large 70 % of its step
        # time on an H100 (bench/noise_scale_overhead.py); one foreach norm over all of them at the end is cheap.
        self._micro_grads.append(grad)

    @contextmanager
    def micro_batch(self, weight: float, scale):
        """Around one micro-batch's backward whose loss was multiplied by `weight` (and the loss scale)."""
        self._micro_grads = []
        yield
        if self._micro_grads and weight > 0:
            sq = squared_norm(self._micro_grads)
            self.micro_sq.append(sq.double() / (weight * weight) / (scale * scale))
        self._micro_grads = []

    def take(self) -> PendingNorms | None:
        """This step's norms (|G_small|², |G_big|²), to read back later, or None when not measurable; clears the
        records. Nothing here reads a device value: what decides is known on the host. Call it before the loss
        scaler's `update()`: under fp16 the recorded scale is the scaler's own tensor, which `update()` changes in
        place (`trainer.train.train_step` takes the norms right after `before_step`)."""
        if self.watching:
            return self._take_micro()
        if not self.local:
            return None
        indices = sorted(self.local)
        sums = self._local_rows(indices)
        if self.world_size > 1:
            dist.all_reduce(sums, group=self.process_group)
        mean_sq = ((torch.stack([self.mean[i] for i in indices]).double() / self.scale) ** 2).to(sums.device)
        self.local.clear()
        self.mean.clear()
        world, count = self.world_size, len(indices)

        def finish(values: list[float]) -> tuple[float, float] | None:
            if world < 2:  # one rank without accumulation: no smaller batch than its own to compare with
                return None
            rows = [values[4 * i : 4 * i + 4] for i in range(count)]
            buckets = [BucketSums(*row, mean_sq=m) for row, m in zip(rows, values[4 * count :], strict=True)]
            return _finite(two_batch_norms(buckets, world))

        return PendingNorms(torch.cat([sums.reshape(-1), mean_sq]), finish)

    def _take_micro(self) -> PendingNorms:
        """Micro-batch (small) and this rank's accumulated batch (big), averaged over ranks. Every rank joins
        the all-reduce, also one that has nothing to report (its `valid` is 0 and the step is skipped)."""
        if self.big_sq is not None:  # one process: the accumulated gradient's norm
            big_sq = self.big_sq
        elif self.local:  # DDP: the sum over buckets of this rank's local norms before the all-reduce
            big_sq = ((torch.stack([norm for norm, _ in self.local.values()]).double() / self.scale) ** 2).sum()
        else:
            big_sq = None
        if big_sq is not None and len(self.micro_sq) >= 2:
            micro = torch.stack(self.micro_sq).to(big_sq.device)
            sums = torch.stack(
                [micro.mean(), big_sq.double(), torch.ones((), dtype=torch.float64, device=big_sq.device)]
            )
        else:
            sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # made there: no copy to wait for
        self.micro_sq.clear()
        self.local.clear()
        self.mean.clear()
        self.big_sq = None
        if self.world_size > 1:
            sums = sums.to(self.device)
            dist.all_reduce(sums, group=self.process_group)
        world = self.world_size

        def finish(values: list[float]) -> tuple[float, float] | None:
            if values[2] != world:
                return None
            return _finite((values[0] / world, values[1] / world))

        return PendingNorms(sums, finish)


def _finite(pair: tuple[float, float]) -> tuple[float, float] | None:
    """None when an fp16 overflow (inf/nan) reached a norm: the scaler skips that step, so do we."""
    return pair if all(x == x and abs(x) != float("inf") for x in pair) else None
