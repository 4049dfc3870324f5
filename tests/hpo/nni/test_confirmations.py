"""Confirmation runs under engine: nni end to end: a real NNI manager, NNI's GridSearch over each arm's best
configuration and seeds, trainer trials recording themselves in SQLite.

What must hold: the rows are the local engine's (kind confirmation, the arm's best configuration, the seeds after
its own, the runs per arm that `runs_to_queue` says); each round is an NNI experiment of its own whose trials NNI
handed exactly their row's configuration and seed (what its web UI shows); under auto the verdict at the look
decides whether another round runs; the summary gives the verdict; and a resume after a stop re-runs only the
interrupted runs. Which verdicts start another round is checked in test_confirm.py (real trials' accuracies on
the tiny BERT cannot be steered to a given verdict).
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpo.evidence.confirmations import stored_verdict
from hpo.evidence.verdict import Outcome
from hpo.experiment import experiment_from_dict, spec_from_stored
from hpo.experiment.arms import trial_config
from hpo.nni.config import CONFIRMATION_SEED
from hpo.nni.engine import run_nni
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from tests.hpo.nni.conftest import nni_experiment_data, store_experiment

pytestmark = [pytest.mark.nni, pytest.mark.slow]
ARM_SPACE = {
    "optimizer.name": {"choice": ["adamw", "lamb"]},
    "optimizer.lr@lamb": {"float": [1e-3, 1e-2], "log": True, "when": {"optimizer.name": "lamb"}},
    "optimizer.lr@adamw": {"float": [1e-4, 1e-2], "log": True, "when": {"optimizer.name": "adamw"}},
}


def handed_out(run_dir: Path, nni_id: str) -> dict[str, dict]:
    """{NNI trial id: the parameters NNI generated for it} from the NNI experiment's own database."""
    path = run_dir / "nni" / "nni-experiments" / nni_id / "db" / "nni.sqlite"
    found: dict[str, dict] = {}
    with sqlite3.connect(path) as db:
        for job, data in db.execute("SELECT trialJobId, data FROM TrialJobEvent WHERE data LIKE '%\"parameters\"%'"):
            found.setdefault(job, json.loads(data)["parameters"])
    return found


def test_an_auto_round_runs_as_nni_experiments_of_the_best_configuration_and_the_summary_gives_the_verdict(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_random", trials=4, parallel=2, space=ARM_SPACE,
                               compare=["optimizer.name"])  # fmt: skip
    # No run reaches this target: after the first round the verdict is "not yet", and more runs would not decide
    # (no configuration of either arm reaches it), so the second round (up to 4 runs per arm) never starts.
    data["overrides"]["eval.target_mlm_accuracy"] = 0.9
    data["budget"].update(confirm_seeds="auto", max_confirm_seeds=4)  # rounds of 3, then 4 runs per arm
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    run = subprocess.run([sys.executable, "-m", "hpo", "--db", db, "run", "exp.yaml", "--run-dir", "run", "--port",
                          "18650"], cwd=tmp_path, capture_output=True, text=True, timeout=1800)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    storage = SqlStorage(db)
    record = storage.get_experiment_by_name("nniexp")
    spec, rows, best = spec_from_stored(record), storage.list_trials(record.id), storage.best_per_arm(record.id)
    for index, arm in enumerate(("optimizer.name=adamw", "optimizer.name=lamb")):
        tuning = [t for t in rows if t.arm == arm and t.kind is TrialKind.TUNING]
        runs = [t for t in rows if t.arm == arm and t.kind is TrialKind.CONFIRMATION]
        assert len(tuning) == 2 and len(runs) == 3  # the first round only
        assert all(t.params == best[arm].params for t in runs)
        own = trial_config(spec, best[arm].params).seed
        assert [t.seed for t in runs] == [own + 1, own + 2, own + 3]
        assert all(t.state is TrialState.COMPLETED and t.worker.startswith("nni:") for t in runs)
        nni_id = f"hpo{record.id}-arm{index}-confirm1"  # the round is an NNI experiment of its own
        shown = rf"nniexp {re.escape(arm)}: NNI web UI at http://\S+ \(NNI experiment {nni_id}, 3 confirmation runs\)"
        assert re.search(shown, run.stdout), run.stdout
        expected = {t.worker.removeprefix("nni:"): {**t.params, CONFIRMATION_SEED: t.seed} for t in runs}
        assert handed_out(tmp_path / "run", nni_id) == expected  # what NNI gave each trial is its row's run
        trained = yaml.safe_load((tmp_path / "run" / "trials" / f"{runs[0].number:05d}" / "trial.yaml").read_text())
        assert trained["seed"] == runs[0].seed and trained["optimizer"]["name"] == arm.split("=")[1]
    verdict = stored_verdict(storage, record.id, spec)
    assert verdict.outcome is Outcome.NOT_YET and verdict.runs_needed is None  # more runs would not decide
    assert (verdict.look, verdict.looks) == (1, 2)
    assert [a.runs for a in verdict.arms] == [3, 3]
    assert f"verdict (look 1 of 2): {verdict.line}" in run.stdout  # the summary's verdict
    links = {link["nni_experiment"] for link in record.nni_webui}  # the report links every NNI experiment's web UI
    assert links == {f"hpo{record.id}-arm{i}{r}" for i in (0, 1) for r in ("", "-confirm1")}


