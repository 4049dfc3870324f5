"""Every way a trial ends early ends every process of it, torchrun's ranks included, and closes its record for good.

torchrun starts each rank in a session of its own, so killing torchrun's process group leaves the ranks training.
These tests run real 2-rank gloo trials of the tiny BERT and stop them as users and machines do (the API's stop
request, SIGTERM or Ctrl-C to `hpo run`, the trial time limit), then look for survivors the way an operator would:
every process on the machine whose command line names the experiment's run directory (torchrun and each rank carry
`--workdir RUN_DIR/trials/N`), independent of how the runner finds them. A stopped trial must also write nothing
after its record's `finished_at`.
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
import yaml

from hpo.engine.liveness import Heartbeat
from hpo.engine.local import STOP_REASONS
from hpo.engine.study import Study
from hpo.experiment import stored_form
from hpo.runners import build_runner
from hpo.runners.process import TRIAL_TAG_ENV, end_trial, kill_process_group, trial_tag
from hpo.storage import SqlStorage
from hpo.storage.base import ExperimentStatus
from hpo.trial.entry import EXIT_NOT_CLAIMED
from hpo.trials import TrialResult, TrialSpec, TrialState
from tests.hpo.engine.test_study import make_spec, tiny_overrides
from tests.polling import wait_for
from tests.processes import alive, kill_all

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="Linux only: survivors in /proc")

RANKS = 2
# A trial long enough to be stopped after its first metric row whatever the load (about 100 steps), short enough
# that a resume runs it to the end in seconds; the target is out of reach, so only the budget ends it.
MODERATE = {"budget.max_samples": 800, "eval.every_samples": 10**6, "eval.target_mlm_accuracy": 1.0,
            "log.every_steps": 1, "batch.micro_batch_size": 4}  # fmt: skip
ENDLESS = {**MODERATE, "budget.max_samples": 10**8}


def processes_naming(text: str) -> dict[int, str]:
    """Live processes (zombies excluded) whose command line contains `text`: pid -> command line."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found[int(entry)] = cmdline
    return found


def training_trial(storage: SqlStorage, experiment_id: int, run_dir: Path):
    """The running trial once it has stored a metric row and torchrun and both ranks are up; with their pids."""
    trials = str(run_dir / "trials")  # not the run dir: `hpo run --run-dir RUN_DIR` names it too
    for trial in storage.list_trials(experiment_id, state=TrialState.RUNNING):
        ranks = [cmd for cmd in processes_naming(trials).values() if "hpo.trial.torchrun" not in cmd]
        if storage.get_metrics(trial.id) and len(ranks) == RANKS:
            return trial, processes_naming(trials)
    return None


def assert_closed_and_silent(storage: SqlStorage, trial_id: int, settle_s: float = 0.5) -> None:
    """The trial's record is closed, and no metric row is dated after it, even a while later (the callers have
    found no process of the trial left: this is the database's side of it)."""
    record = storage.get_trial(trial_id)
    assert record.finished_at is not None
    count = len(storage.get_metrics(trial_id))
    time.sleep(settle_s)  # a surviving rank would write a row per step (log.every_steps: 1, several a second)
    rows = storage.get_metrics(trial_id)
    assert len(rows) == count > 0
    assert max(r.created_at for r in rows) <= record.finished_at


def start_study(tmp_path: Path, spec):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    run_dir = tmp_path / "run"
    experiment_id = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    return storage, experiment_id, run_dir, Study(spec, storage, experiment_id, run_dir, build_runner(spec), url)


def two_rank_spec(tmp_path: Path, **budget):
    return make_spec(tmp_path, trials=1, resources={"cpu_slots": 1, "cpu_ranks_per_trial": RANKS},
                     budget={"max_parallel": 1, **budget}, **ENDLESS)  # fmt: skip


@pytest.mark.distributed
def test_an_api_stop_ends_both_ranks_of_a_torchrun_trial_and_closes_its_record(tmp_path):
    """The server's stop action is a stop request in the database (`request_stop`); the controller polls it."""
    storage, eid, run_dir, study = start_study(tmp_path, two_rank_spec(tmp_path))
    seen: dict[int, str] = {}

    def stop_once_training() -> None:
        trial, processes = wait_for(lambda: training_trial(storage, eid, run_dir))
        seen.update(processes)
        storage.request_stop(eid)

    threading.Thread(target=stop_once_training, daemon=True).start()
    try:
        assert study.run() is ExperimentStatus.STOPPED
    finally:
        study.runner.close()
    assert len(seen) == RANKS + 1  # torchrun and its two ranks were found while training
    assert [pid for pid in seen if alive(pid)] == []
    assert processes_naming(str(run_dir)) == {}
    (trial,) = storage.list_trials(eid)
    assert (trial.state, trial.reason) == (TrialState.INTERRUPTED, "experiment stopped by request")
    assert_closed_and_silent(storage, trial.id)


