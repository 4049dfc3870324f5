"""Full training step (forward, backward, optimizer) of our unpadded BERT vs Hugging Face `BertForPreTraining`.

Both models have the same size and weights, BERT's dropout (0.1 on hidden states and attention weights), the same
batches (MLPerf-like lengths: many short sequences, a bump at the maximum) and the same optimizer. HF runs padded
with SDPA attention, twice: padded to the shard width (how MLPerf shards are stored) and padded to the longest
sequence of each batch (dynamic padding). Ours runs once per `--variants` entry: an attention kernel
(`model.attention`: padded, packed, jagged, varlen) with `+compile` for the compiled per-token layers (`model.compile`),
`+whole` for the whole forward pass compiled as one graph (`model.compile_model`; on CUDA graphs with `+static`),
`+fused` for the bias-dropout-residual-LayerNorm kernels (`model.fused_norm`), `+gelu` for the bias-GELU kernels
(`model.fused_gelu`), `+cudnn` for the varlen attention on cuDNN's kernel instead of the flash one
(`model.varlen_kernel: cudnn`), `+bf16w` for the weights held in bf16 (a bound for timing: no fp32 master copies);
`--fused-launch` launches the fused kernels as `bench.fused_kernels` found fastest. Steps are
interleaved so all see the same machine state: one at a time from an idle device by default, or `--chain N` in a row
without waiting for the device, as the trainer's loop runs. Prints valid tokens/s and sequences/s of each, the
ratios, and the share of the device's dense bf16 peak at 6·N FLOPs per valid token (`--peak-tflops`).

With `--breakdown`, one more step of each runs under the PyTorch profiler: its time split into attention kernels,
matrix products, the optimizer step's kernels and the rest, and the host time in which the device had nothing to
run.

    python -m bench.trainer_throughput                 # CPU default size
    python -m bench.trainer_throughput --device cuda --size large --dtype bf16 --batch 32 --steps 20 \
        --variants padded,jagged,jagged+compile --breakdown
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from bench.fused_kernels import use_launch
from trainer.config import ModelConfig, OptimizerConfig
from trainer.data.batch import ShapeBudget, masked_counts, pack_batch
from trainer.data.shards import PretrainingSamples
from trainer.hf_weights import load_hf_state_dict
from trainer.model import BertForPreTraining, pretraining_loss
from trainer.optim import build_optimizer
from trainer.precision import autocast as autocast_region

SIZES = {
    "cpu": dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


def mlperf_like_lengths(n: int, max_len: int, rng: np.random.Generator) -> np.ndarray:
    """About 1/4 of sequences at the maximum, the rest a broad hump of short-to-medium lengths."""
    at_max = rng.random(n) < 0.25
    body = np.clip(rng.gamma(2.2, max_len / 7.0, n), 12, max_len).astype(np.int64)
    return np.where(at_max, max_len, body)


def make_samples(n: int, seq_len: int, max_pred: int, vocab: int, seed: int) -> PretrainingSamples:
    rng = np.random.default_rng(seed)
    lengths = mlperf_like_lengths(n, seq_len, rng)
    ids = rng.integers(5, vocab, (n, seq_len)).astype(np.int32)
    mask = (np.arange(seq_len)[None, :] < lengths[:, None]).astype(np.int8)
    ids *= mask
    segments = (np.arange(seq_len)[None, :] >= (lengths // 2)[:, None]).astype(np.int8) * mask
    positions = np.zeros((n, max_pred), np.int32)
    labels = np.zeros((n, max_pred), np.int32)
    for i, length in enumerate(lengths):
        k = min(max_pred, max(1, int(0.15 * length)))
        pos = np.sort(rng.choice(np.arange(1, length - 1), k, replace=False))
        positions[i, :k], labels[i, :k] = pos, ids[i, pos]
        ids[i, pos] = 4
    nsp = rng.integers(0, 2, n).astype(np.int8)
    return PretrainingSamples(ids, mask, segments, positions, labels, nsp)


def hf_inputs(samples: PretrainingSamples, index: np.ndarray, pad_to: int | None, device) -> dict:
    s = samples.subset(index)
    width = pad_to or int(s.lengths.max())
    labels = np.full((len(index), s.max_seq_length), -100, np.int64)
    rows, cols = np.nonzero(s.masked_lm_positions > 0)
    labels[rows, s.masked_lm_positions[rows, cols]] = s.masked_lm_ids[rows, cols]

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a[:, :width]).astype(np.int64)).to(device)

    return dict(
        input_ids=t(s.input_ids),
        attention_mask=t(s.input_mask),
        token_type_ids=t(s.segment_ids),
        labels=t(labels),
        next_sentence_label=torch.from_numpy(s.next_sentence_labels.astype(np.int64)).to(device),
    )


# `--variants` entries: an attention kernel of ours (model.attention), `+compile` for model.compile, `+half` for
# model.half_residual
ATTENTION_KERNELS = ("padded", "packed", "jagged", "varlen", "auto")
# kernel (GPU) or operator (CPU) names by what they compute, for --breakdown; the first match wins
CATEGORIES = (
    ("attention", ("flash", "fmha", "attention", "scaled_dot_product", "softmax")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "sm90", "sm80", "aten::mm", "aten::addmm", "aten::bmm")),
)
# the loss's log-softmax (CUDA: cunn_SoftMaxForward<..., LogSoftMaxForwardEpilogue>) is no attention
NOT_ATTENTION = ("logsoftmax",)


def category(name: str) -> str | None:
    """The CATEGORIES entry a kernel (CPU: operator) of this name counts in, or None (other work)."""
    lowered = name.lower()
    for label, needles in CATEGORIES:
        if label == "attention" and any(n in lowered.replace("_", "") for n in NOT_ATTENTION):
            continue
        if any(n in lowered for n in needles):
            return label
    return None


VARIANT_FLAGS = {
    "compile": "compile",
    "whole": "compile_model",
    "half": "half_residual",
    "static": "static_shapes",
    "fused": "fused_norm",
    "gelu": "fused_gelu",
}
# `+FLAG` -> its switch; `+cudnn` -> model.varlen_kernel: cudnn. `+bf16w`, the benchmark's own: the model's weights
# cast to bf16 (no fp32 master copies; the optimizer updates in fp32 and rounds each step to bf16): what a model
# holding bf16 weights would gain at most over autocast's casts of fp32 weights at every matrix product, a bound for
# timing, not a way to train
BENCH_FLAGS = ("bf16w",)


def parse_variant(text: str) -> dict:
    """`jagged+compile` -> {"attention": "jagged", "compile": True, "compile_model": False, "half_residual": False,
    "static_shapes": False, "fused_norm": False, "fused_gelu": False, "varlen_kernel": "flash"} (the model's
    switches; `bf16_weights` reads the benchmark's own)."""
    kernel, *flags = text.split("+")
    known = (*VARIANT_FLAGS, *BENCH_FLAGS, "cudnn")
    if kernel not in ATTENTION_KERNELS or any(f not in known for f in flags):
        raise SystemExit(
            f"--variants: {text!r} is not KERNEL[+compile|+whole|+fused|+gelu][+half][+static][+bf16w][+cudnn] with "
            "KERNEL one of "
            f"{ATTENTION_KERNELS}"
        )
    variant = {"attention": kernel, **{field: flag in flags for flag, field in VARIANT_FLAGS.items()},
               "varlen_kernel": "cudnn" if "cudnn" in flags else "flash"}  # fmt: skip
    try:  # the switches' own rules (model.compile_model takes no model.compile, nor jagged attention; cudnn: varlen)
        ModelConfig(**variant)
    except ValueError as e:
        raise SystemExit(f"--variants: {text!r}: {e.errors()[0]['msg'] if hasattr(e, 'errors') else e}") from None
    return variant


def bf16_weights(variant: str) -> bool:
    """Whether the variant holds its weights in bf16 (`+bf16w`)."""
    return "bf16w" in variant.split("+")[1:]


def build_models(cfg: ModelConfig, device, seed: int, variants: list[str], hf_too: bool = True):
    """Ours once per variant and HF's, all with the same weights; without `hf_too`, ours alone (HF's is None), its
    weights drawn by our own initialization. All are made and initialized where they train: on a GPU seconds sooner
    than on the host, for BERT-large."""
    torch.manual_seed(seed)
    if not hf_too:
        with device:
            first = BertForPreTraining(cfg)
            ours = {}
            for variant in variants:
                model = BertForPreTraining(cfg.model_copy(update=parse_variant(variant)))
                model.load_state_dict(first.state_dict())
                ours[variant] = (model.to(torch.bfloat16) if bf16_weights(variant) else model).train()
        return ours, None
    import transformers

    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        hidden_dropout_prob=cfg.hidden_dropout_prob,
        attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
        attn_implementation="sdpa",
    )
    with device:
        hf = transformers.BertForPreTraining(hf_cfg).train()
        weights = hf.state_dict()
        ours = {}
        for variant in variants:
            model = BertForPreTraining(cfg.model_copy(update=parse_variant(variant)))
            load_hf_state_dict(model, weights)
            ours[variant] = (model.to(torch.bfloat16) if bf16_weights(variant) else model).train()
    return ours, hf


