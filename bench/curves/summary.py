"""What a learning-curve table holds, as the tables of bench/curves/README.md: grid and budgets, samples to target
per point and seed, each optimizer's best learning rate per batch size, the noise scale near the target, CPU time.

    python -m bench.curves.summary                                   # hpo/simulation/tables/large_batch.jsonl
    python -m bench.curves.summary --table hpo/simulation/tables/curves.jsonl
    python -m bench.curves.summary --seeds 0 1                       # the seeds generated so far

Definitions (the README's):

- an optimizer's **best learning rate** at a batch size (and warmup): among the learning rates where every recorded
  seed reached the target, the one with the smallest geometric mean of samples to target; none where no rate has
  every seed reaching it;
- the **noise scale near the target** of a run: the last gradient noise scale (B_simple, as the trainer logs it)
  at or before the samples at which the run first reached the target; per batch size, over each optimizer's best
  learning rate and every seed, and pooled over the batch sizes (B_simple is a property of the model at a loss,
  not of the batch that measures it: the pooled median is the model's one figure near the target);
- **CPU time**: the runs' `train_time_s` and `wall_s` summed (each run is one process, one torch thread here).

Reads only; a partly generated table is summarized as far as it goes (the "runs" column says how far).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpo.simulation.table import TABLES

LARGE_TABLE = TABLES / "large_batch.jsonl"


@dataclass
class Point:
    """One (batch, optimizer, warmup, lr) of the table: its runs by seed."""

    batch: int
    optimizer: str
    warmup: int
    lr: float
    runs: dict[int, dict[str, Any]] = field(default_factory=dict)

    def all_hit(self, seeds: list[int]) -> bool:
        """Every one of `seeds` (the table's) ran here and reached the target."""
        return all(s in self.runs and self.runs[s]["samples_to_target"] is not None for s in seeds)

    def geometric_mean(self, seeds: list[int]) -> float | None:
        if not self.all_hit(seeds):
            return None
        return math.exp(statistics.fmean(math.log(r["samples_to_target"]) for r in self.runs.values()))


def noise_at_target(run: dict[str, Any]) -> float | None:
    """The last noise scale logged at or before the run's samples to target; None: a miss, or none logged."""
    hit = run["samples_to_target"]
    if hit is None:
        return None
    before = [value for samples, value in run.get("noise_scale", []) if samples <= hit]
    return before[-1] if before else None


def read(path: Path) -> tuple[dict[str, Any], list[Point]]:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    meta, points = lines[0], {}
    for run in lines[1:]:
        key = (run["global_batch_size"], run["optimizer"], run["warmup_steps"], run["lr"])
        points.setdefault(key, Point(*key)).runs[run["seed"]] = run
    return meta, [points[k] for k in sorted(points)]


def table_seeds(meta: dict[str, Any], points: list[Point]) -> list[int]:
    """The table's seeds: its grid's (meta line) and the recorded ones."""
    return sorted({s for p in points for s in p.runs} | set(meta.get("grid", {}).get("seed", [])))


def best_points(points: list[Point], seeds: list[int]) -> dict[tuple[int, str, int], Point | None]:
    """(batch, optimizer, warmup) -> its best learning rate's point (None: no rate has every seed at the target)."""
    groups: dict[tuple[int, str, int], list[Point]] = defaultdict(list)
    for p in points:
        groups[(p.batch, p.optimizer, p.warmup)].append(p)
    best = {}
    for key, group in groups.items():
        hits = [p for p in group if p.all_hit(seeds)]
        best[key] = min(hits, key=lambda p: p.geometric_mean(seeds)) if hits else None
    return best


def noise_by_batch(points: list[Point], seeds: list[int]) -> dict[int, list[float]]:
    """Per batch size: the noise scale near the target of every seed's run at each optimizer's best learning rate."""
    by_batch: dict[int, list[float]] = defaultdict(list)
    for (batch, _, _), p in sorted(best_points(points, seeds).items()):
        if p is not None:
            by_batch[batch] += [v for v in (noise_at_target(r) for r in p.runs.values()) if v is not None]
    return dict(by_batch)


def markdown(meta: dict[str, Any], points: list[Point], seeds: list[int] | None = None) -> list[str]:
    """The summary's lines; `seeds`: over these seeds only (default: the table's)."""
    seeds = seeds or table_seeds(meta, points)
    points = [Point(p.batch, p.optimizer, p.warmup, p.lr, {s: r for s, r in p.runs.items() if s in seeds})
              for p in points]  # fmt: skip
    best = best_points(points, seeds)
    lines = [f"Samples to target (a miss: its best accuracy in brackets; `-`: not run yet); seeds {seeds}; the best "
             "learning rate in bold, its geometric mean last:", "",
             "| global batch | optimizer | warmup | lr | " + " | ".join(f"seed {s}" for s in seeds) + " | geo. mean |",
             "|---" * (5 + len(seeds)) + "|"]  # fmt: skip
    for p in points:
        cells = []
        for s in seeds:
            run = p.runs.get(s)
            if run is None:
                cells.append("-")
            elif run["samples_to_target"] is not None:
                cells.append(f"{run['samples_to_target']:,}")
            else:
                cells.append(f"miss ({max(a for _, a in run['curve']):.4f})")
        mean = p.geometric_mean(seeds)
        lr = f"**{p.lr:g}**" if best.get((p.batch, p.optimizer, p.warmup)) is p else f"{p.lr:g}"
        lines.append(f"| {p.batch:,} | {p.optimizer} | {p.warmup} | {lr} | " + " | ".join(cells)
                     + f" | {f'{mean:,.0f}' if mean else ''} |")  # fmt: skip
    lines += ["", "Noise scale near the target (B_simple where each optimizer's best learning rate reached it, every "
              "seed; `all`: every batch size's pooled, the model's one figure):", "",
              "| global batch | runs | median | range | batch / median | batch / pooled median |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    noise = noise_by_batch(points, seeds)
    pooled = [v for values in noise.values() for v in values]
    pooled_median = statistics.median(pooled) if pooled else None
    for batch, values in sorted(noise.items()):
        median = statistics.median(values)
        lines.append(f"| {batch:,} | {len(values)} | {median:,.0f} | {min(values):,.0f}-{max(values):,.0f} | "
                     f"{batch / median:.1f} | {batch / pooled_median:.1f} |")  # fmt: skip
    if pooled:
        lines.append(f"| all | {len(pooled)} | {pooled_median:,.0f} | {min(pooled):,.0f}-{max(pooled):,.0f} | | |")
    lines += ["", "Best learning rate with every seed at the target:", ""]
    for (batch, optimizer, warmup), p in sorted(best.items()):
        point = [q for q in points if (q.batch, q.optimizer, q.warmup) == (batch, optimizer, warmup)]
        lacking = any(s not in q.runs for q in point for s in seeds)
        missed = "none yet (runs still missing)" if lacking else "none: no learning rate has every seed at the target"
        found = f"lr {p.lr:g}, {p.geometric_mean(seeds):,.0f} samples ({len(p.runs)} seeds)" if p else missed
        lines.append(f"- batch {batch:,}, {optimizer}, warmup {warmup}: {found}")
    runs = [r for p in points for r in p.runs.values()]
    cpus: dict[str, int] = defaultdict(int)
    for r in runs:
        cpus[r.get("cpu") or "unknown"] += 1
    train, wall = sum(r.get("train_time_s", 0.0) for r in runs), sum(r.get("wall_s", 0.0) for r in runs)
    lines += ["", f"CPU time: {len(runs)} runs, {train / 3600:.1f} h of training and {wall / 3600:.1f} h of "
              "wall-clock, summed over the runs (one process each); CPUs: "
              + ", ".join(f"{c} ({n} runs)" for c, n in sorted(cpus.items()))]  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.curves.summary", description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=LARGE_TABLE, help=f"the table (default {LARGE_TABLE.name})")
    parser.add_argument("--seeds", type=int, nargs="+", help="only these seeds (a table still being generated)")
    args = parser.parse_args(argv)
    meta, points = read(args.table)
    print("\n".join(markdown(meta, points, args.seeds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
