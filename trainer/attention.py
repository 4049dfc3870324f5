"""Attention within each sequence of a packed stream: the kernels `model.attention` names, and what decides them.

The model's tokens come packed, all valid tokens of a micro-batch in one [T, hidden] tensor, sequences delimited by
`cu_seqlens`; the query, key and value projections give [T, 3, heads, head_dim]. Attention is the one layer that needs
the sequences' boundaries:

- `varlen`: PyTorch's flash kernel on the packed stream (`aten._flash_attention_forward`, the kernel its jagged
  nested tensors and `varlen_attn` call), with attention dropout; a GPU of compute capability 8.0 or newer,
  bf16/fp16, heads of a multiple of 8 up to 256. With `model.varlen_kernel: cudnn`, cuDNN's fused attention on the
  same packed stream instead (`CudnnVarlenAttention`);
- `jagged`: `scaled_dot_product_attention` on a jagged nested tensor that views the packed stream (no copy); on
  CUDA it runs the same flash kernel through the nested tensor's Python layer, elsewhere PyTorch's per-sequence math;
- `packed`: the sequences packed into rows of a grid as wide as the longest, several short ones to a row (first-fit
  decreasing on the host, `trainer.data.batch.RowPacking`); SDPA with a mask that keeps each sequence within itself. On
  MLPerf's length mix that is about half the rows of `padded`, so half its attention work;
- `padded`: scatter into a [B, max_seqlen] grid (not [B, 512]), SDPA with a key-padding mask, gather back. Exact,
  padding only up to the longest sequence of the batch; the reference the others are tested against.

`auto` picks varlen where it runs (with BERT's attention dropout on an H200 at batch 128 it trained BERT-large 1.56x
as fast as the padded grid, which the packed grid beat by 1.05x and which ran 1.5x jagged on 2026-11-28:
BENCHMARKS.md); else, on a GPU, padded;
elsewhere packed.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from trainer.data.batch import PackedBatch, RowPacking
from trainer.errors import ConfigError

# PyTorch's CPU math path for jagged attention builds a strided nested tensor internally and warns about that layout
warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
# and its backward asks whether FX traces it, a question PyTorch answers with a log line to its own developers
logging.getLogger("torch.fx._symbolic_trace").addFilter(lambda r: "is_fx_tracing will return" not in r.getMessage())


@dataclass
class PaddingLayout:
    """Where each packed token sits in a [B, L] grid; built once per batch, shared by all layers."""

    slots: torch.Tensor  # int64 [T]: flat index b * L + position of each token
    key_mask: torch.Tensor  # bool [B, 1, 1 or L, L]: True where the query (row) may see the key (column)
    batch: int
    length: int
    _additive: dict = field(default_factory=dict, repr=False)  # dtype -> the pair mask as 0 / -inf

    def attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask for SDPA. A key-padding mask ([B, 1, 1, L]) as it is; a mask of query-key pairs (packed rows)
        once per batch as an additive one in the queries' dtype, shared by every layer: SDPA would otherwise turn
        it into one in each layer, and each layer's backward would keep its own copy."""
        if self.key_mask.shape[-2] == 1:
            return self.key_mask
        if dtype not in self._additive:
            additive = torch.zeros(self.key_mask.shape, dtype=dtype, device=self.key_mask.device)
            self._additive[dtype] = additive.masked_fill_(~self.key_mask, float("-inf"))
        return self._additive[dtype]

    @staticmethod
    def from_rows(rows: RowPacking) -> PaddingLayout:
        """The grid of sequences packed several to a row: a query sees the keys of its own sequence (a padding cell
        sees the padding of its row, which no token reads back, so that no row of the softmax is empty)."""
        segments = rows.segments.view(rows.rows, rows.width)
        same = segments[:, :, None] == segments[:, None, :]
        return PaddingLayout(rows.slots, same[:, None], rows.rows, rows.width)

    @staticmethod
    def from_cu_seqlens(cu_seqlens: torch.Tensor, position_ids: torch.Tensor, max_seqlen: int) -> PaddingLayout:
        starts = cu_seqlens[:-1].long()
        lengths = cu_seqlens[1:].long() - starts
        batch = lengths.numel()
        seq_of_token = torch.repeat_interleave(torch.arange(batch, device=cu_seqlens.device), lengths,
                                               output_size=position_ids.numel())  # fmt: skip
        slots = seq_of_token * max_seqlen + position_ids
        key_mask = torch.arange(max_seqlen, device=cu_seqlens.device)[None, :] < lengths[:, None]
        return PaddingLayout(slots, key_mask[:, None, None, :], batch, max_seqlen)


