"""An NNI trial that meets a full disk: under a real NNI manager, the trial records itself interrupted (not charged to
its arm, nothing told as its configuration's failure), the engine stops the experiment before the next trial meets
the same disk, and a resume runs another trial in its place. /dev/full stands for the full disk: it answers every
write with ENOSPC ("No space left on device"); the first trial's report file is a link to it."""

from __future__ import annotations

import pytest

from hpo.nni.engine import run_nni
from hpo.nni.jobs import DISK_FULL
from hpo.trials import TrialState
from tests.hpo.nni.conftest import make_nni_spec, store_experiment

pytestmark = [pytest.mark.nni, pytest.mark.slow]  # a real NNI manager, started twice, and three trainer trials
PORT = 18360


def test_a_trial_on_a_full_disk_stops_the_nni_experiment_and_a_resume_runs_another_in_its_place(tmp_path, capsys):
    spec = make_nni_spec(tmp_path, "nni_random", trials=2, parallel=1)
    url, storage, eid, run_dir = store_experiment(tmp_path, spec)
    report = run_dir / "trials" / "00000" / "report.jsonl"
    report.parent.mkdir(parents=True)
    report.symlink_to("/dev/full")

    assert run_nni(spec, storage, eid, run_dir, url, port=PORT, quiet=True) == "stopped"
    trial, *later = storage.list_trials(eid)
    assert trial.state is TrialState.INTERRUPTED and trial.reason.startswith(DISK_FULL), trial
    assert "No space left on device" in trial.reason
    # NNI starts the next trial as soon as a slot frees: one that recorded itself before the stop is interrupted
    assert all(t.state is TrialState.INTERRUPTED and "stopped for a full disk" in t.reason for t in later), later
    said = capsys.readouterr().err
    assert "stopped: trial 0 could not write its files: " in said and f"`hpo resume {spec.name}`" in said, said

    report.unlink()  # space again
    assert run_nni(spec, storage, eid, run_dir, url, port=PORT, quiet=True) == "finished"
    trials = storage.list_trials(eid)
    assert [t.state for t in trials] == [TrialState.FAILED] * (1 + len(later)) + [TrialState.COMPLETED] * 2
    assert trials[0].reason.startswith(DISK_FULL)  # replaced, not charged: the arm still ran its 2 trials
