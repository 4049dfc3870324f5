"""Training-step time of each clipping strategy relative to `none`, with DDP on 2 ranks (gloo on CPU, NCCL on GPU).

Every rank runs the same model on its own fixed batches. With one rank (`--nproc 1`) the model runs as the trainer
runs it on one process: without DDP, so `bucketwise` and `before_allreduce` clip the whole gradient; `--ddp always`
wraps it in DDP all the same (its buckets and communication hooks on one rank: the multi-GPU path's own cost, with an
all-reduce that has nothing to reduce), and `--ddp both` times each strategy both ways in the same run. The strategies
are interleaved round by round (each round times one step of every strategy, in a rotated order), so all of them see
the same machine state. Prints the median step time of each strategy and its ratio to `none`.

    python bench/clipping_overhead.py                      # 2 CPU ranks
    python bench/clipping_overhead.py --device cuda --nproc 2 --size base --breakdown   # + one profiled step of each
    python bench/clipping_overhead.py --device cuda --nproc 1 --ddp both --size large --dtype bf16 --batch 128
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from bench.trainer_throughput import (
    BREAKDOWN_HEADER,
    SIZES,
    breakdown,
    format_breakdown,
    format_top,
    make_samples,
    optimizer_step,
)
from trainer.clipping import GradientClipper
from trainer.config import ClippingConfig, ModelConfig, OptimizerConfig
from trainer.data.batch import pack_batch
from trainer.distributed import DistEnv
from trainer.model import BertForPreTraining, pretraining_loss
from trainer.optim import build_optimizer
from trainer.precision import autocast as autocast_region

STRATEGIES = ["none", "after_allreduce", "before_allreduce", "bucketwise"]


def build(strategy: str, cfg: ModelConfig, env: DistEnv, device: torch.device, bucket_cap_mb: float, probe=None,
          accumulation: int = 1, ddp: bool | None = None):  # fmt: skip
    """The model (in DDP with 2+ ranks, as the trainer has it, or where `ddp` says), its clipper (with a noise-scale
    probe when given) and its optimizer."""
    torch.manual_seed(0)
    with device:  # made and initialized where it trains: on a GPU seconds sooner than on the host, for BERT-large
        model = BertForPreTraining(cfg)
    if probe is not None and accumulation > 1:  # as the trainer: micro-batches are the small batches
        probe.watch_micro_batches([p for p in model.parameters() if p.requires_grad])
    wrapped = None
    if env.enabled if ddp is None else ddp:
        device_ids = [device.index] if device.type == "cuda" else None
        wrapped = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb)
    scaler = torch.amp.GradScaler(device.type, enabled=False)
    clipping = ClippingConfig(strategy=strategy, max_norm=1.0)
    clipper = GradientClipper(clipping, "adamw", model, wrapped, scaler, env, probe)
    optimizer = build_optimizer(model, OptimizerConfig(name="adamw", lr=1e-5))
    return wrapped or model, clipper, optimizer, probe


def step(
    model,
    clipper,
    optimizer,
    probe,
    batch,
    device,
    autocast,
    accumulation: int = 1,
    measured: bool = True,
    profiled: bool = False,
) -> None:
    """One training step; with a probe, measured or not (`log.noise_scale_every`: the trainer measures every k-th);
    `profiled` as in `bench.trainer_throughput.optimizer_step`."""
    if probe is not None:
        probe.measure(measured)
        probe = probe if measured else None
    for i in range(accumulation):  # the same batch every micro-batch: only the time matters here
        around = probe.micro_batch(1 / accumulation, 1.0) if probe is not None and accumulation > 1 else nullcontext()
        with clipper.backward_context(last_micro_batch=i == accumulation - 1), around:
            with autocast_region(device, autocast):
                loss = pretraining_loss(model(batch), batch).total
            (loss / accumulation).backward()
    clipper.before_step(optimizer)
    if probe is not None:
        probe.take()  # the scalar all-reduce, as in the trainer (which reads the numbers back with the loss)
    optimizer_step(optimizer, device, profiled)


@dataclass
class Rank:
    """What every rank of a DDP step benchmark sets up: its device, process group, model config and batch."""

    args: argparse.Namespace
    device: torch.device
    env: DistEnv
    cfg: ModelConfig
    batch: object
    autocast: torch.dtype | None

    @classmethod
    def start(cls, rank: int, args: argparse.Namespace, init_file: str) -> Rank:
        use_cuda = args.device == "cuda"
        if not use_cuda:
            torch.set_num_threads(max(1, args.threads // args.nproc))
        device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
        backend = "nccl" if use_cuda else "gloo"
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=args.nproc)
        env = DistEnv(rank, args.nproc, rank, args.nproc)
        cfg = ModelConfig(vocab_size=30522, max_position_embeddings=args.seq_len, attention=args.attention,
                          **SIZES[args.size])  # fmt: skip
        samples = make_samples(args.batch * args.nproc, args.seq_len, 76, 30522, seed=1)
        batch = pack_batch(samples, np.arange(rank * args.batch, (rank + 1) * args.batch)).to(device)
        return cls(args, device, env, cfg, batch, torch.bfloat16 if args.dtype == "bf16" else None)

    def time_interleaved(self, runs: dict) -> dict:
        """Median-ready step times of every run, one step of each per round in a rotated order (warm-up
        rounds dropped), so all runs see the same machine state."""
        keys, use_cuda = list(runs), self.device.type == "cuda"
        times: dict = {k: [] for k in keys}
        for round_ in range(self.args.warmup + self.args.rounds):
            shift = round_ % len(keys)
            for k in keys[shift:] + keys[:shift]:
                dist.barrier()
                if use_cuda:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                measured = round_ % getattr(self.args, "every", 1) == 0  # noise_scale_overhead --every
                step(*runs[k], self.batch, self.device, self.autocast, self.args.accumulation, measured)
                if use_cuda:
                    torch.cuda.synchronize()
                if round_ >= self.args.warmup:
                    times[k].append(time.perf_counter() - t0)
        return times

    def print_breakdowns(self, runs: dict) -> None:
        """One more step of every run under the profiler (every rank steps, rank 0 prints): where its time goes
        and how many kernels it launched, to tell the clip's own device work from host time."""
        if self.env.rank == 0:
            print(f"  breakdown of one step: {BREAKDOWN_HEADER}")
        for k, run in runs.items():
            dist.barrier()
            parts = breakdown(partial(step, *run, self.batch, self.device, self.autocast, self.args.accumulation),
                              self.device)  # fmt: skip
            if self.env.rank == 0:
                label = k if isinstance(k, str) else f"{k[0]} {'on' if k[1] else 'off'}"
                print(f"  {label:<22} {format_breakdown(parts)}")
                if self.args.top:
                    print(format_top(parts, self.args.top))


