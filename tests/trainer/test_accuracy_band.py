"""A 2-rank run with bucket-wise clipping and local presorting learns as well as one process with the same
global batch (the distributed methods must not cost accuracy). Minutes of CPU: marked slow.

    .venv/bin/pytest -m slow tests/trainer/test_accuracy_band.py -s
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainer.data.demo_corpus import make_demo_data
from trainer.report import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SAMPLES = 24_576


def run_trainer(tmp_path, name: str, nproc: int, extra: list[str]) -> dict:
    report = tmp_path / f"{name}.jsonl"
    overrides = [
        f"data.train={tmp_path / 'data' / 'train'}", f"data.eval={tmp_path / 'data' / 'eval'}",
        "optimizer.name=adamw", "optimizer.lr=2e-3", "schedule.warmup_steps=30", "batch.global_batch_size=32",
        f"budget.max_samples={SAMPLES}", "budget.max_time_s=null", f"eval.every_samples={SAMPLES // 4}",
        "eval.target_mlm_accuracy=1.0", f"log.jsonl={report}", "log.every_steps=50", *extra,
    ]  # fmt: skip
    launcher = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                     f"--nproc_per_node={nproc}"]  # fmt: skip
    cmd = [*launcher, "-m", "trainer", "--config", "trainer/configs/demo_cpu.yaml", *overrides]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, 2 // nproc))}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_jsonl(report)[-1]


@pytest.mark.parametrize("seed", [1234, 7])
def test_two_ranks_bucketwise_local_presort_match_one_process(tmp_path, seed):
    meta = make_demo_data(tmp_path / "data", documents=4000, log=lambda *_: None)
    single = run_trainer(tmp_path, "single", 1, [f"seed={seed}", "batch.micro_batch_size=32"])
    dist = run_trainer(tmp_path, "two_ranks", 2, [
        f"seed={seed}",
        "batch.micro_batch_size=16", "clipping.strategy=bucketwise", "clipping.max_norm=1.0",
        "balance.method=local_presort", "balance.bins=[32,64,96,127,128]",
    ])  # fmt: skip
    baseline = meta["baseline_mlm_accuracy"]
    print(json.dumps({"seed": seed, "baseline": baseline, "single": single["final_mlm_accuracy"],
                      "two_ranks": dist["final_mlm_accuracy"]}))  # fmt: skip
    # An epoch's last step may be smaller, so the runs can stop a few samples apart; both must use the budget.
    assert SAMPLES <= single["samples"] < SAMPLES + 32 and SAMPLES <= dist["samples"] < SAMPLES + 32
    assert single["final_mlm_accuracy"] > 1.5 * baseline
    assert abs(single["final_mlm_accuracy"] - dist["final_mlm_accuracy"]) < 0.03
