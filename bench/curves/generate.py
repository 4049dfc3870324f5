"""Generate the learning-curve table of our trainer: real `python -m trainer` runs over a grid (resumable).

Every run trains the tiny CPU BERT of `trainer/configs/demo_cpu.yaml` on the generated demo corpus with the
evaluation set-up of the `adam_vs_lamb_demo_cpu` preset (512 eval samples, target MLM accuracy 0.12), to the full
sample budget: `eval.stop_at_target: false`, so the curve goes on past the target and the trainer still
records the samples at which it first reached it. The grid (see README.md beside this file):

    optimizer  adamw, lamb
    lr         3.16e-4 .. 1e-1, 6 points a half-decade apart (log grid)
    warmup     0 and 40 optimizer steps
    batch      global batch 32 (micro 16: 2 accumulation steps) and 128 (micro 32: 4 steps)
    seed       0, 1, 2 (the trainer's seed: weights, masking and data order)

Everything else is the demo config's (beta1 0.9, beta2 0.999, weight decay 0.01, no clipping). Micro-batches
smaller than the global batch let the trainer measure the gradient noise scale on one process.

    python -m bench.curves.generate                 # the whole grid, 2 runs at a time, one thread each
    python -m bench.curves.generate --jobs 1 --limit 4   # a few runs (resumes: finished runs are kept)
    # 20 seeds at each optimizer's best point (hpo/simulation/tables/seeds.jsonl)
    python -m bench.curves.generate --seeds-table
    # global batches 128-2,048 (hpo/simulation/tables/large_batch.jsonl)
    python -m bench.curves.generate --large-batch --jobs 1

The seeds table (`--seeds-table`) is for the verdict's power study (bench/verdict_power.py): with 3
seeds per point, more than 2 confirmation runs would re-read the same curves; at each optimizer's best point of
batch 32 (AdamW lr 1e-3, LAMB lr 1e-2, warmup 0) it records seeds 0-19, in the same format and set-up.

The table is `hpo/simulation/tables/curves.jsonl`: a first line `{"kind": "meta", ...}` (grid, budget, data fingerprint,
CPU), then one `{"kind": "run", ...}` line per finished run, appended as each ends, so an interrupted
generation resumes where it stopped. A table whose meta differs (another grid, other data) is refused, except a
grid grown by learning rates or (the large-batch table) by batch sizes, nothing else changed: its runs stay valid,
so its meta line is updated.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.machine import cpu_model
from hpo.simulation.table import TABLES
from trainer import CURVES_REVISION

ROOT = Path(__file__).resolve().parents[2]
TABLE = TABLES / "curves.jsonl"
DATA = ROOT / "data/demo"
BASE_CONFIG = "trainer/configs/demo_cpu.yaml"

OPTIMIZERS = ("adamw", "lamb")
LRS = tuple(round(10 ** (-3.5 + k / 2), 8) for k in range(6))  # 3.16e-4, 1e-3, ..., 1e-1
WARMUPS = (0, 40)
BATCHES = {32: 16, 128: 32}  # global batch -> micro batch
SEEDS = (0, 1, 2)
SEEDS_TABLE = TABLES / "seeds.jsonl"
BEST_POINTS = (  # each optimizer's best point at batch 32 (README.md): where the power study re-runs seeds
    {"optimizer": "adamw", "lr": LRS[1], "warmup_steps": 0, "global_batch_size": 32},
    {"optimizer": "lamb", "lr": LRS[3], "warmup_steps": 0, "global_batch_size": 32},
)
POWER_SEEDS = tuple(range(20))
LARGE_TABLE = TABLES / "large_batch.jsonl"
# The large-batch table (--large-batch): per global batch its micro-batch, sample budget (grown with the batch so
# that each optimizer's best rate reaches the target), evaluation interval, warmup (1/16 of the budget's samples,
# so it grows with the batch) and learning rates: quarter-decade steps around where each optimizer learned in
# the pilot runs (README.md), none far from it. AdamW's 3.16e-3 at 512 and 1,024 came later (seed 0 was best at the
# top of the first grid there), and batch 2,048 later still (1,024 is under 4x the noise scale measured near the
# target; 2,048's budget is 1.2x 1,024's, as its samples to target extrapolate to about 200-230k): a grown grid
# keeps the runs already made (`load`).
LARGE_BATCHES = {
    128: {"micro": 64, "max_samples": 49_152, "every": 2_048, "warmup_steps": 24,
          "lr": {"adamw": (5.62e-4, 1e-3, 1.78e-3), "lamb": (5.62e-3, 1e-2, 1.78e-2, 3.16e-2)}},
    512: {"micro": 64, "max_samples": 163_840, "every": 8_192, "warmup_steps": 20,
          "lr": {"adamw": (5.62e-4, 1e-3, 1.78e-3, 3.16e-3), "lamb": (1e-2, 1.78e-2, 3.16e-2)}},
    1024: {"micro": 64, "max_samples": 327_680, "every": 16_384, "warmup_steps": 20,
           "lr": {"adamw": (1e-3, 1.78e-3, 3.16e-3), "lamb": (1e-2, 1.78e-2, 3.16e-2)}},
    2048: {"micro": 64, "max_samples": 393_216, "every": 16_384, "warmup_steps": 12,
           "lr": {"adamw": (1e-3, 1.78e-3, 3.16e-3), "lamb": (1e-2, 1.78e-2, 3.16e-2)}},
}  # fmt: skip
MAX_SAMPLES = 12_288
EVAL_EVERY = 1_024
FIXED = {
    "budget.max_samples": MAX_SAMPLES,
    "budget.max_time_s": None,
    "eval.every_samples": EVAL_EVERY,
    "eval.max_samples": 512,
    "eval.target_mlm_accuracy": 0.12,
    "eval.stop_at_target": False,
    "log.every_steps": 4,
}
LARGE_FIXED = {k: v for k, v in FIXED.items() if k not in ("budget.max_samples", "eval.every_samples")}


def large_grid(batches: Iterable[int] | None = None) -> list[dict[str, Any]]:
    """The large-batch table's runs, seed by seed (a partly generated table holds whole seeds first), each seed's
    batches smallest first; with `batches`, only those batch sizes' runs (one batch finished on every seed first)."""
    batches = LARGE_BATCHES.keys() if batches is None else set(batches)
    return [
        {"optimizer": o, "lr": lr, "warmup_steps": plan["warmup_steps"], "global_batch_size": b, "seed": s}
        for s in SEEDS
        for b, plan in LARGE_BATCHES.items()
        if b in batches
        for o in OPTIMIZERS
        for lr in plan["lr"][o]
    ]


