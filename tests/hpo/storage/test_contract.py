"""The `Storage` contract, run against every backend (see conftest: SQLite always, PostgreSQL on request)."""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime, timedelta, timezone

import pytest

from hpo.errors import (
    ClaimLostError,
    ControllerBusyError,
    NotFoundError,
    StaleAttemptError,
    StorageError,
    TrialClosedError,
)
from hpo.storage import Direction, ExperimentStatus, MetricPoint, SqlStorage
from hpo.storage.base import TrialVersion
from hpo.trials import TrialResult, TrialSpec, TrialState
from tests.hpo.storage.conftest import add_finished_trial, make_spec

DELETER = ("deleter-host", 4321)  # the (host, pid) `hpo delete` claims an experiment with

SPEC = {"name": "lamb-vs-adam", "space": {"optimizer.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}}}

# -- experiments ---------------------------------------------------------------------------------------------


def test_experiment_round_trip(storage: SqlStorage):
    experiment_id = storage.create_experiment("lamb-vs-adam", SPEC, "minimize")
    experiment = storage.get_experiment(experiment_id)
    assert experiment.id == experiment_id
    assert experiment.name == "lamb-vs-adam"
    assert experiment.spec == SPEC
    assert experiment.direction is Direction.MINIMIZE
    assert experiment.status is ExperimentStatus.RUNNING
    assert experiment.stop_requested is False
    assert experiment.created_at.tzinfo is timezone.utc and experiment.ended_at is None
    assert storage.get_experiment_by_name("lamb-vs-adam") == experiment


def test_list_experiments_oldest_first_and_by_status(storage: SqlStorage):
    ids = [storage.create_experiment(f"exp-{i}", {}, Direction.MAXIMIZE) for i in range(3)]
    storage.set_experiment_status(ids[1], ExperimentStatus.FINISHED)
    assert [e.id for e in storage.list_experiments()] == ids
    assert [e.id for e in storage.list_experiments(status="finished")] == [ids[1]]
    assert [e.id for e in storage.list_experiments(status=ExperimentStatus.RUNNING)] == [ids[0], ids[2]]


def test_duplicate_experiment_name_is_a_storage_error_naming_it(storage: SqlStorage):
    storage.create_experiment("same", {}, "minimize")
    with pytest.raises(StorageError, match="experiment named 'same' already exists"):
        storage.create_experiment("same", {}, "maximize")
    assert len(storage.list_experiments()) == 1  # the failed create left nothing behind
    storage.create_experiment("other", {}, "minimize")  # and the storage is still usable


def test_an_experiment_without_trials_can_be_deleted_and_its_name_used_again(storage: SqlStorage):
    kept = storage.create_experiment("kept", SPEC, "minimize")
    failed = storage.create_experiment("lamb-vs-adam", SPEC, "minimize")
    storage.delete_experiment(failed)
    with pytest.raises(NotFoundError):
        storage.get_experiment(failed)
    assert [e.name for e in storage.list_experiments()] == ["kept"]
    again = storage.create_experiment("lamb-vs-adam", SPEC, "maximize")  # the name is free again
    assert storage.get_experiment_by_name("lamb-vs-adam").id == again
    storage.create_trial(kept, make_spec(0))
    with pytest.raises(StorageError, match="experiment 'kept' has 1 trial"):
        storage.delete_experiment(kept)
    assert storage.count_trials(kept) == 1 and storage.get_experiment(kept).name == "kept"  # trials are data
    with pytest.raises(NotFoundError):
        storage.delete_experiment(999)


def _experiment_with_curves(storage: SqlStorage, name: str, trials: int) -> tuple[int, list[int]]:
    """An experiment of `trials` finished trials, each with a curve of 3 reports of 2 values (6 metric rows)."""
    experiment_id = storage.create_experiment(name, SPEC, "minimize")
    ids = []
    for number in range(trials):
        trial_id = storage.create_trial(experiment_id, make_spec(number))
        storage.mark_trial_running(trial_id)
        curve = [(step, 64 * step, {"loss": 2.0 / step, "acc": 0.1 * step}) for step in (1, 2, 3)]
        storage.add_metrics(trial_id, curve)
        storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(number)))
        ids.append(trial_id)
    return experiment_id, ids


def test_purging_an_experiment_removes_its_trials_and_curves_and_nothing_of_another(storage: SqlStorage, monkeypatch):
    monkeypatch.setattr("hpo.storage.sql.PURGE_CHUNK", 2)  # SQLite's curves go in chunks of trials: 2 and 1 here
    kept, kept_trials = _experiment_with_curves(storage, "kept", 2)
    purged, purged_trials = _experiment_with_curves(storage, "purged", 3)
    assert storage.purge_experiment(purged, *DELETER, stale_after_s=60) == (3, 3 * 6)
    with pytest.raises(NotFoundError):
        storage.get_experiment(purged)
    for trial_id in purged_trials:
        with pytest.raises(NotFoundError):
            storage.get_trial(trial_id)
    assert [e.name for e in storage.list_experiments()] == ["kept"]
    assert [t.id for t in storage.list_trials(kept)] == kept_trials
    assert [len(storage.get_metrics(t)) for t in kept_trials] == [6, 6]
    with storage._session() as session:  # no row of the purged trials' curves is left behind
        from sqlalchemy import func, select

        from hpo.storage.models import TrialMetricModel

        assert session.scalar(select(func.count()).select_from(TrialMetricModel)) == 2 * 6
    with pytest.raises(NotFoundError):
        storage.purge_experiment(purged, *DELETER, stale_after_s=60)


def test_ids_of_a_purged_experiment_and_its_trials_are_never_given_again(storage: SqlStorage):
    # The newest experiment's ids are the ones SQLite would otherwise give again (the highest plus one); a server
    # keeps what it read under them.
    storage.create_experiment("older", SPEC, "minimize")
    purged, purged_trials = _experiment_with_curves(storage, "again", 2)
    storage.purge_experiment(purged, *DELETER, stale_after_s=60)
    again, again_trials = _experiment_with_curves(storage, "again", 2)
    assert again > purged and min(again_trials) > max(purged_trials)


