"""The NNI engine end to end: a real NNI manager (patched by `make setup`), real tuners, real trainer trials
recording themselves in a real SQLite database.

The check that matters: for every trial, the parameters NNI recorded for it (what its web UI shows and its tuner
learns from), the parameters its trainer ran with (the trial's `trial.yaml`) and its row in our database are the
same. NNI 3.0 unpatched hands parameters to whichever trial asks first, so at concurrency > 1 (or after a trial
that dies before asking) they differ.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import yaml

from hpo.nni.engine import run_nni
from hpo.nni.manager import NniEngineError, load_experiments, rest, stop_all, view
from hpo.trials import TrialState
from tests.hpo.nni.conftest import make_nni_spec, store_experiment

pytestmark = [pytest.mark.nni, pytest.mark.slow]  # each runs 6 trainer trials under a real NNI manager
PORT = 18300


class UiProbe:
    """Called at every poll of the engine: checks once that the REST API and the web UI answer while trials run."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.status, self.title, self.manager = run_dir, None, None, None

    def __call__(self, note: str) -> None:
        if self.title is not None:
            return
        served = load_experiments(self.run_dir)[0]
        port, self.manager = served.port, served.pid
        self.status = rest(port, "check-status")["status"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/oview", timeout=10) as response:
            html = response.read().decode()
        self.title = html.split("<title>")[1].split("</title>")[0]


def run_experiment(tmp_path: Path, spec, command_prefix: str = ""):
    url, storage, eid, run_dir = store_experiment(tmp_path, spec)
    probe = UiProbe(run_dir)
    ending = run_nni(spec, storage, eid, run_dir, url, port=PORT, quiet=True, tick=probe,
                     command_prefix=command_prefix)  # fmt: skip
    return storage, eid, run_dir, ending, probe


def nni_leaves(params: dict) -> dict:
    """NNI's (possibly nested) parameters as {name: value}; a nested choice {"_name": v, ...} gives name: v."""
    flat = {}
    for key, value in params.items():
        if isinstance(value, dict):
            flat[key] = value["_name"]
            flat.update(nni_leaves({k: v for k, v in value.items() if k != "_name"}))
        else:
            flat[key] = value
    return flat


def recorded_by_nni(run_dir: Path) -> dict[str, tuple[str, dict]]:
    """{NNI trial id: (status, parameters)} read back from NNI's REST API in view mode (the manager is stopped)."""
    experiments = view(run_dir, port=PORT)
    try:
        jobs = rest(experiments[0].port, "trial-jobs")
    finally:
        stop_all(run_dir)
    return {j["trialJobId"]: (j["status"], nni_leaves(json.loads(j["hyperParameters"][0])["parameters"])) for j in jobs}


def assert_same_parameters(storage, eid, run_dir: Path, nni_trials: dict, n_trials: int) -> None:
    rows = storage.list_trials(eid)
    assert len(rows) == len(nni_trials) == n_trials
    assert sorted(t.number for t in rows) == list(range(n_trials))
    for row in rows:
        status, nni_params = nni_trials[row.worker.removeprefix("nni:")]
        assert row.params == nni_params, f"trial {row.number} ({row.worker}) ran other parameters than NNI recorded"
        if row.state != TrialState.COMPLETED:
            continue
        config = yaml.safe_load((run_dir / "trials" / f"{row.number:05d}" / "trial.yaml").read_text())
        assert config["optimizer"]["lr"] == row.params["optimizer.lr"]
        assert config["clipping"]["strategy"] == row.params["clipping.strategy"]
        assert ("clipping.max_norm" in row.params) == (row.params["clipping.strategy"] != "none")
        assert config["clipping"]["max_norm"] == row.params.get("clipping.max_norm", 1.0)  # 1.0: the default
        # EARLY_STOPPED: the assessor's stop reached a trial that had just recorded its result; it stays completed
        assert status in ("SUCCEEDED", "EARLY_STOPPED")


def test_smac_inside_nni_at_concurrency_3(tmp_path):
    options = {"assessor": "medianstop", "assessor_start_step": 1}
    spec = make_nni_spec(tmp_path, "nni_smac", trials=6, parallel=3, options=options)
    storage, eid, run_dir, ending, probe = run_experiment(tmp_path, spec)
    assert ending == "finished"
    assert probe.status in ("RUNNING", "NO_MORE_TRIAL", "TUNER_NO_MORE_TRIAL", "DONE")
    assert probe.title == "Neural Network Intelligence"
    nni_trials = recorded_by_nni(run_dir)
    assert_same_parameters(storage, eid, run_dir, nni_trials, 6)
    for row in storage.list_trials(eid):
        assert storage.get_metrics(row.id, "mlm_accuracy")  # intermediate results stored (and sent to NNI)
        status = nni_trials[row.worker.removeprefix("nni:")][0]
        if status == "EARLY_STOPPED" and row.state != TrialState.COMPLETED:  # the median-stop assessor ended it
            assert row.state == TrialState.FAILED and "median-stop assessor" in row.reason
        else:  # finished (an assessor stop that came after the trial recorded its result changes nothing)
            assert status in ("SUCCEEDED", "EARLY_STOPPED") and row.state == TrialState.COMPLETED
            assert row.objective is not None
    pids = [row.pid for row in storage.list_trials(eid)]  # each trial's own process group, never the manager's
    assert probe.manager and None not in pids and probe.manager not in pids and len(set(pids)) == len(pids)
    assert not (Path.home() / "nni-experiments" / "hpo1-arm0").exists()  # NNI's files stay in the run dir
    assert (run_dir / "nni" / "nni-experiments" / ".experiment").exists()


def test_tpe_conditional_space_at_concurrency_4_with_a_trial_dying_before_it_asks(tmp_path):
    spec = make_nni_spec(tmp_path, "nni_tpe", trials=6, parallel=4)
    # The first trial to start exits before it asks NNI for parameters; the others go on.
    crash_once = f"mkdir {tmp_path / 'crashed'} 2>/dev/null && exit 3; "
    storage, eid, run_dir, ending, _ = run_experiment(tmp_path, spec, command_prefix=crash_once)
    assert ending == "finished"
    nni_trials = recorded_by_nni(run_dir)
    assert_same_parameters(storage, eid, run_dir, nni_trials, 6)
    rows = storage.list_trials(eid)
    failed = [t for t in rows if t.state == TrialState.FAILED]
    assert len(failed) == 1 and "before it asked for its parameters" in failed[0].reason
    assert nni_trials[failed[0].worker.removeprefix("nni:")][0] == "FAILED"
    assert sum(t.state == TrialState.COMPLETED for t in rows) == 5
    assert {t.params["clipping.strategy"] for t in rows} <= {"none", "after_allreduce"}


def test_a_stop_request_stops_nni_and_records_what_ran(tmp_path):
    spec = make_nni_spec(tmp_path, "nni_random", trials=4, parallel=2)
    url, storage, eid, run_dir = store_experiment(tmp_path, spec)
    started: list[str] = []

    def stop_once_trials_run(note: str) -> None:  # what `POST /experiments/NAME/stop` does
        jobs = rest(load_experiments(run_dir)[0].port, "trial-jobs")
        running = [j["trialJobId"] for j in jobs if j["status"] == "RUNNING"]
        if running and not started:
            started.extend(running)
            storage.request_stop(eid)

    ending = run_nni(spec, storage, eid, run_dir, url, port=PORT, quiet=True, tick=stop_once_trials_run)
    assert ending == "stopped"
    rows = storage.list_trials(eid)
    assert {t.worker.removeprefix("nni:") for t in rows} >= set(started)  # every trial that ran has a row
    reason = "interrupted: the NNI experiment was stopped on request"  # not charged: a resume runs others instead
    assert all(t.state == TrialState.INTERRUPTED and t.reason == reason for t in rows)  # as the local engine
    manager = load_experiments(run_dir)[0]
    assert manager.pid is None
    with pytest.raises(NniEngineError):
        rest(manager.port, "check-status", timeout=2)


@pytest.mark.parametrize("tuner", ["nni_anneal", "nni_evolution"])
def test_anneal_and_evolution_under_the_manager_propose_the_same_trials_for_the_same_seed(tmp_path, tuner):
    """NNI's own Anneal and Evolution take no seed (they proposed anew every run): under the manager they are ours,
    seeded (hpo.nni.seeded), so one trial at a time the same file proposes the same trials."""
    runs = []
    for attempt in ("first", "again"):
        options = {"assessor": "none", **({"population_size": 2} if tuner == "nni_evolution" else {})}
        spec = make_nni_spec(tmp_path / attempt, tuner, trials=4, parallel=1, options=options)
        storage, eid, _, ending, _ = run_experiment(tmp_path / attempt, spec)
        assert ending == "finished"
        runs.append([t.params for t in sorted(storage.list_trials(eid), key=lambda t: t.number)])
    assert runs[0] == runs[1] and len(runs[0]) == 4, runs
