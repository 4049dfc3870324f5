"""The study loop when its runner fails it, with stand-in runners: a trial whose worker is lost (a Dask worker that
died under it) runs once more, then fails, and the attempts a resume made do not count against that allowance; a
trial that cannot start ends the running ones, recorded as interrupted, before the error leaves the loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.engine.study import Study
from hpo.errors import ResourceError
from hpo.experiment import stored_form
from hpo.runners.base import Runner, TrialExit
from hpo.storage import SqlStorage
from hpo.storage.base import ExperimentStatus
from hpo.trials import TrialSpec, TrialState
from tests.hpo.engine.test_study import make_spec


class EveryWorkerLost(Runner):
    def __init__(self, storage: SqlStorage):
        self.storage, self.started = storage, []

    def describe(self) -> str:
        return "workers that are all lost"

    def free_slots(self) -> int:
        return 1 - len(self.started)

    def why_waiting(self) -> str:
        return ""

    def submit(self, launch) -> None:
        self.storage.mark_trial_running(launch.trial_id, attempt=launch.attempt, host="w1", pid=1)
        self.started.append(launch)

    def poll(self) -> list[TrialExit]:
        lost = "its Dask worker tcp://w1 was lost while it ran"
        exits = [TrialExit(launch.trial_id, launch.attempt, lost=lost) for launch in self.started]
        self.started = []
        return exits

    def cancel_all(self) -> list[TrialExit]:
        return []


def test_a_lost_worker_reruns_a_trial_once_also_after_a_resume(tmp_path: Path):
    spec = make_spec(tmp_path, trials=1, budget={"max_parallel": 1})
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    fresh = storage.create_experiment("fresh", stored_form(spec, tmp_path / "fresh"), spec.direction)
    Study(spec, storage, fresh, tmp_path / "fresh", EveryWorkerLost(storage), "sqlite://").run()
    (trial,) = storage.list_trials(fresh)
    assert (trial.state, trial.attempt) == (TrialState.FAILED, 1)  # attempt 0 lost, re-run once, lost again
    assert trial.reason.endswith("(its worker lost 2 times)")

    # A trial a dead controller left running: the resume re-queues it (attempt 1), which must not use up the re-run
    resumed = storage.create_experiment("resumed", stored_form(spec, tmp_path / "resumed"), spec.direction)
    left = storage.create_trial(resumed, TrialSpec(None, {"optimizer.lr": 1e-3}))
    storage.mark_trial_running(left, attempt=0, host="elsewhere", pid=1)
    study = Study(spec, storage, resumed, tmp_path / "resumed", EveryWorkerLost(storage), "sqlite://")
    study.restore()
    study.run()
    trial = storage.get_trial(left)
    assert (trial.state, trial.attempt) == (TrialState.FAILED, 2)  # 1 (the resume's) lost, re-run once, lost again
    assert trial.reason.endswith("(its worker lost 2 times)")


class SecondStartFails(EveryWorkerLost):
    """Its first attempt runs (and never ends by itself); starting a second one fails, as a fork can."""

    def free_slots(self) -> int:
        return 2 - len(self.started)

    def submit(self, launch) -> None:
        if self.started:
            raise OSError("cannot start a process: out of file descriptors")
        super().submit(launch)

    def poll(self) -> list[TrialExit]:
        return []

    def cancel_all(self) -> list[TrialExit]:
        ended = [TrialExit(launch.trial_id, launch.attempt, returncode=-9) for launch in self.started]
        self.started = []
        return ended


def test_a_controller_error_ends_the_running_trials_and_records_them_before_it_is_raised(tmp_path: Path):
    spec = make_spec(tmp_path, trials=2, budget={"max_parallel": 2})
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment("e", stored_form(spec, tmp_path / "run"), spec.direction)
    runner = SecondStartFails(storage)
    with pytest.raises(OSError, match="out of file descriptors"):
        Study(spec, storage, eid, tmp_path / "run", runner, "sqlite://").run()
    assert runner.started == []  # ended
    first = storage.list_trials(eid)[0]
    assert first.state is TrialState.INTERRUPTED
    assert first.reason == ("the controller failed (OSError: cannot start a process: out of file descriptors); "
                            "`hpo resume` runs it again")  # fmt: skip


class SchedulerLostAtSecondStart(SecondStartFails):
    """The runner's error says what a resume does itself (as a lost Dask scheduler's does)."""

    def submit(self, launch) -> None:
        if self.started:
            raise ResourceError("runner.scheduler: lost the Dask scheduler; start it again, then `hpo resume` runs "
                                "the interrupted trials again")  # fmt: skip
        super().submit(launch)


def test_a_controller_error_that_says_what_a_resume_does_is_recorded_without_saying_it_twice(tmp_path: Path):
    spec = make_spec(tmp_path, trials=2, budget={"max_parallel": 2})
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment("e", stored_form(spec, tmp_path / "run"), spec.direction)
    with pytest.raises(ResourceError, match="lost the Dask scheduler"):
        Study(spec, storage, eid, tmp_path / "run", SchedulerLostAtSecondStart(storage), "sqlite://").run()
    first = storage.list_trials(eid)[0]
    assert first.reason == ("the controller failed (ResourceError: runner.scheduler: lost the Dask scheduler; start "
                            "it again, then `hpo resume` runs the interrupted trials again)")  # fmt: skip


class WorkersLostBeforeStart(EveryWorkerLost):
    """Every worker dies before the trial process claims its row (a worker that restarts at its memory limit)."""

    def submit(self, launch) -> None:
        self.started.append(launch)


def test_workers_lost_before_their_trials_start_stop_the_loop_with_the_trials_queued(tmp_path: Path):
    """Not the trials' fault: none is failed or told to a tuner; three such losses in a row stop the loop, saying
    why, and leave every trial queued for `hpo resume`."""
    spec = make_spec(tmp_path, trials=4, budget={"max_parallel": 1})
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment("e", stored_form(spec, tmp_path / "run"), spec.direction)
    study = Study(spec, storage, eid, tmp_path / "run", WorkersLostBeforeStart(storage), "sqlite://")
    assert study.run() is ExperimentStatus.STOPPED
    (trial,) = storage.list_trials(eid)  # the same trial each time: a lost start does not make a new one
    assert (trial.state, trial.attempt) == (TrialState.QUEUED, 3)
    assert trial.reason == "interrupted: its Dask worker tcp://w1 was lost before the trial started; re-queued"
    assert study.workers_error.startswith("the runner's workers were lost 3 times in a row before a trial started")
    assert study.stop_reason == study.workers_error


class OneWorkerDiesOnceWithThreeAttempts(EveryWorkerLost):
    """Three slots on one worker: it dies once before any of its three trials started, then its replacement runs
    trials until their worker is lost under them (the stand-in's one way to end a started trial)."""

    def __init__(self, storage: SqlStorage):
        super().__init__(storage)
        self.died = False

    def free_slots(self) -> int:
        return 3 - len(self.started)

    def submit(self, launch) -> None:
        if self.died:
            super().submit(launch)  # claims its row: started
        else:
            self.started.append(launch)

    def poll(self) -> list[TrialExit]:
        if len(self.started) < 3 and not self.died:
            return []
        self.died = True
        return super().poll()


def test_one_worker_lost_with_several_unstarted_trials_counts_once(tmp_path: Path):
    spec = make_spec(tmp_path, trials=3, budget={"max_parallel": 3})
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment("e", stored_form(spec, tmp_path / "run"), spec.direction)
    study = Study(spec, storage, eid, tmp_path / "run", OneWorkerDiesOnceWithThreeAttempts(storage), "sqlite://")
    assert study.run() is ExperimentStatus.FINISHED and study.workers_error is None
    trials = storage.list_trials(eid)
    assert len(trials) == 3 and all(t.state is TrialState.FAILED for t in trials)  # lost twice after they started
    assert all(t.attempt == 2 and t.reason.endswith("(its worker lost 2 times)") for t in trials)
