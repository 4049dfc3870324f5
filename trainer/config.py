"""The trainer's typed configuration.

One `TrainerConfig` with the sections listed in docs/architecture.md. Every field carries a one-line doc where it is
declared. Configs come from a YAML file plus dotted overrides (`optimizer.lr=1e-3`); unknown keys, wrong types
and out-of-range values raise `ConfigError` naming the dotted key.
"""

from __future__ import annotations

import functools
import numbers
import typing
from collections.abc import Callable, Iterable
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trainer.errors import ConfigError

MAX_SEED = 2**64 - 1  # the largest seed torch.manual_seed takes (NumPy's default_rng takes any seed >= 0)


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated, a number is finite (inf
    and nan are refused) and never `true` or `false` (pydantic would read them as 1 and 0), and a switch is `true`
    or `false`, never a number or a string (pydantic would read 0, 0.0 and "yes" as false and true)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            if _field_kinds(cls, info.field_name) <= {bool, type(None)}:
                raise ValueError("takes true or false")
            return value
        items = value if isinstance(value, list) else [value]  # a list's items too (balance.bins)
        if not any(isinstance(v, bool) for v in items):
            return value  # the common case, at no cost
        kinds = _field_kinds(cls, info.field_name)
        in_place = list in kinds or not isinstance(value, list)  # a list where a list goes, else the value itself
        if in_place and bool not in kinds and kinds & {int, float}:
            raise ValueError("takes a number, not true or false")
        return value


@functools.cache
def _field_kinds(section: type[BaseModel], name: str) -> frozenset[Any]:
    return frozenset(_kinds(section.model_fields[name].annotation))


