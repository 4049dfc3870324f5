"""The aggregates read commands use instead of listing trials (counts, confirmation runs, the span of the ended
trials) and the noise scale kept at finish, on both backends, each against the same numbers computed from
`list_trials` and `get_metrics` in the test."""

from __future__ import annotations

import statistics
from collections import Counter
from datetime import datetime, timedelta, timezone

import pytest

from hpo.errors import NotFoundError
from hpo.storage import MetricPoint, SqlStorage
from hpo.storage.base import TrialSpan
from hpo.trials import TrialKind, TrialResult, TrialState
from tests.hpo.storage.conftest import make_spec

ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"
# (kind, state, arm, samples to target) of each trial, numbered in this order
TRIALS = [
    (TrialKind.TUNING, TrialState.COMPLETED, ADAMW, 900),
    (TrialKind.TUNING, TrialState.COMPLETED, ADAMW, None),
    (TrialKind.TUNING, TrialState.COMPLETED, LAMB, None),
    (TrialKind.TUNING, TrialState.DIVERGED, LAMB, None),
    (TrialKind.TUNING, TrialState.FAILED, None, None),
    (TrialKind.TUNING, TrialState.RUNNING, LAMB, None),
    (TrialKind.TUNING, TrialState.QUEUED, ADAMW, None),
    (TrialKind.CONFIRMATION, TrialState.COMPLETED, ADAMW, 800),
    (TrialKind.CONFIRMATION, TrialState.COMPLETED, ADAMW, 1000),
    (TrialKind.CONFIRMATION, TrialState.TIMEOUT, LAMB, None),
    (TrialKind.CONFIRMATION, TrialState.QUEUED, LAMB, None),
]


def store(storage: SqlStorage, trials=TRIALS) -> int:
    experiment_id = storage.create_experiment("tally", {}, "minimize")
    for number, (kind, state, arm, samples) in enumerate(trials):
        trial_id = storage.create_trial(experiment_id, make_spec(number, arm=arm, kind=kind, seed=number))
        if state is TrialState.QUEUED:
            continue
        storage.mark_trial_running(trial_id)
        if state.finished:
            storage.finish_trial(trial_id, TrialResult(state, objective=float(number), samples_to_target=samples))
    return experiment_id


def test_the_tally_counts_trials_by_kind_state_and_arm_and_their_hits(storage: SqlStorage):
    experiment_id = store(storage)
    records = storage.list_trials(experiment_id)
    trials = Counter((t.kind, t.state, t.arm) for t in records)
    hits = Counter((t.kind, t.state, t.arm) for t in records if t.samples_to_target is not None)
    tally = storage.tally_trials(experiment_id)
    assert {(t.kind, t.state, t.arm): (t.trials, t.reached) for t in tally} == {
        key: (n, hits[key]) for key, n in trials.items()
    }
    assert sum(t.trials for t in tally) == len(TRIALS) and sum(t.reached for t in tally) == 3
    assert tally == sorted(tally, key=lambda t: (t.kind.value, t.state.value, t.arm is not None, t.arm or ""))
    assert storage.tally_trials(storage.create_experiment("empty", {}, "minimize")) == []
    with pytest.raises(NotFoundError, match="experiment 999"):
        storage.tally_trials(999)


def test_the_confirmations_are_the_confirmation_trials_in_number_order(storage: SqlStorage):
    experiment_id = store(storage)
    expected = [t for t in storage.list_trials(experiment_id) if t.kind is TrialKind.CONFIRMATION]
    assert [t.number for t in expected] == [7, 8, 9, 10]
    assert storage.list_confirmations(experiment_id) == expected
    assert storage.list_confirmations(store_tuning_only(storage)) == []
    with pytest.raises(NotFoundError, match="experiment 999"):
        storage.list_confirmations(999)


def store_tuning_only(storage: SqlStorage) -> int:
    experiment_id = storage.create_experiment("tuning only", {}, "minimize")
    storage.create_trial(experiment_id, make_spec(0))
    return experiment_id