def batch_max_is_full_length(samples, batch: int, batches: int, seq_len: int) -> bool:
    """Whether every one of the first `batches` batches holds a sequence of the full length: padding to the batch's
    longest is then padding to the full length (on the MLPerf-like mix, 1/4 of sequences are full: from a batch of
    32 on, almost surely)."""
    lengths = samples.lengths[: batch * batches].reshape(batches, batch)
    return bool((lengths.max(axis=1) == seq_len).all())


def hf_parameters(ours: BertForPreTraining) -> int:
    """The parameters Hugging Face's `BertForPreTraining` of the same size has: ours, less the rows by which ours pads
    the vocabulary (the word embeddings' and the MLM decoder's bias)."""
    cfg = ours.config
    return sum(p.numel() for p in ours.parameters()) - (cfg.padded_vocab_size - cfg.vocab_size) * (cfg.hidden_size + 1)


def synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


OPTIMIZER_RANGE = "optimizer step"  # the profiler's name for it: `breakdown` counts what runs from its start on


def optimizer_step(opt, device, profiled: bool = False) -> None:
    """`opt.step()`; in a profiled step, after the device finished the backward, so that the kernels that run from
    the start of OPTIMIZER_RANGE on are the optimizer's."""
    if profiled:
        synchronize(device)
    with torch.profiler.record_function(OPTIMIZER_RANGE):
        opt.step()
        opt.zero_grad(set_to_none=True)