def _kinds(annotation: Any) -> set[Any]:
    """The types an annotation is made of: unions, Annotated and list items unwrapped (`list` itself kept)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _kinds(typing.get_args(annotation)[0])
    if origin is list:
        return {list, *(k for arg in typing.get_args(annotation) for k in _kinds(arg))}
    if typing.get_args(annotation) and origin is not typing.Literal:
        return {k for arg in typing.get_args(annotation) for k in _kinds(arg)}
    return {annotation}


def _a_path(value: Any) -> Any:
    """A path key's value: an empty string is refused (it would name the current folder, or no file), not taken for
    the key left out. A pydantic length bound would refuse paths that are not valid UTF-8 too (Linux allows them)."""
    if isinstance(value, str) and not value.strip():
        raise ValueError("an empty path: give a path, or leave the key out for its default")
    return value


PathText = Annotated[str, BeforeValidator(_a_path)]  # a file or directory key's value (`_a_path`)


class ModelConfig(Section):
    vocab_size: int = Field(30522, ge=1, description="Vocabulary size before padding (HF checkpoints use this).")
    pad_vocab_to_multiple_of: int = Field(8, ge=1, description="Pad the embedding rows to a multiple of this.")
    hidden_size: int = Field(1024, ge=1, description="Width of the encoder (BERT-large: 1024).")
    num_hidden_layers: int = Field(24, ge=1, description="Number of transformer layers (BERT-large: 24).")
    num_attention_heads: int = Field(16, ge=1, description="Attention heads per layer; must divide hidden_size.")
    intermediate_size: int = Field(4096, ge=1, description="Width of the feed-forward layer (BERT-large: 4096).")
    max_position_embeddings: int = Field(512, ge=1, description="Longest sequence the position table covers.")
    type_vocab_size: int = Field(2, ge=1, description="Number of segment (token type) ids.")
    hidden_dropout_prob: float = Field(0.1, ge=0.0, lt=1.0, description="Dropout on hidden states.")
    attention_probs_dropout_prob: float = Field(0.1, ge=0.0, lt=1.0, description="Dropout on attention weights.")
    layer_norm_eps: float = Field(1e-12, gt=0.0, description="LayerNorm epsilon (HF BERT: 1e-12).")
    initializer_range: float = Field(0.02, gt=0.0, description="Std of the normal init of weights.")
    init_checkpoint: PathText | None = Field(
        None, description="HF state dict (.bin/.pt) or .safetensors to start from."
    )
    attention: Literal["auto", "packed", "padded", "jagged", "varlen"] = Field(
        "auto",
        description="Attention kernel over the packed stream: varlen (PyTorch's flash kernel, with dropout; a GPU of "
        "compute capability 8.0+, half precision), jagged (nested-tensor SDPA; the same flash kernel on CUDA), "
        "packed (a grid as wide as the longest sequence, several sequences to a row), padded (a [B, longest] grid, "
        "one sequence to a row). auto: varlen on such a GPU in half precision (1.56x the padded grid's speed on an "
        "H200 with BERT's dropout); else padded on a GPU, packed elsewhere.",
    )
    varlen_kernel: Literal["flash", "cudnn"] = Field(
        "flash",
        description="The kernel the varlen attention runs on (model.attention: varlen, or auto where it takes varlen): "
        "flash, PyTorch's FlashAttention 2 kernel; cudnn, cuDNN's fused attention on the packed stream (PyTorch's "
        "cuDNN attention with the sequences' cumulative lengths, as its jagged nested tensors call it on the cuDNN "
        "backend; on Hopper GPUs cuDNN's kernels use the wgmma instructions the flash kernel does not), with the same "
        "attention dropout, drawn by cuDNN. cuDNN plans its kernels for each shape it is given (the number of "
        "sequences, the longest, the tokens), which packed micro-batches change from step to step: time it on your "
        "GPU before you keep it. cudnn needs a CUDA GPU where PyTorch's cuDNN attention takes a packed stream and "
        "computes the flash kernel's attention: refused before any work where a trial of it fails; not with "
        "model.static_shapes or model.compile_model.",
    )
    compile: bool = Field(
        False,
        description="Compile the per-token parts of each encoder layer (bias + GELU, dropout + residual + LayerNorm) "
        "with torch.compile; the first steps take longer while it compiles.",
    )
    compile_model: bool = Field(
        False,
        description="Compile the whole forward pass (embeddings, every encoder layer with its attention, the heads) "
        "as one graph with torch.compile, LayerNorm left to PyTorch's own kernels (with model.compile, Inductor's "
        "LayerNorm backward took 69 ms of a 446 ms step on an H200). With model.static_shapes on a GPU, the compiled "
        "forward and backward are replayed as CUDA graphs (torch.compile's reduce-overhead mode): the host launches a "
        "step's thousands of kernels in a few calls. Attention varlen, packed or padded; not with model.compile "
        "(per-token layers); the first steps of each shape take longer while it compiles.",
    )
    fused_norm: bool = Field(
        False,
        description="End each half of every encoder layer (the matrix product's bias, dropout, the residual addition "
        "and LayerNorm) with one Triton kernel forward and one backward instead of eager PyTorch's several (their "
        "statistics in fp32; the dropout mask drawn in the kernel from a seed of torch's generator and kept, a byte an "
        "element, for the backward). Needs a CUDA GPU and the triton package (PyTorch's CUDA wheels bring it), refused "
        "before any work elsewhere or where a trial launch fails; not with model.compile or model.compile_model. The "
        "output keeps the residual stream's dtype (model.half_residual).",
    )
    fused_gelu: bool = Field(
        False,
        description="Add the feed-forward layer's bias and apply GELU (exact) in one Triton kernel forward and one "
        "backward that also sums the bias's gradient, one pass fewer over the widest activations (in fp32; the output "
        "in the matrix product's dtype). Needs a CUDA GPU and the triton package; not with model.compile or "
        "model.compile_model.",
    )
    half_residual: bool = Field(
        False,
        description="Under bf16/fp16 autocast, keep the residual stream in the half dtype, as NVIDIA's MLPerf BERT "
        "and Megatron do: each LayerNorm reads and writes half-precision activations (its statistics still in fp32), "
        "so the residual additions and LayerNorms move half the bytes and the matrix products need no cast (the "
        "LayerNorm weights' gradients are rounded to the half dtype, as a half-precision model's are). Off: "
        "autocast's fp32 LayerNorm, whose output (the residual stream) is fp32, as in Hugging Face's model under "
        "autocast. No effect in fp32.",
    )
    static_shapes: bool = Field(
        False,
        description="Pad every training micro-batch to one of four lengths, as NVIDIA's packed BERT runs fixed-size "
        "packs: its tokens to the smallest of four lengths spaced from just above the most any micro-batch of the "
        "first epoch holds (a multiple of 64) down towards the fewest, its masked positions to the most any holds "
        "(evaluation batches to the evaluation set's own budget), so that model.compile compiles each layer once per "
        "shape instead of for any number of tokens. The padding tokens run through the per-token layers and are "
        "dropped before attention; the losses and gradients are those without padding (only the dropout draws "
        "differ). A later epoch's micro-batch with more tokens than the longest length, or more masked positions, is "
        "padded to a shape of its own (the next multiple of 64 tokens, of 8 masked positions): a compilation more "
        "each; the padding depends on the micro-batch alone, so a resumed run pads as the uninterrupted one did. Off: "
        "each micro-batch as long as its sequences.",
    )

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelConfig:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"model.num_attention_heads ({self.num_attention_heads}) must divide "
                f"model.hidden_size ({self.hidden_size})"
            )
        return self

    @model_validator(mode="after")
    def _one_compiled_scope(self) -> ModelConfig:
        if self.compile_model and self.compile:
            raise ValueError("model.compile_model compiles the whole forward pass, model.compile its per-token layers: "
                             "set one of them")  # fmt: skip
        for key in ("fused_norm", "fused_gelu"):
            if getattr(self, key) and (self.compile or self.compile_model):
                raise ValueError(f"model.{key} runs its own kernels where model.compile and model.compile_model "
                                 "compile: set one of them")  # fmt: skip
        if self.compile_model and self.attention == "jagged":
            raise ValueError("model.compile_model runs attention varlen, packed or padded (or auto), not jagged")
        if self.varlen_kernel == "cudnn":
            if self.attention not in ("varlen", "auto"):
                raise ValueError(f"model.varlen_kernel: cudnn is a kernel of the varlen attention, not of model."
                                 f"attention: {self.attention}: set model.attention to varlen or auto")  # fmt: skip
            for key in ("static_shapes", "compile_model"):
                if getattr(self, key):
                    raise ValueError(f"model.varlen_kernel: cudnn takes batches of their sequences' tokens alone, "
                                     f"eager: not with model.{key}")  # fmt: skip
        return self

    @property
    def head_dim(self) -> int:
        """The size of one attention head: hidden_size / num_attention_heads."""
        return self.hidden_size // self.num_attention_heads

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_to_multiple_of
        return (self.vocab_size + m - 1) // m * m


class DataConfig(Section):
    train: PathText = Field("data/demo/train", description="Directory or glob of training HDF5 shards.")
    eval: PathText = Field("data/demo/eval", description="Directory or glob of evaluation HDF5 shards.")
    max_seq_length: int | None = Field(
        None,
        ge=8,
        description="Cut training and evaluation rows to their first this-many tokens, dropping the masked "
        "positions past the cut (None: the shards' width).",
    )
    shuffle: bool = Field(True, description="Shuffle training samples every epoch.")


class OptimizerConfig(Section):
    name: Literal["adamw", "lamb"] = Field("lamb", description="Optimizer: adamw (PyTorch) or lamb (apex semantics).")
    impl: Literal["torch", "apex"] = Field("torch", description="torch: our foreach code / PyTorch; apex: FusedLAMB.")
    lr: float = Field(1e-3, gt=0.0, description="Peak learning rate.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="First-moment decay.")
    beta2: float = Field(0.999, ge=0.0, lt=1.0, description="Second-moment decay.")
    eps: float = Field(1e-6, gt=0.0, description="Added outside the square root of the second moment.")
    weight_decay: float = Field(0.01, ge=0.0, description="Decoupled weight decay (not on bias/LayerNorm).")
    max_grad_norm: float = Field(1.0, gt=0.0, description="LAMB global-norm pre-normalization threshold.")
    use_nvlamb: bool = Field(False, description="LAMB: apply the trust ratio also where weight decay is 0.")


class ScheduleConfig(Section):
    warmup_steps: int = Field(0, ge=0, description="Linear warmup length in optimizer steps.")
    start_warmup_step: int = Field(0, description="Warmup start offset S (may be negative, MLPerf).")
    total_steps: int | None = Field(
        None,
        ge=1,
        description="Decay horizon T in optimizer steps (None: the steps schedule.horizon_samples take).",
    )
    horizon_samples: int | None = Field(
        None,
        ge=1,
        description="Decay horizon as the samples whose optimizer steps it spans, each epoch's short last step "
        "counted (None: budget.max_samples); a multi-fidelity trial's short run keeps its full run's.",
    )
    power: float = Field(1.0, ge=0.0, description="Polynomial decay power p.")
    end_lr: float = Field(0.0, ge=0.0, description="Learning rate e at and after the total steps.")


class ClippingConfig(Section):
    strategy: Literal["none", "after_allreduce", "before_allreduce", "bucketwise"] = Field(
        "none", description="Where gradients are clipped relative to the data-parallel all-reduce."
    )
    max_norm: float = Field(1.0, gt=0.0, description="Clipping threshold, in unscaled gradient units.")
    bucket_cap_mb: float = Field(25.0, gt=0.0, description="DDP gradient bucket size (bucketwise clips per bucket).")


class BatchConfig(Section):
    global_batch_size: int = Field(32, ge=1, description="Sequences per optimizer step over all ranks.")
    micro_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        32,
        description="Sequences per forward/backward on one rank. auto: the largest divisor of the per-rank batch "
        "that fits the device's free memory, measured before the first step (trainer/memory.py).",
    )

    @field_validator("micro_batch_size", mode="before")
    @classmethod
    def _whole_or_auto(cls, value: Any) -> Any:
        if value == "auto":
            return value
        whole = None  # what the other integer fields accept: whole numbers, also as 8.0 or "8", NumPy's integers
        if isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer():
            whole = int(value)
        elif isinstance(value, str) and value.strip().isdigit():
            whole = int(value.strip())
        if whole is not None and whole >= 1:
            return whole
        raise ValueError("must be a whole number >= 1, or auto (the largest that fits the device's memory)")


class BalanceConfig(Section):
    method: Literal["none", "stratified", "local_presort"] = Field(
        "none", description="How sequences are spread over ranks to even out tokens per rank."
    )
    bins: list[Annotated[int, Field(ge=1)]] = Field(
        [64, 128, 192, 256, 320, 384, 448, 511, 512],
        min_length=1,
        description="Upper bounds of the length bins, in tokens, strictly increasing: bin k holds the sequences "
        "longer than bins[k-1] and at most bins[k] long, longer ones go to the last bin (a bin of its own for "
        "full-length sequences balances best).",
    )

    @field_validator("bins")
    @classmethod
    def _strictly_increasing(cls, bins: list[int]) -> list[int]:
        # trainer/balance.py (assign_bins) bins sequences by these bounds and refuses any other list
        if any(later <= earlier for earlier, later in pairwise(bins)):
            raise ValueError("must be strictly increasing upper bounds of sequence lengths, e.g. [64, 128, 512]")
        return bins


class PrecisionConfig(Section):
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field("auto", description="auto: bf16 on GPU, fp32 on CPU.")
    initial_loss_scale: float = Field(2.0**16, gt=0.0, description="fp16 only: starting loss scale.")


class EvalConfig(Section):
    every_samples: int = Field(10_000, ge=1, description="Evaluate after this many training samples.")
    target_mlm_accuracy: float = Field(0.720, gt=0.0, le=1.0, description="Stop when eval MLM accuracy reaches this.")
    stop_at_target: bool = Field(
        True,
        description="Stop at the target (False: record samples to target and train on to the budget, for full "
        "learning curves).",
    )
    max_samples: int = Field(10_000, ge=1, description="Size of the fixed eval set (first samples of data.eval).")
    batch_size: int = Field(64, ge=1, description="Eval sequences per forward pass on one rank.")


class BudgetConfig(Section):
    max_samples: int = Field(
        1_000_000,
        ge=1,
        description="Stop after this many training samples: at the end of the step that reaches them (a step trains "
        "a whole global batch, so 100 at a batch of 32 trains 128).",
    )
    max_time_s: float | None = Field(
        None,
        gt=0.0,
        description="Stop after this many seconds of training (with several ranks, checked where they read back "
        "their losses: every log.every_steps steps, at evaluations and checkpoints, so that all stop together).",
    )


class CheckpointConfig(Section):
    dir: PathText | None = Field(None, description="Directory for checkpoints (None: no checkpoints).")
    every_samples: int | None = Field(None, ge=1, description="Save every this many samples (None: only at end).")
    resume: bool = Field(True, description="Resume from the latest checkpoint in dir if one exists.")
    keep: int | None = Field(
        None,
        ge=1,
        description="Keep this many saves (ckpt-<samples>.pt): after each save the older ones beyond it are deleted "
        "(None: every save of the run stays; a BERT-large save is about 4 GB). Saves of more samples than the one "
        "just made are deleted either way (an earlier run's started afresh in dir with resume false).",
    )


class MLPerfSubmissionConfig(Section):
    org: str = Field("bert-hpo", min_length=1, description="submission_org: the organization that ran the run.")
    division: Literal["open", "closed"] = Field(
        "open", description="submission_division: open, or closed (MLPerf's fixed rules, target 0.720 accuracy)."
    )
    platform: str | None = Field(
        None, min_length=1, description="submission_platform (None: '<ranks>x<device name>', e.g. 8xNVIDIA H100)."
    )
    status: Literal["onprem", "cloud", "research"] = Field(
        "research", description="submission_status: onprem, cloud (available systems) or research (RDI)."
    )
    cache_cleared: bool = Field(
        False, description="cache_clear: whether the launcher dropped the OS caches before this run (we do not)."
    )


class LogConfig(Section):
    every_steps: int = Field(10, ge=1, description="Print and report training progress every this many steps.")
    jsonl: PathText | None = Field(
        None,
        description="Write JSON-lines reports to this file (None: stdout only), added to the end of what it holds (a "
        "resumed run continues its file).",
    )

    noise_scale: bool = Field(True, description="Measure the gradient noise scale B_simple (log.noise_scale_every).")
    noise_scale_every: int = Field(
        1,
        ge=1,
        description="Measure the noise scale on every this-many-th step only (its hooks and read-back cost nothing "
        "on the others); the noise scale changes slowly.",
    )
    noise_scale_decay: float = Field(
        0.95,
        ge=0.0,
        lt=1.0,
        description="EMA decay of the noise scale's numerator and denominator, per measured step (~20 of them).",
    )

    @field_validator("noise_scale_every", "noise_scale_decay", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: Any, info: ValidationInfo) -> Any:
        """null: the default (undoes a base config's value, as `log.noise_scale: false` needs where one sets it)."""
        return cls.model_fields[info.field_name].default if value is None else value

    mlperf: str | None = Field(
        None,
        min_length=1,
        description="Write MLPerf mllog events to this file, rank 0 (None: off; see mlperf_log.py). In an HPO trial "
        "a relative path is under the trial's directory (run_dir/trials/NNNNN/), one log per trial.",
    )
    mlperf_submission: MLPerfSubmissionConfig = Field(
        default_factory=MLPerfSubmissionConfig, description="The submission_* values of the MLPerf log."
    )


class TrainerConfig(Section):
    seed: int = Field(
        1234,
        ge=0,
        le=MAX_SEED,
        description="Seed for weights, masking order and shuffling: 0 to 2**64 - 1, what both of its users take "
        "(torch.manual_seed takes up to 2**64 - 1, NumPy's default_rng no negative seed).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when available.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="BERT architecture.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training and evaluation shards.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="Optimizer and its settings.")
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig, description="MLPerf LR schedule.")
    clipping: ClippingConfig = Field(default_factory=ClippingConfig, description="Gradient clipping strategy.")
    batch: BatchConfig = Field(default_factory=BatchConfig, description="Batch sizes.")
    balance: BalanceConfig = Field(default_factory=BalanceConfig, description="Load balancing over ranks.")
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig, description="Numeric precision.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation and target.")
    budget: BudgetConfig = Field(default_factory=BudgetConfig, description="When to stop.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    log: LogConfig = Field(default_factory=LogConfig, description="Progress output and reports.")


# Keys the trainer reads only under some values of another key: key -> ((that key, the values under which the
# trainer does not read key), ...), any one of them enough. Under such a value every setting of key trains alike, so
# the experiment checks refuse tuning (or comparing) key there (`inert_under`).
# - clipping.max_norm: under clipping.strategy none nothing clips by it (trainer/clipping.py; LAMB's own
#   pre-normalization reads optimizer.max_grad_norm);
# - optimizer.max_grad_norm, optimizer.use_nvlamb: LAMB's settings; AdamW, PyTorch's or apex's, takes neither
#   (trainer/optim.py, build_optimizer). Under clipping.strategy after_allreduce, LAMB's pre-normalization is the clip,
#   at clipping.max_norm (trainer/clipping.py, effective_optimizer_config);
# - precision.initial_loss_scale: only fp16 scales the loss; the scaler is off otherwise (auto is bf16 or fp32;
#   trainer/run.py, trainer/precision.py);
# - model.half_residual: the residual stream's dtype under autocast, which fp32 does not enter (trainer/layer_norm.py).
INERT_UNDER: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "clipping.max_norm": (("clipping.strategy", ("none",)),),
    "optimizer.max_grad_norm": (("optimizer.name", ("adamw",)), ("clipping.strategy", ("after_allreduce",))),
    "optimizer.use_nvlamb": (("optimizer.name", ("adamw",)),),
    "precision.initial_loss_scale": (("precision.dtype", ("auto", "fp32", "bf16")),),
    "model.half_residual": (("precision.dtype", ("fp32",)),),
}


