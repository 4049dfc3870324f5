"""Step-time cost of measuring the gradient noise scale (`log.noise_scale`), with DDP on 2 ranks.

With one rank (`--nproc 1 --accumulation 2`) the model runs as the trainer runs it on one process, without DDP: the
micro-batches are the small batches, seen by a hook on every parameter. `--ddp always` wraps it in DDP all the
same (the probe then also records each bucket in a communication hook).

For each clipping strategy, a training step with the measurement (NormProbe: per-bucket norms before and after
the all-reduce, one all-reduce of a few scalars, the host reading them) is timed against the same step
without it. Runs are interleaved round by round in a rotated order so both see the same machine state.
Prints medians and the ratio (goal: <= 1.02). With `--every K` the probe measures every K-th round only (as
`log.noise_scale_every: K` in the trainer); the ratio is then of the means over the rounds, which include the
measured ones (use a multiple of K rounds).

    python -m bench.noise_scale_overhead                      # 2 CPU ranks
    python -m bench.noise_scale_overhead --accumulation 2     # micro-batches against a rank's batch
    python -m bench.noise_scale_overhead --accumulation 2 --every 8 --rounds 16
    python -m bench.noise_scale_overhead --device cuda --size base --breakdown    # + one profiled measured step
"""

from __future__ import annotations

import argparse
import statistics

import torch.distributed as dist

from bench.clipping_overhead import Rank, build, ddp_modes, launch, parse_args
from trainer.noise_probe import NormProbe


def worker(rank: int, args: argparse.Namespace, init_file: str) -> None:
    r = Rank.start(rank, args, init_file)
    keys = [(s, m) for s in args.strategies for m in (False, True)]

    def probe(measured: bool) -> NormProbe | None:  # its scalars go where the backend reduces them (cuda for NCCL)
        return NormProbe(r.env.world_size, device=r.device) if measured else None

    (ddp,) = ddp_modes(args)  # one way: `--ddp both` is refused here
    runs = {(s, m): build(s, r.cfg, r.env, r.device, args.bucket_cap_mb, probe(m), args.accumulation, ddp)
            for s, m in keys}  # fmt: skip
    times = r.time_interleaved(runs)
    if rank == 0:
        report(args, times)
    if args.breakdown:  # a measured step of each (the probe on)
        r.print_breakdowns(runs)
    dist.destroy_process_group()


def report(args, times) -> None:
    in_ddp = args.nproc > 1 or args.ddp == "always"
    print(
        f"size={args.size} ranks={args.nproc} device={args.device} dtype={args.dtype} batch/rank={args.batch} "
        f"seq_len={args.seq_len} {'DDP' if in_ddp else 'no DDP'} bucket_cap_mb={args.bucket_cap_mb} "
        f"accumulation={args.accumulation} rounds={args.rounds}"
    )
    average = statistics.median if args.every == 1 else statistics.mean
    print(f"  the {average.__name__} of {args.rounds} rounds; the probe measures every {args.every} round(s)")
    for s in args.strategies:
        off, on = average(times[(s, False)]), average(times[(s, True)])
        print(f"  {s:<17} off {1e3 * off:9.1f} ms/step   on {1e3 * on:9.1f} ms/step   x{on / off:5.3f}")


def main() -> None:
    args = parse_args(__doc__.split("\n")[0], every=True)
    if args.ddp == "both":
        raise SystemExit("error: --ddp both is for bench.clipping_overhead; here use auto or always")
    if args.nproc * args.accumulation < 2:
        raise SystemExit(
            "error: the noise scale needs two gradients at least: --nproc 2, or --accumulation 2 on one rank"
        )
    launch(worker, args)


if __name__ == "__main__":
    main()