def test_a_live_controller_keeps_its_experiment_from_a_purge_and_a_stale_one_does_not(storage: SqlStorage):
    experiment_id, trials = _experiment_with_curves(storage, "driven", 1)
    storage.claim_controller(experiment_id, "hostA", 111, stale_after_s=60)
    with pytest.raises(ControllerBusyError, match="hostA, pid 111"):
        storage.purge_experiment(experiment_id, *DELETER, stale_after_s=60)
    assert storage.get_experiment(experiment_id).controller_pid == 111  # nothing removed, the claim as it was
    assert len(storage.get_metrics(trials[0])) == 6
    assert storage.purge_experiment(experiment_id, *DELETER, stale_after_s=0) == (
        1,
        6,
    )  # its heartbeat is older than 0 s
    with pytest.raises(NotFoundError):  # the controller, should it come back, learns it (Heartbeat.deleted)
        storage.heartbeat(experiment_id, "hostA", 111)


def test_a_controller_whose_claim_was_taken_over_creates_no_trial(storage: SqlStorage):
    """A controller paused while another took its experiment over (`hpo resume`) created trials on its return that
    nobody drove (they stayed running in a finished experiment): the create checks the claim under the row lock."""
    experiment_id, _ = _experiment_with_curves(storage, "taken", 1)
    storage.claim_controller(experiment_id, "hostA", 111, stale_after_s=60)
    created = storage.create_trial(experiment_id, TrialSpec(None, {"x": 1}), controller=("hostA", 111))
    assert storage.get_trial(created).number == 1
    storage.claim_controller(experiment_id, "hostB", 222, stale_after_s=0)  # A's heartbeat is older than 0 s
    with pytest.raises(ClaimLostError, match=r"pid 222 on hostB\), which took it over: this one \(pid 111 on hostA"):
        storage.create_trial(experiment_id, TrialSpec(None, {"x": 2}), controller=("hostA", 111))
    assert storage.count_trials(experiment_id) == 2  # nothing written
    assert storage.get_trial(storage.create_trial(experiment_id, TrialSpec(None, {"x": 2}),
                                                  controller=("hostB", 222))).number == 2  # fmt: skip
    storage.create_trial(experiment_id, TrialSpec(None, {"x": 3}))  # no controller named: not checked (NNI's)


def test_a_purge_retried_after_its_first_try_landed_finds_it_done(storage: SqlStorage):
    from hpo.storage.retry import as_replay

    experiment_id, _ = _experiment_with_curves(storage, "once", 1)
    assert storage.purge_experiment(experiment_id, *DELETER, stale_after_s=60) == (1, 6)
    with as_replay():
        assert storage.purge_experiment(experiment_id, *DELETER, stale_after_s=60) is None


def test_annotations_join_the_spec_and_the_definition_stays(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {"experiment": {"name": "x"}, "run_dir": "/runs/x"}, "minimize")
    links = [{"arm": None, "nni_experiment": "hpo1-arm0", "url": "http://127.0.0.1:8080"}]
    storage.annotate_experiment(experiment_id, "nni_webui", links)
    storage.annotate_experiment(experiment_id, "note", 1)
    spec = storage.get_experiment(experiment_id).spec
    assert spec == {"experiment": {"name": "x"}, "run_dir": "/runs/x", "nni_webui": links, "note": 1}
    storage.annotate_experiment(experiment_id, "note", 2)  # replaced
    assert storage.get_experiment(experiment_id).spec["note"] == 2
    for key in ("experiment", "run_dir"):
        with pytest.raises(ValueError, match="definition"):
            storage.annotate_experiment(experiment_id, key, {})
    assert storage.get_experiment(experiment_id).spec["run_dir"] == "/runs/x"
    with pytest.raises(NotFoundError):
        storage.annotate_experiment(999, "note", 1)


def test_invalid_direction_or_status_is_a_value_error(storage: SqlStorage):
    with pytest.raises(ValueError):
        storage.create_experiment("x", {}, "sideways")
    experiment_id = storage.create_experiment("y", {}, "minimize")
    with pytest.raises(ValueError):
        storage.set_experiment_status(experiment_id, "paused")