class GatherRows(torch.autograd.Function):
    """`x.index_select(0, index)` for *distinct* indices. Its backward writes rows back (index_copy) instead of
    accumulating them (index_add), which is several times slower on CPU and not needed without repeats. A repeated
    index is right only where every copy's gradient is zero: the masked positions that pad a batch to a budget
    (`model.static_shapes`) all point at one padding token, and their labels (IGNORE) give them none, so whichever
    copy the write keeps (on CUDA, any), the row's gradient is zero, as an index_add would make it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.num_rows = x.shape[0]
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (index,) = ctx.saved_tensors
        return grad.new_zeros((ctx.num_rows, *grad.shape[1:])).index_copy_(0, index, grad), None


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return GatherRows.apply(x, index)


@dataclass
class JaggedLayout:
    """The packed stream's sequence offsets, for viewing [T, heads, head_dim] as a jagged [B, heads, j, head_dim]."""

    offsets: torch.Tensor  # int64 [B + 1]
    max_seqlen: int
    min_seqlen: int  # both given, so that no kernel reads them back from the device

    def view(self, t: torch.Tensor) -> torch.Tensor:
        nested = torch.nested.nested_tensor_from_jagged(t, offsets=self.offsets, max_seqlen=self.max_seqlen,
                                                        min_seqlen=self.min_seqlen)  # fmt: skip
        return nested.transpose(1, 2)


