"""BERT for pretraining (masked LM + next sentence prediction), run without padding.

Parameter names are those of Hugging Face `BertForPreTraining`, so HF checkpoints load as they are
(trainer/hf_weights.py) and outputs can be checked against HF. The forward pass takes a `PackedBatch`: all valid
tokens of the micro-batch in one [T, hidden] tensor, sequences delimited by `cu_seqlens`. Linear layers, LayerNorm
and GELU are per token, so they only ever see real tokens; attention is the one place that needs sequence boundaries
(`model.attention`: varlen, jagged, packed or padded, trainer/attention.py). The query, key and value projections run
as one matrix product (their weights concatenated at each call, so the parameters keep Hugging Face's names) and the
attention kernels take the packed [T, 3, heads, head_dim] result. With `model.compile`, the per-token parts of every
encoder layer (dense + bias + GELU; dense + dropout + residual + LayerNorm) run compiled by `torch.compile` (fused
kernels; dynamic in the number of tokens); the eager modules are the reference, and parameter names do not change.
With `model.compile_model`, the whole forward pass from the batch's tensors to the heads' logits is one compiled
graph (`compiled_logits`; the grids' layouts are built before it, on the host), LayerNorm kept on PyTorch's kernels
(`trainer.layer_norm.opaque_layer_norm`); on fixed shapes with the varlen kernel it reads no int of the batch's, so
each shape compiles once and, on a GPU, runs as CUDA graphs.

With `model.static_shapes`, batches come padded to a budget (`trainer.data.batch.ShapeBudget`): the per-token layers
run on the padding too (so that the compiled layers see a few shapes), attention only on the sequences, and the MLM
head also on the padding masked positions, whose labels count in no loss.

With `model.half_residual`, under bf16/fp16 autocast every LayerNorm reads and writes the half dtype (statistics in
fp32, trainer/layer_norm.py), so the residual stream between layers is half precision, as in NVIDIA's MLPerf BERT,
instead of autocast's fp32.

The MLM head (transform + vocab projection, the most expensive per-token layer) runs only on masked tokens,
as MLPerf's "dense sequence output" does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

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
from trainer.layer_norm import layer_norm

# --------------------------------------------------------------------------- encoder


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