def test_a_controller_that_lost_its_claim_ends_its_trials_processes_and_leaves_the_experiment_alone(tmp_path):
    """`hpo resume` took the experiment over while this controller seemed gone (paused, or cut off from the
    database): at its next heartbeat it learns so, ends its trial's processes (the other runs the attempt again)
    and stops without writing the trial's record or the experiment's status, which are the other's now."""
    spec = make_spec(tmp_path, trials=1, resources={"cpu_slots": 1}, budget={"max_parallel": 1}, **ENDLESS)
    storage, eid, run_dir, study = start_study(tmp_path, spec)
    status_before = storage.get_experiment(eid).status
    heartbeat = Heartbeat(storage, eid).start()
    study.claim_lost = lambda: heartbeat.lost

    def take_over_once_training() -> None:
        wait_for(lambda: any(storage.get_metrics(t.id) for t in storage.list_trials(eid, state=TrialState.RUNNING)))
        storage.claim_controller(eid, "another-host", 4242, stale_after_s=0.0)  # `hpo resume` elsewhere
        heartbeat.beat()
        time.sleep(60)  # a controller that went on regardless is stopped here, and the test fails on its status
        storage.request_stop(eid)

    threading.Thread(target=take_over_once_training, daemon=True).start()
    try:
        assert study.run() is ExperimentStatus.RUNNING
    finally:
        study.runner.close()
        heartbeat.stop()
    assert processes_naming(str(run_dir)) == {}
    (trial,) = storage.list_trials(eid)
    assert trial.state is TrialState.RUNNING and trial.finished_at is None  # the other controller settles it
    record = storage.get_experiment(eid)
    assert (record.controller_host, record.controller_pid, record.status) == ("another-host", 4242, status_before)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_timed_out_torchrun_trial_leaves_no_rank_and_writes_nothing_after_it(tmp_path):
    storage, eid, run_dir, study = start_study(tmp_path, two_rank_spec(tmp_path, trial_timeout_s=40))
    seen: dict[int, str] = {}
    threading.Thread(target=lambda: seen.update(wait_for(lambda: training_trial(storage, eid, run_dir))[1]),
                     daemon=True).start()  # fmt: skip
    try:
        assert study.run() is ExperimentStatus.FINISHED
    finally:
        study.runner.close()
    assert len(seen) == RANKS + 1  # it was killed while training
    assert [pid for pid in seen if alive(pid)] == []
    assert processes_naming(str(run_dir)) == {}
    (trial,) = storage.list_trials(eid)
    assert trial.state is TrialState.TIMEOUT
    assert_closed_and_silent(storage, trial.id)


def experiment_file(tmp_path: Path, trials: int) -> Path:
    overrides = tiny_overrides(tmp_path / "data", **MODERATE)
    experiment = {
        "name": "stoppable", "base_config": {}, "overrides": overrides,
        "space": {"optimizer.lr": {"float": [1e-4, 1e-3], "log": True}},
        "tuner": {"name": "random", "seed": 0}, "budget": {"trials": trials, "max_parallel": 1},
        "resources": {"gpus": "none", "cpu_slots": 1, "cpu_ranks_per_trial": RANKS},
    }  # fmt: skip
    path = tmp_path / "stoppable.yaml"
    path.write_text(yaml.safe_dump(experiment))
    return path


