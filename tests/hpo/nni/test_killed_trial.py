"""An NNI trial whose process a signal ended (SIGKILL from the out-of-memory killer or `kill -9`) after it recorded
itself: NNI 3.0 keeps no signal, only an exit code of null, which it reports as USER_CANCELED (what a cancel in its
web UI also gives). The recorded reason says so rather than blaming a user who cancelled nothing."""

from __future__ import annotations

from types import SimpleNamespace

from hpo.experiment.arms import arm_plans
from hpo.nni.jobs import _ending, reconcile, record_stopped
from hpo.nni.trial import tuning_trial
from hpo.storage import SqlStorage
from hpo.trials import TrialState
from tests.hpo.nni.conftest import make_nni_spec


def test_a_trial_nni_reports_user_canceled_is_recorded_as_killed_by_a_signal(tmp_path):
    spec = make_nni_spec(tmp_path, "nni_random", trials=2, parallel=1)
    killed = {"status": "USER_CANCELED", "trialJobId": "ZEoBw", "startTime": 1_000, "endTime": 13_000}
    assert _ending(spec, killed, True) == (
        TrialState.FAILED,
        "NNI trial ZEoBw ended (USER_CANCELED) without a final result: its process was killed by a signal (the "
        "out-of-memory killer, `kill`) or the trial was cancelled in NNI's web UI",
    )
    assert "before it asked for its parameters" in _ending(spec, killed, False)[1]


def stored(tmp_path):
    spec = make_nni_spec(tmp_path, "nni_random", trials=2, parallel=1)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    data = spec.self_contained()
    eid = storage.create_experiment(spec.name, {"experiment": data, "run_dir": str(tmp_path / "run")}, spec.direction)
    return spec, storage, eid, arm_plans(spec)[0]


GENERATED = {"optimizer.lr": 1e-3, "clipping.strategy": "none"}


def test_a_trial_killed_between_its_row_and_its_start_leaves_one_row_the_engine_finishes(tmp_path):
    """The NNI trial records its row with its worker in one write: killed before it claims that row (the
    out-of-memory killer, a stop), it leaves a row the engine finds by the worker and finishes; no queued row that
    nobody claims beside a failed one the engine adds for the same NNI trial."""
    spec, storage, eid, plan = stored(tmp_path)
    trial_id = tuning_trial(storage, eid, spec, plan, GENERATED, "nni:ZEoBw")
    assert storage.get_trial(trial_id).worker == "nni:ZEoBw"
    killed = {"status": "USER_CANCELED", "trialJobId": "ZEoBw", "startTime": 1_000, "endTime": 3_000}

    assert reconcile(spec, storage, eid, plan, SimpleNamespace(confirmation=False), [killed]) == 1

    (record,) = storage.list_trials(eid)
    assert (record.id, record.state, record.worker) == (trial_id, TrialState.FAILED, "nni:ZEoBw")
    assert record.reason.startswith("NNI trial ZEoBw ended (USER_CANCELED) without a final result")
    assert record.params["optimizer.lr"] == 1e-3


def test_a_stop_before_a_trial_starts_interrupts_its_row_alone(tmp_path):
    spec, storage, eid, plan = stored(tmp_path)
    trial_id = tuning_trial(storage, eid, spec, plan, GENERATED, "nni:AbCdE")
    job = {"status": "RUNNING", "trialJobId": "AbCdE", "startTime": 1_000}

    record_stopped(storage, eid, plan, [job], "the NNI experiment was stopped on request")

    (record,) = storage.list_trials(eid)
    assert (record.id, record.state, record.reason) == (
        trial_id,
        TrialState.INTERRUPTED,
        "the NNI experiment was stopped on request",
    )
