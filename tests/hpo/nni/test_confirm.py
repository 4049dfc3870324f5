"""The NNI engine's confirmation runs and interrupted trials on a real SQLite database, without NNI's manager:
which rows it creates (the local engine's: kind confirmation, the arm's best configuration, the seeds after its
own, `runs_to_queue` of them per arm), the rounds `run_confirmations` goes through as the verdict decides (an
arm's NNI experiment replaced by a function that records each run's samples to target), which row an NNI trial
runs, and what a resume does with the trials a stop interrupted. The NNI experiments themselves run in
test_confirmations.py, test_engine.py and test_resume.py."""

from __future__ import annotations

import pytest

from hpo.evidence.confirmations import stored_verdict
from hpo.evidence.verdict import Outcome
from hpo.experiment import experiment_from_dict
from hpo.experiment.arms import arm_plans, trial_config
from hpo.nni.confirm import next_seeds, queue_round, queued_confirmation, waiting
from hpo.nni.engine import run_confirmations
from hpo.nni.jobs import INTERRUPTED, REPLACED, charged, interrupted, settle_interrupted
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from tests.hpo.nni.conftest import make_nni_spec

SPACE = {
    "optimizer.name": {"choice": ["adamw", "lamb"]},
    "optimizer.lr@lamb": {"float": [1e-3, 1e-2], "log": True, "when": {"optimizer.name": "lamb"}},
    "optimizer.lr@adamw": {"float": [1e-4, 1e-2], "log": True, "when": {"optimizer.name": "adamw"}},
}
ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"


def experiment(tmp_path, budget: dict):
    spec = make_nni_spec(tmp_path, "nni_random", trials=4, parallel=2, space=SPACE, compare=["optimizer.name"])
    data = spec.self_contained()
    data["budget"].update(budget)
    spec = experiment_from_dict(data, "exp.yaml", base_dir=tmp_path)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment(spec.name, {"experiment": data, "run_dir": str(tmp_path / "run")}, spec.direction)
    return spec, storage, eid


def tuned(storage, eid, arm: str, lr: float, objective: float, samples: int | None = None) -> int:
    """A completed tuning trial of the arm, as an NNI trial records it (`samples`: to the target; None: missed)."""
    name = arm.split("=")[1]
    trial_id = storage.create_trial(eid, TrialSpec(None, {"optimizer.name": name, f"optimizer.lr@{name}": lr}, arm))
    storage.mark_trial_running(trial_id, worker=f"nni:t{trial_id:04d}")
    storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=objective, samples_to_target=samples))
    return trial_id


def ran(storage, run, samples: float | None) -> None:
    """A confirmation run that completed, reaching the target at `samples` (None: it missed; the budget is 48)."""
    storage.mark_trial_running(run.id, worker=f"nni:c{run.id:04d}")
    result = TrialResult(TrialState.COMPLETED, objective=samples or 96.0, samples_to_target=samples)
    storage.finish_trial(run.id, result)


def tune_both(storage, eid) -> dict[str, int]:
    """Two tuning trials per arm; returns the best of each (the lower objective: the experiment minimizes)."""
    best = {ADAMW: tuned(storage, eid, ADAMW, 1e-3, 40.0), LAMB: tuned(storage, eid, LAMB, 2e-3, 30.0)}
    tuned(storage, eid, ADAMW, 5e-3, 50.0)
    tuned(storage, eid, LAMB, 8e-3, 45.0)
    return best


def confirmations(storage, eid, arm: str) -> list:
    return [t for t in storage.list_trials(eid, arm=arm) if t.kind is TrialKind.CONFIRMATION]


def finish_all(storage, eid, state=TrialState.FAILED) -> None:
    for t in storage.list_trials(eid, state=TrialState.QUEUED):
        storage.finish_trial(t.id, TrialResult(state, "missed"))