def fixed_shape(samples: PretrainingSamples, batch: int, steps: int) -> ShapeBudget:
    """`model.static_shapes`' budget for the benchmark's `steps` batches of `batch` sequences: one length, above the
    most tokens and masked positions any of them holds (the trainer's has a few lengths, from its first epoch; here
    a length first met in a timed step would time its compilation)."""
    masked = masked_counts(samples)
    spans = [slice(k * batch, (k + 1) * batch) for k in range(steps)]
    return ShapeBudget.fitting(
        max(int(samples.lengths[s].sum()) for s in spans), max(int(masked[s].sum()) for s in spans)
    )


def step_ours(model, opt, samples, index, device, autocast, profiled=False, budget: ShapeBudget | None = None):
    """One training step of ours."""
    batch = pack_batch(samples, index, budget).to(device)
    if model.config.compile_model and device.type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()  # as the trainer's step does
    with autocast_region(device, autocast):
        loss = pretraining_loss(model(batch), batch).total
    loss.backward()
    optimizer_step(opt, device, profiled)


def step_hf(model, opt, samples, index, device, autocast, pad_to, profiled=False):
    inputs = hf_inputs(samples, index, pad_to, device)
    with autocast_region(device, autocast):
        loss = model(**inputs).loss
    loss.backward()
    optimizer_step(opt, device, profiled)


