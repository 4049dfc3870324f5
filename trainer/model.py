"""BERT for pretraining (masked LM + next sentence prediction), run without padding.

Parameter names are those of Hugging Face `BertForPreTraining`, so HF checkpoints load as they are and outputs
can be checked against HF. The forward pass takes a `PackedBatch`: all valid tokens of the micro-batch in one
[T, hidden] tensor, sequences delimited by `cu_seqlens`. Linear layers, LayerNorm and GELU are per token, so
they only ever see real tokens; attention is the one place that needs sequence boundaries (`model.attention`:
varlen, jagged, packed or padded, trainer/attention.py).
The query, key and value projections run as one matrix product (their weights concatenated at each call, so the
parameters keep Hugging Face's names) and the attention kernels take the packed [T, 3, heads, head_dim] result.
With `model.compile`, the per-token parts of every encoder layer (dense + bias + GELU; dense + dropout + residual
+ LayerNorm) run compiled by `torch.compile` (fused kernels; dynamic in the number of tokens); the eager modules
are the reference, and parameter names do not change. With `model.compile_model`, the whole forward pass from the
batch's tensors to the heads' logits is one compiled graph (`compiled_logits`; the grids' layouts are built before it,
on the host), LayerNorm kept on PyTorch's kernels (`opaque_layer_norm`); on fixed shapes with the varlen kernel it reads
no int of the batch's, so each shape compiles once and, on a GPU, runs as CUDA graphs.

With `model.static_shapes`, batches come padded to a budget (`trainer.data.batch.ShapeBudget`): the per-token layers
run on the padding too (so that the compiled layers see a few shapes), attention only on the sequences, and the MLM head
also on the padding masked positions, whose labels count in no loss.

With `model.half_residual`, under bf16/fp16 autocast every LayerNorm reads and writes the half dtype (statistics in
fp32), so the residual stream between layers is half precision, as in NVIDIA's MLPerf BERT, instead of autocast's fp32.

The MLM head (transform + vocab projection, the most expensive per-token layer) runs only on masked tokens,
as MLPerf's "dense sequence output" does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trainer.attention import (
    VARLEN_KERNELS,
    JaggedLayout,
    PaddingLayout,
    attention_kernel,
    attention_layout,
    gather_rows,
    packed_attention,
)
from trainer.config import ModelConfig
from trainer.data.batch import IGNORE, PackedBatch
from trainer.errors import CheckpointError

# --------------------------------------------------------------------------- encoder


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


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = layer_norm(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)

    def forward(self, batch: PackedBatch) -> torch.Tensor:
        x = self.word_embeddings(batch.input_ids)
        x = x + self.position_embeddings(batch.position_ids) + self.token_type_embeddings(batch.segment_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.query = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.key = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.value = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.dropout_p = cfg.attention_probs_dropout_prob
        # The compiled model on fixed shapes reads no int of the batch's: the varlen kernel is told the longest a
        # sequence can be, and every batch may be padded (`packed_attention`)
        self.fixed_max_seqlen = cfg.max_position_embeddings if cfg.compile_model and cfg.static_shapes else None
        self.varlen = VARLEN_KERNELS[cfg.varlen_kernel]  # the varlen attention's kernel (model.varlen_kernel)

    def forward(self, x: torch.Tensor, batch: PackedBatch, layout: PaddingLayout | JaggedLayout | None) -> torch.Tensor:
        projections = (self.query, self.key, self.value)  # one matrix product for the three
        weight = torch.cat([p.weight for p in projections])
        bias = torch.cat([p.bias for p in projections])
        qkv = F.linear(x, weight, bias).view(x.shape[0], 3, self.heads, self.head_dim)
        dropout_p = self.dropout_p if self.training else 0.0
        out = packed_attention(qkv, batch, layout, dropout_p, self.fixed_max_seqlen, self.varlen)
        return out.reshape(x.shape[0], -1)


class BertSelfOutput(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = layer_norm(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout_prob)
        self.fused = None  # the bias, dropout, residual and LayerNorm in one kernel each way (model.fused_norm)
        if cfg.fused_norm:
            from trainer.fused.norm import bias_dropout_add_norm  # (imports Triton: only where the switch is on)

            self.fused = bias_dropout_add_norm

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:  # the matrix product without its bias, which the kernel adds (and sums the grad of)
            norm = self.LayerNorm
            return self.fused(F.linear(h, self.dense.weight), self.dense.bias, residual, norm.weight, norm.bias,
                              self.dropout.p, norm.eps, self.training)  # fmt: skip
        return self.LayerNorm(self.dropout(self.dense(h)) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x, batch, layout):
        return self.output(self.self(x, batch, layout), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.fused = None  # the bias and GELU in one kernel each way (model.fused_gelu)
        if cfg.fused_gelu:
            from trainer.fused.gelu import bias_gelu  # (imports Triton: only where the switch is on)

            self.fused = bias_gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:  # the matrix product without its bias, which the kernel adds (and sums the grad of)
            return self.fused(F.linear(x, self.dense.weight), self.dense.bias)
        return F.gelu(self.dense(x))


class BertOutput(BertSelfOutput):
    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)


class BertLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, x, batch, layout):
        x = self.attention(x, batch, layout)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x, batch, layout):
        for layer in self.layer:
            x = layer(x, batch, layout)
        return x


class BertPooler(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, first_tokens: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(first_tokens))


class BertModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)
        self.pooler = BertPooler(cfg)
        self.attention = cfg.attention
        self.head_dim = cfg.head_dim

    def attention_kernel(self) -> str:
        """The kernel `model.attention` names here: decided by the embeddings' output, whose dtype and device are the
        word embeddings' (`attention_kernel`), and by autocast."""
        return attention_kernel(self.attention, self.embeddings.word_embeddings.weight, self.head_dim)

    def forward(
        self, batch: PackedBatch, layout: PaddingLayout | JaggedLayout | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns the packed sequence output [T, hidden] and the pooled [CLS] output [B, hidden]; `layout`: the
        attention kernel's (`attention_layout`), built before (on the host, for the grids)."""
        x = self.embeddings(batch)
        x = self.encoder(x, batch, layout)
        first_tokens = gather_rows(x, batch.cu_seqlens[:-1].long())
        return x, self.pooler(first_tokens)


# --------------------------------------------------------------------------- pretraining heads


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = layer_norm(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.transform = BertPredictionHeadTransform(cfg)
        self.decoder = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)  # tied to word embeddings
        self.bias = nn.Parameter(torch.zeros(cfg.padded_vocab_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self.transform(x), self.decoder.weight, self.bias)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.predictions = BertLMPredictionHead(cfg)
        self.seq_relationship = nn.Linear(cfg.hidden_size, 2)


@dataclass
class PretrainingOutput:
    mlm_logits: torch.Tensor  # [M, vocab_size] at the masked positions only (vocab padding cut off)
    nsp_logits: torch.Tensor  # [B, 2]


@dataclass
class PretrainingLoss:
    total: torch.Tensor
    mlm: torch.Tensor
    nsp: torch.Tensor
    mlm_correct: torch.Tensor  # number of masked tokens predicted right (no grad)
    mlm_count: int


def raise_recompile_limit(config, at_least: int) -> None:
    """Let torch.compile recompile a function for `at_least` shapes before it falls back to eager: `config` is
    `torch._dynamo.config`, whose limit is `recompile_limit` from PyTorch 2.7 on and `cache_size_limit` before (the
    project takes torch 2.4 and later; the newer name is an error there)."""
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), at_least))


