"""The progress view of `hpo run` prints each finished trial once, whatever order trials finish in, and reads only
the trials numbered from the first it has not printed; `experiment_progress` counts what the trials say."""

from __future__ import annotations

import io

from hpo.engine.progress import ProgressView, experiment_progress, time_left
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState


def finish(storage: SqlStorage, trial_ids: list[int], *numbers: int) -> None:
    for number in numbers:
        storage.mark_trial_running(trial_ids[number])
        storage.finish_trial(trial_ids[number], TrialResult(TrialState.COMPLETED, objective=float(number)))


def printed(stream: io.StringIO) -> list[int]:
    """The numbers of the trials printed so far, in order."""
    return [int(line.split()[1].rstrip(":")) for line in stream.getvalue().splitlines() if line.startswith("trial ")]


def test_each_finished_trial_is_printed_once_in_any_order_of_finishing(tmp_path):
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    experiment_id = storage.create_experiment("progress", {}, "minimize")
    trial_ids = [storage.create_trial(experiment_id, TrialSpec(n, {"x": n})) for n in range(6)]
    stream = io.StringIO()
    view = ProgressView(storage, experiment_id, total=6, stream=stream)
    steps = [((1, 2), [1, 2], 0), ((0, 4), [1, 2, 0, 4], 3), ((), [1, 2, 0, 4], 3), ((3, 5), [1, 2, 0, 4, 3, 5], 6)]
    for numbers, expected, below in steps:
        finish(storage, trial_ids, *numbers)
        view._tick()
        assert printed(stream) == expected
        assert view._below == below  # every trial numbered below it is printed: the next read starts there
    storage.close()


def test_the_last_line_of_a_stopped_run_keeps_the_planned_total_and_an_ended_one_counts_what_it_made(tmp_path):
    """3 trials planned, 1 made and finished: stopped (a lost scheduler, Ctrl-C), 1 of 3 are done; run to its end
    (sequential confirmations that decided early), the 1 it made is the total."""
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    experiment_id = storage.create_experiment("progress", {}, "minimize")
    finish(storage, [storage.create_trial(experiment_id, TrialSpec(0, {"x": 0}))], 0)
    for ended, line in (
        (False, "trials: 1/3 done, 0 running, 2 waiting"),
        (True, "trials: 1/1 done, 0 running, 0 waiting"),
    ):
        stream = io.StringIO()
        view = ProgressView(storage, experiment_id, total=3, stream=stream).start()
        view.stop(ended=ended)
        assert stream.getvalue().splitlines()[-1].startswith(line), stream.getvalue()
    storage.close()


def test_progress_counts_tuning_trials_and_confirmation_runs(tmp_path):
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    spec = {"experiment": {"budget": {"trials": 5, "confirm_seeds": 2}}}  # not a valid file: the raw budget counts
    experiment_id = storage.create_experiment("counts", spec, "minimize")
    kinds = [TrialKind.TUNING] * 3 + [TrialKind.CONFIRMATION] * 2
    trial_ids = [storage.create_trial(experiment_id, TrialSpec(n, {"x": n}, kind=kind)) for n, kind in enumerate(kinds)]
    finish(storage, trial_ids, 0, 2, 4)
    record = storage.get_experiment(experiment_id)
    trials = storage.list_trials(experiment_id)
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    confirmations = [t for t in trials if t.kind is TrialKind.CONFIRMATION]
    assert (sum(t.state.finished for t in tuning), sum(t.state.finished for t in confirmations)) == (2, 1)
    assert experiment_progress(storage, record) == "2/5 tuning trials done, 1/2 confirmation runs"
    storage.close()


def test_time_left_is_the_runs_pace_for_each_unfinished_trial_less_the_running_ones_work_since_the_last():
    # one trial ended 30 s into the run; 21 unfinished, 20 of them waiting
    assert time_left(30.0, 1, 21, 20, since_last_s=1.0) == 30 * 21 - 1
    assert time_left(30.0, 1, 21, 20, since_last_s=100.0) == 30 * 20  # never below the waiting trials' share
    assert time_left(90.0, 3, 4, 2, since_last_s=10.0) == 30 * 4 - 10
    assert time_left(30.0, 0, 21, 20, since_last_s=1.0) is None  # no pace yet
    assert time_left(30.0, 1, 0, 0, since_last_s=1.0) is None  # nothing left


def test_the_estimate_counts_down_while_a_trial_runs_and_leaves_out_the_trials_of_an_earlier_run(monkeypatch):
    """A resumed run with 1 of 4 trials finished before it: no estimate until a trial of its own ends (30 s in), then
    30 s a trial for the 2 unfinished, counting down as the running one works, never below the waiting one's 30 s.
    (Elapsed over finished, the estimate before, gave 0m30s at 30 s and rose to 1m20s at 80 s.)"""
    now = [100.0]
    monkeypatch.setattr("hpo.engine.progress.time.monotonic", lambda: now[0])
    view = ProgressView(None, 0, total=4, stream=io.StringIO())
    seen = []
    for at, finished in ((100.0, 1), (130.0, 2), (145.0, 2), (180.0, 2)):
        now[0] = at
        line = view.status_line({TrialState.COMPLETED: finished, TrialState.RUNNING: 1}, {}, "")
        seen.append(line.split("elapsed ")[1])
    assert seen == ["0m00s", "0m30s, about 1m00s left", "0m45s, about 0m45s left", "1m20s, about 0m30s left"]


def test_the_last_line_of_a_stopped_run_has_no_estimate_and_no_reason_to_wait(monkeypatch):
    """Once the view stops nothing runs: what the controller's last note said trials waited for is past."""
    now = [0.0]
    monkeypatch.setattr("hpo.engine.progress.time.monotonic", lambda: now[0])
    view = ProgressView(None, 0, total=4, stream=io.StringIO())
    note = "1 running, 0 queued; waiting: the one CPU slot is busy"
    view.status_line({TrialState.RUNNING: 1}, {}, note)
    now[0] = 30.0
    running = view.status_line({TrialState.COMPLETED: 1, TrialState.RUNNING: 1}, {}, note)
    assert running.endswith("elapsed 0m30s, about 1m30s left (the one CPU slot is busy)")
    view._stop.set()
    assert view.status_line({TrialState.COMPLETED: 1, TrialState.INTERRUPTED: 1}, {}, note).endswith("elapsed 0m30s")


def test_a_trial_queued_again_is_said_once_with_why(tmp_path):
    """A Dask worker lost mid-trial: the trial is queued again for another attempt, which `hpo run` said nothing of
    (only `hpo trials` showed it, until the trial ended)."""
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    experiment_id = storage.create_experiment("progress", {}, "minimize")
    trial_ids = [
        storage.create_trial(experiment_id, TrialSpec(n, {"x": n}, arm="optimizer.name=lamb")) for n in range(2)
    ]
    stream = io.StringIO()
    view = ProgressView(storage, experiment_id, total=2, stream=stream)
    storage.mark_trial_running(trial_ids[1])
    view._tick()
    lost = "interrupted: its Dask worker tcp://10.0.0.7:40123 was lost while it ran"
    storage.requeue_trial(trial_ids[1], 0, lost)
    view._tick()
    view._tick()
    said = [line for line in stream.getvalue().splitlines() if line.startswith("trial ")]
    assert said == [f"trial 1 [optimizer.name=lamb]: queued again (attempt 2): {lost}"]
    storage.close()
