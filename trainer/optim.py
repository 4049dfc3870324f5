"""Optimizers for BERT pretraining: LAMB with NVIDIA apex `FusedLAMB` semantics, AdamW, and the apex backends.

`build_optimizer(model, cfg.optimizer)` is the entry point the trainer uses. `Lamb` is written with
`torch._foreach_*` multi-tensor ops so that one step costs a fixed number of batched kernels, not a Python
loop over the ~200 parameter tensors of BERT. Its norms (global gradient norm, trust ratios) come from
`trainer.norms`, exact to float32 rounding also for large tensors on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from trainer.config import OptimizerConfig
from trainer.errors import BackendUnavailableError
from trainer.norms import global_norm, tensor_norms

NO_DECAY_NAME_PARTS = ("bias", "LayerNorm")


def param_groups_for(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two param groups: names containing "bias" or "LayerNorm" get weight decay 0, the rest `weight_decay`."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if any(part in name for part in NO_DECAY_NAME_PARTS) else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


@dataclass
class _Bucket:
    """Parameters of one param group on one device and dtype, with their gradients and state."""

    group: dict
    params: list[Tensor] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    exp_avgs: list[Tensor] = field(default_factory=list)
    exp_avg_sqs: list[Tensor] = field(default_factory=list)
    steps: list[Tensor] = field(default_factory=list)

    def __getitem__(self, s: slice) -> _Bucket:
        return _Bucket(self.group, *(getattr(self, f)[s] for f in _LIST_FIELDS))


_LIST_FIELDS = ("params", "grads", "exp_avgs", "exp_avg_sqs", "steps")

# On the CPU a pass over a whole bucket streams every array from memory; a batch of tensors this small stays in
# cache across the passes of one batch. On a GPU one batch per bucket (fewest kernel launches) is best.
CPU_BATCH_NUMEL = 1 << 21


class Lamb(torch.optim.Optimizer):
    """LAMB with the semantics of NVIDIA apex `FusedLAMB` (adam_w_mode, bias correction, grad averaging).

    One step: (1) global gradient norm G over every parameter of every group, gradients divided by
    max(1, G / max_grad_norm) (`.grad` itself is left untouched); (2) Adam moments with bias correction;
    (3) u = m̂ / (sqrt(v̂) + eps) + weight_decay * w; (4) per tensor trust ratio r = ‖w‖ / ‖u‖ where
    weight_decay != 0 (or `use_nvlamb`) and both norms are non-zero, else 1; (5) w -= lr * r * u.
    Moments are kept in fp32, also for bf16/fp16 parameters.
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float = 1.0,
        use_nvlamb: bool = False,
    ):
        if lr < 0.0 or eps <= 0.0 or weight_decay < 0.0 or max_grad_norm <= 0.0:
            raise ValueError(
                f"Lamb: need lr >= 0, eps > 0, weight_decay >= 0, max_grad_norm > 0; "
                f"got lr={lr}, eps={eps}, weight_decay={weight_decay}, max_grad_norm={max_grad_norm}"
            )
        if not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"Lamb: betas must lie in [0, 1), got {betas}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, use_nvlamb=use_nvlamb)
        super().__init__(params, defaults)
        # Like apex, the pre-normalization threshold is one number for the whole model, not per group.
        self.max_grad_norm = max_grad_norm
        self._scratch_buffers: dict[tuple, Tensor] = {}

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Take one LAMB step over all parameters that have a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        buckets = self._buckets()
        if not buckets:
            return loss
        clip = self._clip_divisor(buckets)
        for bucket in buckets:
            torch._foreach_add_(bucket.steps, 1.0)
            max_numel = CPU_BATCH_NUMEL if bucket.params[0].device.type == "cpu" else None
            for s in _batches(bucket.params, max_numel):
                self._update(bucket[s], clip)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """Load as torch does, then keep each step count on its parameter's device and 16-bit moments in fp32."""
        super().load_state_dict(state_dict)
        # torch leaves `step` where it was saved (the CPU after map_location="cpu"), but the fused kernel reads it
        # on the parameter's device; and torch casts moments to the parameter dtype, so re-take them at fp32.
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for saved_id, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(saved_id)
            if saved is not None:
                self.state[p]["step"] = saved["step"].to(device=p.device, dtype=torch.float32)
                for key in ("exp_avg", "exp_avg_sq"):
                    self.state[p][key] = saved[key].to(device=p.device, dtype=_math_dtype(p))

    def _buckets(self) -> list[_Bucket]:
        """Group the parameters with a gradient by (param group, device, dtype), creating state on first use."""
        buckets: dict[tuple[int, torch.device, torch.dtype], _Bucket] = {}
        for i, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)  # the fused kernel reads it
                    # Contiguous like the scratch tensors, so all lists given to the fused kernel share one layout.
                    state["exp_avg"] = torch.zeros(p.shape, dtype=_math_dtype(p), device=p.device)
                    state["exp_avg_sq"] = torch.zeros_like(state["exp_avg"])
                b = buckets.setdefault((i, p.device, p.dtype), _Bucket(group))
                b.params.append(p)
                b.grads.append(p.grad)
                b.exp_avgs.append(state["exp_avg"])
                b.exp_avg_sqs.append(state["exp_avg_sq"])
                b.steps.append(state["step"])
        return list(buckets.values())

    def _clip_divisor(self, buckets: list[_Bucket]) -> Tensor:
        """max(1, G / max_grad_norm) as a 0-dim fp32 tensor on the first bucket's device, without a host sync."""
        norm = global_norm([g for b in buckets for g in b.grads])
        return torch.clamp(norm / self.max_grad_norm, min=1.0).float()  # the fused kernel reads fp32

    def _update(self, b: _Bucket, clip: Tensor) -> None:
        """Steps (2)-(5) for tensors of one group, device and dtype; their step counts already include this step."""
        group = b.group
        dtype = _math_dtype(b.params[0])
        weights = b.params if b.params[0].dtype == dtype else [p.to(dtype) for p in b.params]
        grads = self._scratch(weights, 0)
        torch._foreach_copy_(grads, b.grads)  # the kernel below divides by `clip` in place: not in `.grad`
        if weights[0].device.type == "cpu":  # one pass per tensor into kept memory; calls are cheap on the CPU
            updates = self._scratch(weights, 1)
            for u, w in zip(updates, weights, strict=True):
                torch.mul(w, group["weight_decay"], out=u)
        else:  # one kernel launch for all tensors
            updates = torch._foreach_mul(weights, group["weight_decay"])
        # torch's fused Adam kernel does the moments, bias correction and m̂ / (sqrt(v̂) + eps) in one pass and adds
        # -lr times that to its "params": given λ·w and lr = -1 it leaves u = m̂ / (sqrt(v̂) + eps) + λ·w.
        beta1, beta2 = group["betas"]
        torch._fused_adam_(
            updates,
            grads,
            b.exp_avgs,
            b.exp_avg_sqs,
            [],
            b.steps,
            lr=-1.0,
            beta1=beta1,
            beta2=beta2,
            weight_decay=0.0,
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
            grad_scale=clip.to(weights[0].device),
        )
        if group["weight_decay"] != 0.0 or group["use_nvlamb"]:
            torch._foreach_addcmul_(weights, updates, _trust_ratios(weights, updates), value=-group["lr"])
        else:
            torch._foreach_add_(weights, updates, alpha=-group["lr"])
        if weights is not b.params:
            torch._foreach_copy_(b.params, weights)

    def _scratch(self, like: list[Tensor], slot: int) -> list[Tensor]:
        """Temporaries shaped like `like`: on the CPU views of a buffer kept between steps, because fresh memory
        costs page faults there; on a GPU new tensors, which the caching allocator hands back to activations."""
        if like[0].device.type != "cpu":
            return [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in like]
        numels = [t.numel() for t in like]
        key = (like[0].device, like[0].dtype, slot)
        buffer = self._scratch_buffers.get(key)
        if buffer is None or buffer.numel() < sum(numels):
            buffer = self._scratch_buffers[key] = torch.empty(sum(numels), dtype=like[0].dtype, device=like[0].device)
        return [v.view_as(t) for v, t in zip(buffer[: sum(numels)].split(numels), like, strict=True)]


