"""Each encoder layer's output block in one kernel each way: bias, dropout, residual add and LayerNorm
(`model.fused_norm`).

BERT ends both halves of a layer with `LayerNorm(dropout(dense(h)) + residual)`. Eager PyTorch runs that as a matrix
product with its bias, a dropout kernel (which writes its mask), an addition and a LayerNorm; the backward as a
LayerNorm backward, a separate kernel for its weights' gradients, the dropout's backward and a reduction for the
bias's gradient: each a pass over [tokens, hidden] activations. On an H200 at batch 128 (BERT-large, varlen, bf16
residual stream) the step's element-wise work took 47 ms of 171, the LayerNorm weights' gradients alone 6.3 ms.

Here the forward is one Triton kernel: it reads the matrix product (without its bias) and the residual, adds the
bias, draws the dropout mask (Philox, four draws a call, from a seed drawn with torch's generator, so
`torch.manual_seed` and the saved RNG state decide it), adds the residual and normalizes, in fp32, and writes the
output, the mask (a byte an element, as eager dropout's) and each row's mean and 1/std. The backward kernel reads the
same two inputs and the mask, recomputes the sum, and writes the gradients of the matrix product and of the residual,
with per-program partial sums of the bias's, the LayerNorm weight's and its bias's gradients (summed by PyTorch, in
fp32).

Runs where `trainer.fused.kernels_run` says (see the package's doc).
"""

from __future__ import annotations

import torch

