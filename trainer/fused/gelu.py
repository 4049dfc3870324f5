"""The feed-forward layer's bias and GELU in one kernel each way (`model.fused_gelu`).

Eager PyTorch adds the bias inside the matrix product and runs GELU (exact, with erf) as a kernel of its own; the
backward runs GELU's backward, which writes the pre-activation's gradient, and a reduction that reads it again for
the bias's gradient: at BERT-large's 4,096 columns those are [tokens, 4,096] passes, the largest element-wise
tensors of the step (on an H200 at batch 128, GELU's backward took 5.7 ms of a 171 ms step).

Here the forward kernel reads the matrix product (without its bias), adds the bias and writes GELU of it; the
backward reads the gradient and the same product, writes the product's gradient and sums the bias's over the rows
each program covers (summed across programs by PyTorch, in fp32): one pass fewer over the widest activations.
Both compute in fp32. Runs where `trainer.fused.kernels_run` says (see the package's doc).
"""

from __future__ import annotations

import torch

from trainer.fused import COMPILE_OPTIONS, interpreting, launch, triton

if triton is not None:
    import triton.language as tl

    @triton.jit(do_not_specialize=["rows"])  # rows: any count, one compiled kernel
    def _forward_kernel(MM, BIAS, OUT, rows, cols, ROWS: tl.constexpr, COLS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # rows on the grid's first axis (2^31 - 1)
        col = tl.program_id(1) * COLS + tl.arange(0, COLS)
        valid = (row < rows)[:, None] & (col < cols)[None, :]
        at = row[:, None] * cols + col[None, :]
        x = tl.load(MM + at, mask=valid, other=0.0).to(tl.float32)
        x += tl.load(BIAS + col, mask=col < cols, other=0.0).to(tl.float32)[None, :]
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))  # x·Φ(x); 0.707...: 1/sqrt(2)
        tl.store(OUT + at, y.to(OUT.dtype.element_ty), mask=valid)

    @triton.jit(do_not_specialize=["rows"])  # rows: any count, one compiled kernel
    def _backward_kernel(
        GRAD, MM, BIAS, D_MM, PARTIAL, rows, cols,
        ROWS: tl.constexpr, COLS: tl.constexpr, TILES_PER_PROGRAM: tl.constexpr,
    ):  # fmt: skip
        col = tl.program_id(1) * COLS + tl.arange(0, COLS)
        bias = tl.load(BIAS + col, mask=col < cols, other=0.0).to(tl.float32)[None, :]
        d_bias = tl.zeros([ROWS, COLS], dtype=tl.float32)
        for i in range(0, TILES_PER_PROGRAM):
            row = (tl.program_id(0).to(tl.int64) * TILES_PER_PROGRAM + i) * ROWS + tl.arange(0, ROWS)
            valid = (row < rows)[:, None] & (col < cols)[None, :]
            at = row[:, None] * cols + col[None, :]
            x = tl.load(MM + at, mask=valid, other=0.0).to(tl.float32) + bias
            grad = tl.load(GRAD + at, mask=valid, other=0.0).to(tl.float32)
            cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
            pdf = tl.exp(-0.5 * x * x) * 0.3989422804014327  # 1/sqrt(2 pi)
            d_x = tl.where(valid, grad * (cdf + x * pdf), 0.0)
            tl.store(D_MM + at, d_x.to(D_MM.dtype.element_ty), mask=valid)
            d_bias += d_x
        tl.store(PARTIAL + tl.program_id(0) * cols + col, tl.sum(d_bias, axis=0), mask=col < cols)


def _launch(kernel: str, cols: int) -> dict:
    """`kernel`'s launch parameters (`trainer.fused.launch`). On a GPU by default a tile of 1,024 columns by 4 rows
    (8 warps, 16 values a thread), the backward's programs taking 64 tiles each (one compiled kernel for any batch;
    500 programs at 32,000 tokens and 4,096 columns); in the interpreter, where each program costs milliseconds, 16
    rows by the whole row, 2 tiles a program."""
    if interpreting():
        defaults = {"ROWS": 16, "COLS": max(triton.next_power_of_2(cols), 16), "num_warps": 1}
    else:
        defaults = {"ROWS": 4, "COLS": min(max(triton.next_power_of_2(cols), 16), 1024), "num_warps": 8}
    if kernel == "gelu_backward":
        defaults["TILES_PER_PROGRAM"] = 2 if interpreting() else 64
    return launch(kernel, defaults)


def gelu_forward(mm, bias):
    """The forward kernel's launch: gelu(mm + bias), with mm's dtype."""
    rows, cols = mm.shape
    out = torch.empty_like(mm)
    if rows:
        shape = _launch("gelu_forward", cols)
        _forward_kernel[(triton.cdiv(rows, shape["ROWS"]), triton.cdiv(cols, shape["COLS"]))](
            mm, bias, out, rows, cols, **shape, **COMPILE_OPTIONS
        )
    return out


def gelu_backward(grad, mm, bias):
    """The backward kernel's launch: the gradients of the product and (in fp32) of its bias."""
    rows, cols = mm.shape
    d_mm = torch.empty_like(mm)
    shape = _launch("gelu_backward", cols)
    groups = max(triton.cdiv(rows, shape["ROWS"] * shape["TILES_PER_PROGRAM"]), 1)
    partial = (torch.empty if rows else torch.zeros)(groups, cols, dtype=torch.float32, device=mm.device)
    if rows:
        _backward_kernel[(groups, triton.cdiv(cols, shape["COLS"]))](
            grad.contiguous(), mm, bias, d_mm, partial, rows, cols, **shape, **COMPILE_OPTIONS
        )
    return d_mm, partial.sum(0)


class FusedBiasGelu(torch.autograd.Function):
    """gelu(mm + bias), exact (erf); see the module's doc. mm: [T, I], contiguous; the output has mm's dtype."""

    @staticmethod
    def forward(ctx, mm, bias):
        ctx.save_for_backward(mm, bias)
        return gelu_forward(mm, bias)

    @staticmethod
    def backward(ctx, grad):
        mm, bias = ctx.saved_tensors
        d_mm, d_bias = gelu_backward(grad, mm, bias)
        return d_mm, d_bias.to(bias.dtype)


def bias_gelu(mm: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`F.gelu(mm + bias)` (exact) in one kernel each way (see the module's doc), over mm [..., I]."""
    shape = mm.shape
    return FusedBiasGelu.apply(mm.reshape(-1, shape[-1]).contiguous(), bias).view(shape)
