"""A trial whose worker is lost (a Dask worker that died under it) runs once more, then fails; the attempts a
resume made do not count against that allowance. The runner here is a stand-in whose every worker is lost right
after the attempt claimed its trial."""

from __future__ import annotations

from pathlib import Path

from hpo.engine.study import Study
from hpo.experiment import stored_form
from hpo.runners.base import Runner, TrialExit
from hpo.storage import SqlStorage
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