def inert_under(key: str, value_of: Callable[[str], Any]) -> tuple[str, Any] | None:
    """(the key, its value) under which the trainer does not read `key` (`INERT_UNDER`), given the value of each key
    of a config (`value_of("clipping.strategy")`); None where the trainer reads `key`."""
    for governing, values in INERT_UNDER.get(key, ()):
        value = value_of(governing)
        if isinstance(value, str) and value in values:
            return governing, value
    return None


def refuse_unread(cfg: TrainerConfig) -> None:
    """ConfigError naming the settings this run would not read (`unread_settings`), where there are any."""
    if unread := list(unread_settings(cfg).values()):
        raise ConfigError(
            unread[0] if len(unread) == 1 else "settings this run would not read:\n  " + "\n  ".join(unread)
        )


def unread_settings(cfg: TrainerConfig) -> dict[str, str]:
    """Settings of `cfg` that its run would not read: key -> `key: why; what to do`. A decay horizon in samples beside
    one in steps (the steps win), checkpoints every so many samples, or no resume, without a checkpoint directory,
    the noise scale's interval or decay with the noise scale off. `python -m trainer` refuses them before any work,
    and so do the experiment checks (which read the checkpoint's keys where the controller gives trials their
    directory)."""
    unread = {}
    schedule, checkpoint, log = cfg.schedule, cfg.checkpoint, cfg.log
    if schedule.total_steps is not None and schedule.horizon_samples is not None:
        unread["schedule.horizon_samples"] = (
            f"schedule.horizon_samples: {schedule.horizon_samples}, but schedule.total_steps ({schedule.total_steps}) "
            "sets the decay horizon, in steps: set one of them")  # fmt: skip
    if checkpoint.every_samples is not None and checkpoint.dir is None:
        unread["checkpoint.every_samples"] = (
            f"checkpoint.every_samples: {checkpoint.every_samples}, but checkpoint.dir is not set, so no checkpoint "
            "is saved: set checkpoint.dir, or remove checkpoint.every_samples")  # fmt: skip
    if checkpoint.keep is not None and checkpoint.dir is None:
        unread["checkpoint.keep"] = (f"checkpoint.keep: {checkpoint.keep}, but checkpoint.dir is not set, so no "
                                     "checkpoint is saved: set checkpoint.dir, or remove checkpoint.keep")  # fmt: skip
    if not checkpoint.resume and checkpoint.dir is None:
        unread["checkpoint.resume"] = ("checkpoint.resume: false, but checkpoint.dir is not set, so there is no "
                                       "checkpoint to resume from: remove checkpoint.resume")  # fmt: skip
    if not log.noise_scale:
        for key in ("noise_scale_every", "noise_scale_decay"):
            if (value := getattr(log, key)) != LogConfig.model_fields[key].default:
                unread[f"log.{key}"] = (f"log.{key}: {value}, but log.noise_scale is false, so no noise scale is "
                                        f"measured: set log.noise_scale to true, or remove log.{key} (where a base "
                                        f"config sets it, set log.{key}=null)")  # fmt: skip
    return unread


