"""The local engine end to end: real SMAC3, real trainer processes, a real SQLite database.

Trials train the tiny BERT on random shards for a few steps, so each takes seconds; the studies' runners share one
preloaded trial launcher (`shared_launcher`), which imports torch once. Failures are injected through what a trial
really does: a missing data file (crash), a huge learning rate (NaN), a memory limit (out of memory), a time limit
(timeout), and a SIGKILL from outside.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpo.engine.study import Study
from hpo.experiment import experiment_from_dict, stored_form
from hpo.experiment.arms import arm_quotas, arm_subspace
from hpo.runners import build_runner
from hpo.storage import SqlStorage
from hpo.storage.base import ExperimentStatus
from hpo.trials import TrialState
from search_spaces.space import SearchSpace
from tests.trainer.conftest import make_shards

HEARTBEAT_S = 2.0


def tiny_overrides(data_dir: Path, **extra) -> dict:
    train_dir, eval_dir = make_shards(data_dir)
    base = {
        "device": "cpu", "model.vocab_size": 99, "model.hidden_size": 32, "model.num_hidden_layers": 1,
        "model.num_attention_heads": 2, "model.intermediate_size": 64, "model.max_position_embeddings": 64,
        "data.train": str(train_dir), "data.eval": str(eval_dir), "batch.global_batch_size": 8,
        "batch.micro_batch_size": 8, "eval.every_samples": 16, "eval.target_mlm_accuracy": 0.02,
        "eval.batch_size": 32, "budget.max_samples": 48, "log.every_steps": 2,
    }  # fmt: skip
    base.update(extra)
    return base


def make_spec(tmp_path: Path, name="exp", tuner="random", trials=2, space=None, compare=(), budget=None,
              resources=None, runner=None, tuner_options=None, **overrides):  # fmt: skip
    dask = (runner or {}).get("name") == "dask"
    data = {
        "name": name,
        "base_config": {},
        "overrides": tiny_overrides(tmp_path / "data", **overrides),
        "space": space or {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}},
        "compare": list(compare),
        "tuner": {"name": tuner, "seed": 0, "options": tuner_options or {}},
        "budget": {"trials": trials, "max_parallel": 2, "trial_timeout_s": 120, **(budget or {})},
        "resources": {"gpus": "none", "cpu_slots": 1 if dask else 2, **(resources or {})},  # dask: its threads
        "runner": runner or {"name": "local"},
    }
    return experiment_from_dict(data, f"{name}.yaml", base_dir=tmp_path)


@pytest.fixture(scope="module", autouse=True)
def shared_launcher():
    """The module's local runners share their preloaded trial launcher (hpo.runners.preload): a runner's first trial
    starts one (`start_launcher`), which imports torch and the trainer, seconds of CPU; here a runner gets the one of
    the same modules an earlier study of the module started, as a Dask worker's runs share theirs. Whether it forks a
    trial or execs it is its own check, as ever (`Launcher.accepts`). A launcher's own start and end are tested in
    tests/hpo/runners/test_preload.py and by every `hpo run` of real trials (tests/hpo/cli)."""
    import hpo.runners.local as local
    from hpo.runners.preload import launcher_modules

    started = {}

    def start_or_share(cmd: list[str], on_gpu: bool):
        modules = launcher_modules(cmd, on_gpu)
        if modules not in started or not started[modules].alive:
            started[modules] = start_launcher(cmd, on_gpu)
        return started[modules]

    start_launcher = local.start_launcher
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local, "start_launcher", start_or_share)
        yield
    for launcher in started.values():
        launcher.close()


def run_study(tmp_path: Path, spec, during=None):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    experiment_id = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    study = Study(spec, storage, experiment_id, tmp_path / "run", build_runner(spec), url)
    if during:
        threading.Thread(target=during, args=(storage, experiment_id), daemon=True).start()
    status = study.run()
    return storage, experiment_id, status


# tests/hpo/engine/test_fair_comparison.py::test_smac_gives_each_arm_an_equal_share_and_only_its_own_...
@pytest.mark.slow
def test_smac_bo_compares_arms_with_equal_budgets(tmp_path):
    """Also run by default, on the tiny comparison's trials (the same conditional space, SMAC3, 2 trials per arm):
    tests/hpo/engine/test_fair_comparison.py::test_smac_gives_each_arm_an_equal_share_and_only_its_own_conditional_dimensions.
    Here the two arms' trials run side by side."""
    space = {
        "optimizer.name": {"choice": ["adamw", "lamb"]},
        "optimizer.lr@lamb": {"float": [1e-3, 1e-2], "log": True, "when": {"optimizer.name": "lamb"}},
        "optimizer.lr@adamw": {"float": [1e-4, 1e-2], "log": True, "when": {"optimizer.name": "adamw"}},
    }
    spec = make_spec(tmp_path, tuner="smac_bo", trials=4, space=space, compare=["optimizer.name"])
    storage, eid, status = run_study(tmp_path, spec)
    assert status == ExperimentStatus.FINISHED
    trials = storage.list_trials(eid)
    assert [t.state for t in trials] == [TrialState.COMPLETED] * 4
    assert sorted(t.arm for t in trials) == ["optimizer.name=adamw"] * 2 + ["optimizer.name=lamb"] * 2
    for t in trials:
        lr_key = "optimizer.lr@lamb" if t.params["optimizer.name"] == "lamb" else "optimizer.lr@adamw"
        assert set(t.params) == {"optimizer.name", lr_key}
        assert t.metrics["samples"] == 48 and t.objective is not None
        assert storage.get_metrics(t.id, "loss")  # the learning curve was streamed in
        config = (tmp_path / "run" / "trials" / f"{t.number:05d}" / "trial.yaml").read_text()
        assert f"name: {t.params['optimizer.name']}" in config
    assert set(storage.best_per_arm(eid)) == {"optimizer.name=adamw", "optimizer.name=lamb"}