class BertForPreTraining(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg)
        self.cls = BertPreTrainingHeads(cfg)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight
        self.apply(self._init_weights)
        if cfg.compile:
            self.compile_token_layers()
        # Whether the compiled model on fixed shapes (`compiled_logits`) may replay CUDA graphs on a GPU. The trainer
        # says no where gradients accumulate over micro-batches: a backward graph's replay writes its gradients where
        # the last replay's lie, which the parameters' .grad still holds (PyTorch issue 169545); and while it
        # measures micro-batches' memory.
        self.cuda_graphs = True

    def compile_token_layers(self) -> None:
        """Compile, in place, the per-token parts of every encoder layer and the MLM transform (`model.compile`):
        `torch.compile` fuses bias + GELU and dropout + residual + LayerNorm into the matrix products' neighbours.
        Compiled on first use; dynamic in the number of tokens, so batches of any size reuse the same kernels, or,
        with `model.static_shapes` (every batch padded to one of a few lengths), for each of those shapes."""
        dynamic = not self.config.static_shapes
        if not dynamic:  # a graph per shape: the layers of one kind share their code, the two output kinds too, and
            # each padding length of training (trainer.data.batch.TOKEN_LEVELS) and evaluation is a shape of its own
            raise_recompile_limit(torch._dynamo.config, 32)
        for layer in self.bert.encoder.layer:
            for part in (layer.attention.output, layer.intermediate, layer.output):
                part.compile(dynamic=dynamic)
        self.cls.predictions.transform.compile(dynamic=dynamic)

    def _init_weights(self, module: nn.Module) -> None:
        # Same init as HF BERT: N(0, initializer_range) weights, zero biases, unit LayerNorm.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(self, batch: PackedBatch) -> PretrainingOutput:
        kernel = self.bert.attention_kernel()
        layout = attention_layout(kernel, batch)  # eager: the grids are laid out on the host
        if not self.config.compile_model:
            return PretrainingOutput(*pretraining_logits(self, batch, layout))
        fixed = graph_per_shape(self.config, kernel)
        graphs = fixed and batch.input_ids.is_cuda and self.cuda_graphs
        # One graph under DDP too: Dynamo's DDP optimizer would split it at DDP's gradient buckets (and refuses a
        # bucket cap below DDP's first bucket, 1 MiB: clipping.bucket_cap_mb 0.5); the gradients are all-reduced
        # once the compiled backward has made them all
        with torch._dynamo.config.patch(optimize_ddp=False):
            return PretrainingOutput(*compiled_logits(fixed, graphs)(self, batch, layout))