def ddp_modes(args: argparse.Namespace) -> list[bool | None]:
    """`--ddp`: None as the trainer has it (DDP with 2+ ranks only), True for DDP on one rank too, both for one rank."""
    return {"auto": [None], "always": [True], "both": [None, True]}[args.ddp]


def run_label(strategy: str, ddp: bool | None, nproc: int) -> str:
    """The strategy's name, with ", DDP" where one rank runs in DDP all the same."""
    return f"{strategy}, DDP" if ddp and nproc == 1 else strategy


def worker(rank: int, args: argparse.Namespace, init_file: str) -> None:
    r = Rank.start(rank, args, init_file)
    runs = {run_label(s, d, args.nproc): build(s, r.cfg, r.env, r.device, args.bucket_cap_mb, ddp=d)
            for d in ddp_modes(args) for s in args.strategies}  # fmt: skip
    times = r.time_interleaved(runs)
    if rank == 0:
        report(args, runs, times)
    if args.breakdown:
        r.print_breakdowns(runs)
    dist.destroy_process_group()


def report(args, runs: dict, times: dict[str, list[float]]) -> None:
    """Median step times, each against `none` run the same way (in DDP or not)."""
    buckets = next((run[1].hook_state.num_buckets for run in runs.values() if run[1].hook_state is not None), "-")
    print(
        f"size={args.size} ranks={args.nproc} device={args.device} dtype={args.dtype} batch/rank={args.batch} "
        f"seq_len={args.seq_len} accumulation={args.accumulation} bucket_cap_mb={args.bucket_cap_mb} "
        f"DDP buckets={buckets} rounds={args.rounds}"
    )
    for d in ddp_modes(args):
        base = statistics.median(times[run_label("none", d, args.nproc)])
        for s in args.strategies:
            label = run_label(s, d, args.nproc)
            med = statistics.median(times[label])
            print(f"  {label:<22} {1e3 * med:9.1f} ms/step   x{med / base:5.3f} vs {run_label('none', d, args.nproc)}")


def parse_args(description: str, every: bool = False) -> argparse.Namespace:
    """The options of the DDP step benchmarks (this one and bench/noise_scale_overhead.py, which has `--every`)."""
    ap = argparse.ArgumentParser(description=description)
    if every:
        ap.add_argument("--every", type=int, default=1, help="the probe measures every this-many-th round")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--size", choices=SIZES, default="cpu")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--accumulation", type=int, default=1, help="micro-batches per step (each of --batch sequences)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="CPU threads shared by the ranks")
    ap.add_argument("--breakdown", action="store_true", help="one profiled step of each: where its time goes")
    ap.add_argument("--top", type=int, default=0, help="with --breakdown: the N kernels that took the most time")
    ap.add_argument("--strategies", type=strategy_list, default=STRATEGIES,
                    help=f"comma-separated, from {','.join(STRATEGIES)} (default all; none always runs)")  # fmt: skip
    ap.add_argument("--ddp", choices=["auto", "always", "both"], default="auto",
                    help="auto: DDP with 2+ ranks only, as the trainer; always: one rank in DDP too; both: one rank, "
                    "each run with and without DDP")  # fmt: skip
    ap.add_argument("--attention", default="auto", choices=["auto", "packed", "padded", "jagged", "varlen"],
                    help="model.attention")  # fmt: skip
    args = ap.parse_args()
    if args.ddp == "both" and args.nproc > 1:
        ap.error("--ddp both is for one rank (--nproc 1): with 2+ ranks every run is in DDP")
    return args


def strategy_list(text: str) -> list[str]:
    """`--strategies`: known names, in STRATEGIES' order, with none (the baseline) always in."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = names - set(STRATEGIES)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(sorted(unknown))}; choose from {', '.join(STRATEGIES)}")
    return [s for s in STRATEGIES if s in names | {"none"}]


def launch(worker_fn, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker_fn, args=(args, os.path.join(tmp, "init")), nprocs=args.nproc, start_method="spawn")


def main() -> None:
    launch(worker, parse_args(__doc__.split("\n")[0]))


if __name__ == "__main__":
    main()