def test_smac_hyperband_runs_budgets_and_continues_promoted_trials(tmp_path):
    # 4 trials: the first bracket's 3 configurations at 1/3 of the budget (2 steps), then the best of them continued
    # to 1 (6 steps)
    spec = make_spec(tmp_path, tuner="smac_hyperband", trials=4,
                     budget={"min_budget": 1 / 3, "max_budget": 1.0, "eta": 3, "max_parallel": 1},
                     **{"budget.max_samples": 48, "eval.every_samples": 16})  # fmt: skip
    storage, eid, _ = run_study(tmp_path, spec)
    trials = storage.list_trials(eid)
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETED for t in trials)
    budgets = sorted({round(t.budget, 3) for t in trials})
    assert budgets[0] == pytest.approx(1 / 3, abs=1e-3) and len(budgets) >= 2
    for t in trials:
        assert t.metrics["samples"] == pytest.approx(48 * t.budget, abs=8)
    promoted = [t for t in trials if t.budget > 0.34 and any(
        o.params == t.params and o.budget < t.budget for o in trials)]  # fmt: skip
    assert promoted, "hyperband should promote a configuration to a larger budget"
    stderr = (tmp_path / "run" / "trials" / f"{promoted[0].number:05d}" / "stderr.log").read_text()
    assert "resumed from" in stderr  # continued from the lower budget's checkpoint, not restarted


def states_and_reasons(storage, eid):
    return [(t.state, t.reason or "") for t in storage.list_trials(eid)]


# a missing data.train ends the trial as a data error: by default that path is
# test_bad_data_is_a_failed_trial_with_the_data_error_and_is_not_told_to_the_tuner (FAILED with its reason, FINISHED)
@pytest.mark.slow
def test_a_crashing_trial_is_recorded_and_the_experiment_goes_on(tmp_path):
    spec = make_spec(tmp_path, **{"data.train": str(tmp_path / "missing")})
    storage, eid, status = run_study(tmp_path, spec)
    assert status == ExperimentStatus.FINISHED
    got = states_and_reasons(storage, eid)
    assert len(got) == 2 and all(s == TrialState.FAILED and "missing" in r for s, r in got)