def test_a_fixed_confirm_seeds_is_one_round_of_the_best_configuration_with_the_next_seeds(tmp_path):
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": 3})
    best = tune_both(storage, eid)
    own_seed = trial_config(spec, storage.get_trial(best[ADAMW]).params).seed
    created = queue_round(spec, storage, eid)
    assert len(created) == 6
    for arm in (ADAMW, LAMB):
        runs = confirmations(storage, eid, arm)
        assert [t.seed for t in runs] == [own_seed + 1, own_seed + 2, own_seed + 3]
        assert all(t.params == storage.get_trial(best[arm]).params and t.state is TrialState.QUEUED for t in runs)
        assert all(t.kind is TrialKind.CONFIRMATION and t.arm == arm and t.worker is None for t in runs)
        plan = next(p for p in arm_plans(spec) if p.label == arm)
        assert [t.id for t in waiting(storage, eid, plan)] == [t.id for t in runs]  # one NNI experiment's runs
    assert queue_round(spec, storage, eid) == []  # asked again: nothing more
    finish_all(storage, eid)
    assert queue_round(spec, storage, eid) == []  # one round only, whatever the verdict


def test_auto_queues_the_next_round_only_when_every_arm_finished_and_the_verdict_says_not_yet(tmp_path):
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": "auto", "max_confirm_seeds": 6})
    assert spec.budget.confirmation_rounds == (3, 6)
    tune_both(storage, eid)
    assert len(queue_round(spec, storage, eid)) == 6
    adamw = confirmations(storage, eid, ADAMW)
    for run, samples in zip(adamw, (20, 21, 30), strict=True):  # one arm finished its round: no next round yet
        ran(storage, run, samples)
    assert queue_round(spec, storage, eid) == []
    for run, samples in zip(confirmations(storage, eid, LAMB), (25, 40, None), strict=True):
        ran(storage, run, samples)  # AdamW always hit, LAMB missed once: "not yet", more runs would decide
    second = queue_round(spec, storage, eid)
    assert sorted(t.arm for t in second) == [ADAMW] * 3 + [LAMB] * 3
    assert [t.seed for t in confirmations(storage, eid, ADAMW)] == [t.seed for t in adamw] + [
        adamw[-1].seed + k for k in (1, 2, 3)
    ]
    finish_all(storage, eid)
    assert queue_round(spec, storage, eid) == []  # at the cap


ROUNDS = {  # samples to target of each arm's runs in the order they run (None: missed), runs per arm, the verdict
    "not yet, then the cap": ({ADAMW: [20, 21, 30, 22, 26, None], LAMB: [25, 40, None, 31, None, 28]}, 6, None),
    "every arm missed once": ({ADAMW: [20, None, 30], LAMB: [25, 40, None]}, 3, Outcome.NOT_YET),  # more cannot decide
    "a winner at the first look": ({ADAMW: [16, 17, 16.5], LAMB: [None, None, None]}, 3, Outcome.WINNER),
    "no arm reached the target": ({ADAMW: [None] * 3, LAMB: [None] * 3}, 3, Outcome.NOT_YET),  # more would not help
}


@pytest.mark.parametrize("case", ROUNDS)
def test_rounds_go_on_while_the_verdict_says_not_yet_and_more_runs_would_decide(tmp_path, case):
    samples, per_arm, outcome = ROUNDS[case]
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": "auto", "max_confirm_seeds": 6})
    tuned(storage, eid, ADAMW, 1e-3, 40.0, samples=40 if case != "no arm reached the target" else None)
    tuned(storage, eid, LAMB, 2e-3, 45.0, samples=45 if case != "no arm reached the target" else None)
    rounds = []

    def confirm(plan, runs) -> str:  # what an arm's NNI experiment records: each run's result
        rounds.append((plan.label, [t.seed for t in runs]))
        for run in runs:
            ran(storage, run, samples[plan.label].pop(0))
        return "done"

    assert run_confirmations(spec, storage, eid, confirm) == "finished"
    first = trial_config(spec, confirmations(storage, eid, ADAMW)[0].params).seed + 1
    expected = [(ADAMW, [first, first + 1, first + 2]), (LAMB, [first, first + 1, first + 2])]
    if per_arm == 6:  # the second round: 3 more runs per arm, the seeds after the first round's
        expected += [(ADAMW, [first + 3, first + 4, first + 5]), (LAMB, [first + 3, first + 4, first + 5])]
    assert rounds == expected
    assert [len(confirmations(storage, eid, arm)) for arm in (ADAMW, LAMB)] == [per_arm, per_arm]
    verdict = stored_verdict(storage, eid, spec)
    if outcome is not None:  # why the confirmations ended after the first round
        assert verdict.outcome is outcome and verdict.look == 1, verdict.line
        assert verdict.winner == (ADAMW if outcome is Outcome.WINNER else None) and verdict.runs_needed is None


