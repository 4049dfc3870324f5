"""Gradient clipping strategies, relative to the data-parallel all-reduce (this docstring is the specification).

All thresholds are `clipping.max_norm` in unscaled gradient units; the clip coefficient is the one of
`torch.nn.utils.clip_grad_norm_`: min(1, threshold / (norm + 1e-6)). Norms come from `trainer.norms`
(exact to float32 rounding also for multi-million-element buckets on the CPU, unlike torch's own).

- `none`: no clip of its own. LAMB still pre-normalizes the averaged gradient at `optimizer.max_grad_norm` (apex
  FusedLAMB semantics), so with LAMB `none` clips like `after_allreduce` with max_norm = optimizer.max_grad_norm.
- `after_allreduce` (the reference): DDP averages, then the averaged gradient is clipped by its global norm.
  With LAMB this *is* LAMB's own pre-normalization, so the trainer does not clip a second time: LAMB's
  `max_grad_norm` is set to `clipping.max_norm` instead (`effective_optimizer_config`).
- `before_allreduce`: each rank clips its whole local gradient by its global norm, then gradients are
  averaged. That needs the full local gradient first, so DDP's overlapped all-reduce is switched off (every
  micro-batch runs under `no_sync`) and one coalesced all-reduce runs after backward.
- `bucketwise`: a DDP communication hook clips each gradient bucket on each rank to
  max_norm / sqrt(number of buckets) as soon as the bucket is ready and launches its all-reduce
  asynchronously, so communication overlaps the rest of backward. If every bucket is at its threshold the
  whole local gradient has norm max_norm, which is what makes the per-bucket threshold comparable.
  DDP builds its buckets anew after the first synchronized iteration, so the number of buckets is only known
  from the second one on: the first two synchronized iterations wait for the last bucket, then clip and
  launch all buckets (no overlap); from the third on, each bucket goes as soon as it is ready. A change of
  the bucket count after that is detected at the last bucket and the next iteration waits again. A checkpoint
  keeps the final buckets' parameters, and a resumed run's first synchronized iteration (DDP's first buckets
  again) clips by them: it goes on with the losses of a run never stopped.
  How many buckets there are decides what this clips: with one (a model whose gradient fits
  `clipping.bucket_cap_mb`) it clips the whole local gradient, as `before_allreduce` does. The trainer's start line
  names the count (`ddp_bucket_count`).

With LAMB, `before_allreduce` and `bucketwise` are local clips before the average; LAMB's global
pre-normalization after the average still applies (apex FusedLAMB semantics, as in the MLPerf submissions).
With one process there is no all-reduce and no buckets: `before_allreduce` and `bucketwise` clip the whole
gradient by max_norm, like `after_allreduce`.

Under fp16 loss scaling, gradients seen before the optimizer step are multiplied by the loss scale S; the
thresholds are multiplied by S so they stay in unscaled units, and a non-finite norm leaves the bucket
untouched so that the scaler still sees the overflow and skips the step.

With a `NormProbe` (the gradient noise scale, `log.noise_scale`), the same places record each rank's norm and
clip coefficient before the all-reduce and the all-reduced norm after it; under `none` and `after_allreduce`
a communication hook doing DDP's plain average (`measured_allreduce_hook`) takes over to see the buckets.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at runtime.

import math
import time
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from trainer.config import ClippingConfig, OptimizerConfig
from trainer.distributed import DistEnv
from trainer.noise_probe import NormProbe
from trainer.norms import global_norm

EPS = 1e-6  # as in torch.nn.utils.clip_grad_norm_


def effective_optimizer_config(optimizer: OptimizerConfig, clipping: ClippingConfig) -> OptimizerConfig:
    """With LAMB and after_allreduce, LAMB's pre-normalization is the clip: one threshold, applied once."""
    if optimizer.name == "lamb" and clipping.strategy == "after_allreduce":
        return optimizer.model_copy(update={"max_grad_norm": clipping.max_norm})
    return optimizer