def test_a_trial_whose_disk_is_full_is_queued_again_and_stops_the_experiment_until_a_resume(tmp_path):
    # /dev/full answers every write with ENOSPC ("No space left on device"): the first trial's report file is a
    # link to it, so that trial meets a full disk on its first record, as on a disk that filled up
    spec = make_spec(tmp_path, budget={"max_parallel": 1})
    report = tmp_path / "run" / "trials" / "00000" / "report.jsonl"
    report.parent.mkdir(parents=True)
    report.symlink_to("/dev/full")
    storage, eid, status = run_study(tmp_path, spec)
    assert status == ExperimentStatus.STOPPED  # not FINISHED with every later trial failed on the same disk
    [trial] = storage.list_trials(eid)  # the next trial never started
    assert trial.state is TrialState.QUEUED and trial.attempt == 1, trial  # not failed: not its configuration's fault
    assert "No space left on device" in trial.reason and trial.reason.endswith("; re-queued"), trial.reason
    assert storage.get_experiment(eid).status is not ExperimentStatus.FINISHED

    report.unlink()  # space again: a resume runs it, as a new attempt, and the rest
    study = Study(spec, storage, eid, tmp_path / "run", build_runner(spec), f"sqlite:///{tmp_path / 'hpo.db'}")
    study.restore()
    assert study.run() == ExperimentStatus.FINISHED
    trials = storage.list_trials(eid)
    assert [(t.number, t.state, t.attempt) for t in trials] == [
        (0, TrialState.COMPLETED, 1),
        (1, TrialState.COMPLETED, 0),
    ]


@pytest.mark.distributed
@pytest.mark.slow  # the single-process trial's case runs by default (above)
def test_a_torchrun_trial_whose_disk_is_full_is_queued_again_and_stops_the_experiment(tmp_path):
    # torchrun exits with 1 whatever its ranks' codes: rank 0's 7 (its disk is full) reaches the study loop through
    # hpo.trial.torchrun, and the trial is queued again, not failed with "exit code 1 without a result"
    spec = make_spec(tmp_path, budget={"max_parallel": 1}, resources={"cpu_slots": 2, "cpu_ranks_per_trial": 2},
                     **{"batch.micro_batch_size": 4})  # fmt: skip
    report = tmp_path / "run" / "trials" / "00000" / "report.jsonl"
    report.parent.mkdir(parents=True)
    report.symlink_to("/dev/full")
    storage, eid, status = run_study(tmp_path, spec)
    assert status == ExperimentStatus.STOPPED
    [trial] = storage.list_trials(eid)
    assert trial.state is TrialState.QUEUED and trial.attempt == 1, trial
    # the reason quotes rank 0's own line where the stderr tail still holds it (the other rank's traceback and
    # torchrun's summary may push it out, as the ranks' output interleaves), else names the trial's directory
    quoted = trial.reason.startswith("interrupted: its disk is full (error: trial ") and (
        "[Errno 28] No space left on device" in trial.reason
    )
    assert quoted or f"the disk of {report.parent} is full (exit code 7" in trial.reason, trial.reason


# by default: tests/hpo/cli/test_cli.py::test_a_run_whose_every_trial_failed_exits_1_and_says_so (every trial
# diverged, end to end) and tests/hpo/test_objective.py::test_the_tuner_is_told_costs_crashes_or_nothing (the penalty)
@pytest.mark.slow
def test_a_diverging_trial_is_recorded_as_diverged(tmp_path):
    spec = make_spec(tmp_path, space={"optimizer.lr": {"float": [1e29, 1e30]}},
                     **{"optimizer.name": "adamw", "optimizer.eps": 1e-30})  # fmt: skip
    storage, eid, _ = run_study(tmp_path, spec)
    assert [s for s, _ in states_and_reasons(storage, eid)] == [TrialState.DIVERGED] * 2
    assert all(t.objective is not None for t in storage.list_trials(eid))  # penalized, told to the tuner


def test_a_trial_out_of_memory_is_recorded_as_such(tmp_path):
    spec = make_spec(tmp_path, trials=1, resources={"memory_limit_mb": 3000},
                     **{"model.intermediate_size": 400_000_000})  # fmt: skip
    storage, eid, _ = run_study(tmp_path, spec)
    got = states_and_reasons(storage, eid)
    # the trial records it itself, with the allocator's words (it fails as the model is built)
    assert [(state, reason.startswith("out of memory before the first step:")) for state, reason in got] == [
        (TrialState.FAILED, True)
    ], got
    assert all("can't allocate memory" in reason for _, reason in got), got


def test_a_trial_over_its_time_limit_is_killed_and_recorded(tmp_path):
    spec = make_spec(tmp_path, trials=1, budget={"trial_timeout_s": 1}, **{"budget.max_samples": 10**8})
    storage, eid, _ = run_study(tmp_path, spec)
    assert [s for s, _ in states_and_reasons(storage, eid)] == [TrialState.TIMEOUT]


