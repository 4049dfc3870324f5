"""The asha tuner end to end: real trainer processes, a real SQLite database, rungs of 32 and 96 samples.

Three configurations train to the first rung, then the best of them is promoted and continues from its rung
checkpoint. Its accuracy curve, rung by rung, must be the very curve (bit for bit) of the same configuration
trained straight to the top rung by the trainer's own command line: a promotion only saves the samples
already trained, it changes nothing that is learned. The evaluation loss and the training loss are compared as
well as the accuracy: on this tiny model the accuracy alone does not tell a resume without the RNG state
(dropout draws other masks) from an exact one, the losses do.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpo.engine.study import Study
from hpo.experiment import stored_form
from hpo.runners import build_runner
from hpo.storage import SqlStorage
from hpo.storage.base import ExperimentStatus
from hpo.trials import TrialKind, TrialState
from tests.hpo.engine.test_study import make_spec, run_study
from trainer.report import read_jsonl

PRESETS = Path(__file__).resolve().parents[3] / "search_spaces" / "presets"
# rungs: 96 x 3^-k for k = 1..0, on multiples of eval.every_samples = 16 -> [32, 96] (hpo/experiment/rungs.py)
RUNG_SAMPLES = (32, 96)
OPTIONS = {"sampler": "random", "eta": 3, "min_samples": 32, "max_samples": 96}
# A target no trial reaches, so none stops early and the best one at rung 0 is promoted.
TINY_ASHA = {"budget.max_samples": 96, "eval.every_samples": 16, "eval.target_mlm_accuracy": 0.99}


def asha_spec(tmp_path: Path, runner=None, resources=None):
    # 4 trials, one at a time: 3 new configurations at rung 0, then the top floor(3 / eta) = 1 of them promoted
    return make_spec(tmp_path, name="asha", tuner="asha", trials=4, tuner_options=OPTIONS,
                     budget={"max_parallel": 1}, runner=runner, resources=resources, **TINY_ASHA)  # fmt: skip


def accuracies(storage, trial, name="mlm_accuracy") -> list[tuple[int, float]]:
    return [(m.samples, m.value) for m in storage.get_metrics(trial.id, name)]


def trial_dir(tmp_path: Path, trial) -> Path:
    return tmp_path / "run" / "trials" / f"{trial.number:05d}"


def check_promotion(tmp_path: Path, storage, eid):
    """The first three trials are new configurations at rung 0, the fourth is the best of them at the top rung,
    resumed from its rung-0 checkpoint; returns (its rung-0 trial, the promoted trial)."""
    trials = storage.list_trials(eid)
    assert [t.state for t in trials] == [TrialState.COMPLETED] * 4, [(t.number, t.state, t.reason) for t in trials]
    assert [round(t.budget * 96) for t in trials] == [RUNG_SAMPLES[0]] * 3 + [RUNG_SAMPLES[1]]
    low, promoted = trials[:3], trials[3]
    assert len({tuple(sorted(t.params.items())) for t in low}) == 3
    # The best at rung 0: the highest best accuracy (no target reached: every cost is a miss
    # ranked by its gap to the target), the earliest on ties.
    best = max(low, key=lambda t: (max(v for _, v in accuracies(storage, t)), -t.number))
    assert promoted.params == best.params
    assert [s for s, _ in accuracies(storage, best)] == [16, 32]
    assert [s for s, _ in accuracies(storage, promoted)] == [48, 64, 80, 96]  # only the new samples trained
    assert promoted.metrics["samples"] == 96
    stderr = (trial_dir(tmp_path, promoted) / "stderr.log").read_text()
    assert "resumed from" in stderr and "at step 4, 32 samples" in stderr, stderr[-2000:]
    return best, promoted


@pytest.mark.slow  # 19 s: two real trainings; promotions on the simulated runner are in the default suite
def test_a_promoted_trial_continues_bit_for_bit_as_the_same_configuration_trained_straight(tmp_path):
    storage, eid, status = run_study(tmp_path, asha_spec(tmp_path))
    assert status == ExperimentStatus.FINISHED
    low, promoted = check_promotion(tmp_path, storage, eid)
    names = ("mlm_accuracy", "mlm_loss", "loss")  # the eval curves and the training loss every 2 steps
    promoted_curves = {n: accuracies(storage, low, n) + accuracies(storage, promoted, n) for n in names}

    # The promoted trial's own trainer config (its budget is the top rung), trained from scratch, in one go.
    straight = yaml.safe_load((trial_dir(tmp_path, promoted) / "trial.yaml").read_text())
    assert straight["budget"]["max_samples"] == 96 and straight["checkpoint"]["resume"] is True
    straight["checkpoint"]["dir"] = None
    straight["log"]["jsonl"] = str(tmp_path / "straight.jsonl")
    (tmp_path / "straight.yaml").write_text(yaml.safe_dump(straight))
    # The same environment as the trial: the local runner gives its one slot all the cores (hpo/runners/local.py).
    threads = str(os.cpu_count() or 1)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "trainer", "--config", str(tmp_path / "straight.yaml")],
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "resumed from" not in proc.stderr
    records = read_jsonl(tmp_path / "straight.jsonl")
    straight_curves = {n: [(r["samples"], r[n]) for r in records if n in r] for n in names}
    assert [s for s, _ in straight_curves["mlm_accuracy"]] == [16, 32, 48, 64, 80, 96]
    assert [s for s, _ in straight_curves["loss"]] == [16, 32, 48, 64, 80, 96]  # log.every_steps 2, batch 8
    assert promoted_curves == straight_curves  # bitwise: floats compared with ==, not approx


@pytest.fixture
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, resources={"GPU": 1},
                                       dashboard_address=None, worker_dashboard_address=None)  # fmt: skip
    yield cluster
    cluster.close()


@pytest.mark.slow  # about 22 s on a busy 2-core machine: four trials through a Dask worker
def test_asha_promotes_and_resumes_on_the_dask_runner(tmp_path, dask_cluster):
    spec = asha_spec(tmp_path, resources={"gpus": "all", "gpus_per_trial": 1},
                     runner={"name": "dask", "scheduler": dask_cluster.scheduler_address})  # fmt: skip
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    runner = build_runner(spec)
    try:
        status = Study(spec, storage, eid, tmp_path / "run", runner, url).run()
    finally:
        runner.close()
    assert status == ExperimentStatus.FINISHED
    _, promoted = check_promotion(tmp_path, storage, eid)
    assert promoted.worker and promoted.worker.startswith("tcp://")


def check_asha_demo(db: str, run_dir: Path, report: Path) -> None:
    """What the asha CPU demo must show: 8 tuning trials per optimizer at the rungs of 4,096 and 12,288 samples,
    promotions that resumed from the rung checkpoint and trained only the new samples, confirmation runs in rounds
    of 3 per optimizer (at most 6), and the promotions in the report's Rungs section."""
    storage = SqlStorage(db)
    trials = storage.list_trials(storage.get_experiment_by_name("adam_vs_lamb_demo_cpu_asha").id)
    assert all(t.state.finished for t in trials)
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    assert sorted(t.arm for t in tuning) == ["optimizer.name=adamw"] * 8 + ["optimizer.name=lamb"] * 8
    confirmations = [t.arm for t in trials if t.kind is TrialKind.CONFIRMATION]  # confirm_seeds auto: rounds of 3
    assert sorted(confirmations) in [sorted(["optimizer.name=adamw", "optimizer.name=lamb"] * n) for n in (3, 6)]
    assert {round(t.budget * 12288) for t in tuning} == {4096, 12288}
    promoted = [t for t in tuning if t.budget == 1.0]
    assert promoted, "no configuration was promoted"
    page = report.read_text()
    assert "<h2>Rungs</h2>" in page
    for trial in promoted:
        (lower,) = [t for t in tuning if t.params == trial.params and t.number < trial.number]
        assert round(lower.budget * 12288) == 4096 and lower.metrics["samples"] == 4096
        stderr = (run_dir / "trials" / f"{trial.number:05d}" / "stderr.log").read_text()
        assert "resumed from" in stderr and "4,096 samples" in stderr
        assert storage.get_metrics(trial.id, "mlm_accuracy")[0].samples == 5120  # only the new samples trained
        assert f"trial #{lower.number} (4,096 samples" in page and f"→ #{trial.number} (12,288" in page


@pytest.mark.slow  # about 12 min on a busy 2-core machine (README: the asha demo)
def test_the_asha_demo_preset_promotes_and_its_report_shows_the_rungs(tmp_path):
    corpus = [sys.executable, "-m", "trainer.data.demo_corpus", "--out", str(tmp_path / "data" / "demo")]
    subprocess.run(corpus, check=True, capture_output=True, timeout=600)
    db, run_dir = f"sqlite:///{tmp_path / 'hpo.db'}", tmp_path / "run"
    preset = PRESETS / "adam_vs_lamb_demo_cpu_asha.yaml"
    run = subprocess.run([sys.executable, "-m", "hpo", "--db", db, "run", str(preset), "--run-dir", str(run_dir)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=3000)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"^verdict( \(look \d of \d\))?: ", run.stdout, re.M), run.stdout  # confirm_seeds auto: looks
    command = [sys.executable, "-m", "hpo", "--db", db, "report", "adam_vs_lamb_demo_cpu_asha", "-o", "reports"]
    report = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert report.returncode == 0, report.stderr
    check_asha_demo(db, run_dir, tmp_path / "reports" / "adam_vs_lamb_demo_cpu_asha.html")