def clip_coefficient(norm: torch.Tensor, threshold) -> torch.Tensor:
    """min(1, threshold / (norm + eps)); exactly 1 where the norm is not finite (an fp16 overflow must stay visible),
    however small the threshold (if not 0 in the norm's precision): a non-finite norm is read as -eps, so the
    quotient is threshold / 0 = inf, clamped to 1. Four small kernels, run once per DDP bucket."""
    return (threshold / (torch.nan_to_num(norm, nan=-EPS, posinf=-EPS, neginf=-EPS) + EPS)).clamp_(max=1.0)


# --------------------------------------------------------------------------- the bucket-wise DDP hook


@dataclass
class BucketClipState:
    """State of `bucketwise_clip_hook`; one per DDP model."""

    max_norm: float | None  # None: no clip, only the noise-scale measurement (`measured_allreduce_hook`)
    world_size: int
    loss_scale: object  # callable returning the current loss scale (tensor or float)
    probe: NormProbe | None = None  # records the norms of the gradient noise scale
    process_group: object = None
    num_buckets: int | None = None  # known once DDP's bucket layout is final
    synced_iterations: int = 0
    seen: int = 0
    pending: list = field(default_factory=list)
    timeline: list | None = None  # (event, bucket index, perf_counter_ns) when recording
    bucket_params: list | None = None  # parameters of each bucket of the last iteration, when recording
    param_index: dict[int, int] = field(default_factory=dict)  # id(parameter) -> its place among the trainable ones
    layout: list[list[int]] | None = None  # the final buckets' parameters (by place), once known: saved with a run
    resumed_layout: list[list[int]] | None = None  # a resumed run's saved layout, which its first iteration clips by


def _clip_and_launch(state: BucketClipState, bucket: dist.GradBucket, num_buckets: int,
                     clip: bool = True) -> torch.futures.Future:  # fmt: skip
    buf, index, scale = bucket.buffer(), bucket.index(), state.loss_scale()
    probe = state.probe if state.probe is not None and state.probe.active else None
    coef = 1.0
    if state.max_norm is not None or probe is not None:
        norm = global_norm([buf])
    if state.max_norm is not None and clip:
        coef = clip_coefficient(norm, state.max_norm / math.sqrt(num_buckets) * scale)
        buf.mul_((coef / state.world_size).to(buf.dtype))  # clip and average in one pass over the bucket
    else:
        buf.div_(state.world_size)
    if probe is not None:
        probe.record_local(index, norm, coef, scale)
    if state.timeline is not None:
        state.timeline.append(("allreduce", index, time.perf_counter_ns()))
    work = dist.all_reduce(buf, group=state.process_group, async_op=True)

    def reduced(fut: torch.futures.Future) -> torch.Tensor:
        out = fut.value()[0]
        if probe is not None:
            probe.record_mean(index, global_norm([out]), scale)
        return out

    return work.get_future().then(reduced)


def measured_allreduce_hook(state: BucketClipState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: DDP's plain average, recording the bucket's norms for the noise scale."""
    return _clip_and_launch(state, bucket, 1)


def bucketwise_clip_hook(state: BucketClipState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: clip this bucket on this rank, then all-reduce it asynchronously."""
    state.seen += 1
    if state.bucket_params is not None:
        if state.seen == 1:
            state.bucket_params.clear()
        state.bucket_params.append(list(bucket.parameters()))
    if state.num_buckets is None:  # layout not final yet: wait for the last bucket to know the count
        buffer = bucket.buffer()  # a CUDA future syncs the streams: DDP must not read the bucket before NCCL wrote it
        fut: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)
        state.pending.append((bucket, fut))
        if bucket.is_last():
            _launch_pending(state)
        return fut
    result = _clip_and_launch(state, bucket, state.num_buckets)
    if bucket.is_last():
        if state.seen != state.num_buckets:  # DDP rebuilt its buckets: wait again next iteration
            state.num_buckets = None
        state.seen = 0
    return result