def test_a_sigkilled_trial_is_recorded_and_its_slot_freed(tmp_path):
    # 100 steps short of the target: seconds of training, so the first trial is killed mid-run (it reports every
    # step); the other two end by their budget instead of running into a time limit
    spec = make_spec(tmp_path, trials=3, **{"budget.max_samples": 800, "log.every_steps": 1,
                                            "eval.every_samples": 400, "eval.target_mlm_accuracy": 1.0})  # fmt: skip

    def kill_first_running(storage, eid):
        deadline = time.time() + 60
        while time.time() < deadline:
            running = [t for t in storage.list_trials(eid, state=TrialState.RUNNING) if t.pid]
            if running and storage.get_metrics(running[0].id):
                os.killpg(running[0].pid, signal.SIGKILL)
                return
            time.sleep(0.2)

    storage, eid, status = run_study(tmp_path, spec, during=kill_first_running)
    got = states_and_reasons(storage, eid)
    assert (TrialState.FAILED, "killed by SIGKILL") in got
    assert len(got) == 3 and status == ExperimentStatus.FINISHED  # the freed slot ran the remaining trial


def smac_history(run_dir: Path) -> list[tuple]:
    """SMAC's own saved run history of the (single) arm: (configuration, budget, cost, status) in tell order."""
    import json

    (path,) = (run_dir / "tuner" / "arm0").rglob("runhistory.json")
    saved = json.loads(path.read_text())
    return [(json.dumps(saved["configs"][str(row["config_id"])], sort_keys=True), row["budget"], row["cost"],
             row["status"]) for row in saved["data"]]  # fmt: skip