class Timing(NamedTuple):
    seconds: dict  # runner -> seconds of its timed steps
    tokens: dict  # runner -> valid tokens of its timed steps
    steps: int  # timed steps (each runner's)


def time_steps(runners: dict, optimizers: dict, samples, batch: int | dict, warmup: int, steps: int, device,
               deadline: float | None = None, chain: int = 1) -> Timing:  # fmt: skip
    """Seconds of each runner over `steps` timed steps after `warmup`, interleaved so that all see the same machine
    state, and the valid tokens of each runner's timed steps. `batch`: sequences a step, one number for all or one
    per runner (each runner's step k takes the samples k·b to (k+1)·b - 1, so runners of one batch size see the same
    batches). `chain`: timed steps a runner takes in a row before the next runner's, without waiting for the device
    in between, as the trainer's loop runs (it reads the device back every few steps): the host prepares and
    launches a step while the device runs the last one, so host time shows only where it is longer than the
    device's; with 1 (the default) every step is timed from an idle device to an idle device. A runner whose step
    runs out of device memory or fails (a kernel that refuses its input, say) leaves `runners`, said so, and the
    others go on: a GPU is lent for minutes. None left is an error. Past `deadline` (a `time.perf_counter()`
    value) the timing stops after the round under way, once at least one step was timed: fewer steps, but figures,
    where a time limit would leave none."""
    sizes = batch if isinstance(batch, dict) else dict.fromkeys(runners, batch)
    seconds = dict.fromkeys(runners, 0.0)
    tokens = dict.fromkeys(runners, 0)
    timed = 0
    first = {}  # each runner's first step: its compilation, where compiled (minutes for a whole BERT-large)
    rounds = [[k] for k in range(warmup)]
    rounds += [list(range(k, min(k + chain, warmup + steps))) for k in range(warmup, warmup + steps, chain)]
    for round_steps in rounds:
        for name, (run, _) in list(runners.items()):
            indexes = [np.arange(k * sizes[name], (k + 1) * sizes[name]) for k in round_steps]
            synchronize(device)
            t0 = time.perf_counter()
            failure = try_steps(run, device, indexes, opt=optimizers[name])
            if failure:
                drop(name, failure, runners, optimizers, (seconds, tokens), device, sizes[name])
                continue
            if round_steps == [0]:  # (a chained first round, without warm-up, is no one step's time)
                first[name] = time.perf_counter() - t0
            if round_steps[0] >= warmup:
                seconds[name] += time.perf_counter() - t0
                tokens[name] += sum(int(samples.lengths[index].sum()) for index in indexes)
        timed += len(round_steps) if round_steps[0] >= warmup else 0
        last = round_steps[-1] == warmup + steps - 1
        if deadline is not None and timed and time.perf_counter() > deadline and not last:
            print(f"  time is up (--max-seconds): {timed} of {steps} steps timed")
            break
    if runners and first:
        print("  first step (with any compiling): " + ", ".join(f"{n} {first[n]:.1f} s" for n in runners))
    if not runners:
        at = ", ".join(str(b) for b in sorted(set(sizes.values())))
        raise SystemExit(f"every model ran out of device memory or failed at batch {at}: see above; try a smaller "
                         "--batch if they ran out of memory")  # fmt: skip
    return Timing(seconds, tokens, timed)


def try_steps(run, device, indexes: list, **kwargs) -> str | None:
    """Runs one step per index array in a row, then waits for the device; None if they ran, else why not (their
    activations are freed when this returns). A kernel's error surfaces at the synchronization, which is inside."""
    try:
        for index in indexes:
            run(index=index, **kwargs)
        synchronize(device)
    except torch.OutOfMemoryError:
        return "out of device memory"
    except Exception as e:  # a kernel that refuses its input, one this device cannot run, one Triton cannot compile
        first = (str(e).strip().splitlines() or [""])[0]
        return f"failed ({type(e).__name__}: {first[:200]})"
    return None


