"""bench.curves.summary on a small table whose answers are worked out by hand."""

from __future__ import annotations

import json
import math

from bench.curves import summary


def run(batch, optimizer, lr, seed, hit, noise, curve_top=0.13):
    return {"kind": "run", "optimizer": optimizer, "lr": lr, "warmup_steps": 0, "global_batch_size": batch,
            "seed": seed, "status": "reached_target" if hit else "budget_exhausted", "samples": 4096,
            "samples_to_target": hit, "curve": [[1024, 0.05], [4096, curve_top if hit else 0.09]],
            "noise_scale": noise, "train_time_s": 1800.0, "wall_s": 1900.0, "cpu": "AMD EPYC"}  # fmt: skip


def write(tmp_path, runs, seeds=(0, 1)):
    path = tmp_path / "t.jsonl"
    meta = {"kind": "meta", "grid": {"seed": list(seeds)}}
    path.write_text("\n".join(json.dumps(r) for r in [meta, *runs]) + "\n")
    return path


RUNS = [
    # batch 64, adamw: lr 1e-3 hits on both seeds (2,000 and 3,200: geometric mean 2,530); lr 3e-3 only on seed 0
    run(64, "adamw", 1e-3, 0, 2000, [[1000, 50.0], [2000, 80.0], [3000, 99.0]]),
    run(64, "adamw", 1e-3, 1, 3200, [[1000, 60.0], [3000, 120.0], [4000, 150.0]]),
    run(64, "adamw", 3e-3, 0, 1000, [[1000, 10.0]]),
    run(64, "adamw", 3e-3, 1, None, [[1000, 10.0]]),
    # batch 64, lamb: one rate, both seeds hit
    run(64, "lamb", 1e-2, 0, 1500, [[1024, 30.0]]),
    run(64, "lamb", 1e-2, 1, 1800, [[1024, 40.0], [2048, 999.0]]),
    # batch 256, lamb: seed 1 not run yet
    run(256, "lamb", 1e-2, 0, 5000, [[4096, 200.0]]),
]


def test_best_rates_noise_near_the_target_and_cpu_time(tmp_path):
    meta, points = summary.read(write(tmp_path, RUNS))
    seeds = summary.table_seeds(meta, points)
    best = summary.best_points(points, seeds)
    assert best[(64, "adamw", 0)].lr == 1e-3  # the only rate with every seed at the target
    assert math.isclose(best[(64, "adamw", 0)].geometric_mean(seeds), math.sqrt(2000 * 3200))
    assert best[(64, "lamb", 0)].lr == 1e-2 and best[(256, "lamb", 0)] is None  # seed 1 missing at 256
    # the last value at or before each hit: adamw 80 (at 2,000) and 120 (at 3,000 <= 3,200); lamb 30 and 40
    assert summary.noise_by_batch(points, seeds) == {64: [80.0, 120.0, 30.0, 40.0]}
    text = "\n".join(summary.markdown(meta, points))
    assert "| 64 | 4 | 60 | 30-120 | 1.1 | 1.1 |" in text  # median of 30, 40, 80, 120 = 60; 64 / 60
    assert "| all | 4 | 60 | 30-120 | | |" in text  # one batch size: pooled is the same
    assert "| 64 | adamw | 0 | **0.001** | 2,000 | 3,200 | 2,530 |" in text
    assert "| 64 | adamw | 0 | 0.003 | 1,000 | miss (0.0900) |  |" in text
    assert "batch 256, lamb, warmup 0: none yet (runs still missing)" in text
    assert "7 runs, 3.5 h of training and 3.7 h of wall-clock" in text and "AMD EPYC (7 runs)" in text


def test_a_subset_of_seeds_summarizes_what_is_generated_so_far(tmp_path):
    meta, points = summary.read(write(tmp_path, RUNS))
    text = "\n".join(summary.markdown(meta, points, seeds=[0]))
    assert "batch 256, lamb, warmup 0: lr 0.01, 5,000 samples (1 seeds)" in text
    assert "| 64 | adamw | 0 | **0.003** | 1,000 | 1,000 |" in text  # on seed 0 alone the faster rate is best
    # near the target on seed 0: adamw 3e-3 10 and lamb 30 at 64, lamb 200 at 256; pooled median 30
    assert "| 64 | 2 | 20 | 10-30 | 3.2 | 2.1 |" in text and "| 256 | 1 | 200 | 200-200 | 1.3 | 8.5 |" in text
    assert "| all | 3 | 30 | 10-200 | | |" in text
