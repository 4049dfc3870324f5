"""scripts/check_mlperf_logs.sh, the compliance check of every trial's MLPerf log in the GPU experiment: a log that
passes, one that fails, and one of a trial that stopped before its first evaluation (which the rules cannot
accept as a result, and which says nothing about the log's format), with MLPerf's own checker."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from tests.trainer.conftest import make_samples
from tests.trainer.test_mlperf_log import config, train_logged
from trainer.distributed import DistEnv
from trainer.mlperf_log import open_log
from trainer.result import TrainResult, TrainStatus

ROOT = Path(__file__).resolve().parents[2]


def check(trials: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/check_mlperf_logs.sh", str(trials)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable})  # fmt: skip


def test_a_log_without_an_evaluation_is_listed_not_checked_and_a_failing_log_fails_the_check(tmp_path):
    _, good = train_logged(tmp_path / "run")
    trials = tmp_path / "trials"
    for number in ("00000", "00001", "00002"):
        (trials / number).mkdir(parents=True)
    shutil.copy(good, trials / "00000" / "mlperf.log")
    lines = good.read_text().splitlines()
    broken = [line for line in lines if '"key": "run_start"' not in line]  # the rules need run_start
    assert len(broken) == len(lines) - 1
    (trials / "00001" / "mlperf.log").write_text("\n".join(broken) + "\n")
    diverged = open_log(config(path=trials / "00002" / "mlperf.log"), DistEnv(), torch.device("cpu"))
    samples = make_samples([10, 20], seq_len=64, max_pred=8)
    diverged.run_start(1, 3, samples, samples)  # the calls train.py makes for a run that diverged in its first block
    diverged.training(0, 16)
    diverged.run_stop(TrainResult(status=TrainStatus.DIVERGED, samples=8))

    done = check(trials)
    assert done.returncode == 1, done.stderr
    assert f"{trials}/00000/mlperf.log: SUCCESS" in done.stdout
    assert f"{trials}/00001/mlperf.log: FAILED" in done.stdout
    note = "not checked: the trial stopped before its first evaluation (run_stop aborted)"
    assert f"{trials}/00002/mlperf.log: {note}" in done.stdout
    assert done.stdout.splitlines()[-1] == "compliance checker: 1 of 2 trial logs passed"

    shutil.rmtree(trials / "00001")
    done = check(trials)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "compliance checker: 1 of 1 trial logs passed"
    shutil.rmtree(trials / "00000")
    done = check(trials)  # nothing checked is not a pass
    assert done.returncode == 1 and done.stdout.splitlines()[-1] == "compliance checker: 0 of 0 trial logs passed"


def test_the_logs_where_docs_put_them_are_checked_and_the_checkers_output_is_not(tmp_path):
    """`log.mlperf: mlperf/result_0.txt` (docs/mlperf.md) gives each trial RUN_DIR/trials/NNNNN/mlperf/result_0.txt;
    the script found only trials/NNNNN/mlperf.log ("0 of 0 trial logs passed")."""
    _, good = train_logged(tmp_path / "run")
    trials = tmp_path / "trials"
    for number in ("00000", "00001"):
        (trials / number / "mlperf").mkdir(parents=True)
        shutil.copy(good, trials / number / "mlperf" / "result_0.txt")
    for _ in range(2):  # a second check does not take the first one's result_0.txt.checker.txt for a log
        done = check(trials)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[-1] == "compliance checker: 2 of 2 trial logs passed"


def test_a_missing_folder_or_a_python_without_the_checker_is_refused_by_name(tmp_path):
    run = subprocess.run(["bash", "scripts/check_mlperf_logs.sh", str(tmp_path / "nope")], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and f"got: {tmp_path / 'nope'}" in run.stderr and run.stdout == ""
    bare = tmp_path / "python"  # a Python that cannot import mlperf_logging
    bare.write_text("#!/bin/sh\nexit 1\n")
    bare.chmod(0o755)
    script = ROOT / "scripts/check_mlperf_logs.sh"
    run = subprocess.run(["bash", str(script), str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHON": str(bare)})  # fmt: skip
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.startswith(f"error: {bare} has no MLPerf compliance checker (mlperf-logging): run `make setup`")
