"""A full disk under the run directory, for real: a small tmpfs mounted for the test and filled up (the controller's
files, a trial's directory, a trial's kept outcome).

Mounting needs root (CI's machines run the tests as root); elsewhere these tests say why they cannot run. The
trial-side case (a trial whose own files meet a full disk) runs everywhere, through /dev/full, in test_study.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from hpo.files import full_disk
from hpo.storage import SqlStorage
from hpo.storage.base import ExperimentStatus
from hpo.trial.entry import DatabaseReporter, record_outcome
from hpo.trials import TrialState
from tests.hpo.engine.test_study import tiny_overrides
from tests.hpo.trial.test_outcome import POINTS, RESULT, running_trial


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs at tmp_path/disk, unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True,
                          text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Fill the disk to the last byte; the file that does it."""
    filler = disk / f"filler-{uuid.uuid4().hex}"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    return filler


def hpo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpo", *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))  # fmt: skip


@pytest.mark.slow  # a real experiment on a small disk (make test-all); test_study.py has a trial's full disk
def test_a_tuner_that_cannot_write_its_files_leaves_the_experiment_stopped_for_a_resume(tmp_path, small_disk):
    # SMAC3 writes its scenario as the tuner is built: on a full disk that was a traceback and an experiment left
    # "running" under a controller that was gone
    spec = {"name": "full", "base_config": {}, "overrides": tiny_overrides(tmp_path / "data"),
            "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}}, "tuner": {"name": "smac_bo", "seed": 0},
            "budget": {"trials": 1, "max_parallel": 1, "trial_timeout_s": 120},
            "resources": {"gpus": "none", "cpu_slots": 1}}  # fmt: skip
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    filler = fill(small_disk)
    ran = hpo("--db", url, "run", str(path), "--run-dir", str(small_disk / "run"), "--quiet")
    assert ran.returncode == 1, ran.stderr
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: the controller could not write its files: the disk under {small_disk / 'run'} "
        "is full (0.0 MiB free). Free space on that disk, then `hpo resume full`"
    ), ran.stderr
    assert "Traceback" not in ran.stderr
    with SqlStorage(url) as storage:
        assert storage.get_experiment_by_name("full").status is ExperimentStatus.STOPPED

    filler.unlink()
    resumed = hpo("--db", url, "resume", "full", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    with SqlStorage(url) as storage:
        record = storage.get_experiment_by_name("full")
        assert record.status is ExperimentStatus.FINISHED
        assert [t.state for t in storage.list_trials(record.id)] == [TrialState.COMPLETED]


def test_a_trial_directory_this_machine_does_not_have_is_not_taken_for_a_full_disk(small_disk):
    # a Dask worker's trial directory is on the worker's disk: the controller, whose run directory holds no such
    # directory, measured the nearest folder above it, its own disk, and re-queued a trial that had failed for its
    # own reasons, stopping the experiment for a disk the trial never wrote to
    fill(small_disk)
    trials = small_disk / "run" / "trials"
    trials.mkdir(parents=True)
    assert full_disk(trials / "00003") is None
    (trials / "00003").mkdir()
    assert full_disk(trials / "00003") == f"the disk under {trials / '00003'} is full (0.0 MiB free)"


def test_a_disk_too_full_for_the_kept_outcome_does_not_hold_the_result_back(tmp_path, small_disk):
    # the outcome file is for a database that is away; a trial that had trained to its end when its disk filled up
    # (its final checkpoint, say) failed to write it, recorded nothing and was queued again to train it all over,
    # while the database could take its result
    storage, trial_id = running_trial(tmp_path)
    workdir = small_disk / "trial"
    workdir.mkdir()
    fill(small_disk)
    database = DatabaseReporter(storage, trial_id, 0)
    database.pending = POINTS[:1]  # kept while the database was away
    record_outcome(database, workdir, RESULT)
    trial = storage.get_trial(trial_id)
    assert (trial.state, trial.objective, trial.samples_to_target) == (TrialState.COMPLETED, 96.0, 96)
    assert [(m.step, m.value) for m in storage.get_metrics(trial_id)] == [(2, 4.5)]
    assert list(workdir.iterdir()) == []  # nothing half-written left on the full disk
