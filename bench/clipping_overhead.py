"""Training-step time of each clipping strategy relative to `none`, with DDP on 2 ranks (gloo on CPU, NCCL on GPU).

Every rank runs the same model on its own fixed batches. The strategies are interleaved round by round (each
round times one step of every strategy, in a rotated order), so all of them see the same machine state. Prints
the median step time of each strategy and its ratio to `none`.

    python bench/clipping_overhead.py                      # 2 CPU ranks
    python bench/clipping_overhead.py --device cuda --nproc 2 --size base
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from bench.trainer_throughput import SIZES, make_samples
from trainer.clipping import GradientClipper
from trainer.config import ClippingConfig, ModelConfig, OptimizerConfig
from trainer.data.batch import pack_batch
from trainer.distributed import DistEnv
from trainer.model import BertForPreTraining, pretraining_loss
from trainer.optim import build_optimizer

STRATEGIES = ["none", "after_allreduce", "before_allreduce", "bucketwise"]


def build(strategy: str, cfg: ModelConfig, env: DistEnv, device: torch.device, bucket_cap_mb: float):
    torch.manual_seed(0)
    model = BertForPreTraining(cfg).to(device)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=bucket_cap_mb
    )
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    clipper = GradientClipper(ClippingConfig(strategy=strategy, max_norm=1.0), "adamw", model, ddp, scaler, env)
    optimizer = build_optimizer(model, OptimizerConfig(name="adamw", lr=1e-5))
    return ddp, clipper, optimizer


def step(ddp, clipper, optimizer, batch, device, autocast) -> None:
    with clipper.backward_context(last_micro_batch=True):
        with torch.autocast(device.type, dtype=autocast or torch.float32, enabled=autocast is not None):
            loss = pretraining_loss(ddp(batch), batch).total
        loss.backward()
    clipper.before_step(optimizer)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def worker(rank: int, args: argparse.Namespace, init_file: str) -> None:
    use_cuda = args.device == "cuda"
    if not use_cuda:
        torch.set_num_threads(max(1, args.threads // args.nproc))
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=args.nproc)
    env = DistEnv(rank, args.nproc, rank, args.nproc)
    cfg = ModelConfig(vocab_size=30522, max_position_embeddings=args.seq_len, **SIZES[args.size])
    samples = make_samples(args.batch * args.nproc, args.seq_len, 76, 30522, seed=1)
    batch = pack_batch(samples, np.arange(rank * args.batch, (rank + 1) * args.batch)).to(device)
    autocast = torch.bfloat16 if args.dtype == "bf16" else None
    runs = {s: build(s, cfg, env, device, args.bucket_cap_mb) for s in STRATEGIES}
    times: dict[str, list[float]] = {s: [] for s in STRATEGIES}
    for round_ in range(args.warmup + args.rounds):
        order = STRATEGIES[round_ % 4 :] + STRATEGIES[: round_ % 4]
        for s in order:
            dist.barrier()
            if use_cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(*runs[s], batch, device, autocast)
            if use_cuda:
                torch.cuda.synchronize()
            if round_ >= args.warmup:
                times[s].append(time.perf_counter() - t0)
    if rank == 0:
        report(args, runs["bucketwise"][1], times)
    dist.destroy_process_group()


def report(args, clipper, times: dict[str, list[float]]) -> None:
    base = statistics.median(times["none"])
    buckets = clipper.hook_state.num_buckets
    print(
        f"size={args.size} ranks={args.nproc} device={args.device} dtype={args.dtype} batch/rank={args.batch} "
        f"seq_len={args.seq_len} bucket_cap_mb={args.bucket_cap_mb} buckets={buckets} rounds={args.rounds}"
    )
    for s in STRATEGIES:
        med = statistics.median(times[s])
        print(f"  {s:<17} {1e3 * med:9.1f} ms/step   x{med / base:5.3f} vs none")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--size", choices=SIZES, default="cpu")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="CPU threads shared by the ranks")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, args=(args, os.path.join(tmp, "init")), nprocs=args.nproc, start_method="spawn")


if __name__ == "__main__":
    main()
