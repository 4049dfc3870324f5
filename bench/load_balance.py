"""Simulate the load-balancing methods of trainer/balance.py on an MLPerf-like length distribution (no training).

Lengths model MLPerf BERT phase-2 Wikipedia samples at max_seq_length 512: a spike of 25 % at exactly 512 (long
documents fill the whole window) and 75 % from a gamma bump (shape 3, scale 80: mode 160, mean ~220 after
truncation to [16, 511]) for shorter pairs; the overall mean is ~295 tokens, so padding to 512 wastes ~42 %.

For each layout and method, per step (one micro-batch on every rank):
- token imbalance = max tokens on a rank / mean tokens per rank, averaged over the full steps of an epoch;
- step time vs none = sum over steps of the busiest rank's tokens, relative to `none` (tokens set the time);
- padding waste = padded tokens / all tokens if each rank pads to its batch's longest sequence, or to 512.
Padding to the batch's longest barely beats padding to 512: almost every batch of 16 holds a 512-token sample
(0.75**16 ~ 1 % do not), so balancing only pays off with unpadded (cu_seqlens) kernels.
`global_presort` is a reference that needs global communication: each step's global batch (the random batches
of `none`) sorted by length and dealt in snake order across all ranks.

    python bench/load_balance.py --seed 0 --steps 500 [--bins 128,256,384,511,512]
"""

from __future__ import annotations

import argparse

import numpy as np

from trainer.balance import plan_epoch, presort_node, token_imbalance
from trainer.config import BalanceConfig

DEFAULT_BINS = BalanceConfig().bins  # the trainer's default `balance.bins`
MAX_SEQ_LENGTH = 512
LAYOUTS = {  # name: (world_size, local_world_size, micro_batch_size)
    "1 node x 8 ranks x 16": (8, 8, 16),
    "8 nodes x 8 ranks x 16 (64 ranks)": (64, 8, 16),
}
METHODS = ("none", "stratified", "local_presort", "global_presort")


def mlperf_like_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """25 % exactly 512; the rest gamma(3, 80) truncated to [16, 511] (see module doc)."""
    body = rng.gamma(3.0, 80.0, 2 * n)
    body = body[(body >= 16) & (body < MAX_SEQ_LENGTH)][:n].astype(np.int64)
    return np.where(rng.random(n) < 0.25, MAX_SEQ_LENGTH, body)


def simulated_plan(lengths, method, bins, world_size, local_world_size, micro_batch_size, seed):
    if method == "global_presort":
        plan = plan_epoch(lengths, "none", bins, micro_batch_size, world_size, local_world_size, seed, 0)
        return [presort_node(step, lengths) for step in plan]
    return plan_epoch(lengths, method, bins, micro_batch_size, world_size, local_world_size, seed, 0)


def plan_metrics(plan, lengths) -> dict[str, float]:
    """Metrics over the full steps of the plan (all of them when N is a multiple of the global batch)."""
    tokens = np.array([[lengths[batch].sum() for batch in step] for step in plan], dtype=np.float64)
    padded_longest = sum(len(batch) * lengths[batch].max() for step in plan for batch in step if len(batch))
    n = sum(len(batch) for step in plan for batch in step)
    return {
        "imbalance": float(np.mean([token_imbalance(step) for step in tokens])),
        "worst_step": float(max(token_imbalance(step) for step in tokens)),
        "busiest_tokens": float(tokens.max(axis=1).sum()),
        "waste_longest": 1.0 - tokens.sum() / padded_longest,
        "waste_512": 1.0 - tokens.sum() / (n * MAX_SEQ_LENGTH),
    }


def run_layout(name, layout, bins, steps, seed) -> None:
    rng = np.random.default_rng(seed)
    lengths = mlperf_like_lengths(steps * layout[0] * layout[2], rng)
    rows = {m: plan_metrics(simulated_plan(lengths, m, bins, *layout, seed), lengths) for m in METHODS}
    print(f"\n{name}: {steps} steps, {len(lengths)} samples, mean length {lengths.mean():.1f}, bins {bins}")
    print(
        f"{'method':<16}{'imbalance':>10}{'worst step':>12}{'step time vs none':>19}"
        f"{'pad waste (longest)':>21}{'pad waste (512)':>17}"
    )
    for method, m in rows.items():
        time_ratio = m["busiest_tokens"] / rows["none"]["busiest_tokens"]
        print(
            f"{method:<16}{m['imbalance']:>10.4f}{m['worst_step']:>12.4f}{time_ratio:>19.3f}"
            f"{m['waste_longest']:>21.1%}{m['waste_512']:>17.1%}"
        )
    excess = {m: rows[m]["imbalance"] - 1.0 for m in METHODS}
    print(
        "imbalance excess (imbalance - 1) vs none: "
        + ", ".join(f"{m} {excess[m] / excess['none']:.3f}" for m in METHODS[1:])
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the lengths and of the plans")
    parser.add_argument("--steps", type=int, default=500, help="steps per simulated epoch")
    parser.add_argument("--bins", default=",".join(map(str, DEFAULT_BINS)), help="length bin upper bounds, a,b,c")
    args = parser.parse_args()
    bins = [int(b) for b in args.bins.split(",")]
    for name, layout in LAYOUTS.items():
        run_layout(name, layout, bins, args.steps, args.seed)


if __name__ == "__main__":
    main()