def drop(name, why: str, runners, optimizers, tallies: tuple[dict, ...], device, batch: int) -> None:
    """A model whose step ran out of device memory or failed leaves the comparison (said so), with its gradients,
    optimizer state and cached blocks freed, so the others still run: at large batches Hugging Face's padded model
    needs several times our activations."""
    print(f"  {name}: {why} at batch {batch}; left out of the comparison")
    runners.pop(name)
    optimizers.pop(name).zero_grad(set_to_none=True)
    for tally in tallies:  # its seconds and tokens so far
        tally.pop(name)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def breakdown(run, device) -> dict[str, float]:
    """One step of `run(profiled=True)` under the profiler: seconds of wall time, of attention and matmul kernels (CPU:
    operators), of the optimizer step's kernels (those that ran from the start of its OPTIMIZER_RANGE on: the step
    waits for the backward before it), of other device work, and of host time with the device idle; and the number
    of kernels (CPU: operators) the step ran, which is what costs host time when the device outruns the host."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        synchronize(device)
        t0 = time.perf_counter()
        run(profiled=True)
        synchronize(device)
        wall = time.perf_counter() - t0
    events = prof.events()
    ranges = [e for e in events if e.name == OPTIMIZER_RANGE and e.device_type == DeviceType.CPU]
    optimizer_from = ranges[-1].time_range.start if ranges else float("inf")
    # A `record_function` range (OPTIMIZER_RANGE, the optimizer's own "Optimizer.step#...") is no work of its own: on
    # a GPU it also appears as a device event spanning the kernels it launched, which are counted themselves.
    work_events = [e for e in events if not getattr(e, "is_user_annotation", False)]
    if cuda:
        work = [(e.name, e.time_range.elapsed_us() / 1e6, e.time_range.start >= optimizer_from)
                for e in work_events if e.device_type == DeviceType.CUDA]  # fmt: skip
    else:
        work = [(e.name, e.self_cpu_time_total / 1e6, e.time_range.start >= optimizer_from)
                for e in work_events if e.device_type == DeviceType.CPU]  # fmt: skip
    split = {"attention": 0.0, "matmul": 0.0, "optimizer": 0.0}
    busy = 0.0
    for name, seconds, in_optimizer in work:
        busy += seconds
        if in_optimizer:
            split["optimizer"] += seconds
        elif (label := category(name)) is not None:
            split[label] += seconds
    other = max(busy - sum(split.values()), 0.0)
    return {"wall": wall, **split, "other device": other,
            "host, device idle": max(wall - busy, 0.0) if cuda else float("nan"), "kernels": len(work),
            "by name": by_name([(name, seconds) for name, seconds, _ in work])}  # fmt: skip


def by_name(work: list[tuple[str, float]]) -> list[tuple[str, float, int]]:
    """(kernel or operator name, seconds, launches) summed over one step, the most time first."""
    totals: dict[str, list] = {}
    for name, seconds in work:
        entry = totals.setdefault(name, [0.0, 0])
        entry[0] += seconds
        entry[1] += 1
    return sorted(((n, t, c) for n, (t, c) in totals.items()), key=lambda row: -row[1])


def format_top(parts: dict, top: int) -> str:
    """The `top` kernels (CPU: operators) of `breakdown`'s step by time, one indented line each."""
    rows = parts["by name"][:top]
    return "\n".join(f"      {1e3 * t:8.2f} ms {c:6d}x  {name[:100]}" for name, t, c in rows)


BREAKDOWN_HEADER = "wall | attention | matmul | optimizer | other device | host, device idle (ms) | kernels"


