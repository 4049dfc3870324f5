"""Four trials stream metrics into one database at the same time, as parallel trials do during an experiment (four
processes released together still contend for it, on 2 cores as on more). They are forked, each opening a storage of
its own, and no connection of the test's process is open across the fork (SQLite's rule): a spawned one started an
interpreter and imported pytest and hpo.storage first, about half a second of CPU each."""

from __future__ import annotations

import multiprocessing
import os
import queue

from hpo.storage import MetricPoint, SqlStorage
from hpo.trials import TrialResult, TrialSpec, TrialState

WRITERS = 4
ROWS_PER_TRIAL = 1_000
ROWS_PER_CALL = 50  # a trial reports its progress in batches, not one row per transaction
TIMEOUT_S = 120


def run_at_once(target, storage: SqlStorage, experiment_id: int, processes: int) -> dict:
    """Start `processes` forked children running target(storage's url, experiment_id, index, barrier, results),
    released together by the barrier; their outcomes, {index: what each put on `results`} ({} if none answered in
    time). The storage's pooled connections are closed first: it opens new ones when it is used again."""
    storage._engine.dispose()
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(processes), context.Queue()
    children = [context.Process(target=target, args=(storage.url, experiment_id, i, start, results))
                for i in range(processes)]  # fmt: skip
    for child in children:
        child.start()
    try:
        return dict(results.get(timeout=TIMEOUT_S) for _ in children)
    except queue.Empty:
        return {}
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()


def stream_one_trial(url: str, experiment_id: int, number: int, start, results) -> None:
    """Child process: create a trial, stream its curve, finish it; put (number, error or None) on `results`."""
    try:
        storage = SqlStorage(url)
        start.wait(timeout=TIMEOUT_S)  # every writer begins at the same moment
        trial_id = storage.create_trial(experiment_id, TrialSpec(number, {"seed": number}))
        storage.mark_trial_running(trial_id, pid=os.getpid())
        for first in range(0, ROWS_PER_TRIAL, ROWS_PER_CALL):
            steps = range(first, first + ROWS_PER_CALL)
            storage.add_metrics(trial_id, [MetricPoint(step, step * 64, {"loss": 1.0 / (step + 1)}) for step in steps])
        storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(number)))
        storage.close()
        results.put((number, None))
    except BaseException as exc:  # report everything: the parent asserts no writer saw an error
        results.put((number, f"{type(exc).__name__}: {exc}"))


def test_parallel_trials_write_every_row(storage: SqlStorage):
    experiment_id = storage.create_experiment("parallel", {}, "minimize")
    outcomes = run_at_once(stream_one_trial, storage, experiment_id, WRITERS)
    assert outcomes == {number: None for number in range(WRITERS)}
    trials = storage.list_trials(experiment_id)
    assert [trial.state for trial in trials] == [TrialState.COMPLETED] * WRITERS
    # created, started, finished: three changes each, none lost, and no deadlock between creators (which lock the
    # experiment's row first) and finishers (which lock it after their trial's)
    assert storage.trials_version(experiment_id) == 3 * WRITERS
    for trial in trials:
        curve = storage.get_metrics(trial.id)
        assert [row.step for row in curve] == list(range(ROWS_PER_TRIAL))
        assert [row.value for row in curve] == [1.0 / (step + 1) for step in range(ROWS_PER_TRIAL)]


CREATORS = 4
TRIALS_PER_CREATOR = 10


def create_numbered_trials(url: str, experiment_id: int, creator: int, start, results) -> None:
    """Child process: create trials with `number=None` (the storage numbers them) as fast as it can."""
    try:
        storage = SqlStorage(url)
        start.wait(timeout=TIMEOUT_S)
        ids = [storage.create_trial(experiment_id, TrialSpec(None, {"creator": creator, "k": k}))
               for k in range(TRIALS_PER_CREATOR)]  # fmt: skip
        storage.close()
        results.put((creator, ids))
    except BaseException as exc:
        results.put((creator, f"{type(exc).__name__}: {exc}"))


def test_concurrent_creators_get_distinct_trial_numbers(storage: SqlStorage):
    experiment_id = storage.create_experiment("numbers", {}, "minimize")
    outcomes = run_at_once(create_numbered_trials, storage, experiment_id, CREATORS)
    errors = {c: o for c, o in outcomes.items() if isinstance(o, str)}
    assert not errors and len(outcomes) == CREATORS
    trials = storage.list_trials(experiment_id)
    assert sorted(t.number for t in trials) == list(range(CREATORS * TRIALS_PER_CREATOR))
    assert storage.trials_version(experiment_id) == CREATORS * TRIALS_PER_CREATOR  # no creation counted twice or lost
    for creator, ids in outcomes.items():  # each creator's trials are numbered in the order it created them
        numbers = [storage.get_trial(i).number for i in ids]
        assert numbers == sorted(numbers) and all(storage.get_trial(i).params["creator"] == creator for i in ids)