# over a minute; tests/hpo/engine/test_liveness.py and tests/hpo/engine/test_stop.py cover resume by default
@pytest.mark.slow
def test_controller_sigkill_then_resume_finishes_without_running_anything_twice(tmp_path):
    """Also: after the resume, SMAC's run history equals that of an uninterrupted run of the same file."""
    import yaml

    # 200 steps: long enough that the controller is killed while a trial trains, whatever the machine's load
    overrides = tiny_overrides(tmp_path / "data", **{"budget.max_samples": 1600})
    experiment = {
        "base_config": {}, "overrides": overrides,
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
                  "precision.dtype": {"choice": ["fp32", "bf16"]}},
        "tuner": {"name": "smac_bo", "seed": 0, "options": {"n_initial_configs": 4}},
        "budget": {"trials": 4, "max_parallel": 1},
        "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    cmd = [sys.executable, "-m", "hpo", "--db", db]
    env = {**os.environ, "HPO_HEARTBEAT_S": str(HEARTBEAT_S)}
    twin_file = tmp_path / "twin.yaml"
    twin_file.write_text(yaml.safe_dump({"name": "twin", **experiment}))
    twin = subprocess.run([*cmd, "run", str(twin_file), "--run-dir", str(tmp_path / "twin"), "--quiet"],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert twin.returncode == 0, twin.stderr[-2000:]
    spec_file = tmp_path / "exp.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "resumable", **experiment}))
    controller = subprocess.Popen([*cmd, "run", str(spec_file), "--run-dir", str(tmp_path / "run")],
                                  stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    storage = SqlStorage(db)
    eid = storage.get_experiment_by_name("twin").id + 1
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            time.sleep(0.1)
            if len(storage.list_experiments()) < 2:
                continue
            finished = sum(n for s, n in storage.count_trials_by_state(eid).items() if s.finished)
            running = storage.list_trials(eid, state=TrialState.RUNNING)
            if finished >= 1 and running and storage.get_metrics(running[0].id):  # mid-training
                break
        controller.send_signal(signal.SIGKILL)
        controller.wait(timeout=30)
    finally:
        if controller.poll() is None:
            controller.kill()
    before = {t.number: t for t in storage.list_trials(eid)}
    interrupted = [t for t in before.values() if t.state == TrialState.RUNNING]
    assert len(interrupted) == 1
    done_before = {n: t.finished_at for n, t in before.items() if t.state.finished}

    resume = [*cmd, "resume", "resumable", "--quiet"]  # at once: it waits for the killed controller's claim to lapse
    result = subprocess.run(resume, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    after = storage.list_trials(eid)
    assert [t.number for t in after] == [0, 1, 2, 3]  # the configured total, no duplicate numbers
    assert all(t.state.finished for t in after)
    for number, finished_at in done_before.items():  # finished trials were kept, not re-run
        assert after[number].finished_at == finished_at
    rerun = after[interrupted[0].number]
    assert rerun.params == interrupted[0].params
    if rerun.attempt == 0:  # the orphaned trial finished and recorded itself before the resume: kept as is
        assert rerun.started_at == interrupted[0].started_at
    else:  # it was still running at the resume: killed and run again as attempt 1
        assert rerun.attempt == 1 and rerun.started_at > interrupted[0].started_at
    with pytest.raises(ProcessLookupError):  # the interrupted attempt's process did not survive the resume
        os.killpg(interrupted[0].pid, 0)

    twin_trials = storage.list_trials(eid - 1)
    assert [(t.params, t.state, t.objective) for t in after] == [(t.params, t.state, t.objective) for t in twin_trials]
    assert smac_history(tmp_path / "run") == smac_history(tmp_path / "twin")


def test_arm_subspace_fixes_the_compare_key_and_drops_other_arms_parameters():
    space = SearchSpace.from_dict({
        "optimizer.name": {"choice": ["adamw", "lamb"]},
        "optimizer.lr@lamb": {"float": [1e-3, 1e-2], "when": {"optimizer.name": "lamb"}},
        "optimizer.eps": {"float": [1e-9, 1e-6], "log": True, "when": {"optimizer.name": "adamw"}},
        "clipping.strategy": {"choice": ["none", "bucketwise"]},
        "clipping.max_norm": {"float": [0.1, 10], "when": {"clipping.strategy": {"not": "none"}}},
    })  # fmt: skip
    lamb = arm_subspace(space, {"optimizer.name": "lamb"})
    assert lamb.names == ["optimizer.lr@lamb", "clipping.strategy", "clipping.max_norm"]
    assert lamb["optimizer.lr@lamb"].when == ()
    assert lamb["clipping.max_norm"].when == space["clipping.max_norm"].when
    assert arm_quotas(10, 3) == [4, 3, 3] and arm_quotas(8, 2) == [4, 4]


def test_bad_data_is_a_failed_trial_with_the_data_error_and_is_not_told_to_the_tuner(tmp_path):
    """A label past the vocabulary in the training shard: every trial fails before its first step, with the
    file, key and row in its reason; it is not the hyperparameters' fault, so SMAC is told nothing."""
    from tests.trainer.conftest import make_samples
    from trainer.data.shards import write_shard

    samples = make_samples([20] * 16)
    samples.masked_lm_ids[5, 0] = 150  # model.vocab_size is 99
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    write_shard(bad_dir / "part-00000.h5", samples)
    spec = make_spec(tmp_path, tuner="smac_bo", trials=2, budget={"max_parallel": 1}, **{"data.train": str(bad_dir)})
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    study = Study(spec, storage, eid, tmp_path / "run", build_runner(spec), url)
    assert study.run() == ExperimentStatus.FINISHED
    assert len(storage.list_trials(eid)) == 2
    for trial in storage.list_trials(eid):
        assert trial.state == TrialState.FAILED and trial.reason.startswith("bad data: ")
        assert "part-00000.h5" in trial.reason and "masked_lm_ids" in trial.reason and "row 5" in trial.reason
        assert trial.metrics["error"] == "data" and trial.metrics["steps"] == 0
        assert storage.get_metrics(trial.id, "loss") == []  # no training step was taken
    from smac.runner.abstract_runner import StatusType

    told = [v.status for v in study.arms[0].controller.smac.runhistory._data.values()]
    assert told == [StatusType.RUNNING] * 2  # asked, never told: no crash, no cost


def test_a_controller_whose_claim_another_took_creates_no_trial_and_leaves_the_experiment_to_it(tmp_path):
    """A controller paused while `hpo resume` elsewhere took its experiment over went on, once continued, to create
    trials before its heartbeat noticed: they stayed running in the experiment the other finished. Its first create
    is refused (the claim is checked under the experiment's row lock), and it leaves the experiment to the other."""
    spec = make_spec(tmp_path, trials=2)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    experiment_id = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction,
                                              controller=("other-host", 4242))  # fmt: skip
    study = Study(spec, storage, experiment_id, tmp_path / "run", build_runner(spec), url)
    study.controller = ("this-host", 1111)  # what it claimed before the other took it over
    assert study.run() is ExperimentStatus.RUNNING  # the other's to finish
    assert study.lost_claim and study.stop_reason == "another controller took the experiment over"
    assert storage.count_trials(experiment_id) == 0