from trainer.fused import COMPILE_OPTIONS, interpreting, launch, triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _keep_tile(SEED, row, p, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        """Which elements of a [ROWS, BLOCK] tile dropout keeps: uniform draws >= p, four from each Philox call."""
        counter = row[:, None] * (BLOCK // 4) + tl.arange(0, BLOCK // 4)[None, :]
        u0, u1, u2, u3 = tl.rand4x(tl.load(SEED), counter)
        return tl.reshape(tl.join(tl.join(u0, u1), tl.join(u2, u3)), [ROWS, BLOCK]) >= p

    @triton.jit(do_not_specialize=["rows"])  # rows: any count, one compiled kernel
    def _forward_kernel(
        MM, BIAS, RES, W, B, OUT, MEAN, RSTD, SEED, KEEP,
        rows, cols, p, scale, eps,
        ROWS: tl.constexpr, BLOCK: tl.constexpr, DROPOUT: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)  # a tile of ROWS rows, BLOCK columns
        col = tl.arange(0, BLOCK)
        valid = (row < rows)[:, None] & (col < cols)[None, :]
        at = row[:, None] * cols + col[None, :]
        x = tl.load(MM + at, mask=valid, other=0.0).to(tl.float32)
        x += tl.load(BIAS + col, mask=col < cols, other=0.0).to(tl.float32)[None, :]
        if DROPOUT:
            keep = _keep_tile(SEED, row, p, ROWS, BLOCK)
            tl.store(KEEP + at, keep.to(tl.uint8), mask=valid)
            x = tl.where(keep, x * scale, 0.0)
        s = tl.where(valid, x + tl.load(RES + at, mask=valid, other=0.0).to(tl.float32), 0.0)
        mean = tl.sum(s, axis=1) / cols
        centred = tl.where(valid, s - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / cols + eps)
        w = tl.load(W + col, mask=col < cols, other=0.0).to(tl.float32)[None, :]
        b = tl.load(B + col, mask=col < cols, other=0.0).to(tl.float32)[None, :]
        tl.store(OUT + at, (centred * rstd[:, None] * w + b).to(OUT.dtype.element_ty), mask=valid)
        tl.store(MEAN + row, mean, mask=row < rows)
        tl.store(RSTD + row, rstd, mask=row < rows)

    @triton.jit(do_not_specialize=["rows"])  # rows: any count, one compiled kernel
    def _backward_kernel(
        GRAD, MM, BIAS, RES, W, MEAN, RSTD, KEEP, D_MM, D_RES, PARTIAL,
        rows, cols, p, scale,
        ROWS: tl.constexpr, TILES_PER_PROGRAM: tl.constexpr, BLOCK: tl.constexpr, DROPOUT: tl.constexpr,
    ):  # fmt: skip
        program = tl.program_id(0)
        col = tl.arange(0, BLOCK)
        bias = tl.load(BIAS + col, mask=col < cols, other=0.0).to(tl.float32)[None, :]
        w = tl.load(W + col, mask=col < cols, other=0.0).to(tl.float32)[None, :]
        d_w = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        d_b = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        d_bias = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
        for i in range(0, TILES_PER_PROGRAM):
            row = (program.to(tl.int64) * TILES_PER_PROGRAM + i) * ROWS + tl.arange(0, ROWS)
            valid = (row < rows)[:, None] & (col < cols)[None, :]
            at = row[:, None] * cols + col[None, :]
            x = tl.load(MM + at, mask=valid, other=0.0).to(tl.float32) + bias  # the forward's sum, again
            if DROPOUT:
                keep = tl.load(KEEP + at, mask=valid, other=0) != 0
                x = tl.where(keep, x * scale, 0.0)
            s = x + tl.load(RES + at, mask=valid, other=0.0).to(tl.float32)
            mean = tl.load(MEAN + row, mask=row < rows, other=0.0)[:, None]
            rstd = tl.load(RSTD + row, mask=row < rows, other=0.0)[:, None]
            x_hat = tl.where(valid, (s - mean) * rstd, 0.0)
            grad = tl.load(GRAD + at, mask=valid, other=0.0).to(tl.float32)
            w_grad = grad * w
            c_hat = tl.sum(w_grad * x_hat, axis=1)[:, None] / cols
            c_one = tl.sum(w_grad, axis=1)[:, None] / cols
            d_s = (w_grad - x_hat * c_hat - c_one) * rstd
            d_x = d_s
            if DROPOUT:
                d_x = tl.where(keep, d_s * scale, 0.0)
            tl.store(D_RES + at, d_s.to(D_RES.dtype.element_ty), mask=valid)
            tl.store(D_MM + at, d_x.to(D_MM.dtype.element_ty), mask=valid)
            d_w += grad * x_hat
            d_b += grad
            d_bias += tl.where(valid, d_x, 0.0)
        partial = PARTIAL + program * 3 * cols + col
        tl.store(partial, tl.sum(d_bias, axis=0), mask=col < cols)
        tl.store(partial + cols, tl.sum(d_w, axis=0), mask=col < cols)
        tl.store(partial + 2 * cols, tl.sum(d_b, axis=0), mask=col < cols)

    @triton.jit(do_not_specialize=["rows"])  # rows: any count, one compiled kernel
    def _keep_kernel(KEEP, SEED, rows, cols, p, ROWS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        col = tl.arange(0, BLOCK)
        valid = (row < rows)[:, None] & (col < cols)[None, :]
        keep = _keep_tile(SEED, row, p, ROWS, BLOCK)
        tl.store(KEEP + row[:, None] * cols + col[None, :], keep.to(tl.uint8), mask=valid)


def _launch(kernel: str, cols: int) -> dict:
    """A tile's columns (the row, rounded up to a power of two) and `kernel`'s launch parameters
    (`trainer.fused.launch`). On a GPU by default one row a tile (a row of BERT-large is 1,024 values: 8 warps keep
    it in registers), the backward's programs looping over 64 tiles each, keeping their partial sums of the weights'
    gradients in registers (one number for any batch: one compiled kernel; 500 programs at 32,000 tokens). In the
    interpreter, where each program costs milliseconds, 16 rows a tile and 2 tiles a program."""
    block = max(triton.next_power_of_2(cols), 16)
    defaults = {"BLOCK": block, "ROWS": 16 if interpreting() else 1, "num_warps": min(max(block // 128, 1), 8)}
    if kernel == "norm_backward":
        defaults["TILES_PER_PROGRAM"] = 2 if interpreting() else 64
    return launch(kernel, defaults)


def norm_forward(mm, bias, residual, weight, norm_bias, p: float, eps: float, seed):
    """The forward kernel's launch: (output, mean, 1/std, kept mask) for `FusedBiasDropoutAddNorm`'s arguments; the
    mask is empty without dropout (seed None)."""
    rows, cols = mm.shape
    out = torch.empty_like(residual)
    mean = torch.empty(rows, dtype=torch.float32, device=mm.device)
    rstd = torch.empty_like(mean)
    dropout = seed is not None
    keep = torch.empty(mm.shape if dropout else 0, dtype=torch.uint8, device=mm.device)
    if rows:
        shape = _launch("norm_forward", cols)
        _forward_kernel[(triton.cdiv(rows, shape["ROWS"]),)](
            mm, bias, residual, weight, norm_bias, out, mean, rstd,
            seed if dropout else mean, keep if dropout else mean,  # (not read without dropout)
            rows, cols, p, _scale(p, dropout), eps, DROPOUT=dropout, **shape, **COMPILE_OPTIONS,
        )  # fmt: skip
    return out, mean, rstd, keep


def norm_backward(grad, mm, bias, residual, weight, mean, rstd, keep, p: float, dropout: bool):
    """The backward kernel's launch: the gradients of the product, its bias, the residual, the LayerNorm weight and
    its bias (these three in fp32), given the forward's inputs and what `norm_forward` returned."""
    rows, cols = mm.shape
    d_mm, d_res = torch.empty_like(mm), torch.empty_like(residual)
    shape = _launch("norm_backward", cols)
    programs = max(triton.cdiv(rows, shape["ROWS"] * shape["TILES_PER_PROGRAM"]), 1)
    partial = (torch.empty if rows else torch.zeros)(programs, 3, cols, dtype=torch.float32, device=mm.device)
    if rows:
        _backward_kernel[(programs,)](
            grad.contiguous(), mm, bias, residual, weight, mean, rstd, keep if dropout else mean,
            d_mm, d_res, partial, rows, cols, p, _scale(p, dropout), DROPOUT=dropout, **shape,
            **COMPILE_OPTIONS,
        )  # fmt: skip
    d_bias, d_weight, d_norm_bias = partial.sum(0).unbind(0)
    return d_mm, d_bias, d_res, d_weight, d_norm_bias


def _scale(p: float, dropout: bool) -> float:
    """What dropout multiplies the kept values by."""
    return 1.0 / (1.0 - p) if dropout else 1.0


class FusedBiasDropoutAddNorm(torch.autograd.Function):
    """layer_norm(residual + dropout(mm + bias)) over the last dimension; see the module's doc. mm, residual: [T, H],
    contiguous; the output has the residual's dtype (the residual stream's); seed: int64 [1] on the device, or None
    without dropout."""

    @staticmethod
    def forward(ctx, mm, bias, residual, weight, norm_bias, p: float, eps: float, seed):
        out, mean, rstd, keep = norm_forward(mm, bias, residual, weight, norm_bias, p, eps, seed)
        ctx.save_for_backward(mm, bias, residual, weight, mean, rstd, keep)
        ctx.p, ctx.dropout, ctx.norm_bias_dtype = p, seed is not None, norm_bias.dtype
        return out

    @staticmethod
    def backward(ctx, grad):
        mm, bias, residual, weight, mean, rstd, keep = ctx.saved_tensors
        d_mm, d_bias, d_res, d_weight, d_norm_bias = norm_backward(
            grad, mm, bias, residual, weight, mean, rstd, keep, ctx.p, ctx.dropout
        )
        return (d_mm, d_bias.to(bias.dtype), d_res, d_weight.to(weight.dtype), d_norm_bias.to(ctx.norm_bias_dtype),
                None, None, None)  # fmt: skip


def dropout_seed(device: torch.device) -> torch.Tensor:
    """A seed for the kernel's dropout, drawn on the device from torch's generator (no host sync)."""
    return torch.randint(0, 2**62, (1,), device=device, dtype=torch.int64)


def bias_dropout_add_norm(
    mm: torch.Tensor,
    bias: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    norm_bias: torch.Tensor,
    p: float,
    eps: float,
    training: bool,
) -> torch.Tensor:
    """`F.layer_norm(residual + F.dropout(mm + bias, p, training), ...)` in one kernel each way (see the module's
    doc), over the last dimension of mm and residual [..., H]. Its output has the residual's dtype."""
    shape = residual.shape
    mm2, res2 = mm.reshape(-1, shape[-1]).contiguous(), residual.reshape(-1, shape[-1]).contiguous()
    seed = dropout_seed(mm.device) if training and p > 0 else None
    return FusedBiasDropoutAddNorm.apply(mm2, bias, res2, weight, norm_bias, p, eps, seed).view(shape)


def dropout_keep(seed: torch.Tensor, shape: tuple[int, int], p: float) -> torch.Tensor:
    """The elements the forward kernel keeps (True) for `seed` over a [T, H] input: the mask it draws, for checking
    the kernels against the eager composition."""
    rows, cols = shape
    keep = torch.empty(shape, dtype=torch.uint8, device=seed.device)
    if rows:
        tile = _launch("norm_forward", cols)
        _keep_kernel[(triton.cdiv(rows, tile["ROWS"]),)](keep, seed, rows, cols, p, **tile, **COMPILE_OPTIONS)
    return keep.bool()