def test_a_stop_interrupts_confirmation_runs_and_the_resume_reruns_only_those(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=2)
    data["overrides"].update({"budget.max_samples": 800, "eval.every_samples": 200})  # 100 steps: caught training
    data["budget"]["confirm_seeds"] = 3
    spec = experiment_from_dict(data, "exp.yaml", base_dir=tmp_path)
    url, storage, eid, run_dir = store_experiment(tmp_path, spec)

    def confirmations() -> list:
        return [t for t in storage.list_trials(eid) if t.kind is TrialKind.CONFIRMATION]

    def stop_midway(note: str) -> None:  # a confirmation run finished, another still training
        states = {t.state for t in confirmations()}
        if {TrialState.COMPLETED, TrialState.RUNNING} <= states:
            storage.request_stop(eid)

    assert run_nni(spec, storage, eid, run_dir, url, port=18700, quiet=True, tick=stop_midway) == "stopped"
    before = {t.id: t for t in confirmations()}
    done = [t for t in before.values() if t.state is TrialState.COMPLETED]
    cut = [t for t in before.values() if t.state is TrialState.INTERRUPTED]
    left = [t for t in before.values() if t not in done and t not in cut]  # not started yet: still queued
    assert len(before) == 3 and done and cut, [(t.state, t.reason) for t in before.values()]
    assert all(t.reason == "interrupted: the NNI experiment was stopped on request" for t in cut)
    assert all(t.state is TrialState.QUEUED for t in left)

    storage.set_experiment_status(eid, "running")  # what `hpo resume` does first (it clears the stop request)
    assert run_nni(spec, storage, eid, run_dir, url, port=18700, quiet=True) == "finished"

    after = {t.id: t for t in confirmations()}
    assert set(after) == set(before)  # no new confirmation run, none lost
    assert [t.seed for t in after.values()] == [t.seed for t in before.values()]
    for t in done:  # finished runs never run again
        assert (after[t.id].attempt, after[t.id].finished_at, after[t.id].worker) == (0, t.finished_at, t.worker)
    for t in cut:  # the interrupted ones ran again: the same row, its next attempt, a new NNI trial
        assert after[t.id].state is TrialState.COMPLETED and after[t.id].attempt == 1 and after[t.id].worker != t.worker
    assert all(after[t.id].state is TrialState.COMPLETED and after[t.id].attempt == 0 for t in left)
    assert sum(t.kind is TrialKind.TUNING for t in storage.list_trials(eid)) == 2  # tuning was over: none added
    resumed = json.loads((run_dir / "nni" / f"hpo{eid}-arm0-confirm2.json").read_text())
    assert resumed["searchSpace"][CONFIRMATION_SEED]["_value"] == sorted(t.seed for t in [*cut, *left])