def _batches(tensors: list[Tensor], max_numel: int | None) -> list[slice]:
    """Consecutive ranges of `tensors` holding at most `max_numel` elements each (a larger tensor alone)."""
    if max_numel is None:
        return [slice(0, len(tensors))]
    ranges, start, numel = [], 0, 0
    for i, t in enumerate(tensors):
        if numel and numel + t.numel() > max_numel:
            ranges.append(slice(start, i))
            start, numel = i, 0
        numel += t.numel()
    ranges.append(slice(start, len(tensors)))
    return ranges


def _math_dtype(p: Tensor) -> torch.dtype:
    """fp32 for 16-bit parameters (their moments and update math), else the parameter's own dtype."""
    return torch.float32 if p.dtype in (torch.float16, torch.bfloat16) else p.dtype


def _trust_ratios(weights: list[Tensor], updates: list[Tensor]) -> list[Tensor]:
    """‖w‖ / ‖u‖ per tensor, 1 where either norm is zero; 0-dim tensors so nothing waits for the device."""
    w_norms, u_norms = tensor_norms(weights), tensor_norms(updates)
    ratios = torch.where((w_norms > 0) & (u_norms > 0), w_norms / u_norms, torch.ones_like(w_norms))
    return list(ratios.unbind())


def build_optimizer(model: torch.nn.Module, cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """The optimizer named by `cfg` over `model`, with no weight decay on bias and LayerNorm parameters."""
    groups = param_groups_for(model, cfg.weight_decay)
    betas = (cfg.beta1, cfg.beta2)
    if cfg.impl == "apex":
        return _build_apex(groups, cfg)
    if cfg.name == "lamb":
        return Lamb(
            groups,
            lr=cfg.lr,
            betas=betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            use_nvlamb=cfg.use_nvlamb,
        )
    on_cuda = all(p.is_cuda for g in groups for p in g["params"])
    fused = {"fused": True} if on_cuda else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay, **fused)


def apex_optimizers() -> tuple[type, type]:
    """apex's (FusedAdam, FusedLAMB); BackendUnavailableError where apex does not import."""
    try:
        from apex.optimizers import FusedAdam, FusedLAMB
    except ImportError as e:
        raise BackendUnavailableError(
            f"optimizer.impl: apex needs NVIDIA apex, which cannot be imported ({e}); install apex from source "
            "(https://github.com/NVIDIA/apex, with its CUDA extensions) or set optimizer.impl=torch"
        ) from e
    return FusedAdam, FusedLAMB


def _build_apex(groups: list[dict], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    FusedAdam, FusedLAMB = apex_optimizers()  # noqa: N806 (classes)
    betas = (cfg.beta1, cfg.beta2)
    if cfg.name == "lamb":
        return FusedLAMB(
            groups,
            lr=cfg.lr,
            betas=betas,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            bias_correction=True,
            adam_w_mode=True,
            max_grad_norm=cfg.max_grad_norm,
            use_nvlamb=cfg.use_nvlamb,
        )
    return FusedAdam(groups, lr=cfg.lr, betas=betas, eps=cfg.eps, weight_decay=cfg.weight_decay, adam_w_mode=True)
