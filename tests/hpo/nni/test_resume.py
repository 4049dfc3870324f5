"""Resume under engine nni: an experiment at concurrency 4 stopped after some trials finished, then resumed.

NNI cannot resume an NNI experiment's running trials, so a resumed arm is a new NNI experiment. What must hold:
its tuner gets the finished trials (NNI's import_data) and another seed, so no completed configuration runs
twice; the trials the stop interrupted are recorded as interrupted, then, as the resume replaces them, as failed
with their "interrupted:" reason, never charged (others run in their place); and the arm ends with its planned
number of completed-or-genuinely-failed trials. Real NNI manager, TPE, trainer trials, SQLite.
"""

from __future__ import annotations

import json
import sqlite3

import pytest

from hpo.nni.config import RESTART_SEED_STEP
from hpo.nni.engine import run_nni
from hpo.nni.jobs import REPLACED
from hpo.nni.manager import load_experiments, rest
from hpo.trials import TrialState
from tests.hpo.nni.conftest import make_nni_spec, store_experiment

pytestmark = [pytest.mark.nni, pytest.mark.slow]
PORT = 18800
TRIALS = 8


def imported(run_dir, nni_id: str) -> list[dict]:
    """The data NNI's manager passed to the tuner of an NNI experiment (its IMPORT_DATA events)."""
    path = run_dir / "nni" / "nni-experiments" / nni_id / "db" / "nni.sqlite"
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT data FROM TrialJobEvent WHERE event = 'IMPORT_DATA'").fetchall()
    return [entry for (data,) in rows for entry in json.loads(data)]


def test_resume_imports_finished_trials_reruns_interrupted_ones_and_repeats_no_configuration(tmp_path):
    spec = make_nni_spec(tmp_path, "nni_tpe", trials=TRIALS, parallel=4)
    url, storage, eid, run_dir = store_experiment(tmp_path, spec)

    def stop_midway(note: str) -> None:  # some trials finished, others still running
        jobs = rest(load_experiments(run_dir)[0].port, "trial-jobs")
        completed = storage.count_trials(eid, state=[TrialState.COMPLETED])
        if completed >= 2 and any(j["status"] == "RUNNING" for j in jobs):
            storage.request_stop(eid)

    assert run_nni(spec, storage, eid, run_dir, url, port=PORT, quiet=True, tick=stop_midway) == "stopped"
    before = {t.id: t for t in storage.list_trials(eid)}
    done_before = [t for t in before.values() if t.state == TrialState.COMPLETED]
    cut = [t for t in before.values() if t.state == TrialState.INTERRUPTED and t.reason.startswith("interrupted: ")]
    assert len(done_before) >= 2 and cut, [(t.state, t.reason) for t in before.values()]
    assert len(done_before) < TRIALS

    storage.set_experiment_status(eid, "running")  # what `hpo resume` does first (it clears the stop request)
    assert run_nni(spec, storage, eid, run_dir, url, port=PORT, quiet=True) == "finished"

    rows = storage.list_trials(eid)
    interrupted = [t for t in rows if t.state == TrialState.FAILED and t.reason.startswith("interrupted: ")]
    assert {t.id for t in interrupted} == {t.id for t in cut}  # the resume interrupted nothing more
    assert all(t.reason.endswith(REPLACED) for t in interrupted)  # replaced by new trials
    charged = [t for t in rows if t not in interrupted]
    assert len(charged) == TRIALS  # the planned number of completed-or-genuinely-failed trials
    assert all(t.state.finished for t in charged)
    completed = [json.dumps(t.params, sort_keys=True) for t in rows if t.state == TrialState.COMPLETED]
    assert len(completed) == len(set(completed)), "a completed configuration ran twice"
    assert sorted(t.number for t in rows) == list(range(len(rows)))

    # the resumed arm's NNI experiment: another seed, and the trials completed before the stop imported
    config = json.loads((run_dir / "nni" / "hpo1-arm0-r1.json").read_text())
    assert config["tuner"]["classArgs"]["seed"] == spec.tuner.seed + RESTART_SEED_STEP
    assert config["maxTrialNumber"] == TRIALS - len(done_before)
    given = imported(run_dir, "hpo1-arm0-r1")
    assert sorted(e["value"] for e in given) == sorted(t.objective for t in done_before)
    assert len(given) == len(done_before)