def _launch_pending(state: BucketClipState) -> None:
    count, pending = state.seen, state.pending
    state.pending, state.seen = [], 0
    state.synced_iterations += 1
    if state.synced_iterations == 1 and state.resumed_layout is not None and state.max_norm is not None:
        # A resumed run's first iteration has DDP's first buckets, not the rebuilt ones the uninterrupted run
        # clipped by at this step (every bucket is here): it clips and measures by the saved layout instead.
        _clip_by_layout(state, pending, state.resumed_layout)
    else:
        for bucket, fut in pending:
            _clip_and_launch(state, bucket, count).then(lambda f, target=fut: target.set_result(f.value()))
    if state.synced_iterations >= 2:  # DDP rebuilds buckets once, after the first synchronized iteration
        state.num_buckets = count
        ordered = sorted((bucket for bucket, _ in pending), key=lambda bucket: bucket.index())
        state.layout = [[state.param_index[id(p)] for p in bucket.parameters()] for bucket in ordered]


def _clip_by_layout(state: BucketClipState, pending: list, layout: list[list[int]]) -> None:
    """Clip and average this rank's gradient in `pending` (every bucket of the iteration, with its future) as the
    buckets of `layout` would be, through the buckets' views of their gradients: each group flattened in its bucket's
    order, as `_clip_and_launch` sees a bucket (the same norm, coefficient and product, to the bit), and the noise
    scale's norms recorded by group. The buckets' all-reduces are waited for here (one iteration of a resumed run)."""
    grads = {state.param_index[id(p)]: g for bucket, _ in pending
             for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True)}  # fmt: skip
    groups = [[grads[i] for i in group] for group in layout]
    scale = state.loss_scale()
    probe = state.probe if state.probe is not None and state.probe.active else None
    threshold = state.max_norm / math.sqrt(len(layout)) * scale
    for index, views in enumerate(groups):
        flat = torch.cat([v.reshape(-1) for v in views])
        norm = global_norm([flat])
        coef = clip_coefficient(norm, threshold)
        torch._foreach_mul_(views, (coef / state.world_size).to(flat.dtype))
        if probe is not None:
            probe.record_local(index, norm, coef, scale)
    for bucket, _ in pending:
        dist.all_reduce(bucket.buffer(), group=state.process_group)
    if probe is not None:
        for index, views in enumerate(groups):
            probe.record_mean(index, global_norm([torch.cat([v.reshape(-1) for v in views])]), scale)
    for bucket, fut in pending:
        fut.set_result(bucket.buffer())


def ddp_bucket_count(params: Iterable[torch.Tensor], bucket_bytes_cap: int) -> int:
    """How many gradient buckets DDP makes of `params` (a model's trainable parameters, in registration order) with
    buckets of `bucket_bytes_cap` bytes (a DDP model's `bucket_bytes_cap`: `clipping.bucket_cap_mb` MiB): DDP's own
    assignment (`torch.distributed._compute_bucket_assignment_by_size`: a bucket closes once it holds the cap), over
    the parameters in the order DDP expects their gradients, the reverse of registration. DDP rebuilds its buckets
    after the first iteration in the order the gradients actually became ready, which differs within a layer (a
    LayerNorm's bias before its weight, an attention's value before its key): the count `bucketwise_clip_hook` finds
    can then differ by a bucket or two (at a cap of 1 KB on the tests' tiny BERTs; from 5 KB up the two agreed)."""
    trainable = [p for p in params if p.requires_grad]
    if not trainable:
        return 0
    order = list(reversed(trainable))
    buckets, _ = dist._compute_bucket_assignment_by_size(order, [bucket_bytes_cap], [False] * len(order))
    return len(buckets)


# --------------------------------------------------------------------------- the strategies