def test_status_changes_set_ended_at_and_resume_clears_stop_request(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    assert storage.is_stop_requested(experiment_id) is False
    storage.request_stop(experiment_id)
    assert storage.is_stop_requested(experiment_id) is True
    storage.set_experiment_status(experiment_id, ExperimentStatus.STOPPED)
    stopped = storage.get_experiment(experiment_id)
    assert stopped.status is ExperimentStatus.STOPPED and stopped.ended_at is not None
    storage.set_experiment_status(experiment_id, ExperimentStatus.RUNNING)
    resumed = storage.get_experiment(experiment_id)
    assert resumed.stop_requested is False and resumed.ended_at is None


def test_missing_experiments_raise_not_found_naming_them(storage: SqlStorage):
    with pytest.raises(NotFoundError, match="experiment 999"):
        storage.get_experiment(999)
    with pytest.raises(NotFoundError, match="'nope'"):
        storage.get_experiment_by_name("nope")
    calls = [
        lambda: storage.set_experiment_status(999, "finished"),
        lambda: storage.request_stop(999),
        lambda: storage.is_stop_requested(999),
        lambda: storage.create_trial(999, make_spec(0)),
        lambda: storage.list_trials(999),
        lambda: storage.list_trials(999, after=0),
        lambda: storage.count_trials(999),
        lambda: storage.count_trials_by_state(999),
        lambda: storage.requeue_interrupted(999),
        lambda: storage.best_trial(999),
        lambda: storage.best_trial_id(999),
        lambda: storage.best_per_arm(999),
        lambda: storage.get_trial_by_number(999, 0),
    ]
    for call in calls:
        with pytest.raises(NotFoundError, match="experiment 999 does not exist"):
            call()


# -- trials --------------------------------------------------------------------------------------------------


def test_trial_lifecycle(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    spec = TrialSpec(
        0, {"optimizer.lr": 2e-3}, arm="optimizer.name=lamb", budget=0.5, gpus=(0, 1), global_batch_size=64
    )
    trial_id = storage.create_trial(experiment_id, spec)
    queued = storage.get_trial(trial_id)
    assert queued.state is TrialState.QUEUED and queued.spec == spec and queued.result is None
    assert queued.started_at is None and queued.finished_at is None

    storage.mark_trial_running(trial_id, [2, 3], pid=4242, host="node-1")
    running = storage.get_trial(trial_id)
    assert running.state is TrialState.RUNNING
    assert (running.gpus, running.pid, running.host) == ((2, 3), 4242, "node-1")
    assert running.started_at is not None

    result = TrialResult(
        TrialState.COMPLETED,
        reason="reached_target",
        objective=1.5e6,
        samples_to_target=1_500_000,
        time_to_target_s=321.5,
        best_mlm_accuracy=0.721,
        duration_s=330.0,
        metrics={"status": "reached_target", "throughput": {"seq_per_s": 812.5}},
    )
    storage.finish_trial(trial_id, result)
    finished = storage.get_trial(trial_id)
    assert finished.result == result
    assert finished.finished_at >= finished.started_at >= finished.created_at
    assert storage.get_trial_by_number(experiment_id, 0) == finished


def test_mark_running_without_gpus_keeps_the_planned_allocation(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0, gpus=(5,)))
    storage.mark_trial_running(trial_id)
    assert storage.get_trial(trial_id).gpus == (5,)


def test_a_trial_starts_only_once(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    storage.mark_trial_running(trial_id)
    with pytest.raises(StorageError, match=f"cannot start trial {trial_id}: it is running"):
        storage.mark_trial_running(trial_id)


def test_finishing_twice_raises_and_keeps_the_first_result(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = add_finished_trial(storage, experiment_id, 0, objective=3.0)
    with pytest.raises(StorageError, match="it is completed"):
        storage.finish_trial(trial_id, TrialResult(TrialState.FAILED, reason="killed"))
    with pytest.raises(StorageError, match="cannot start"):
        storage.mark_trial_running(trial_id)
    kept = storage.get_trial(trial_id)
    assert kept.state is TrialState.COMPLETED and kept.objective == 3.0 and kept.reason is None


def test_a_queued_trial_can_fail_before_it_runs(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    storage.finish_trial(trial_id, TrialResult(TrialState.FAILED, reason="could not launch torchrun"))
    assert storage.get_trial(trial_id).reason == "could not launch torchrun"


def test_finish_needs_a_finished_state(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    with pytest.raises(ValueError, match="finished state"):
        storage.finish_trial(trial_id, TrialResult(TrialState.RUNNING))


def test_nan_results_are_stored_as_none(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    diverged = TrialResult(TrialState.DIVERGED, "loss is nan", objective=float("nan"), metrics={"loss": float("nan")})
    storage.finish_trial(trial_id, diverged)
    trial = storage.get_trial(trial_id)
    assert trial.objective is None and trial.metrics == {"loss": None}


def test_duplicate_trial_number_is_a_storage_error(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    storage.create_trial(experiment_id, make_spec(0))
    with pytest.raises(StorageError, match="already has a trial number 0"):
        storage.create_trial(experiment_id, make_spec(0))
    other = storage.create_experiment("y", {}, "minimize")
    storage.create_trial(other, make_spec(0))  # numbers are per experiment
    assert [t.number for t in storage.list_trials(experiment_id)] == [0]
    unnumbered = dataclasses.replace(make_spec(5), number=None)  # takes the next number of its experiment
    assert storage.create_trial(experiment_id, unnumbered) != storage.create_trial(other, unnumbered)
    assert [t.number for t in storage.list_trials(experiment_id)] == [0, 1]
    assert [t.number for t in storage.list_trials(other)] == [0, 1]


def test_missing_trials_raise_not_found(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    calls = [
        lambda: storage.get_trial(12345),
        lambda: storage.mark_trial_running(12345),
        lambda: storage.finish_trial(12345, TrialResult(TrialState.FAILED)),
        lambda: storage.add_metrics(12345, [(0, 0, {"loss": 1.0})]),
        lambda: storage.get_metrics(12345),
    ]
    for call in calls:
        with pytest.raises(NotFoundError, match="trial 12345 does not exist"):
            call()
    with pytest.raises(NotFoundError, match="no trial number 7"):
        storage.get_trial_by_number(experiment_id, 7)


def test_list_trials_filters_and_pages_in_number_order(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    for number in [3, 0, 4, 1, 2, 5]:  # created out of order on purpose
        arm = "lamb" if number % 2 else "adam"
        trial_id = storage.create_trial(experiment_id, make_spec(number, arm=arm))
        if number < 4:
            storage.mark_trial_running(trial_id)
        if number < 2:
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(number)))

    def numbers(**filters):
        return [trial.number for trial in storage.list_trials(experiment_id, **filters)]

    assert numbers() == [0, 1, 2, 3, 4, 5]
    assert numbers(offset=2, limit=3) == [2, 3, 4]
    assert numbers(offset=5, limit=10) == [5]
    assert numbers(offset=6) == []
    assert numbers(state=TrialState.RUNNING) == [2, 3]
    assert numbers(state=[TrialState.QUEUED, TrialState.COMPLETED]) == [0, 1, 4, 5]
    assert numbers(arm="lamb") == [1, 3, 5]
    assert numbers(arm="lamb", state=TrialState.RUNNING, limit=1) == [3]
    assert storage.count_trials(experiment_id) == 6
    assert storage.count_trials(experiment_id, arm="adam", state=TrialState.QUEUED) == 1
    with pytest.raises(ValueError):
        storage.list_trials(experiment_id, offset=-1)


def test_list_trials_after_a_number_pages_by_key_with_filters(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    other_id = storage.create_experiment("other", {}, "minimize")
    for number in [3, 0, 4, 1, 2, 5, 7]:  # out of order, and a gap (no 6)
        storage.create_trial(experiment_id, make_spec(number, arm="lamb" if number % 2 else "adam"))
        storage.create_trial(other_id, make_spec(number))  # interleaved ids: the key is the number, not the id
    add_finished_trial(storage, experiment_id, 8, 1.0, arm="lamb")

    def numbers(**paging):
        return [trial.number for trial in storage.list_trials(experiment_id, **paging)]

    assert numbers(after=1) == [2, 3, 4, 5, 7, 8]
    assert numbers(after=1, limit=3) == [2, 3, 4]
    assert numbers(after=5, limit=3) == [7, 8]
    assert numbers(after=6) == [7, 8]  # a number that no trial has is a valid key
    assert numbers(after=8) == numbers(after=2**31 - 1) == []
    assert numbers(after=1, offset=2, limit=2) == [4, 5]  # offset skips within the keyed range
    assert numbers(after=0, arm="lamb") == [1, 3, 5, 7, 8]
    assert numbers(after=3, arm="lamb", state=TrialState.QUEUED) == [5, 7]
    assert numbers(after=3, state=[TrialState.COMPLETED]) == [8]
    with pytest.raises(ValueError, match="after"):
        storage.list_trials(experiment_id, after=-1)
    with pytest.raises(ValueError, match="number order"):
        storage.list_trials(experiment_id, after=0, order_by="objective")


def test_trial_versions_are_list_trials_pages_in_brief_and_get_trials_reads_ids_in_order(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "maximize")
    for number, objective in [(3, 0.5), (0, 0.1), (4, None), (1, 0.9), (2, 0.3)]:
        if objective is None:
            storage.create_trial(experiment_id, make_spec(number, arm="lamb"))
        else:
            add_finished_trial(storage, experiment_id, number, objective, arm="lamb" if number % 2 else "adam")
    storage.requeue_trial(storage.get_trial_by_number(experiment_id, 4).id, attempt=0, reason="lost")
    pagings = [{}, {"after": 1, "limit": 2}, {"order_by": "objective", "offset": 1, "limit": 3},
               {"arm": "lamb"}, {"state": [TrialState.COMPLETED], "after": 0}]  # fmt: skip
    for paging in pagings:
        trials = storage.list_trials(experiment_id, **paging)
        versions = storage.list_trial_versions(experiment_id, **paging)
        assert versions == [TrialVersion(t.id, t.number, t.state, t.attempt) for t in trials], paging
    assert [v.attempt for v in storage.list_trial_versions(experiment_id)] == [0, 0, 0, 0, 1]
    ids = [v.id for v in storage.list_trial_versions(experiment_id)]
    assert storage.get_trials(ids[::-1]) == storage.list_trials(experiment_id)[::-1]
    assert storage.get_trials([]) == []
    with pytest.raises(NotFoundError, match="no trial with id 12345"):
        storage.get_trials([ids[0], 12345])
    with pytest.raises(ValueError, match="after"):
        storage.list_trial_versions(experiment_id, after=-1)


def test_pages_by_key_cover_every_trial_exactly_once_while_trials_are_added(storage: SqlStorage):
    """A reader pages through an experiment while a controller creates trials (next numbers, as `hpo run` does)
    and finishes others between its pages: the pages hold every trial once, in number order."""
    experiment_id = storage.create_experiment("growing", {}, "minimize")

    def create_next() -> int:
        return storage.create_trial(experiment_id, TrialSpec(number=None, params={"optimizer.lr": 1e-3}))

    created = [create_next() for _ in range(5)]
    seen: list[int] = []
    after, pages = None, 0
    while True:
        page = storage.list_trials(experiment_id, after=after, limit=2)
        if not page:
            break
        seen += [trial.number for trial in page]
        after, pages = page[-1].number, pages + 1
        if pages <= 4:  # between pages: two new trials, and an old one finishes
            created += [create_next(), create_next()]
            storage.mark_trial_running(created[pages])
            storage.finish_trial(created[pages], TrialResult(TrialState.COMPLETED, objective=float(pages)))
    everything = [trial.number for trial in storage.list_trials(experiment_id)]
    assert len(everything) == 5 + 2 * 4 == storage.count_trials(experiment_id)
    assert seen == everything == sorted(set(seen))  # every trial once, in number order
    assert pages == 7  # ceil(13 / 2): the walk kept up with the growth


def _walk(storage: SqlStorage, experiment_id: int, limit: int, between=None, versions: bool = False, **filters):
    """The numbers a reader sees paging by key with `filters`, `limit` a page; `between(page_index)` runs between
    pages."""
    read = storage.list_trial_versions if versions else storage.list_trials
    seen: list[int] = []
    after, pages = None, 0
    while page := read(experiment_id, after=after, limit=limit, **filters):
        seen += [trial.number for trial in page]
        after, pages = page[-1].number, pages + 1
        if between is not None:
            between(pages)
    return seen


FILTERS = [{}, {"state": TrialState.COMPLETED}, {"state": [TrialState.FAILED]}, {"arm": "lamb"},
           {"state": TrialState.COMPLETED, "arm": "lamb"}, {"state": [TrialState.QUEUED, TrialState.FAILED]},
           {"state": [TrialState.FAILED, TrialState.COMPLETED, TrialState.RUNNING], "arm": "adam"},
           {"state": [TrialState.DIVERGED]}, {"state": []}]  # fmt: skip


def test_filtered_pages_by_key_hold_exactly_the_matching_trials_in_number_order(storage: SqlStorage):
    """Every filter (one state, several, an arm, both) paged by key at several page sizes, through `list_trials`
    and `list_trial_versions`, gives the trials this test put in those states and arms, in number order."""
    experiment_id = storage.create_experiment("x", {}, "minimize")
    other_id = storage.create_experiment("other", {}, "minimize")
    made: dict[int, tuple[str, TrialState]] = {}  # number -> (arm, state), as this test set them
    states = [TrialState.QUEUED, TrialState.RUNNING, TrialState.COMPLETED, TrialState.FAILED, TrialState.COMPLETED]
    for number in [*range(0, 30, 2), *range(29, 0, -2)]:  # out of order
        arm, state = ("lamb", "adam", "lamb")[number % 3], states[number * 7 % 5]
        trial_id = storage.create_trial(experiment_id, make_spec(number, arm=arm))
        storage.create_trial(other_id, make_spec(number, arm=arm))  # same numbers and arms in another experiment
        if state is not TrialState.QUEUED:
            storage.mark_trial_running(trial_id)
        if state.finished:
            storage.finish_trial(trial_id, TrialResult(state, objective=float(number)))
        made[number] = (arm, state)

    def expected(state=None, arm=None) -> list[int]:
        allowed = None if state is None else {state} if isinstance(state, TrialState) else set(state)
        return [n for n, (a, s) in sorted(made.items()) if (allowed is None or s in allowed) and arm in (None, a)]

    for filters in FILTERS:
        for limit in (1, 4, 50):
            for versions in (False, True):
                assert _walk(storage, experiment_id, limit, versions=versions, **filters) == expected(**filters), (
                    filters, limit, versions)  # fmt: skip
        assert storage.count_trials(experiment_id, **filters) == len(expected(**filters))
    several = {"state": [TrialState.COMPLETED, TrialState.FAILED], "arm": "lamb"}  # an offset within a merged page
    page = storage.list_trials(experiment_id, after=5, offset=2, limit=3, **several)
    assert [t.number for t in page] == [n for n in expected(**several) if n > 5][2:5]


@pytest.mark.parametrize(
    "filters",
    [{"state": TrialState.COMPLETED, "arm": "lamb"}, {"state": [TrialState.COMPLETED, TrialState.FAILED]}],
    ids=["completed-of-one-arm", "completed-or-failed"],
)
def test_filtered_pages_by_key_cover_the_matching_trials_once_while_trials_are_added(storage: SqlStorage, filters):
    """A reader pages a filtered list (the completed trials of one arm; the completed or failed ones) while a
    controller creates trials and finishes most of them between its pages, and starts a queued one (which matches
    neither filter, before or after): every trial that matches at the end, each once, in number order (this test's
    own record of what it made)."""
    experiment_id = storage.create_experiment("growing", {}, "minimize")
    made: dict[int, tuple[str, TrialState]] = {}  # number -> (arm, state), as this test set them
    queued: list[tuple[int, int]] = []  # (id, number) of the queued trials, oldest first
    outcomes = [
        TrialState.COMPLETED,
        TrialState.FAILED,
        TrialState.COMPLETED,
        TrialState.DIVERGED,
        TrialState.COMPLETED,
    ]

    def add(finish: bool) -> None:
        number, arm, state = len(made), ("lamb", "adam")[len(made) % 2], TrialState.QUEUED
        trial_id = storage.create_trial(experiment_id, TrialSpec(None, {"optimizer.lr": 1e-3}, arm))
        if finish:
            state = outcomes[number % 5]
            storage.mark_trial_running(trial_id)
            storage.finish_trial(trial_id, TrialResult(state, objective=float(number)))
        else:
            queued.append((trial_id, number))
        made[number] = (arm, state)

    def between(page: int) -> None:
        if page <= 5:
            for finish in (True, True, True, False):  # new trials above the reader, most of them finished
                add(finish)
            trial_id, number = queued.pop(0)
            storage.mark_trial_running(trial_id)
            made[number] = (made[number][0], TrialState.RUNNING)

    for n in range(20):
        add(finish=n % 4 != 3)
    seen = _walk(storage, experiment_id, 2, between, **filters)
    allowed = {filters["state"]} if isinstance(filters["state"], TrialState) else set(filters["state"])
    expected = [n for n, (arm, state) in sorted(made.items()) if state in allowed and filters.get("arm") in (None, arm)]
    assert len(made) == 40 and len(expected) >= 12  # the walk lasted all five rounds; 12 and 24 trials match
    assert seen == expected


def test_every_change_of_a_trial_record_adds_one_to_its_experiments_version(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    other_id = storage.create_experiment("other", {}, "minimize")
    version = lambda: storage.trials_version(experiment_id)  # noqa: E731
    assert version() == 0 == storage.get_experiment(experiment_id).trials_version
    first = storage.create_trial(experiment_id, make_spec(0))
    second = storage.create_trial(experiment_id, make_spec(1))
    assert version() == 2
    storage.mark_trial_running(first, pid=1)
    storage.add_metrics(first, [MetricPoint(1, 64, {"loss": 2.0})])  # a metric row is not the trial's record
    storage.heartbeat(experiment_id, "h", 1)  # nor is the experiment's own state
    storage.annotate_experiment(experiment_id, "nni_webui", [])
    assert version() == 3
    storage.finish_trial(first, TrialResult(TrialState.COMPLETED, objective=1.0))
    assert version() == 4
    with pytest.raises(StorageError):
        storage.finish_trial(first, TrialResult(TrialState.COMPLETED, objective=0.5))  # refused: nothing changed
    with pytest.raises(StaleAttemptError):
        storage.mark_trial_running(second, attempt=3)
    assert version() == 4
    storage.mark_trial_running(second)
    storage.interrupt_trial(second, "stopped")
    assert version() == 6
    storage.requeue_trial(second, attempt=0, reason="lost")
    storage.mark_trial_running(second, attempt=1)
    assert version() == 8
    assert [t.number for t in storage.requeue_interrupted(experiment_id)] == [1]
    assert version() == 9 == storage.get_experiment(experiment_id).trials_version
    assert storage.trials_version(other_id) == 0  # another experiment's trials are not this one's
    with pytest.raises(NotFoundError, match="experiment 999"):
        storage.trials_version(999)


def test_count_trials_by_state_lists_every_state(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    storage.create_trial(experiment_id, make_spec(0))
    storage.mark_trial_running(storage.create_trial(experiment_id, make_spec(1)))
    add_finished_trial(storage, experiment_id, 2, None, TrialState.FAILED)
    add_finished_trial(storage, experiment_id, 3, 1.0)
    add_finished_trial(storage, experiment_id, 4, 2.0)
    counts = storage.count_trials_by_state(experiment_id)
    assert counts == {
        TrialState.QUEUED: 1,
        TrialState.RUNNING: 1,
        TrialState.COMPLETED: 2,
        TrialState.DIVERGED: 0,
        TrialState.FAILED: 1,
        TrialState.TIMEOUT: 0,
        TrialState.INTERRUPTED: 0,
    }


def test_requeue_interrupted_requeues_only_running_trials(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    other_id = storage.create_experiment("other", {}, "minimize")
    done = storage.create_trial(experiment_id, make_spec(0))
    storage.mark_trial_running(done)
    storage.add_metrics(done, [(0, 0, {"loss": 9.0})])
    storage.finish_trial(done, TrialResult(TrialState.COMPLETED, objective=1.0))
    queued = storage.create_trial(experiment_id, make_spec(1))
    running = [storage.create_trial(experiment_id, make_spec(n)) for n in (2, 3)]
    for trial_id in running:
        storage.mark_trial_running(trial_id, [0], pid=99, host="dead-node")
        storage.add_metrics(trial_id, [(0, 0, {"loss": 9.0}), (1, 32, {"loss": 8.0})])
    elsewhere = storage.create_trial(other_id, make_spec(0))
    storage.mark_trial_running(elsewhere)

    requeued = storage.requeue_interrupted(experiment_id)

    assert [trial.id for trial in requeued] == running
    for trial in requeued:
        assert trial.state is TrialState.QUEUED and "interrupted" in trial.reason
        assert (trial.pid, trial.host, trial.started_at) == (None, None, None)
        assert storage.get_metrics(trial.id) == []  # the re-run reports its curve again
    assert storage.get_trial(done).state is TrialState.COMPLETED and len(storage.get_metrics(done)) == 1
    assert storage.get_trial(queued).state is TrialState.QUEUED
    assert storage.get_trial(elsewhere).state is TrialState.RUNNING
    assert storage.requeue_interrupted(experiment_id) == []  # nothing left to requeue
    storage.mark_trial_running(running[0])  # and a requeued trial runs again normally


def test_interrupt_closes_a_running_attempt_and_resume_requeues_it(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    storage.mark_trial_running(trial_id, pid=99, host="node", attempt=0)
    with pytest.raises(StaleAttemptError):
        storage.interrupt_trial(trial_id, "stopped", attempt=1)
    storage.interrupt_trial(trial_id, "experiment stopped by request", attempt=0)
    stopped = storage.get_trial(trial_id)
    assert stopped.state is TrialState.INTERRUPTED and stopped.reason == "experiment stopped by request"
    assert stopped.finished_at is not None and stopped.finished_at >= stopped.started_at
    assert stopped.result is None  # not a result: the tuner is told nothing
    with pytest.raises(StorageError, match="interrupted"):
        storage.interrupt_trial(trial_id, "again")

    (requeued,) = storage.requeue_interrupted(experiment_id)
    assert (requeued.state, requeued.attempt, requeued.finished_at) == (TrialState.QUEUED, 1, None)


def test_creating_a_trial_stamps_the_trials_told_since_the_previous_one_with_its_number(storage: SqlStorage):
    experiment_id = storage.create_experiment("told", SPEC, "minimize")
    other = storage.create_experiment("other", SPEC, "minimize")
    first, second = (storage.create_trial(experiment_id, make_spec(n)) for n in (0, 1))
    elsewhere = storage.create_trial(other, make_spec(0))
    version = storage.get_experiment(experiment_id).trials_version
    third = storage.create_trial(experiment_id, make_spec(2), told=[second, first, elsewhere])  # in telling order
    told = {t.id: (t.told_before, t.told_order) for t in storage.list_trials(experiment_id)}
    assert told == {first: (2, 1), second: (2, 0), third: (None, None)}
    assert (storage.get_trial(first).told_before, storage.get_trial(first).told_order) == (2, 1)  # the single read
    assert storage.get_trial(elsewhere).told_before is None  # another experiment's trial is not stamped
    assert storage.get_experiment(experiment_id).trials_version > version
    # A re-queued trial has not been told what its next attempt gives
    storage.mark_trial_running(third)
    storage.create_trial(experiment_id, make_spec(3), told=[third])
    assert storage.requeue_trial(third, 0, "lost").told_before is None
    storage.mark_trial_running(third, attempt=1)
    storage.create_trial(experiment_id, make_spec(4), told=[third])
    storage.interrupt_trial(third, "stopped", attempt=1)
    (requeued,) = storage.requeue_interrupted(experiment_id)
    assert (requeued.id, requeued.told_before, requeued.told_order) == (third, None, None)


def test_a_finished_trial_cannot_be_interrupted(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    done = add_finished_trial(storage, experiment_id, 0, objective=1.0)
    with pytest.raises(StorageError, match="completed"):
        storage.interrupt_trial(done, "stopped", attempt=0)
    assert storage.get_trial(done).state is TrialState.COMPLETED


@pytest.mark.parametrize("close", ["finish", "interrupt"])
def test_a_closed_record_takes_no_more_metrics(storage: SqlStorage, close):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    storage.mark_trial_running(trial_id, attempt=0)
    assert storage.add_metrics(trial_id, [(1, 8, {"loss": 2.0})], attempt=0) == 1
    if close == "finish":
        storage.finish_trial(trial_id, TrialResult(TrialState.FAILED, "killed"), attempt=0)
    else:
        storage.interrupt_trial(trial_id, "stopped", attempt=0)
    for attempt in (0, None):  # the attempt that ran, and a writer that does not say
        with pytest.raises(TrialClosedError, match=f"trial {trial_id} is"):
            storage.add_metrics(trial_id, [(2, 16, {"loss": 1.0, "lr": 0.1})], attempt=attempt)
    records = storage.get_metrics(trial_id)
    assert [(r.step, r.name) for r in records] == [(1, "loss")]
    assert records[0].created_at <= storage.get_trial(trial_id).finished_at


# -- metrics -------------------------------------------------------------------------------------------------


def test_metrics_round_trip_in_step_order(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    first = [MetricPoint(step, step * 256, {"loss": 10.0 - step, "mlm_accuracy": step / 10}) for step in range(3)]
    assert storage.add_metrics(trial_id, first) == 6
    assert storage.add_metrics(trial_id, [(3, None, {"loss": float("nan")})]) == 1
    assert storage.add_metrics(trial_id, []) == 0

    records = storage.get_metrics(trial_id)
    assert [(r.step, r.name) for r in records][:4] == [
        (0, "loss"),
        (0, "mlm_accuracy"),
        (1, "loss"),
        (1, "mlm_accuracy"),
    ]
    assert len(records) == 7 and all(r.trial_id == trial_id for r in records)
    loss = storage.get_metrics(trial_id, name="loss")
    assert [(r.step, r.samples) for r in loss] == [(0, 0), (1, 256), (2, 512), (3, None)]
    assert [r.value for r in loss[:3]] == [10.0, 9.0, 8.0] and math.isnan(loss[3].value)
    assert [r.value for r in storage.get_metrics(trial_id, name="mlm_accuracy")] == [0.0, 0.1, 0.2]
    assert storage.get_metrics(trial_id, name="unknown") == []


def test_metrics_of_trials_do_not_mix(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    a, b = (storage.create_trial(experiment_id, make_spec(n)) for n in (0, 1))
    storage.add_metrics(a, [(0, 0, {"loss": 1.0})])
    storage.add_metrics(b, [(0, 0, {"loss": 2.0}), (1, 8, {"loss": 1.5})])
    assert [r.value for r in storage.get_metrics(a)] == [1.0]
    assert [r.value for r in storage.get_metrics(b)] == [2.0, 1.5]


def test_experiment_metrics_are_each_trials_get_metrics_in_one_read(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    other = storage.create_experiment("y", {}, "minimize")
    a, b, quiet = (storage.create_trial(experiment_id, make_spec(n)) for n in (0, 1, 2))
    elsewhere = storage.create_trial(other, make_spec(0))
    storage.add_metrics(a, [(1, 8, {"noise_scale": 3.0, "loss": 1.0}), (0, 0, {"noise_scale": float("nan")})])
    storage.add_metrics(b, [(0, 0, {"grad_sq_norm_big": 2.0, "noise_scale": 5.0})])
    storage.add_metrics(quiet, [(0, 0, {"loss": 1.0})])
    storage.add_metrics(elsewhere, [(0, 0, {"noise_scale": 9.0})])
    names = ("noise_scale", "grad_sq_norm_big")
    read = storage.get_experiment_metrics(experiment_id, names)
    assert read.keys() == {a, b}  # a trial without such a value is absent; another experiment's never appear
    for trial_id in (a, b):
        expected = [r for r in storage.get_metrics(trial_id) if r.name in names]
        assert [(r.step, r.samples, r.name, r.created_at) for r in read[trial_id]] == [
            (r.step, r.samples, r.name, r.created_at) for r in expected
        ]
        assert [r.value for r in read[trial_id]] == pytest.approx([r.value for r in expected], nan_ok=True)
    untimed = storage.get_experiment_metrics(experiment_id, names, times=False)  # the same, without the times
    assert {k: [(r.step, r.samples, r.name, r.created_at) for r in v] for k, v in untimed.items()} == {
        k: [(r.step, r.samples, r.name, None) for r in v] for k, v in read.items()
    }
    with pytest.raises(NotFoundError):
        storage.get_experiment_metrics(999, names)


# -- best trials ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("direction", "best_number"), [("minimize", 2), ("maximize", 4)])
def test_best_trial_follows_the_direction_and_skips_unfinished_or_failed(storage, direction, best_number):
    experiment_id = storage.create_experiment("x", {}, direction)
    add_finished_trial(storage, experiment_id, 0, objective=5.0)
    add_finished_trial(storage, experiment_id, 1, objective=-100.0, state=TrialState.DIVERGED)
    add_finished_trial(storage, experiment_id, 2, objective=1.0)
    add_finished_trial(storage, experiment_id, 3, objective=None, state=TrialState.FAILED)
    add_finished_trial(storage, experiment_id, 4, objective=7.0)
    add_finished_trial(storage, experiment_id, 5, objective=None)  # completed but no objective
    add_finished_trial(storage, experiment_id, 6, objective=100.0, state=TrialState.TIMEOUT)
    storage.create_trial(experiment_id, make_spec(7))  # queued: no result yet
    assert storage.best_trial(experiment_id).number == best_number
    assert storage.get_trial(storage.best_trial_id(experiment_id)).number == best_number


def test_best_trial_ties_go_to_the_earliest_trial(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "maximize")
    for number in [4, 2, 6, 1]:  # created out of number order: ties must follow numbers, not insertion
        add_finished_trial(storage, experiment_id, number, objective=0.72 if number != 1 else 0.5)
    assert storage.best_trial(experiment_id).number == 2


@pytest.mark.parametrize("arm", [None, "lamb"])
def test_a_best_short_rung_yields_to_its_configurations_promotion_with_the_same_objective(storage, arm):
    """Under asha or smac_hyperband a promotion continues its lower rung's run, so one that did not improve on it
    has the same objective: the best is then the run that trained the most of the budget (what `hpo export` and
    the report name), not the short rung that came first; another configuration's tie still goes by number."""
    a, b, c = ({"optimizer.lr": lr, "optimizer.name": "lamb"} for lr in (0.01, 0.02, 0.03))

    def best(trials):  # (params, budget, objective) in number order -> each answer's trial number
        experiment_id = storage.create_experiment(f"x{len(storage.list_experiments())}", {}, "minimize")
        numbers = {
            add_finished_trial(storage, experiment_id, number, objective, params=params, budget=budget, arm=arm): number
            for number, (params, budget, objective) in enumerate(trials)
        }
        answers = {numbers[storage.best_trial_id(experiment_id, arm=arm)], storage.best_trial(experiment_id).number,
                   storage.best_trial(experiment_id, arm=arm).number}  # fmt: skip
        if arm is not None:
            answers.add(storage.best_per_arm(experiment_id)[arm].number)
        assert len(answers) == 1, answers  # every way of asking agrees
        return answers.pop()

    # a misses at every rung with the same best accuracy (the promotions carry it), so its three trials tie, and
    # so does c's full run: a's full-budget run is the best, not its first rung
    assert best([(a, 1 / 9, 3e4), (b, 1 / 9, 3.1e4), (c, 1.0, 3e4), (a, 1 / 3, 3e4), (a, 1.0, 3e4)]) == 4
    assert best([(a, 1 / 9, 3e4), (b, 1 / 9, 3.1e4), (a, 1 / 3, 3e4)]) == 2  # its promotion still running
    # no promotion of a ties (c is another configuration): the earliest, a's short rung
    assert best([(a, 1 / 9, 3e4), (c, 1.0, 3e4), (a, 1 / 3, 3.2e4)]) == 0
    # a short rung strictly better than the rest stays
    assert best([(b, 1 / 3, 2.9e4), (a, 1 / 9, 3e4), (a, 1.0, 3e4)]) == 0


def test_best_trial_is_none_without_completed_trials(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    assert storage.best_trial(experiment_id) is None
    add_finished_trial(storage, experiment_id, 0, objective=None, state=TrialState.FAILED)
    storage.mark_trial_running(storage.create_trial(experiment_id, make_spec(1)))
    assert storage.best_trial(experiment_id) is None
    assert storage.best_per_arm(experiment_id) == {}


def test_best_trial_per_arm_and_per_batch_size(storage: SqlStorage):
    experiment_id = storage.create_experiment("x", {}, "minimize")
    trials = [  # (arm, global batch size, objective)
        ("adam", 256, 9.0),
        ("adam", 1024, 7.0),
        ("lamb", 256, 8.0),
        ("lamb", 1024, 3.0),
        ("lamb", 1024, 3.0),  # a tie within the arm
        ("adam", 256, 6.0),
        ("lamb", 4096, None),
    ]
    for number, (arm, batch, objective) in enumerate(trials):
        add_finished_trial(storage, experiment_id, number, objective, arm=arm, global_batch_size=batch)
    add_finished_trial(storage, experiment_id, 7, objective=0.5, state=TrialState.FAILED, arm="sgd")
    add_finished_trial(storage, experiment_id, 8, objective=2.0, arm=None)  # no arm: only in the overall best

    assert storage.best_trial(experiment_id).number == 8
    assert storage.best_trial(experiment_id, arm="adam").number == 5
    assert storage.best_trial(experiment_id, arm="lamb").number == 3
    assert storage.best_trial(experiment_id, arm="sgd") is None
    assert storage.best_trial(experiment_id, global_batch_size=256).number == 5
    assert storage.best_trial(experiment_id, global_batch_size=1024).number == 3
    assert storage.best_trial(experiment_id, global_batch_size=4096) is None
    assert storage.best_trial(experiment_id, arm="adam", global_batch_size=1024).number == 1
    best = storage.best_per_arm(experiment_id)
    assert {arm: trial.number for arm, trial in best.items()} == {"adam": 5, "lamb": 3}
    # The id-only question agrees with the full one for every filter, including the empty answers.
    for arm in [None, "adam", "lamb", "sgd"]:
        for batch in [None, 256, 1024, 4096]:
            trial = storage.best_trial(experiment_id, arm=arm, global_batch_size=batch)
            assert storage.best_trial_id(experiment_id, arm=arm, global_batch_size=batch) == (trial and trial.id)


def test_best_trial_ignores_other_experiments(storage: SqlStorage):
    mine = storage.create_experiment("mine", {}, "minimize")
    theirs = storage.create_experiment("theirs", {}, "minimize")
    add_finished_trial(storage, mine, 0, objective=10.0, arm="lamb")
    add_finished_trial(storage, theirs, 0, objective=1.0, arm="lamb")
    add_finished_trial(storage, theirs, 1, objective=1.0, arm="adam")
    assert storage.best_trial(mine).objective == 10.0
    assert list(storage.best_per_arm(mine)) == ["lamb"]


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_list_trials_by_objective_is_best_first_with_ties_by_number_and_missing_last(storage: SqlStorage, direction):
    eid = storage.create_experiment("ordered", {}, direction)
    objectives = {0: 5.0, 1: None, 2: 1.0, 3: 5.0, 4: 9.0, 5: None}
    for number, objective in objectives.items():
        state = TrialState.COMPLETED if objective is not None else TrialState.FAILED
        add_finished_trial(storage, eid, number, objective, state)
    with_value = sorted((n for n, o in objectives.items() if o is not None),
                        key=lambda n: ((1 if direction == "minimize" else -1) * objectives[n], n))  # fmt: skip
    expected = with_value + [1, 5]
    assert [t.number for t in storage.list_trials(eid, order_by="objective")] == expected
    assert [t.number for t in storage.list_trials(eid, order_by="objective", offset=2, limit=3)] == expected[2:5]
    with pytest.raises(ValueError):
        storage.list_trials(eid, order_by="name")


def test_a_live_controller_is_not_taken_over_by_a_machine_whose_clock_runs_ahead(storage: SqlStorage, monkeypatch):
    # Controllers on several machines share one server: heartbeats are dated and judged by the server's clock.
    if storage._engine.dialect.name == "sqlite":
        pytest.skip("an SQLite file is used from one machine, with one clock")
    experiment_id = storage.create_experiment("shared", {}, "minimize")
    storage.claim_controller(experiment_id, "hostA", 111, stale_after_s=60)
    ahead = datetime.now(timezone.utc) + timedelta(hours=1)
    monkeypatch.setattr("hpo.storage.sql._now", lambda: ahead)  # hostB's clock runs an hour ahead
    with pytest.raises(ControllerBusyError, match="hostA, pid 111"):
        storage.claim_controller(experiment_id, "hostB", 222, stale_after_s=60)
    assert storage.heartbeat(experiment_id, "hostA", 111)


def test_a_reader_whose_clock_is_off_still_sees_a_live_controller_as_live(storage: SqlStorage, monkeypatch):
    # `hpo status` and the API judge a heartbeat's age on the clock that dated it (read with the record).
    from hpo.engine import liveness as liveness_module
    from hpo.engine.liveness import liveness

    experiment_id = storage.create_experiment("watched", {}, "minimize")
    storage.set_experiment_status(experiment_id, ExperimentStatus.RUNNING)
    storage.claim_controller(experiment_id, "hostA", 111, stale_after_s=60)
    record = storage.get_experiment(experiment_id)
    assert record.read_at is not None and abs((record.read_at - record.heartbeat_at).total_seconds()) < 30
    assert liveness(record) == "live"
    if storage._engine.dialect.name != "sqlite":  # a reader on another machine, its clock an hour ahead
        ahead = datetime.now(timezone.utc) + timedelta(hours=1)

        class Ahead(datetime):
            @classmethod
            def now(cls, tz=None):
                return ahead

        monkeypatch.setattr(liveness_module, "datetime", Ahead)
        monkeypatch.setattr("hpo.storage.sql._now", lambda: ahead)
        assert liveness(storage.get_experiment(experiment_id)) == "live"
        assert [liveness(e) for e in storage.list_experiments()] == ["live"]
    # A heartbeat older than the stale limit on that clock is an interrupted controller
    stale = record.read_at + timedelta(hours=1)
    assert liveness(record, now=stale) == "interrupted"