def test_a_stop_during_a_round_ends_the_confirmations_and_leaves_the_rest_queued(tmp_path):
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": 2})
    tune_both(storage, eid)

    def confirm(plan, runs) -> str:
        return "stopped"

    assert run_confirmations(spec, storage, eid, confirm) == "stopped"
    assert {t.state for t in storage.list_trials(eid) if t.kind is TrialKind.CONFIRMATION} == {TrialState.QUEUED}


def test_a_run_its_nni_experiment_did_not_run_is_failed_so_the_round_ends(tmp_path):
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": 2})
    tune_both(storage, eid)
    assert run_confirmations(spec, storage, eid, lambda plan, runs: "done") == "finished"
    runs = [t for t in storage.list_trials(eid) if t.kind is TrialKind.CONFIRMATION]
    assert len(runs) == 4 and {t.state for t in runs} == {TrialState.FAILED}
    assert runs[0].reason == f"its NNI experiment ended without a trial for seed {runs[0].seed}"


def test_an_arm_without_a_completed_trial_gets_no_confirmation_runs(tmp_path):
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": 2})
    tuned(storage, eid, LAMB, 2e-3, 30.0)
    failed = storage.create_trial(eid, TrialSpec(None, {"optimizer.name": "adamw", "optimizer.lr@adamw": 1e-3}, ADAMW))
    storage.finish_trial(failed, TrialResult(TrialState.FAILED, "crashed"))
    assert [t.arm for t in queue_round(spec, storage, eid)] == [LAMB, LAMB]
    finish_all(storage, eid)
    assert queue_round(spec, storage, eid) == []


def test_seeds_continue_after_the_existing_confirmation_runs_of_that_configuration(tmp_path):
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": 2})
    best = storage.get_trial(tune_both(storage, eid)[LAMB])
    other = {"optimizer.name": "lamb", "optimizer.lr@lamb": 9e-3}
    storage.create_trial(eid, TrialSpec(None, other, LAMB, kind=TrialKind.CONFIRMATION, seed=5000))
    storage.create_trial(eid, TrialSpec(None, best.params, LAMB, kind=TrialKind.CONFIRMATION, seed=1300))
    assert next_seeds(spec, best, storage.list_trials(eid), 2) == [1301, 1302]  # another configuration's not counted
    assert next_seeds(spec, best, [], 1) == [trial_config(spec, best.params).seed + 1]


def test_an_nni_trial_finds_its_queued_run_by_arm_seed_and_configuration(tmp_path):
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": 2})
    tune_both(storage, eid)
    first, second = (t for t in queue_round(spec, storage, eid) if t.arm == LAMB)
    assert queued_confirmation(storage, eid, LAMB, second.seed, second.params).id == second.id
    assert queued_confirmation(storage, eid, ADAMW, second.seed, second.params) is None  # another arm's
    assert queued_confirmation(storage, eid, LAMB, second.seed, {**second.params, "optimizer.lr@lamb": 0.5}) is None
    storage.mark_trial_running(first.id, worker="nni:abcde")
    assert queued_confirmation(storage, eid, LAMB, first.seed, first.params) is None  # claimed already


