"""A resume replays the tuners' asks and tells in the order the live loop made them, with several trials in flight.

The case that ordering by times got wrong: a trial that finishes while a tuner is being asked (SMAC's ask can take
seconds) finished before the next trial was created, but the live loop told it after that ask. A stand-in runner
with two slots, and tuners whose every ask from the third on finishes the oldest running trial, make that happen
at every ask; each tuner is wrapped to record what it is asked and told, live and in the replays."""

from __future__ import annotations

from pathlib import Path

from hpo.controllers import Suggestion
from hpo.engine.study import Study
from hpo.experiment import stored_form
from hpo.runners.base import Runner, TrialExit
from hpo.storage import SqlStorage
from hpo.trials import TrialResult, TrialState
from tests.hpo.engine.test_study import make_spec

SLOTS = 2


class TwoSlots(Runner):
    """Two slots; `poll` reports the attempts whose trial has finished in the storage, and when none has, finishes
    the oldest running one (objective: its number) and reports that."""

    def __init__(self, storage: SqlStorage):
        self.storage, self.running = storage, []

    def describe(self) -> str:
        return "two stand-in slots"

    def free_slots(self) -> int:
        return SLOTS - len(self.running)

    def why_waiting(self) -> str:
        return ""

    def submit(self, launch) -> None:
        self.storage.mark_trial_running(launch.trial_id, attempt=launch.attempt, host="here", pid=1)
        self.running.append(launch)

    def finish_oldest(self) -> None:
        oldest = self.running[0]
        number = self.storage.get_trial(oldest.trial_id).number
        self.storage.finish_trial(oldest.trial_id, TrialResult(TrialState.COMPLETED, objective=float(number)))

    def poll(self) -> list[TrialExit]:
        if self.running and not self._finished():
            self.finish_oldest()
        done = self._finished()
        self.running = [launch for launch in self.running if launch not in done]
        return [TrialExit(launch.trial_id, launch.attempt, returncode=0) for launch in done]

    def _finished(self) -> list:
        return [launch for launch in self.running if self.storage.get_trial(launch.trial_id).state.finished]

    def cancel_all(self) -> list[TrialExit]:
        exits = [TrialExit(launch.trial_id, launch.attempt, returncode=-15) for launch in self.running]
        self.running = []
        return exits


class Recorder:
    """A tuner that logs its asks and tells (a replayed result is a tell too) and runs `before_ask` first."""

    def __init__(self, inner, log: list, before_ask=None):
        self.inner, self.log, self.before_ask = inner, log, before_ask

    def ask(self) -> Suggestion:
        if self.before_ask is not None:
            self.before_ask()
        suggestion = self.inner.ask()
        self.log.append(("ask", _key(suggestion.params)))
        return suggestion

    def tell(self, suggestion: Suggestion, cost: float | None) -> None:
        self.log.append(("tell", _key(suggestion.params), cost))
        self.inner.tell(suggestion, cost)

    def replay(self, params: dict, budget: float, cost: float | None) -> None:
        self.log.append(("tell", _key(params), cost))
        self.inner.replay(params, budget, cost)


def _key(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def recorded_study(spec, storage, experiment_id, run_dir, runner, live: bool):
    """A study whose tuners record into the returned log; live, their asks from the third on first finish the oldest
    running trial, as if it ended while the tuner computed its answer."""
    study = Study(spec, storage, experiment_id, run_dir, runner, "sqlite://")
    log: list = []
    asks = []

    def slow_ask():
        asks.append(None)
        if live and len(asks) > SLOTS and runner.running:
            runner.finish_oldest()

    for arm in study.arms:
        arm.controller = Recorder(arm.controller, log, slow_ask)
    return study, log


def test_the_replay_tells_a_trial_that_finished_during_an_ask_after_that_ask_as_live(tmp_path: Path):
    spec = make_spec(tmp_path, trials=5, budget={"max_parallel": SLOTS})
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    experiment_id = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    live, live_log = recorded_study(spec, storage, experiment_id, tmp_path / "run", TwoSlots(storage), live=True)
    live.run()
    trials = storage.list_trials(experiment_id)
    assert [t.state for t in trials] == [TrialState.COMPLETED] * 5
    # Trials 1, 2 and 3 finished while the tuner was asked for the next one: before it was created, told after
    for trial, created_next in zip(trials[1:4], trials[2:5], strict=True):
        assert trial.finished_at <= created_next.created_at
    events = [e[0] for e in live_log]
    assert events == ["ask", "ask", "tell", "ask", "tell", "ask", "tell", "ask", "tell", "tell"]
    assert [t.told_before for t in trials] == [2, 3, 4, None, None]

    replayed, replay_log = recorded_study(spec, storage, experiment_id, tmp_path / "run", TwoSlots(storage), False)
    replayed.restore()
    assert replay_log == live_log


def test_a_second_resume_replays_what_the_first_one_told_where_it_told_it(tmp_path: Path):
    """The controller stops with trial 3 finished but not yet told: the first resume tells it at the end of its
    replay, before it asks for anything new, and a second resume replays it there too. The tuners' whole history,
    across the interrupted run and the resume, is what a replay gives."""
    spec = make_spec(tmp_path, trials=5, budget={"max_parallel": SLOTS})
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    experiment_id = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    runner = TwoSlots(storage)
    first, first_log = recorded_study(spec, storage, experiment_id, tmp_path / "run", runner, live=True)

    def stop_after_three_tells():
        if sum(1 for e in first_log if e[0] == "tell") == 3:  # trial 3 runs: it finishes, and the loop stops
            runner.finish_oldest()
            first.stop_reason = "stopped by the test"

    handle = first._handle
    first._handle = lambda exits: (handle(exits), stop_after_three_tells())
    first.run()
    trials = storage.list_trials(experiment_id)
    assert [t.state for t in trials] == [TrialState.COMPLETED] * 4
    assert [e[0] for e in first_log] == ["ask", "ask", "tell", "ask", "tell", "ask", "tell"]
    assert [t.told_before for t in trials] == [2, 3, None, None]  # 2 told after the newest trial; 3 not told

    second, second_log = recorded_study(spec, storage, experiment_id, tmp_path / "run", TwoSlots(storage), True)
    second.restore()
    assert second_log[: len(first_log)] == first_log  # the first run's history, as it was
    assert second_log[len(first_log) :] == [("tell", first_log[5][1], 3.0)]  # then trial 3's result
    second.run()
    trials = storage.list_trials(experiment_id)
    assert [t.state for t in trials] == [TrialState.COMPLETED] * 5
    assert [t.told_before for t in trials] == [2, 3, 4, 4, None]
    assert [e[0] for e in second_log[len(first_log) :]] == ["tell", "ask", "tell"]

    third, third_log = recorded_study(spec, storage, experiment_id, tmp_path / "run", TwoSlots(storage), False)
    third.restore()
    assert third_log == second_log