def test_the_span_of_the_ended_trials_is_exact_to_the_microsecond(storage: SqlStorage):
    moments = iter(datetime(2026, 11, 28, 10, 0, 0, 0, timezone.utc) + timedelta(seconds=s)
                   for s in (0.25, 7.000001, 93.5, 1e5 + 0.999999, 1e5 + 1.5, 2e5 + 0.123457, 3e5, 4e5 + 0.5, 5e5,
                             6e5, 7e5, 8e5, 9e5, 1e6, 1.1e6, 1.2e6, 1.3e6, 1.4e6, 1.5e6, 1.6e6, 1.7e6, 1.8e6, 1.9e6,
                             2e6, 2.1e6, 2.2e6, 2.3e6, 2.4e6, 2.5e6, 2.6e6))  # fmt: skip
    storage.use_trial_clock(lambda: next(moments))
    experiment_id = store(storage)
    assert storage.trial_span(store_tuning_only(storage)) == TrialSpan(0, 0.0, None, None)
    ended = [t for t in storage.list_trials(experiment_id) if t.started_at and t.finished_at]
    assert len(ended) == 8  # the two queued trials and the running one have not ended
    busy_us = sum((t.finished_at - t.started_at) // timedelta(microseconds=1) for t in ended)
    expected = TrialSpan(8, busy_us / 1e6, min(t.created_at for t in ended), max(t.finished_at for t in ended))
    assert storage.trial_span(experiment_id) == expected
    assert busy_us % 1_000_000 != 0 and busy_us % 1000 != 0  # microseconds count, not only seconds or milliseconds
    with pytest.raises(NotFoundError, match="experiment 999"):
        storage.trial_span(999)


def test_a_trial_keeps_its_late_noise_scale_when_it_finishes(storage: SqlStorage):
    experiment_id = storage.create_experiment("noise", {}, "minimize")
    trial_id = storage.create_trial(experiment_id, make_spec(0))
    storage.mark_trial_running(trial_id)
    # steps 1..10 at 100 samples each; estimates at every step but 7 (missing) and 9 (not positive), one at
    # step 10 is inf; the big batch's norm measured at every step
    points = []
    for step in range(1, 11):
        values = {"grad_sq_norm_big": 1.0, "loss": 3.0}
        if step not in (7, 9, 10):
            values["noise_scale"] = 10.0 * step
        values["noise_scale"] = {9: -4.0, 10: float("inf")}.get(step, values.get("noise_scale"))
        points.append(MetricPoint(step, 100 * step, {k: v for k, v in values.items() if v is not None}))
    storage.add_metrics(trial_id, points)
    assert storage.get_trial(trial_id).late_noise_undefined is None  # not kept before it finishes
    storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=1.0))
    trial = storage.get_trial(trial_id)
    # the positive, finite estimates at steps 1-6 and 8 (samples 100-600, 800); the second half: samples >= 400
    assert trial.late_noise_scale == statistics.median([40.0, 50.0, 60.0, 80.0]) == 55.0
    # late measured steps (samples >= 500): 5..10; without a positive estimate: 7, 9, 10
    assert trial.late_noise_undefined == 3 / 6
    assert storage.list_trials(experiment_id)[0] == trial

    quiet = storage.create_trial(experiment_id, make_spec(1))
    storage.finish_trial(quiet, TrialResult(TrialState.FAILED, reason="crashed"))  # never ran: no records
    assert (storage.get_trial(quiet).late_noise_scale, storage.get_trial(quiet).late_noise_undefined) == (None, 0.0)


def test_listed_trials_are_the_records_read_one_by_one(storage: SqlStorage):
    """`list_trials` builds its records from rows by position; `get_trials` from ORM objects by name: the same
    records, field for field, for trials in every state and kind (with and without results, times, arms)."""
    experiment_id = store(storage)
    listed = storage.list_trials(experiment_id)
    assert len(listed) == len(TRIALS)
    assert listed == storage.get_trials([t.id for t in listed])
    assert {t.state for t in listed} == {state for _, state, _, _ in TRIALS}
    assert all(t.created_at.tzinfo is not None for t in listed)