_ALIASES = {"learning_rate": "lr", "batch_size": "global_batch_size", "train_batch_size": "global_batch_size",
            "warmup": "warmup_steps", "clip_norm": "max_norm", "max_grad_norm": "max_norm"}  # fmt: skip


def _section_at(path: tuple) -> type[BaseModel] | None:
    """The config section (a model) the keys of `path` lead to from the root, None where they name no section."""
    section: Any = TrainerConfig
    for part in path:
        field = section.model_fields.get(str(part))
        section = field.annotation if field is not None else None
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            return None
    return section


def _did_you_mean(loc: tuple) -> str:
    """`; did you mean optimizer.lr?` for an unknown key at `loc` close to a key of its section; '' otherwise."""
    section = _section_at(loc[:-1])
    if section is None:
        return ""
    alias = _ALIASES.get(str(loc[-1]))  # names other programs give a key
    close = alias if alias in section.model_fields else closest_name(str(loc[-1]), section.model_fields)
    return f"; did you mean {'.'.join([*map(str, loc[:-1]), close])}?" if close else ""


def _description(loc: tuple) -> str | None:
    """The field description of the key at `loc` (what it holds), None where `loc` names no field of the config."""
    section = _section_at(loc[:-1])
    field = section.model_fields.get(str(loc[-1])) if section is not None else None
    return field.description if field is not None else None