def stop_controller_then_resume(tmp_path: Path, sig: signal.Signals, trials: int) -> None:
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    run_dir = tmp_path / "run"
    hpo = [sys.executable, "-m", "hpo", "--db", db]
    path = experiment_file(tmp_path, trials)
    storage = SqlStorage(db, upgrade=True)
    controller = subprocess.Popen([*hpo, "run", str(path), "--run-dir", str(run_dir), "--quiet"],
                                  stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        eid = wait_for(lambda: storage.list_experiments() and storage.list_experiments()[0].id)
        trial, seen = wait_for(lambda: training_trial(storage, eid, run_dir))
        controller.send_signal(sig)
        _, stderr = controller.communicate(timeout=60)
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
    assert controller.returncode == 1, stderr[-2000:]
    assert "hpo resume stoppable" in stderr
    assert len(seen) == RANKS + 1  # torchrun and both ranks were training when the signal came
    assert [pid for pid in seen if alive(pid)] == []
    assert processes_naming(str(run_dir)) == {}  # nothing of the experiment is left
    assert storage.get_experiment(eid).status is ExperimentStatus.STOPPED
    stopped = storage.get_trial(trial.id)
    assert (stopped.state, stopped.reason) == (TrialState.INTERRUPTED, STOP_REASONS[sig])
    assert_closed_and_silent(storage, trial.id)

    resumed = subprocess.run([*hpo, "resume", "stoppable", "--quiet"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    after = storage.list_trials(eid)
    assert [t.number for t in after] == list(range(trials))  # the planned trials, no duplicate
    assert all(t.state is TrialState.COMPLETED for t in after)
    assert after[0].attempt == 1 and after[0].params == stopped.params  # the stopped one ran again
    log = (run_dir / "trials" / "00000" / "stderr.log").read_text()
    assert log.count(f"trial {trial.number} (id {trial.id}): completed") == 1  # rank 0 alone says how it ended
    assert "Traceback" not in log
    assert processes_naming(str(run_dir)) == {}


@pytest.mark.distributed
@pytest.mark.slow  # 15 s: two torchrun ranks, a SIGTERM, a resume; the API stop below ends both ranks too
def test_sigterm_to_hpo_run_ends_every_rank_and_resume_finishes_the_experiment(tmp_path):
    stop_controller_then_resume(tmp_path, signal.SIGTERM, trials=1)


@pytest.mark.slow
@pytest.mark.distributed
def test_ctrl_c_to_hpo_run_ends_every_rank_and_resume_finishes_the_experiment(tmp_path):
    stop_controller_then_resume(tmp_path, signal.SIGINT, trials=2)


@pytest.mark.slow
@pytest.mark.distributed
def test_the_ranks_of_a_lost_dask_worker_die_with_it_and_the_trial_runs_again(tmp_path):
    """The worker's torchrun dies with the worker (PR_SET_PDEATHSIG), and each rank with its torchrun."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"GPU": 2},
                                       dashboard_address=None, worker_dashboard_address=None)  # fmt: skip
    spec = make_spec(tmp_path, trials=1, budget={"max_parallel": 1}, resources={"gpus": "all", "gpus_per_trial": 2},
                     runner={"name": "dask", "scheduler": cluster.scheduler_address}, **MODERATE)  # fmt: skip
    storage, eid, run_dir, study = start_study(tmp_path, spec)
    seen: dict[int, str] = {}
    gone: list[int] = []

    def kill_the_busy_worker() -> None:
        trial, processes = wait_for(lambda: training_trial(storage, eid, run_dir))
        seen.update(processes)
        with distributed.Client(cluster.scheduler_address) as client:
            os.kill(client.run(os.getpid)[trial.worker], signal.SIGKILL)
        gone.extend(wait_for(lambda: [pid for pid in seen if not alive(pid)] == list(seen) and list(seen), 30))

    killer = threading.Thread(target=kill_the_busy_worker, daemon=True)
    killer.start()
    try:
        assert study.run() is ExperimentStatus.FINISHED
    finally:
        study.runner.close()
        cluster.close()
    killer.join(60)
    assert len(seen) == RANKS + 1 and sorted(gone) == sorted(seen)  # torchrun and both ranks died with the worker
    (trial,) = storage.list_trials(eid)
    assert (trial.state, trial.attempt) == (TrialState.COMPLETED, 1)
    assert processes_naming(str(run_dir)) == {}


def test_a_trial_whose_record_is_closed_under_it_leaves_quietly_and_records_nothing_more(tmp_path):
    spec = make_spec(tmp_path, trials=1, **ENDLESS)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    trial_id = storage.create_trial(eid, TrialSpec(None, {"optimizer.lr": 1e-3}))
    entry = [sys.executable, "-m", "hpo.trial.entry", "--db", url, "--trial-id", str(trial_id), "--attempt", "0",
             "--workdir", str(tmp_path / "run" / "trials" / "00000")]  # fmt: skip
    process = subprocess.Popen(entry, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: storage.get_metrics(trial_id))
        storage.finish_trial(trial_id, TrialResult(TrialState.FAILED, "killed"), attempt=0)  # as a controller does
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == EXIT_NOT_CLAIMED, stderr[-2000:]
    assert f"trial {trial_id} is failed: its record is closed" in stderr
    assert "Traceback" not in stderr
    assert_closed_and_silent(storage, trial_id, settle_s=0.0)


# -- ending an attempt, on plain processes: a launcher whose children start sessions of their own, as torchrun's do

LAUNCHER = """
import subprocess, sys, time
child = sys.argv[1]
ranks = [subprocess.Popen([sys.executable, "-c", child], start_new_session=True) for _ in range(2)]
print(" ".join(str(rank.pid) for rank in ranks), flush=True)
time.sleep(600)
"""
SLEEPER = "import time; time.sleep(600)"
DYING_WITH_LAUNCHER = (  # says "ready" once its death signal is set (one write: two ranks share the pipe)
    "from hpo.runners.process import die_with_launcher; die_with_launcher(); import os; os.write(1, b'ready\\n'); "
    "import time; time.sleep(600)"
)


def start_launcher(
    tag: str | None, child: str = SLEEPER, launcher: str = LAUNCHER
) -> tuple[subprocess.Popen, list[int]]:
    """`launcher` (LAUNCHER: its children, running `child`, inherit its environment) with `tag` in its environment;
    with the pids of its children."""
    env = {k: v for k, v in os.environ.items() if k != TRIAL_TAG_ENV} | ({TRIAL_TAG_ENV: tag} if tag else {})
    launcher = subprocess.Popen([sys.executable, "-c", launcher, child], env=env, stdout=subprocess.PIPE, text=True,
                                process_group=0)  # fmt: skip
    return launcher, [int(pid) for pid in launcher.stdout.readline().split()]


def test_end_trial_finds_ranks_in_sessions_of_their_own_after_their_launcher_is_gone(tmp_path):
    """As after a controller's SIGKILL and torchrun's death: the ranks are orphans in their own sessions, and only
    the trial's record (id, attempt, directory) is known."""
    tag = trial_tag(7, 0, tmp_path / "run" / "trials" / "00007")
    launcher, ranks = start_launcher(tag)
    other, bystanders = start_launcher(trial_tag(8, 0, tmp_path / "run" / "trials" / "00008"))
    try:
        kill_process_group(launcher.pid)  # what killing the trial's process group alone did
        launcher.wait()
        assert all(alive(pid) for pid in ranks)  # the group did not reach them
        end_trial(tag, launcher.pid)
        wait_for(lambda: not any(alive(pid) for pid in ranks), 30)
        assert all(alive(pid) for pid in [other.pid, *bystanders])  # another attempt's processes are left alone
    finally:
        end_trial(tag)
        end_trial(trial_tag(8, 0, tmp_path / "run" / "trials" / "00008"), other.pid)
        other.wait()


def test_end_trial_returns_once_every_process_it_found_is_gone_untagged_children_of_the_attempt_included(tmp_path):
    """A rank that dies with its torchrun gives up its environment (the tag) and, its parent gone, its parent's pid,
    before it has finished exiting: found only after the group's kill, it was not waited for, and the stop said the
    trial ended while a rank still ran (under load). Children whose environment lacks the tag (started with one of
    their own) make that deterministic: they are the attempt's by their parent, which only a look before the kill
    sees. No waiting here: when end_trial returns, none of them runs."""
    tag = trial_tag(10, 0, tmp_path / "trials" / "00010")
    launcher, ranks = start_launcher(tag, SLEEPER, f"import os\nos.environ.pop({TRIAL_TAG_ENV!r})\n{LAUNCHER}")
    try:
        end_trial(tag, launcher.pid)
        assert [pid for pid in ranks if alive(pid)] == []
        assert launcher.wait(timeout=30) == -signal.SIGKILL
    finally:
        kill_all(launcher, ranks)


def test_a_rank_dies_with_its_launcher_and_refuses_to_start_under_another_parent(tmp_path):
    tag = trial_tag(9, 0, tmp_path / "trials" / "00009")
    launcher, ranks = start_launcher(tag, DYING_WITH_LAUNCHER)
    try:
        assert [launcher.stdout.readline().strip() for _ in ranks] == ["ready", "ready"]
        assert all(alive(pid) for pid in ranks)
        launcher.kill()  # SIGKILL to the launcher alone
        launcher.wait()
        wait_for(lambda: not any(alive(pid) for pid in ranks), 30)
    finally:
        end_trial(tag, launcher.pid)
    env = {**os.environ, TRIAL_TAG_ENV: tag}  # a tagged rank whose parent (this test) carries no tag
    refused = subprocess.run([sys.executable, "-c", DYING_WITH_LAUNCHER], env=env, capture_output=True, timeout=60)
    assert (refused.returncode, refused.stdout) == (1, b"")