class GradientClipper:
    """Applies `clipping.strategy` around backward and before the optimizer step."""

    def __init__(
        self,
        cfg: ClippingConfig,
        optimizer_name: str,
        model: torch.nn.Module,
        ddp,
        scaler,
        env: DistEnv,
        probe: NormProbe | None = None,
    ):
        self.cfg = cfg
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.ddp = ddp
        self.scaler = scaler
        self.env = env
        self.probe = probe  # when set, the gradient norms of the noise scale are recorded before any clip
        self.hook_state: BucketClipState | None = None
        # DDP's gradient buckets, where they decide what the strategy clips (bucketwise) or tell it from bucketwise
        # (before_allreduce): `ddp_bucket_count`; None without DDP or for the other strategies
        by_bucket = ddp is not None and cfg.strategy in ("bucketwise", "before_allreduce")
        self.ddp_buckets = ddp_bucket_count(self.params, ddp.bucket_bytes_cap) if by_bucket else None
        self.timeline: list | None = None  # set to a list to record when the all-reduce starts
        # LAMB clips inside its step (effective_optimizer_config); clipping again here would clip twice.
        self.after_allreduce = cfg.strategy == "after_allreduce" and optimizer_name != "lamb"
        self.local_clip = cfg.strategy == "before_allreduce" or (cfg.strategy == "bucketwise" and ddp is None)
        if ddp is not None and cfg.strategy == "bucketwise":
            self.hook_state = BucketClipState(cfg.max_norm, env.world_size, self.loss_scale, probe,
                                              param_index={id(p): i for i, p in enumerate(self.params)})  # fmt: skip
            ddp.register_comm_hook(self.hook_state, bucketwise_clip_hook)
        elif ddp is not None and probe is not None and not self.local_clip:
            self.hook_state = BucketClipState(None, env.world_size, self.loss_scale, probe)
            ddp.register_comm_hook(self.hook_state, measured_allreduce_hook)

    def bucket_layout(self) -> list[list[int]] | None:
        """Bucket-wise clipping's final DDP buckets (each a list of the trainable parameters' places), once known: a
        checkpoint keeps them for `resume_layout`. None otherwise."""
        return self.hook_state.layout if self.hook_state is not None and self.hook_state.max_norm is not None else None

    def resume_layout(self, layout: list[list[int]]) -> None:
        """The layout of the run this one resumes, which its first synchronized iteration clips by (DDP's buckets
        are its first ones there, and the uninterrupted run's were rebuilt); a layout of another model is ignored."""
        places = sorted(i for group in layout for i in group)
        if self.hook_state is not None and places == list(range(len(self.params))):
            self.hook_state.resumed_layout = [list(group) for group in layout]

    def loss_scale(self):
        """The current loss scale without a host sync (1 without fp16 scaling); before the scaler's first `scale()`
        (the first micro-batch of a run) the initial scale, which that call will use."""
        if not self.scaler.is_enabled():
            return 1.0
        scale = self.scaler._get_scale_async()
        return scale if scale is not None else self.scaler._init_scale

    def backward_context(self, last_micro_batch: bool):
        """DDP synchronizes on the last micro-batch, except for before_allreduce, which reduces by itself."""
        if self.ddp is None or (last_micro_batch and not (self.local_clip and self.env.enabled)):
            return nullcontext()
        return self.ddp.no_sync()

    def before_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        if not grads:
            return
        scale = self.loss_scale()
        probe = self.probe if self.probe is not None and self.probe.active else None  # None: step not measured
        one_process_probe = probe if not self.env.enabled else None
        if self.local_clip:
            norm = global_norm(grads)
            coef = clip_coefficient(norm, self.cfg.max_norm * scale)
            if one_process_probe is not None:
                one_process_probe.record_big(norm, scale)
            elif probe is not None:
                probe.record_local(0, norm, coef, scale)
            torch._foreach_mul_(grads, coef)
            if self.env.enabled:
                self._all_reduce_mean(grads)
                if probe is not None:
                    probe.record_mean(0, global_norm(grads), scale)
            return
        if one_process_probe is not None:
            one_process_probe.record_big(global_norm(grads), scale)
        if self.after_allreduce:
            self.scaler.unscale_(optimizer)
            grads = [p.grad for p in self.params if p.grad is not None]  # unscaled now
            torch._foreach_mul_(grads, clip_coefficient(global_norm(grads), self.cfg.max_norm))

    def _all_reduce_mean(self, grads: list[torch.Tensor]) -> None:
        if self.timeline is not None:
            self.timeline.append(("allreduce", -1, time.perf_counter_ns()))
        flat = torch._utils._flatten_dense_tensors(grads)
        flat.div_(self.env.world_size)
        dist.all_reduce(flat)
        for g, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(reduced)
