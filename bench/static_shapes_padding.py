"""The padding `model.static_shapes` computes and throws away, counted (not timed) on the MLPerf-like length mix.

For each balancing method and micro-batch size, one epoch's plan of `--sequences` sequences drawn from
`bench/load_balance.py`'s length mix (seed `--seed`), the share of the padded tokens that are padding with the
trainer's budget (`trainer.data.batch.training_budget`: TOKEN_LEVELS lengths from above the largest micro-batch
down towards the smallest full one) and with a single length above the largest (what one compiled shape would cost):

    python -m bench.static_shapes_padding
    python -m bench.static_shapes_padding --sequences 204800 --micro 32,128,256
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.load_balance import mlperf_like_lengths
from trainer.balance import plan_epoch
from trainer.config import BalanceConfig
from trainer.data.batch import TOKEN_LEVELS, ShapeBudget, training_budget


def padding_share(tokens: np.ndarray, budget: ShapeBudget) -> float:
    """The share of the padded tokens of micro-batches of `tokens` tokens that are padding under `budget`."""
    return 1 - float(tokens.sum()) / sum(budget.pad_to(int(t)) for t in tokens)


def epoch_padding(lengths: np.ndarray, method: str, micro: int, seed: int) -> tuple[float, float, tuple[int, ...]]:
    """(share with the trainer's levels, share with one length, the levels) for one epoch of `lengths`."""
    plan = plan_epoch(lengths, method, BalanceConfig().bins, micro, 1, 1, seed, 0)
    tokens = np.array([int(lengths[b].sum()) for step in plan for b in step])
    sizes = np.array([len(b) for step in plan for b in step])
    levels = training_budget(tokens, sizes, 1)
    return (
        padding_share(tokens, levels),
        padding_share(tokens, ShapeBudget.fitting(int(tokens.max()), 1)),
        levels.levels,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=51_200, help="sequences in the epoch")
    ap.add_argument("--micro", default="32,128", help="micro-batch sizes, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    lengths = mlperf_like_lengths(args.sequences, np.random.default_rng(args.seed))
    print(f"{args.sequences:,} sequences of the MLPerf-like length mix (seed {args.seed}), {TOKEN_LEVELS} lengths")
    print("| balance.method | micro-batch | padding, the trainer's lengths | padding, one length | lengths |")
    print("|---|---|---|---|---|")
    for method in ("none", "stratified"):
        for micro in (int(m) for m in args.micro.split(",")):
            levels, one, lengths_of = epoch_padding(lengths, method, micro, args.seed)
            print(f"| {method} | {micro} | {levels:.1%} | {one:.1%} | {', '.join(f'{n:,}' for n in lengths_of)} |")


if __name__ == "__main__":
    main()