def closest_name(name: str, names: Iterable[str]) -> str | None:
    """The one of `names` closest to a misspelt `name` (difflib's ratio at least 0.6), or None: what every "did you
    mean" of the trainer's and the experiment files' checks names."""
    import difflib

    close = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return close[0] if close else None


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid trainer config ({source}):"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(e["loc"]) + " (`python -m trainer --print-config` shows every key)"
        given = e.get("input")  # a whole section's check (its keys named in the message) got the whole section
        if given is None and e["loc"] and (what := _description(e["loc"])):  # `data.eval=null`: what it must be
            msg = f"needs a value, not null: {what[:1].lower()}{what[1:].rstrip('.')}"
        lines.append(f"  {key}: {msg}" + ("" if isinstance(given, dict) else f" (got {given!r})"))
    return "\n".join(lines)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split `a.b.c=value` into (["a", "b", "c"], parsed value); the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r}: empty part in dotted key {key!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {key}: value {raw!r} is not valid YAML ({e})") from e
    return parts, value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of `raw` with dotted overrides set; intermediate sections are created as needed. A mapping sets
    the keys it names (`optimizer={lr: 0.01}` is `optimizer.lr=0.01`), keeping the section's others."""
    out = yaml.safe_load(yaml.safe_dump(raw)) or {}
    given: dict[str, str] = {}
    for text in overrides:
        parts, value = parse_override(text)
        for key, leaf in _leaves(".".join(parts), value):
            if key in given:  # which was meant is not for the trainer to guess (a config file's twice is refused too)
                raise ConfigError(f"override {text!r}: {key} is given twice ({given[key]!r} before it); give it once")
            given[key] = text
            if leaf == {} and isinstance(_value_at(out, key), dict):
                continue  # an empty mapping for a section there: nothing to set
            set_dotted(out, key, leaf, f"override {text!r}")
    return out


def _leaves(key: str, value: Any) -> list[tuple[str, Any]]:
    """The dotted keys a value sets: itself, or each key of a (non-empty) mapping, nested ones dotted."""
    if isinstance(value, dict) and value:
        return [leaf for name, inner in value.items() for leaf in _leaves(f"{key}.{name}", inner)]
    return [(key, value)]


def _value_at(raw: dict[str, Any], key: str) -> Any:
    """What dotted `key` holds in a nested mapping (None where a part is missing)."""
    node: Any = raw
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def get_dotted(cfg: Any, key: str) -> Any:
    """The value of dotted `key` (`optimizer.lr`) of a config (or any object of nested attributes)."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def set_dotted(raw: dict[str, Any], key: str, value: Any, what: str = "") -> None:
    """Set `a.b.c = value` in a nested mapping in place, creating sections as needed."""
    *sections, leaf = key.split(".")
    node = raw
    for i, part in enumerate(sections):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{what or key}: {'.'.join(sections[: i + 1])} is not a section")
        node = child
    node[leaf] = value


def config_from_dict(raw: dict[str, Any], source: str = "<dict>") -> TrainerConfig:
    """Validate a plain dict into a `TrainerConfig`; errors name the dotted key and the source."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        return TrainerConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None


CONFIGS_DIR = Path(__file__).parent / "configs"  # the shipped configs (`python -m trainer --config NAME`)


def shipped_config(path: str | Path, folder: Path = Path(".")) -> Path | None:
    """The shipped config a bare name stands for (`demo_cpu`, with or without `.yaml`), where no file of that name is
    in `folder`; None for anything else."""
    if "/" in str(path) or (folder / path).exists():  # `./name` is a path, and a file at hand comes first
        return None
    found = CONFIGS_DIR / f"{str(path).removesuffix('.yaml')}.yaml"
    return found if found.is_file() else None


def shipped_config_names() -> str:
    """The shipped configs' names, for help and messages: `bert_large, demo_cpu, gpu_check`."""
    return ", ".join(sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")))


def yaml_error(e: yaml.YAMLError) -> str:
    """A YAML parser's error in one line: where, and the problem (PyYAML's own text spans several, with carets)."""
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return f"{where}not valid YAML ({getattr(e, 'problem', None) or str(e).splitlines()[0]})"


def read_config_text(path: Path) -> str:
    """The text of a config file (UTF-8); a path that is missing, a directory, unreadable or not UTF-8 raises
    `ConfigError` naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} does not exist (a shipped config may be named instead: {shipped_config_names()})"
        ) from None
    except IsADirectoryError:
        found = sorted(p.name for p in path.glob("*.yaml"))[:5]
        hint = f" (it holds {', '.join(found)})" if found else ""
        raise ConfigError(f"config file {path} is a directory: pass one YAML file{hint}") from None
    except UnicodeDecodeError as e:
        line = e.object[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"config file {path} is not UTF-8 text: byte 0x{e.object[e.start]:02x} at offset {e.start} (line {line}) "
            "cannot be decoded; save the file as UTF-8"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None


class DuplicateKeyError(ValueError):
    """A key given twice in one mapping of a YAML document (PyYAML would keep the last silently)."""


def read_yaml(text: str) -> Any:
    """`yaml.safe_load`, but a key given twice in one mapping raises DuplicateKeyError naming its line and its
    dotted place (`line 14: space.optimizer.lr: given twice ...`) instead of the last one silently winning."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_unique_keys(loader, node, [])
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_unique_keys(
    loader: yaml.SafeLoader, node: yaml.Node, place: list[str], seen: set[int] | None = None
) -> None:
    """DuplicateKeyError for the first key given twice in one mapping under `node` (at dotted `place`)."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node checked already (or an anchor that contains itself)
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            where = [*place[:-1], f"{place[-1]}[{i}]"] if place else [f"[{i}]"]
            _check_unique_keys(loader, item, where, seen)
    if not isinstance(node, yaml.MappingNode):
        return
    first_line: dict[Any, int] = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: keys given here override the merged ones
            continue
        key = loader.construct_object(key_node, deep=True) if isinstance(key_node, yaml.ScalarNode) else None
        if isinstance(key_node, yaml.ScalarNode) and isinstance(key, typing.Hashable):
            line = key_node.start_mark.line + 1
            if key in first_line:
                where = ".".join([*place, str(key)])
                raise DuplicateKeyError(f"line {line}: {where}: given twice (first on line {first_line[key]}), and "
                                        "only the last would count; keep one")  # fmt: skip
            first_line[key] = line
        _check_unique_keys(
            loader, value_node, [*place, str(key) if isinstance(key_node, yaml.ScalarNode) else "?"], seen
        )


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> TrainerConfig:
    """Read a YAML config file (or defaults when `path` is None) and apply dotted overrides. A file that sets nothing
    (empty, comments, null) is refused: `{}` says every default."""
    raw: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = shipped_config(path) or Path(path)
        source = str(path)
        try:
            raw = read_yaml(read_config_text(path))
        except DuplicateKeyError as e:
            raise ConfigError(f"config file {path}: {e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path}: {yaml_error(e)}") from None
        if raw is None:  # it would mean every default (BERT-large), which nobody writes by leaving a file empty
            raise ConfigError(
                f"config file {path} sets nothing (it is empty, or only comments or null): write {{}} in it to train "
                "with every default (BERT-large), or the keys to set"
            )
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(raw).__name__}")
        if {"provenance", "config"} <= raw.keys():  # what `hpo export --format json` writes, around a config
            raise ConfigError(
                f"{path} is an `hpo export --format json` answer (provenance, warnings, command, config), not a "
                "trainer config: its `config` member is one; export with --format yaml (the default) for a file "
                "the trainer runs"
            )
    if overrides:
        raw = apply_overrides(raw, overrides)
        source += " + overrides"
    return config_from_dict(raw, source)


def file_in_the_way(directory: Path) -> str | None:
    """What keeps `directory` from being one (or being made): "is a file", "is under F, a file"; None if nothing."""
    blocker = next((p for p in (directory, *directory.parents) if p.exists()), None)
    if blocker is None or blocker.is_dir():
        return None
    return "is a file" if blocker == directory else f"is under {blocker}, a file"


def dump_config(cfg: TrainerConfig) -> str:
    """The resolved config as YAML, loadable again by `load_config`."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
