"""A 2-rank run with bucket-wise clipping and local presorting learns as well as one process with the same
global batch (the distributed methods must not cost accuracy). About 22 minutes of CPU on a 2-core AMD EPYC, 50 on
an Intel Xeon (family 6 model 106) beside other work, 56 minutes of wall clock there: marked slow.

Each run is judged where it has stopped learning: at 98,304 samples (the learning rate decays over the budget) the
tiny model's masked-LM accuracy moves by less than 0.01 over the last quarter of training. Where it stops is a
matter of the seed: measured on a 2-core AMD EPYC (2026-11-29), one process ended at 0.446 (seed 1234) and 0.404
(seed 7), two ranks at 0.426 and 0.410. A single seed's difference (-0.020, +0.006; -0.022 and +0.034 on 2026-11-28)
is as much the seed's as the method's (on the Intel Xeon, 2026-12-02: one process 0.416 and 0.413, two ranks 0.415 and
0.416), so the test asks for the mean over both seeds: the two ranks' accuracy at
most 0.03 below one process's. Earlier in training the curve is steep and the runs differ in when they take off (at
24,576 samples one process was once still at 0.07 for seed 1234), which says nothing about how well they learn.

    .venv/bin/pytest -m slow tests/trainer/test_accuracy_band.py -s
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from trainer.data.demo_corpus import make_demo_data
from trainer.report import read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

SAMPLES = 98_304
PLATEAU = 0.01  # the last two evaluations of a run that has stopped learning differ by less


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
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)  # against a hang, not a timing
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_jsonl(report)
    return {**records[-1], "evals": [r["mlm_accuracy"] for r in records if r.get("event") == "eval"]}


SEEDS = (1234, 7)
MARGIN = 0.03  # the two ranks' mean accuracy over SEEDS may be at most this much below one process's


def test_two_ranks_bucketwise_local_presort_learn_as_well_as_one_process(tmp_path):
    meta = make_demo_data(tmp_path / "data", documents=4000, log=lambda *_: None)
    finals = {"single": [], "two_ranks": []}
    for seed in SEEDS:
        single = run_trainer(tmp_path, f"single-{seed}", 1, [f"seed={seed}", "batch.micro_batch_size=32"])
        dist = run_trainer(tmp_path, f"two_ranks-{seed}", 2, [
            f"seed={seed}",
            "batch.micro_batch_size=16", "clipping.strategy=bucketwise", "clipping.max_norm=1.0",
            "balance.method=local_presort", "balance.bins=[32,64,96,127,128]",
        ])  # fmt: skip
        print(json.dumps({"seed": seed, "baseline": meta["baseline_mlm_accuracy"], "single": single["evals"],
                          "two_ranks": dist["evals"]}))  # fmt: skip
        for run in (single, dist):
            # An epoch's last step may be smaller, so the runs can stop a few samples apart; each uses the budget.
            assert SAMPLES <= run["samples"] < SAMPLES + 32
            # on the plateau, so that the final accuracy says how well it learned, not when
            assert len(run["evals"]) == 4 and abs(run["evals"][-1] - run["evals"][-2]) < PLATEAU, run["evals"]
        assert single["final_mlm_accuracy"] > 3 * meta["baseline_mlm_accuracy"]  # it learned
        finals["single"].append(single["final_mlm_accuracy"])
        finals["two_ranks"].append(dist["final_mlm_accuracy"])
    assert statistics.mean(finals["two_ranks"]) > statistics.mean(finals["single"]) - MARGIN, finals
