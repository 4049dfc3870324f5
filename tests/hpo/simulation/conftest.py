"""A small learning-curve table in the format of bench/curves/curves.jsonl, with known curves.

The accuracy of a run rises linearly from 0.05 towards a plateau that depends on log10(lr): best at the
optimizer's sweet spot (adamw 1e-3, lamb 1e-2), lower away from it; each seed adds its own offset; warmup 40 is a
little slower; lr 1e-1 diverges at 3,072 samples. Every number is a formula, so tests can compute what the
surrogate must return independently.
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