def test_a_resume_requeues_interrupted_confirmation_runs_and_replaces_interrupted_tuning_trials(tmp_path):
    spec, storage, eid = experiment(tmp_path, {"confirm_seeds": 2})
    plans = {p.label: p for p in arm_plans(spec)}
    tune_both(storage, eid)
    cut = storage.create_trial(eid, TrialSpec(None, {"optimizer.name": "adamw", "optimizer.lr@adamw": 2e-3}, ADAMW))
    storage.mark_trial_running(cut, worker="nni:cut01")
    storage.interrupt_trial(cut, INTERRUPTED + "the NNI experiment was stopped on request")
    done, stopped = (t for t in queue_round(spec, storage, eid) if t.arm == LAMB)
    storage.mark_trial_running(done.id, worker="nni:conf1")
    storage.finish_trial(done.id, TrialResult(TrialState.COMPLETED, objective=31.0))
    storage.mark_trial_running(stopped.id, worker="nni:conf2")
    storage.interrupt_trial(stopped.id, INTERRUPTED + "the NNI experiment was stopped by SIGTERM")
    assert interrupted(storage.get_trial(cut)) and charged(storage, eid, plans[ADAMW]) == 2  # not charged

    settle_interrupted(storage, eid)

    replaced = storage.get_trial(cut)
    assert replaced.state is TrialState.FAILED and replaced.reason.startswith(INTERRUPTED)
    assert replaced.reason.endswith(REPLACED) and interrupted(replaced)
    assert charged(storage, eid, plans[ADAMW]) == 2  # still not charged: a new trial takes its place
    assert charged(storage, eid, plans[LAMB]) == 2  # confirmation runs are never charged to tuning
    again = storage.get_trial(stopped.id)
    assert (again.state, again.attempt, again.seed, again.worker) == (TrialState.QUEUED, 1, stopped.seed, None)
    assert [t.id for t in waiting(storage, eid, plans[LAMB])] == [stopped.id]  # only it runs again
    assert storage.get_trial(done.id).state is TrialState.COMPLETED
    assert queue_round(spec, storage, eid) == []  # the round is complete in number: nothing new


@pytest.mark.parametrize("reason", [None, "the controller stopped"])
def test_an_interrupted_tuning_trial_keeps_a_reason_starting_interrupted(tmp_path, reason):
    spec, storage, eid = experiment(tmp_path, {})
    cut = storage.create_trial(eid, TrialSpec(None, {"optimizer.name": "lamb", "optimizer.lr@lamb": 2e-3}, LAMB))
    storage.interrupt_trial(cut, reason or "")
    settle_interrupted(storage, eid)
    record = storage.get_trial(cut)
    assert record.state is TrialState.FAILED and record.reason.startswith(INTERRUPTED) and interrupted(record)


def test_progress_counts_the_budget_not_the_tuning_trials_a_resume_replaced(tmp_path):
    """`hpo status`, its listing and the report say how many of budget.trials are done: a tuning trial a stop
    interrupted and a resume replaced (failed, never charged) is none of them, the new trial in its place is (the
    progress said 5/5 of a budget of 4, and 4/5 while the last trial ran)."""
    import re

    from hpo.engine.progress import experiment_progress
    from hpo.report.data import load_experiment
    from hpo.report.html import experiment_page

    spec, storage, eid = experiment(tmp_path, {})  # budget.trials 4: 2 per arm
    tuned(storage, eid, ADAMW, 1e-3, 40.0)
    tuned(storage, eid, LAMB, 2e-3, 30.0)
    cut = storage.create_trial(eid, TrialSpec(None, {"optimizer.name": "adamw", "optimizer.lr@adamw": 2e-3}, ADAMW))
    storage.mark_trial_running(cut, worker="nni:cut01")
    storage.interrupt_trial(cut, INTERRUPTED + "the NNI experiment was stopped by the user (Ctrl-C)")
    settle_interrupted(storage, eid)  # what `hpo resume` does first

    def progress() -> tuple[str, str]:
        record = storage.get_experiment(eid)
        page = experiment_page(load_experiment(storage, spec.name, with_noise=False))
        return experiment_progress(storage, record), re.search(r"data-field=progress>([^<]*)<", page)[1]

    assert progress() == ("2/4 tuning trials done",) * 2  # two of the four completed; the replaced one is no trial
    tuned(storage, eid, ADAMW, 3e-3, 35.0)  # the new trial in its place
    assert progress() == ("3/4 tuning trials done",) * 2
    tuned(storage, eid, LAMB, 4e-3, 33.0)
    assert sum(charged(storage, eid, plan) for plan in arm_plans(spec)) == spec.budget.trials == 4
    assert progress() == ("4/4 tuning trials done",) * 2


@pytest.mark.parametrize(("quota", "confirmation", "said"), [(1, False, "1 trial"), (2, False, "2 trials"),
                                                              (1, True, "1 confirmation run"),
                                                              (3, True, "3 confirmation runs")])  # fmt: skip
def test_an_arms_start_line_counts_its_trials_in_words(quota, confirmation, said):
    """`NNI web UI at ... (NNI experiment hpo1-arm0-r1, 1 trial)`: a resume of an arm with one trial left said
    `1 trials`."""
    from hpo.nni.engine import quota_text

    assert quota_text(quota, confirmation) == said
