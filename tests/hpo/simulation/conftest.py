"""A small learning-curve table in the format of hpo/simulation/tables/curves.jsonl, with known curves.

The accuracy of a run rises linearly from 0.05 towards a plateau that depends on log10(lr): best at the
optimizer's sweet spot (adamw 1e-3, lamb 1e-2), lower away from it; each seed adds its own offset; warmup 40 is a
little slower; lr 1e-1 diverges at 3,072 samples. Every number is a formula, so tests can compute what the
surrogate must return independently.

`write_large_batch_table` writes the format of hpo/simulation/tables/large_batch.jsonl (a budget, interval, warmup and
learning rates per global batch size) with curves from formulas of the same kind, whole or in part.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

LRS = (1e-4, 1e-3, 1e-2, 1e-1)
SEEDS = (0, 1, 2)
MAX_SAMPLES = 8192
EVERY = 1024
SWEET = {"adamw": 1e-3, "lamb": 1e-2}


def accuracy(optimizer: str, lr: float, warmup: int, batch: int, seed: int, samples: int) -> float:
    plateau = 0.2 - 0.05 * abs(math.log10(lr) - math.log10(SWEET[optimizer])) + 0.004 * seed - 0.00001 * batch
    speed = 4096 if warmup == 0 else 5120
    return round(0.05 + (plateau - 0.05) * min(samples / speed, 1.0), 6)


def write_table(path: Path, seeds=SEEDS, lrs=LRS) -> Path:
    meta = {
        "kind": "meta", "format": 1, "base_config": "trainer/configs/demo_cpu.yaml",
        "fixed": {"budget.max_samples": MAX_SAMPLES, "eval.every_samples": EVERY, "eval.target_mlm_accuracy": 0.12},
        "grid": {}, "data_sha256": "synthetic",
    }  # fmt: skip
    lines = [json.dumps(meta)]
    for optimizer in SWEET:
        for lr in lrs:
            for warmup in (0, 40):
                for batch in (32, 128):
                    for seed in seeds:
                        diverged = lr >= 0.1
                        end = 3072 if diverged else MAX_SAMPLES
                        evals = [s for s in range(EVERY, end + 1, EVERY) if not (diverged and s >= end)]
                        curve = [[s, accuracy(optimizer, lr, warmup, batch, seed, s)] for s in evals]
                        lines.append(json.dumps({
                            "kind": "run", "optimizer": optimizer, "lr": lr, "warmup_steps": warmup,
                            "global_batch_size": batch, "seed": seed,
                            "status": "diverged" if diverged else "budget_exhausted", "samples": end,
                            "samples_to_target": None, "curve": curve,
                            "loss": [[s, 7.0 - s / 4096] for s in range(256, end + 1, 256)],
                            "noise_scale": [[s, 100.0 + s / 64] for s in range(256, end + 1, 256)],
                            "train_time_s": 10.0,
                        }))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ large batch
# A table in the format of hpo/simulation/tables/large_batch.jsonl: a plan per global batch size (budget, evaluation
# interval,
# warmup, learning rates: those of the real table's meta line, which the batch_scaling_simulated preset mirrors), no
# budget in `fixed`. The accuracy rises linearly to a plateau at `large_speed(batch)` samples (later at a larger
# batch), the plateau as above.
LARGE_PLAN = {
    128: {"micro": 64, "max_samples": 49_152, "every": 2_048, "warmup_steps": 24,
          "lr": {"adamw": [0.000562, 0.001, 0.00178], "lamb": [0.00562, 0.01, 0.0178, 0.0316]}},
    512: {"micro": 64, "max_samples": 163_840, "every": 8_192, "warmup_steps": 20,
          "lr": {"adamw": [0.000562, 0.001, 0.00178, 0.00316], "lamb": [0.01, 0.0178, 0.0316]}},
    1024: {"micro": 64, "max_samples": 327_680, "every": 16_384, "warmup_steps": 20,
           "lr": {"adamw": [0.001, 0.00178, 0.00316], "lamb": [0.01, 0.0178, 0.0316]}},
    2048: {"micro": 64, "max_samples": 393_216, "every": 16_384, "warmup_steps": 12,
           "lr": {"adamw": [0.001, 0.00178, 0.00316], "lamb": [0.01, 0.0178, 0.0316]}},
}  # fmt: skip


def large_speed(batch: int) -> int:
    return 16_384 * (1 + batch // 256)  # 16,384, 49,152, 81,920, 147,456 samples to the plateau


def large_accuracy(optimizer: str, lr: float, batch: int, seed: int, samples: int) -> float:
    plateau = 0.2 - 0.05 * abs(math.log10(lr) - math.log10(SWEET[optimizer])) + 0.004 * seed
    return round(0.05 + (plateau - 0.05) * min(samples / large_speed(batch), 1.0), 6)


def write_large_batch_table(path: Path, seeds=SEEDS, keep=lambda optimizer, lr, batch, seed: True) -> Path:
    """The large-batch-format table with every run of the plan for which `keep(...)` holds (a partial table
    leaves some out), seed by seed as the generator appends them."""
    plans = {str(b): plan for b, plan in LARGE_PLAN.items()}
    fixed = {"budget.max_time_s": None, "eval.max_samples": 512, "eval.target_mlm_accuracy": 0.12}
    meta = {"kind": "meta", "format": 1, "base_config": "trainer/configs/demo_cpu.yaml", "fixed": fixed,
            "grid": {"batches": plans, "seed": list(seeds)}, "data_sha256": "synthetic"}  # fmt: skip
    lines = [json.dumps(meta)]
    for seed in seeds:
        for batch, plan in LARGE_PLAN.items():
            budget, every = plan["max_samples"], plan["every"]
            for optimizer, lrs in plan["lr"].items():
                for lr in lrs:
                    if not keep(optimizer, lr, batch, seed):
                        continue
                    curve = [
                        [s, large_accuracy(optimizer, lr, batch, seed, s)] for s in range(every, budget + 1, every)
                    ]
                    lines.append(json.dumps({
                        "kind": "run", "optimizer": optimizer, "lr": lr, "warmup_steps": plan["warmup_steps"],
                        "global_batch_size": batch, "seed": seed, "status": "budget_exhausted", "samples": budget,
                        "samples_to_target": None, "curve": curve,
                        "loss": [[s, 7.0 - s / budget] for s in range(4 * batch, budget + 1, 4 * batch)],
                        "noise_scale": [[s, 100.0 + s / 64] for s in range(4 * batch, budget + 1, 4 * batch)],
                        "train_time_s": 10.0,
                    }))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path