class FlashVarlenAttention(torch.autograd.Function):
    """Flash attention within each sequence of the packed stream, with dropout on the attention weights.

    PyTorch's own varlen flash kernel, called as its jagged nested tensors call it, without their host work per
    call. The forward returns the random state its dropout mask came from; the backward draws the same mask from
    it. q, k, v: [T, heads, head_dim] (rows may be strided, the last dimension contiguous); CUDA, bf16/fp16."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int, dropout_p: float, padded: bool = False):
        out, logsumexp, rng_state, rng_rest, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False, False
        )
        if padded:
            out = token_rows_only(out, cu_seqlens)
        ctx.save_for_backward(q, k, v, out, logsumexp, cu_seqlens, rng_state, rng_rest)
        ctx.max_seqlen, ctx.dropout_p, ctx.padded = max_seqlen, dropout_p, padded
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, k, v, out, logsumexp, cu_seqlens, rng_state, rng_rest = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad.contiguous(), q, k, v, out, logsumexp, cu_seqlens, cu_seqlens, ctx.max_seqlen, ctx.max_seqlen,
            ctx.dropout_p, False, rng_state, rng_rest,
        )  # fmt: skip
        if ctx.padded:
            dq, dk, dv = (token_rows_only(d, cu_seqlens) for d in (dq, dk, dv))
        return dq, dk, dv, None, None, None, None


class CudnnVarlenAttention:
    """`FlashVarlenAttention`'s call on cuDNN's fused attention (`model.varlen_kernel: cudnn`): PyTorch's
    `_cudnn_attention_forward` with the packed stream's cumulative sequence lengths, as its jagged nested tensors call
    it on the cuDNN backend, with the attention dropout drawn by cuDNN (its seed and offset kept for the backward);
    autograd runs cuDNN's backward (`_cudnn_attention_backward`). Batches of their sequences' tokens alone (the
    config refuses model.static_shapes and model.compile_model with it). q, k, v: [T, heads, head_dim]; CUDA,
    bf16/fp16."""

    @staticmethod
    def apply(q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int, dropout_p: float, padded: bool = False):
        if padded:
            raise ValueError("cuDNN's varlen attention takes batches of their sequences' tokens alone, not padded ones")
        stats = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)  # (backward's)
        return torch.ops.aten._cudnn_attention_forward(
            q, k, v, None, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, stats, dropout_p, False, False
        )[0]


VARLEN_KERNELS = {"flash": FlashVarlenAttention, "cudnn": CudnnVarlenAttention}  # model.varlen_kernel


def token_rows_only(t: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """`t` [T, ...] with its rows after the sequences' tokens (a budget's padding, `model.static_shapes`) zero: the
    varlen kernel leaves those rows of its outputs unwritten, whatever memory held (NaN too, which a product with a
    zero gradient would keep). Read from the device (the sequences' end, cu_seqlens[-1]): no int of the batch's, so
    a compiled model sees one shape per budget (`model.compile_model`)."""
    rows = torch.arange(t.shape[0], device=t.device) < cu_seqlens[-1]
    return torch.where(rows.view(-1, *(1,) * (t.dim() - 1)), t, 0)


def packed_attention(
    qkv: torch.Tensor,
    batch: PackedBatch,
    layout: PaddingLayout | JaggedLayout | None,
    dropout_p: float,
    fixed_max_seqlen: int | None = None,
    varlen: type = FlashVarlenAttention,
) -> torch.Tensor:
    """Attention within each packed sequence of qkv [T, 3, heads, head_dim] (query, key, value); returns
    [T, heads, head_dim]. `layout`: None for the varlen kernel (`varlen`: flash's, or cuDNN's, `VARLEN_KERNELS`),
    else the jagged view or a grid, padded or packed (see the module's doc). A batch padded to a budget
    (`model.static_shapes`) attends over its sequences' tokens only; its padding tokens' rows of the result are zeros
    (and so are their gradients). `fixed_max_seqlen`: the varlen kernel is told that bound instead of the batch's
    longest, and any batch may be padded (the compiled model on fixed shapes: one graph for every batch of a shape,
    `model.compile_model`)."""
    if layout is None:  # the varlen kernel: padding rows stay in the stream, zeroed after the kernel
        q, k, v = qkv.unbind(1)
        fixed = fixed_max_seqlen is not None  # (then the batch's ints are not read: see above)
        max_seqlen, padded = (fixed_max_seqlen, True) if fixed else (batch.max_seqlen, batch.padded)
        return varlen.apply(q, k, v, batch.cu_seqlens, max_seqlen, dropout_p, padded)
    if batch.padded:
        out = attend(qkv[: batch.num_tokens], batch, layout, dropout_p)
        return F.pad(out, (0, 0, 0, 0, 0, qkv.shape[0] - batch.num_tokens))
    return attend(qkv, batch, layout, dropout_p)


def attend(
    qkv: torch.Tensor, batch: PackedBatch, layout: PaddingLayout | JaggedLayout | None, dropout_p: float
) -> torch.Tensor:
    """`packed_attention` on a grid or the jagged view of the sequences' tokens of qkv [T, 3, heads, head_dim] (no
    budget's padding)."""
    if isinstance(layout, JaggedLayout):
        q, k, v = (layout.view(t.contiguous()) for t in qkv.unbind(1))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        return out.transpose(1, 2).values()
    T, _, heads, head_dim = qkv.shape  # one scatter for the three; each its own [B, L, heads, head_dim] block
    grid = qkv.new_zeros(3, layout.batch * layout.length, heads, head_dim)
    grid.index_copy_(1, layout.slots, qkv.transpose(0, 1))  # in place: one grid-sized buffer, not two
    q, k, v = grid.view(3, layout.batch, layout.length, heads, head_dim).transpose(2, 3).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=layout.attention_mask(q.dtype), dropout_p=dropout_p)
    out = out.transpose(1, 2).reshape(layout.batch * layout.length, heads, head_dim)
    return gather_rows(out, layout.slots)


FLASH_CAPABILITY = (8, 0)  # PyTorch's flash kernel: Ampere and newer
VARLEN_NEEDS = "a CUDA GPU of compute capability 8.0 or newer, bf16 or fp16, and heads of a multiple of 8 up to 256"


def flash_device(device: torch.device) -> bool:
    """Whether the flash kernel runs on `device`: a CUDA GPU of compute capability 8.0 or newer."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= FLASH_CAPABILITY


def flash_head_dim(head_dim: int) -> bool:
    """Whether the flash kernel takes heads of `head_dim`: a multiple of 8, at most 256 (BERT's: 64)."""
    return head_dim % 8 == 0 and head_dim <= 256


def varlen_runs(flash: bool, half: bool, head_dim: int = 64) -> bool:
    """Whether the varlen flash kernel can run: on a `flash_device`, in half precision, with heads it takes."""
    return flash and half and flash_head_dim(head_dim)


def attention_kernel(choice: str, x: torch.Tensor, head_dim: int) -> str:
    """The kernel `model.attention` names for this batch: varlen, jagged, packed or padded (`auto`: see the module's
    doc). The trainer refuses a `varlen` that cannot run before any work (`trainer.preflight.check_attention`)."""
    half = x.dtype in (torch.float16, torch.bfloat16) or torch.is_autocast_enabled("cuda")
    return resolve_attention(choice, flash_device(x.device), half, head_dim, gpu=x.device.type == "cuda")


def resolve_attention(choice: str, flash: bool, half: bool, head_dim: int = 64, gpu: bool | None = None) -> str:
    """`attention_kernel` from what decides it: a GPU the flash kernel runs on, half precision, the size of a head,
    and whether the device is a GPU at all (by default: a flash GPU is one)."""
    fits = varlen_runs(flash, half, head_dim)
    gpu = flash if gpu is None else gpu
    if choice == "auto":  # on an H200 with BERT's dropout, batch 128: varlen 1.56x the padded grid, packed 1.05x
        if fits:
            return "varlen"
        return "padded" if gpu else "packed"
    if choice == "varlen" and not fits:
        raise ConfigError(f"model.attention: varlen needs {VARLEN_NEEDS} (hidden_size / num_attention_heads); use "
                          "auto, jagged, packed or padded")  # fmt: skip
    return choice


def attention_layout(kernel: str, batch: PackedBatch) -> PaddingLayout | JaggedLayout | None:
    """What `packed_attention` needs for `kernel`, built once per batch and shared by all layers."""
    if kernel == "varlen":
        return None
    if kernel == "jagged":
        return JaggedLayout(batch.cu_seqlens.long(), batch.max_seqlen, batch.min_seqlen)
    if kernel == "packed":
        return PaddingLayout.from_rows(batch.row_packing())
    positions = batch.position_ids[: batch.num_tokens]  # the sequences' tokens, not a budget's padding
    return PaddingLayout.from_cu_seqlens(batch.cu_seqlens, positions, batch.max_seqlen)