def grid(seeds_table: bool = False) -> list[dict[str, Any]]:
    """Every point of the grid, each with its seed: the runs of the table, batch size by batch size and seed by seed
    (a partly generated table holds whole seeds of the first batch size first). With `seeds_table`: the best
    points, seed by seed."""
    if seeds_table:
        return [point | {"seed": s} for s in POWER_SEEDS for point in BEST_POINTS]
    points = itertools.product(BATCHES, SEEDS, OPTIMIZERS, WARMUPS, LRS)
    return [
        {"optimizer": o, "lr": lr, "warmup_steps": w, "global_batch_size": b, "seed": s} for b, s, o, w, lr in points
    ]


def key(run: dict[str, Any]) -> tuple:
    return (run["optimizer"], run["lr"], run["warmup_steps"], run["global_batch_size"], run["seed"])


def data_fingerprint(data: Path = DATA) -> str:
    """sha256 over the demo data's files (names and bytes): the table describes exactly this data."""
    digest = hashlib.sha256()
    for path in sorted(p for p in data.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(data)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def meta(fingerprint: str, seeds_table: bool = False, large_batch: bool = False) -> dict[str, Any]:
    if large_batch:
        plans = json.loads(json.dumps({str(b): plan for b, plan in LARGE_BATCHES.items()}))  # as the file reads
        return {"kind": "meta", "format": 1, "base_config": BASE_CONFIG, "fixed": LARGE_FIXED,
                "grid": {"batches": plans, "seed": list(SEEDS)}, "data_sha256": fingerprint,
                "trainer_revision": CURVES_REVISION}  # fmt: skip
    if seeds_table:
        grid_record: dict[str, Any] = {"points": list(BEST_POINTS), "seed": list(POWER_SEEDS),
                                       "micro_batch_size": {"32": BATCHES[32]}}  # fmt: skip
        return {"kind": "meta", "format": 1, "base_config": BASE_CONFIG, "fixed": FIXED, "grid": grid_record,
                "data_sha256": fingerprint, "trainer_revision": CURVES_REVISION}  # fmt: skip
    return {
        "kind": "meta",
        "format": 1,
        "base_config": BASE_CONFIG,
        "fixed": FIXED,
        "grid": {
            "optimizer": list(OPTIMIZERS),
            "lr": list(LRS),
            "warmup_steps": list(WARMUPS),
            "global_batch_size": list(BATCHES),
            "micro_batch_size": {str(b): m for b, m in BATCHES.items()},
            "seed": list(SEEDS),
        },
        "data_sha256": fingerprint,
        "trainer_revision": CURVES_REVISION,
    }


def overrides(run: dict[str, Any], jsonl: Path, large_batch: bool = False) -> list[str]:
    if large_batch:
        plan = LARGE_BATCHES[run["global_batch_size"]]
        fixed = LARGE_FIXED | {"budget.max_samples": plan["max_samples"], "eval.every_samples": plan["every"]}
        micro = plan["micro"]
    else:
        fixed, micro = FIXED, BATCHES[run["global_batch_size"]]
    values = fixed | {
        "optimizer.name": run["optimizer"],
        "optimizer.lr": run["lr"],
        "schedule.warmup_steps": run["warmup_steps"],
        "batch.global_batch_size": run["global_batch_size"],
        "batch.micro_batch_size": micro,
        "seed": run["seed"],
        "log.jsonl": str(jsonl),
    }
    return [f"{k}={'null' if v is None else v}" for k, v in values.items()]


def train(run: dict[str, Any], threads: int, large_batch: bool = False) -> dict[str, Any]:
    """One real trainer run; its record for the table (the curve, samples to target, seconds, noise scale)."""
    with tempfile.TemporaryDirectory(prefix="curve-") as tmp:
        jsonl = Path(tmp) / "metrics.jsonl"
        env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        command = [sys.executable, "-m", "trainer", "--config", BASE_CONFIG, *overrides(run, jsonl, large_batch)]
        started = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        records = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    finals = [r for r in records if r["kind"] == "final"]
    if proc.returncode not in (0, 3) or not finals:  # 3: diverged, a result like any other
        raise RuntimeError(f"run {key(run)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    final = finals[0]
    evals = [r for r in records if r.get("event") == "eval"]
    progress = [r for r in records if r.get("event") == "progress"]
    return {
        "kind": "run",
        **run,
        "status": final["status"],
        "samples": final["samples"],
        "samples_to_target": final["samples_to_target"],
        "curve": [[e["samples"], round(e["mlm_accuracy"], 6)] for e in evals],
        "loss": [[p["samples"], round(p["loss"], 5)] for p in progress],
        "noise_scale": [[p["samples"], round(p["noise_scale"], 2)] for p in progress if p.get("noise_scale")],
        "train_time_s": round(final["train_time_s"], 2),
        "wall_s": round(wall, 2),
        "threads": threads,
        "cpu": cpu_model(),
    }


def _grown(found: Any, expected: Any, rates: bool = False, batches: bool = False) -> bool:
    """Whether `expected` is `found` with learning rates added (under an "lr" key) or batch sizes added (under the
    "batches" key) and nothing else changed."""
    if isinstance(found, dict) and isinstance(expected, dict):
        if not (found.keys() <= expected.keys() if batches else found.keys() == expected.keys()):
            return False
        return all(_grown(found[k], expected[k], rates or k == "lr", k == "batches") for k in found)
    if rates and isinstance(found, list) and isinstance(expected, list):
        return set(found) <= set(expected)
    return found == expected


def load(table: Path, expected: dict[str, Any]) -> set[tuple]:
    """The keys of the runs already in `table` (after checking its meta line against `expected`)."""
    if not table.exists():
        table.write_text(json.dumps(expected) + "\n")
        return set()
    lines = table.read_text().splitlines()
    found = json.loads(lines[0]) if lines else {}
    if found != expected and _grown(found, expected):
        print(f"{table}: the grid grew (learning rates or batch sizes); its {len(lines) - 1} runs are kept",
              file=sys.stderr)  # fmt: skip
        lines[0] = json.dumps(expected)
        tmp = table.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(table)
        found = expected
    if found != expected:
        changed = sorted(k for k in expected.keys() | found.keys() if found.get(k) != expected.get(k))
        raise SystemExit(
            f"error: {table} was made for another grid, other data or by another revision of the trainer (differs "
            f"in: {', '.join(changed)}; a table without trainer_revision was made by revision 1); "
            "move it away to start a new table"
        )
    return {key(json.loads(line)) for line in lines[1:] if line.strip()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.curves.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--table", type=Path, default=None, help=f"default {TABLE.name} ({SEEDS_TABLE.name} with --seeds-table)"
    )
    parser.add_argument("--seeds-table", action="store_true", help="20 seeds at each optimizer's best point")
    parser.add_argument("--large-batch", action="store_true", help=f"global batches 128-2,048 ({LARGE_TABLE.name})")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2: one per core)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--limit", type=int, default=None, help="stop after this many new runs")
    parser.add_argument(
        "--batches", type=int, nargs="+", default=None, metavar="B",
        help="with --large-batch: only these global batch sizes' runs, e.g. to finish one batch on every seed first",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.batches and not args.large_batch:
        parser.error("--batches picks batch sizes of the large-batch table: add --large-batch")
    unknown = sorted(set(args.batches or ()) - LARGE_BATCHES.keys())
    if unknown:
        parser.error(f"--batches: no batch size {unknown} in the large-batch grid (it has {sorted(LARGE_BATCHES)})")
    if not (DATA / "meta.json").exists():
        subprocess.run([sys.executable, "-m", "trainer.data.demo_corpus", "--out", str(DATA)], cwd=ROOT, check=True)
    if args.seeds_table and args.large_batch:
        parser.error("--seeds-table and --large-batch are two tables: choose one")
    args.table = args.table or (SEEDS_TABLE if args.seeds_table else LARGE_TABLE if args.large_batch else TABLE)
    done = load(args.table, meta(data_fingerprint(), args.seeds_table, args.large_batch))
    runs = large_grid(args.batches) if args.large_batch else grid(args.seeds_table)
    todo = [run for run in runs if key(run) not in done][: args.limit]
    print(f"{len(done)} runs in {args.table}, {len(todo)} to go", file=sys.stderr)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool, args.table.open("a") as out:
        futures = {pool.submit(train, run, args.threads, args.large_batch): run for run in todo}
        for n, future in enumerate(concurrent.futures.as_completed(futures), 1):
            record = future.result()
            out.write(json.dumps(record) + "\n")
            out.flush()
            elapsed = time.perf_counter() - started
            print(
                f"[{n}/{len(todo)}] {record['optimizer']} lr {record['lr']:g} warmup {record['warmup_steps']} "
                f"batch {record['global_batch_size']} seed {record['seed']}: {record['status']}, "
                f"to target {record['samples_to_target']}, {record['wall_s']:.0f} s "
                f"(elapsed {elapsed / 60:.1f} min, about {elapsed / n * (len(todo) - n) / 60:.0f} min left)",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
