"""How often a gloo rank fails to connect when its peer leaves right after `init_process_group` (as a rank does on
a data error every rank meets before any collective): `torchrun --standalone` starts of two ranks, rank 0 leaving at
once, counted with PyTorch's bare `init_process_group` and with the trainer's (`trainer.distributed`, which meets at a
barrier after it on gloo). `--busy` busy loops run beside the starts: the race shows on a loaded machine.

    python -m bench.gloo_init_race --starts 50 --busy 3

A start counts as failed when a rank's `init_process_group` (or the barrier) raised.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

VARIANTS = ("bare", "trainer")
FAILED = "GLOO_RACE_FAILED"


def rank_main(variant: str) -> None:
    """One rank under torchrun: connect, then rank 0 leaves at once; a rank whose connection failed says so."""
    import torch
    import torch.distributed as dist

    from trainer.distributed import COLLECTIVE_TIMEOUT, dist_env_from_environ, init_process_group

    try:
        if variant == "bare":
            dist.init_process_group("gloo", timeout=COLLECTIVE_TIMEOUT)
        else:
            init_process_group(dist_env_from_environ(), torch.device("cpu"))
    except Exception as e:
        print(f"{FAILED} rank {os.environ['RANK']}: {str(e).splitlines()[0][:200]}", flush=True)
        os._exit(1)
    os._exit(0)  # rank 0 leaves at once; torchrun waits for rank 1, which leaves as soon as it is connected


def failed_starts(variant: str, starts: int) -> int:
    failed = 0
    for _ in range(starts):
        ran = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
             "bench.gloo_init_race", "--rank", variant],
            capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        failed += FAILED in ran.stdout
    return failed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gloo_init_race", description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=50, help="torchrun starts of each variant")
    parser.add_argument("--busy", type=int, default=3, help="busy loops beside the starts")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--rank", choices=VARIANTS, help=argparse.SUPPRESS)  # a rank's own process
    args = parser.parse_args(argv)
    if args.rank:
        rank_main(args.rank)
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:
        parser.error(f"--variants: {unknown[0]!r} is not one of {', '.join(VARIANTS)}")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        for variant in variants:
            failed = failed_starts(variant, args.starts)
            print(f"{variant}: a rank failed to connect in {failed} of {args.starts} starts", flush=True)
    finally:
        for process in busy:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
