"""`batch.micro_batch_size: auto` on this device: the micro-batch it chooses, the memory it predicted against the
memory a real step takes, and the speed at the chosen micro-batch beside a fixed one.

BERT of `--size` with BERT's dropout on the MLPerf-like length mix of bench/trainer_throughput.py. The trainer's
choice (trainer/memory.py) is made for a rank's batch of `--per-rank` sequences; then one training step (forward,
backward, LAMB) runs at the chosen micro-batch on the longest sequences, the worst case the choice plans for, and
its peak memory is printed beside the prediction (on CUDA the caching allocator's peak; on the CPU the growth of
the process's peak resident memory over the step, against the prediction less the weights, resident before).
Last, `--steps` steps at the chosen micro-batch and at `--baseline` sequences, interleaved, give sequences/s of
each.

    python -m bench.micro_batch_fit                                   # CPU, the small model
    python -m bench.micro_batch_fit --device cuda --size large --dtype bf16 --per-rank 448
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import numpy as np
import torch

from bench.trainer_throughput import SIZES, make_samples, step_ours, synchronize
from trainer.config import ModelConfig, OptimizerConfig
from trainer.memory import choose_micro_batch, size
from trainer.model import BertForPreTraining
from trainer.optim import build_optimizer


def resident_bytes() -> int:
    """This process's resident memory now (Linux)."""
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_resident_bytes() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=SIZES, default="cpu")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--per-rank", type=int, default=64, help="a rank's batch: the choice is one of its divisors")
    ap.add_argument("--baseline", type=int, default=32, help="the fixed micro-batch to compare with")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--attention", default="auto", help="model.attention")
    args = ap.parse_args()

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    autocast = torch.bfloat16 if args.dtype == "bf16" else None
    cfg = ModelConfig(vocab_size=30522, max_position_embeddings=args.seq_len, attention=args.attention,
                      **SIZES[args.size])  # fmt: skip
    samples = make_samples(max(4 * args.per_rank, 1024), args.seq_len, 76, cfg.vocab_size, seed=0)
    torch.manual_seed(0)
    with device:  # made and initialized where it trains: on a GPU seconds sooner than on the host
        model = BertForPreTraining(cfg).train()
    optimizer = build_optimizer(model, OptimizerConfig(name="lamb", lr=1e-4))
    print(f"size={args.size} ({sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters) device={device} "
          f"dtype={args.dtype} attention={args.attention} per_rank={args.per_rank}")  # fmt: skip

    t0 = time.perf_counter()
    fit = choose_micro_batch(model, samples, args.per_rank, device, autocast)
    print(f"{fit.describe()} [{time.perf_counter() - t0:.1f} s]")
    micro = fit.micro_batch_size
    longest = np.argsort(-samples.lengths, kind="stable")[:micro]
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        allocated = torch.cuda.memory_allocated(device)  # the weights: the prediction, as the probes, leaves them out
    before = max(resident_bytes(), peak_resident_bytes())
    try:
        step_ours(model, optimizer, samples, longest, device, autocast)
    except torch.OutOfMemoryError as e:  # the prediction was too low: say by how much the device was short
        need, budget = size(fit.bytes_for(micro)), size(fit.budget_bytes)
        raise SystemExit(f"one step at {micro} x {fit.longest} tokens ran out of memory, predicted {need} of a "
                         f"{budget} budget: {e}") from None  # fmt: skip
    synchronize(device)
    predicted = fit.bytes_for(micro)
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) - allocated
        what = "allocator peak above the weights"
    else:  # the CPU: what the step added to the process's peak; the weights were resident before it
        peak = peak_resident_bytes() - before
        predicted -= sum(p.numel() * p.element_size() for p in model.parameters())
        what = "peak resident memory growth"
    print(
        f"one step at {micro} x {fit.longest} tokens: {what} {size(peak)}, predicted {size(predicted)} "
        f"(measured/predicted {peak / predicted:.3f}), budget {size(fit.budget_bytes)}"
    )

    rng = np.random.default_rng(1)
    seconds = {micro: 0.0, args.baseline: 0.0}
    sequences = dict.fromkeys(seconds, 0)
    for step in range(args.steps + 1):  # the first round warms up
        for m in seconds:
            index = rng.choice(len(samples), m, replace=False)
            synchronize(device)
            t = time.perf_counter()
            step_ours(model, optimizer, samples, index, device, autocast)
            synchronize(device)
            if step:
                seconds[m] += time.perf_counter() - t
                sequences[m] += m
    rates = {m: sequences[m] / seconds[m] for m in seconds}
    for m, rate in rates.items():
        print(
            f"  micro-batch {m:>4}: {rate:8.1f} seq/s  {rate / rates[args.baseline]:5.2f}x micro-batch {args.baseline}"
        )


if __name__ == "__main__":
    main()