def format_breakdown(parts: dict[str, float]) -> str:
    """`breakdown`'s numbers in the order of BREAKDOWN_HEADER: milliseconds, then the kernel count."""
    times = [f"{v * 1e3:8.1f}" for k, v in parts.items() if k not in ("kernels", "by name")]
    return " | ".join(times) + f" | {parts['kernels']:7d}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=SIZES, default="cpu")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-pred", type=int, default=76)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--hf-batch", type=int, help="Hugging Face's batch, when it differs from ours (--batch): each "
                    "model at the largest batch it fits, say; ratios are then of sequences a second")  # fmt: skip
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--chain", type=int, default=1, help="timed steps a model takes in a row without waiting "
                    "for the device in between, as the trainer does (1: each from an idle device)")  # fmt: skip
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout (BERT's: 0.1)")
    ap.add_argument(
        "--variants",
        default="auto",
        help="ours, comma-separated: KERNEL[+compile|+whole|+fused|+gelu][+half][+static][+bf16w][+cudnn] (+compile: "
        "model.compile; +whole: model.compile_model; +fused: model.fused_norm; +gelu: model.fused_gelu; +half: "
        "model.half_residual; +static: model.static_shapes, every batch padded to one budget; +bf16w: the weights in "
        "bf16, a bound for timing, not a way to train; +cudnn: model.varlen_kernel: cudnn; "
        "default: auto)",
    )
    ap.add_argument(
        "--fused-launch",
        type=Path,
        help="the fused kernels (+fused, +gelu) launched as this file says "
        "(`python -m bench.fused_kernels --write FILE`: the fastest of its candidates on this GPU)",
    )
    ap.add_argument("--no-hf", action="store_true", help="ours only (for batches HF's padded model cannot fit)")
    ap.add_argument("--breakdown", action="store_true", help="one profiled step of each: where its time goes")
    ap.add_argument("--top", type=int, default=0, help="with --breakdown: the N kernels that took the most time")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100 SXM: 989)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, help="stop timing after the round under way once this long has "
                    "passed since the start, and leave out the breakdown then: fewer steps, but figures")  # fmt: skip
    args = ap.parse_args()
    deadline = None if args.max_seconds is None else time.perf_counter() + args.max_seconds

    device = torch.device(args.device)
    autocast = torch.bfloat16 if args.dtype == "bf16" else None
    dropout = {"hidden_dropout_prob": args.dropout, "attention_probs_dropout_prob": args.dropout}
    cfg = ModelConfig(vocab_size=30522, max_position_embeddings=args.seq_len, **SIZES[args.size], **dropout)
    variants = args.variants.split(",")
    for variant in variants:
        parse_variant(variant)
    if args.fused_launch is not None:
        print(f"fused kernels launched as {args.fused_launch} says: {json.dumps(use_launch(args.fused_launch))}")
    hf_batch = args.hf_batch or args.batch
    most = max(args.batch, 0 if args.no_hf else hf_batch)
    samples = make_samples(most * (args.steps + args.warmup + 1), args.seq_len, args.max_pred, 30522, args.seed)
    ours, hf = build_models(cfg, device, args.seed, variants, hf_too=not args.no_hf)
    # 6·N FLOPs a token: N as Hugging Face's model counts it (ours pads the vocabulary to a multiple of 8)
    parameters = sum(p.numel() for p in hf.parameters()) if hf is not None else hf_parameters(next(iter(ours.values())))
    opt_cfg = OptimizerConfig(name="lamb", lr=1e-4)
    runners = {}
    for variant, model in ours.items():
        budget = fixed_shape(samples, args.batch, args.steps + args.warmup + 1) if model.config.static_shapes else None
        runners[f"ours {variant}"] = (partial(step_ours, model, samples=samples, device=device, autocast=autocast,
                                              budget=budget), model)  # fmt: skip
    if not args.no_hf:
        runners["HF padded to seq-len"] = (partial(step_hf, hf, samples=samples, device=device, autocast=autocast,
                                                   pad_to=args.seq_len), hf)  # fmt: skip
        if batch_max_is_full_length(samples, hf_batch, args.warmup + args.steps + 1, args.seq_len):
            print("HF padded to batch max: not run, every batch holds a full-length sequence (the same as seq-len)")
        else:
            runners["HF padded to batch max"] = (partial(step_hf, hf, samples=samples, device=device,
                                                         autocast=autocast, pad_to=None), hf)  # fmt: skip
    optimizers = {name: build_optimizer(model, opt_cfg) for name, (_, model) in runners.items()}
    sizes = {name: hf_batch if name.startswith("HF") else args.batch for name in runners}
    seconds, tokens, timed = time_steps(
        runners, optimizers, samples, sizes, args.warmup, args.steps, device, deadline, max(args.chain, 1)
    )
    first = next(iter(seconds))
    padding = 1 - tokens[first] / (sizes[first] * timed * args.seq_len)
    print(
        f"size={args.size} ({parameters / 1e6:.0f} M parameters) seq_len={args.seq_len} batch={args.batch}"
        f"{f' hf_batch={hf_batch}' if hf_batch != args.batch and not args.no_hf else ''} "
        f"steps={timed}{f' chain={args.chain}' if args.chain > 1 else ''} device={device} dtype={args.dtype} "
        f"dropout={args.dropout} "
        f"threads={torch.get_num_threads()} padding_fraction={padding:.2f}"
    )
    seq_s = {name: sizes[name] * timed / secs for name, secs in seconds.items()}
    hf_name = next((n for n in ("HF padded to seq-len", "HF padded to batch max") if n in seconds), None)
    hf_label = {"HF padded to seq-len": "HF seq-len", "HF padded to batch max": "HF batch max"}.get(hf_name)
    # Ratios of sequences a second: "FIRST/this" is how many times faster the first model is than this one,
    # "HF .../this" how many times faster this one is than Hugging Face's (with equal batches: of their step times)
    for name, secs in seconds.items():
        tps = tokens[name] / secs
        peak = 6 * parameters * tps / (args.peak_tflops * 1e12)
        versus_hf = f"  {hf_label}/this = {seq_s[name] / seq_s[hf_name]:5.2f}x" if hf_name else ""
        print(f"  {name:<26} {tps:12,.0f} tokens/s  {seq_s[name]:8.2f} seq/s  {peak:6.1%} of peak  "
              f"{first}/this = {seq_s[first] / seq_s[name]:5.2f}x{versus_hf}")  # fmt: skip
    if args.breakdown:
        print_breakdowns(runners, optimizers, sizes, args.warmup + args.steps, device, args.top, deadline)


def print_breakdowns(runners, optimizers, sizes: dict[str, int], at_step: int, device, top: int,
                     deadline: float | None) -> None:  # fmt: skip
    """One profiled step of each model (the batch after the timed ones), while the deadline allows: each costs
    seconds. A step that runs out of memory or fails (a batch never timed) is said so, and the rest still come."""
    if deadline is not None and time.perf_counter() > deadline:
        print("  breakdown left out: --max-seconds has passed")
        return
    print(f"  breakdown of one step: {BREAKDOWN_HEADER}")
    for name, (run, _) in runners.items():
        if deadline is not None and time.perf_counter() > deadline:
            print(f"  breakdown of {name} and after left out: --max-seconds has passed")
            return
        index = np.arange(at_step * sizes[name], (at_step + 1) * sizes[name])
        try:
            parts = breakdown(partial(run, opt=optimizers[name], index=index), device)
        except Exception as e:  # out of memory, a kernel that fails: the others' breakdowns still come
            print(f"  {name:<26} breakdown failed ({type(e).__name__}: {str(e).strip()[:160]})")
            continue
        print(f"  {name:<26} {format_breakdown(parts)}")
        if top:
            print(format_top(parts, top))


if __name__ == "__main__":
    main()