def pretraining_logits(
    model: BertForPreTraining, batch: PackedBatch, layout: PaddingLayout | JaggedLayout | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward pass from the batch's tensors and the attention layout: the MLM logits at the masked positions
    and the NSP logits (`PretrainingOutput`'s). What `model.compile_model` compiles as one graph."""
    sequence_output, pooled = model.bert(batch, layout)
    masked = gather_rows(sequence_output, batch.masked_positions)
    mlm_logits = model.cls.predictions(masked)[:, : model.config.vocab_size]
    return mlm_logits, model.cls.seq_relationship(pooled)


def graph_per_shape(cfg: ModelConfig, kernel: str) -> bool:
    """Whether the compiled model (`model.compile_model`) compiles once per shape, and so may replay CUDA graphs: on
    fixed shapes with the varlen kernel, which reads no int of the batch's; else it compiles once for any shape."""
    return cfg.compile_model and cfg.static_shapes and kernel == "varlen"


@functools.cache
def compiled_logits(fixed_shapes: bool, cuda_graphs: bool):
    """`pretraining_logits` compiled as one graph (`model.compile_model`): for any number of tokens, or, on fixed
    shapes (`model.static_shapes` with the varlen kernel, which reads no int of the batch's), once per shape (the
    tokens' and masked positions' budget and the number of sequences: an epoch's or an evaluation's smaller last
    batch is one more); with `cuda_graphs`, each shape's forward and backward replayed as CUDA graphs (torch.compile's
    reduce-overhead mode). Compiled on first use; one compiled function serves every model of the process, each
    model's graphs told apart by guards (and counting in one recompile limit)."""
    if fixed_shapes:  # the training budget's levels and the evaluation's shape, in training and evaluation mode
        raise_recompile_limit(torch._dynamo.config, 32)
    mode = "reduce-overhead" if cuda_graphs else None
    return torch.compile(pretraining_logits, fullgraph=True, dynamic=not fixed_shapes, mode=mode)


def pretraining_loss(
    out: PretrainingOutput, batch: PackedBatch, mlm_weight: float = 1.0, nsp_weight: float = 1.0
) -> PretrainingLoss:
    """MLM cross-entropy averaged over masked tokens plus NSP cross-entropy averaged over sequences; `total` weighs
    them by `mlm_weight` and `nsp_weight` (a micro-batch's shares of its step's masked tokens and sequences, so that
    the micro-batches' totals add up to the step's own loss: `trainer.train.train_step`).

    A batch without masked tokens (rows too short to mask) has an MLM loss of 0, not the NaN of an empty mean. The
    masked positions that pad a batch to a budget (label IGNORE) count in neither the loss nor the hits.
    """
    masked = batch.num_masked
    mlm = F.cross_entropy(out.mlm_logits.float(), batch.masked_labels, reduction="sum", ignore_index=IGNORE)
    mlm = mlm / max(masked, 1)
    nsp = F.cross_entropy(out.nsp_logits.float(), batch.next_sentence_labels)
    with torch.no_grad():
        correct = (out.mlm_logits.argmax(-1) == batch.masked_labels).sum()
    return PretrainingLoss(mlm_weight * mlm + nsp_weight * nsp, mlm.detach(), nsp.detach(), correct, masked)


# --------------------------------------------------------------------------- Hugging Face weights


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from a .safetensors file or a torch-saved .bin/.pt file (tensors only)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist (model.init_checkpoint)")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file: say which one
        detail = "the file is empty" if path.stat().st_size == 0 else str(e).strip()
        if "WeightsUnpickler error:" in detail:  # PyTorch's advice to load with weights_only=False would run code
            why = detail.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n")[0].strip()
            detail = f"not tensors that torch.load reads without running code ({why})"
        raise CheckpointError(f"cannot read weights file {path} (model.init_checkpoint): "
                              f"{detail or type(e).__name__}") from e  # fmt: skip
    state = state.get("model", state) if isinstance(state, dict) else state
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"weights file {path} (model.init_checkpoint) holds a {type(state).__name__}, not a "
                              "state dict (parameter names mapped to tensors, as `torch.save(model.state_dict())` "
                              "writes)")  # fmt: skip
    return state


def _hf_key(key: str) -> str:
    key = key.removeprefix("module.")  # saved from DDP
    return key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")


def load_hf_state_dict(model: BertForPreTraining, state: dict[str, torch.Tensor]) -> None:
    """Load HF `BertForPreTraining` weights; an unpadded vocabulary is padded with zero rows."""
    own = model.state_dict()
    converted = {}
    for key, value in state.items():
        key = _hf_key(key)
        if key in ("cls.predictions.decoder.bias", "bert.embeddings.position_ids"):
            continue  # decoder.bias is tied to cls.predictions.bias in HF; position_ids is a buffer
        if key not in own:
            raise CheckpointError(f"weights have a key {key!r} that BertForPreTraining does not have")
        target = own[key]
        if value.shape != target.shape and value.shape[1:] == target.shape[1:] and len(value) < len(target):
            value = torch.cat([value, value.new_zeros(len(target) - len(value), *value.shape[1:])])
        if value.shape != target.shape:
            raise CheckpointError(
                f"weights key {key!r} has shape {tuple(value.shape)}, the model expects {tuple(target.shape)}; "
                "check model.* sizes against the checkpoint's config"
            )
        converted[key] = value
    missing = set(own) - set(converted) - {"cls.predictions.decoder.weight"}
    if missing:
        raise CheckpointError(f"weights lack {len(missing)} keys, e.g. {sorted(missing)[:3]}")
    model.load_state_dict(converted, strict=False)
