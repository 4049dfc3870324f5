"""The model's LayerNorm: `nn.LayerNorm` with the residual stream in half precision (`model.half_residual`), and
as operators torch.compile does not see into (`model.compile_model`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig


@torch.library.custom_op("trainer::layer_norm", mutates_args=())
def _layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], weight, bias, eps)
    return out, mean, rstd


@_layer_norm.register_fake
def _(x, weight, bias, eps):
    # The statistics' dtype as the kernels give it: fp32 for a half input on CUDA, and on the CPU where the input and
    # the weights differ in dtype (autocast's bf16 input, fp32 weights); else the input's
    half = x.dtype in (torch.float16, torch.bfloat16)
    stats = torch.float32 if half and (x.device.type == "cuda" or weight.dtype != x.dtype) else x.dtype
    rows = (*x.shape[:-1], 1)  # the kernel's outputs are contiguous whatever the input's strides
    return x.new_empty(x.shape), x.new_empty(rows, dtype=stats), x.new_empty(rows, dtype=stats)


@torch.library.custom_op("trainer::layer_norm_backward", mutates_args=())
def _layer_norm_backward(
    grad: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
    bias: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    dx, dweight, dbias = torch.ops.aten.native_layer_norm_backward(
        grad, x, [x.shape[-1]], mean, rstd, weight, bias, [True, True, True]
    )
    return dx, dweight, dbias


@_layer_norm_backward.register_fake
def _(grad, x, mean, rstd, weight, bias):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def _layer_norm_context(ctx, inputs, output) -> None:
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, output[1], output[2], weight, bias)


def _layer_norm_grad(ctx, grad, _mean_grad, _rstd_grad):
    x, mean, rstd, weight, bias = ctx.saved_tensors
    dx, dweight, dbias = _layer_norm_backward(grad.contiguous(), x, mean, rstd, weight, bias)
    return dx, dweight, dbias, None


_layer_norm.register_autograd(_layer_norm_grad, setup_context=_layer_norm_context)


def opaque_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """`F.layer_norm` over the last dimension as two operators torch.compile does not see into (forward, backward):
    a compiled model (`model.compile_model`) runs PyTorch's own LayerNorm kernels between its fused ones. With the
    per-token layers compiled (`model.compile`), Inductor's generated LayerNorm backward, fused with dropout and the
    residual, took 1.44 ms a call on an H200: 69 ms of a 446 ms step at micro-batch 256, where the eager step's
    element-wise work took 90 ms in all (BENCHMARKS.md)."""
    return _layer_norm(x, weight, bias, eps)[0]


class LayerNorm(nn.LayerNorm):
    """`nn.LayerNorm` (same parameters, same names) that, with `half_io` and under autocast, reads and writes the
    autocast's half dtype instead of autocast's fp32 (`model.half_residual`). The kernel still accumulates its
    statistics in fp32; the parameters stay fp32 and are cast for the call, so the kernel writes their gradients in
    the half dtype, cast back to fp32 (as a half-precision model's are). CUDA's autocast would run the kernel in
    fp32 (the CPU's does not), so the call is made with autocast off."""

    def __init__(self, hidden_size: int, eps: float, half_io: bool = False, opaque: bool = False):
        super().__init__(hidden_size, eps=eps)
        self.half_io = half_io
        self.opaque = opaque  # run as `opaque_layer_norm` (model.compile_model), in the dtypes the eager call takes

    def extra_repr(self) -> str:
        return super().extra_repr() + (", half_io=True" if self.half_io else "") + (", opaque=True" * self.opaque)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device.type
        autocast = device in ("cuda", "cpu") and torch.is_autocast_enabled(device)  # (a meta-device model: none)
        if not autocast:
            return opaque_layer_norm(x, self.weight, self.bias, self.eps) if self.opaque else super().forward(x)
        if not (self.half_io or self.opaque):
            return super().forward(x)
        weight, bias = self.weight, self.bias
        if self.half_io:
            dtype = torch.get_autocast_dtype(device)
            weight, bias = weight.to(dtype), bias.to(dtype)
        else:  # autocast's own choice: fp32 on CUDA; on the CPU the input's dtype (with fp32 weights)
            dtype = torch.float32 if device == "cuda" else x.dtype
        with torch.autocast(device, enabled=False):
            if self.opaque:
                return opaque_layer_norm(x.to(dtype), weight, bias, self.eps)
            return F.layer_norm(x.to(dtype), self.normalized_shape, weight, bias, self.eps)


def layer_norm(cfg: ModelConfig) -> LayerNorm:
    return LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, cfg.half_residual, opaque=cfg.compile_model)
