"""The runners with real trials: a Dask `LocalCluster` whose workers declare GPUs (CPU trials under the hood),
a worker SIGKILLed mid-trial, and a trial whose working directory the controller never sees.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from hpo.engine.study import Study
from hpo.errors import ResourceError
from hpo.experiment import stored_form
from hpo.runners import build_runner
from hpo.runners.dask import SEND_INTERVAL_S
from hpo.storage import SqlStorage
from hpo.storage.base import ExperimentStatus
from hpo.trial.launch import build_launch
from hpo.trials import TrialState
from tests.hpo.engine.test_study import make_spec

distributed = pytest.importorskip("distributed")


def drive(tmp_path: Path, spec, runner, during=None):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    if during:
        threading.Thread(target=during, args=(storage, eid), daemon=True).start()
    try:
        status = Study(spec, storage, eid, tmp_path / "run", runner, url).run()
    finally:
        runner.close()
    return storage, eid, status


def max_overlap(trials) -> int:
    """The most trials that ran at the same moment, from their recorded start and finish times."""
    events = sorted([(t.started_at, 1) for t in trials] + [(t.finished_at, -1) for t in trials])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def start_gpu_cluster():
    return distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, resources={"GPU": 2},
                                    dashboard_address=None, worker_dashboard_address=None)  # fmt: skip


@pytest.fixture
def gpu_cluster():
    """A cluster of its own, for a test that kills one of its workers."""
    cluster = start_gpu_cluster()
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def shared_cluster():
    """One cluster for the tests that leave its workers as they found them (each runs its own experiment)."""
    cluster = start_gpu_cluster()
    yield cluster
    cluster.close()


@pytest.mark.parametrize(
    "worker_check_s",
    # each a Dask cluster losing a worker: 20 to 35 s on 2 cores
    [pytest.param(0.25, marks=pytest.mark.slow), pytest.param(30.0, marks=pytest.mark.slow)],
    ids=["runner-sees-the-loss", "dask-reruns-first"],
)
def test_dask_runs_trials_on_declared_gpus_and_requeues_the_trial_of_a_lost_worker(
    tmp_path, gpu_cluster, monkeypatch, worker_check_s
):
    """With a slow check of the workers, Dask re-runs the lost attempt on the other worker before the runner
    notices; the database refuses that re-run, and the trial is still re-queued once, not failed."""
    import hpo.runners.dask

    monkeypatch.setattr(hpo.runners.dask, "WORKER_CHECK_S", worker_check_s)
    spec = make_spec(tmp_path, trials=6, budget={"max_parallel": 6, "trial_timeout_s": 300},
                     resources={"gpus": "all", "gpus_per_trial": 1}, runner={"name": "dask",
                     "scheduler": gpu_cluster.scheduler_address}, **{"budget.max_samples": 400})  # fmt: skip
    killed: dict[str, object] = {}

    def kill_a_busy_worker(storage, eid):
        with distributed.Client(gpu_cluster.scheduler_address) as client:
            pids = client.run(os.getpid)
            deadline = time.time() + 240
            while time.time() < deadline and not killed:
                running = storage.list_trials(eid, state=TrialState.RUNNING)
                for trial in running:
                    if trial.worker in pids and storage.get_metrics(trial.id):  # mid-training
                        os.kill(pids[trial.worker], signal.SIGKILL)
                        on_it = {t.id for t in running if t.worker == trial.worker}
                        killed.update(worker=trial.worker, trials=on_it)
                        break
                time.sleep(0.1)

    storage, eid, status = drive(tmp_path, spec, build_runner(spec), during=kill_a_busy_worker)
    trials = storage.list_trials(eid)
    assert status == ExperimentStatus.FINISHED and killed
    assert [t.number for t in trials] == list(range(6))  # none lost, none twice
    assert [t.state for t in trials] == [TrialState.COMPLETED] * 6, [(t.number, t.attempt, t.reason) for t in trials]
    assert max_overlap(trials) <= 4  # 2 workers x GPU=2, one GPU per trial
    assert all(t.worker and t.worker.startswith("tcp://") and len(t.gpus) == 1 for t in trials)
    for trial in trials:  # the killed worker's trials were re-queued once and finished elsewhere
        lost = trial.id in killed["trials"]
        assert trial.attempt == (1 if lost else 0)
        assert not lost or trial.worker != killed["worker"]
    for a in trials:  # trials side by side on one worker hold different GPUs
        for b in trials:
            same_time = a.id < b.id and a.started_at < b.finished_at and b.started_at < a.finished_at
            if same_time and a.worker == b.worker:
                assert a.gpus != b.gpus


def test_dask_refuses_more_gpus_per_trial_than_any_worker_has(tmp_path, shared_cluster):
    spec = make_spec(tmp_path, resources={"gpus": "all", "gpus_per_trial": 4}, **{"batch.micro_batch_size": 2},
                     runner={"name": "dask", "scheduler": shared_cluster.scheduler_address})  # fmt: skip
    with pytest.raises(ResourceError, match="no worker of the Dask cluster .* declares GPU >= 4"):
        build_runner(spec)


def test_dask_runner_sends_to_the_scheduler_without_the_clients_10_ms_batching(tmp_path, shared_cluster):
    spec = make_spec(tmp_path, resources={"gpus": "all", "gpus_per_trial": 1}, **{"batch.micro_batch_size": 2},
                     runner={"name": "dask", "scheduler": shared_cluster.scheduler_address})  # fmt: skip
    runner = build_runner(spec)
    try:  # Dask's default is 0.01 s; if Dask renames what the runner lowers, this says so
        assert runner.client.scheduler_comm.interval == SEND_INTERVAL_S == 0.001
    finally:
        runner.close()


@pytest.mark.slow  # 10 s: a second Dask cluster run; the lost-worker test above covers the runner
def test_two_experiments_on_one_cluster_run_their_own_trials_although_their_trial_ids_are_the_same(
    tmp_path, shared_cluster
):
    """Task keys are global to a Dask scheduler: two experiments (two databases, so trial 1 in both) running at
    once must each run their own trials, not share the other's task and its result."""
    studies, statuses = {}, {}
    for name in ("a", "b"):  # set up here: h5py (the tiny data) and Alembic (the schema) are not thread-safe
        spec = make_spec(tmp_path / name, name=name, trials=2, **{"batch.micro_batch_size": 2},
                         runner={"name": "dask", "scheduler": shared_cluster.scheduler_address})  # fmt: skip
        url = f"sqlite:///{tmp_path / name / 'hpo.db'}"
        storage = SqlStorage(url, upgrade=True)
        eid = storage.create_experiment(name, stored_form(spec, tmp_path / name / "run"), spec.direction)
        studies[name] = Study(spec, storage, eid, tmp_path / name / "run", build_runner(spec), url)

    def run(name: str) -> None:
        try:
            statuses[name] = studies[name].run()
        finally:
            studies[name].runner.close()

    threads = [threading.Thread(target=run, args=(name,)) for name in studies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, study in studies.items():
        storage, eid, status = study.storage, study.experiment_id, statuses.get(name)
        trials = storage.list_trials(eid)
        assert status == ExperimentStatus.FINISHED
        assert [t.id for t in trials] == [1, 2]  # the same ids in both databases
        assert [t.state for t in trials] == [TrialState.COMPLETED] * 2, [(t.number, t.reason) for t in trials]
        assert all(t.worker and t.worker.startswith("tcp://") for t in trials)  # each claimed by its own process


def test_an_attempt_announces_how_it_ended_on_the_runners_event_topic(tmp_path, shared_cluster):
    """The runner learns an attempt's end from the scheduler's event log; the announcement is the task's value."""
    from hpo.runners.base import TrialLaunch
    from hpo.runners.dask import run_attempt

    def exits_with_three(spec, env):
        return ["/bin/sh", "-c", "echo failing >&2; exit 3"], env

    events = []
    got = threading.Event()
    with distributed.Client(shared_cluster.scheduler_address) as client:
        client.subscribe_topic("hpo-exits-test", lambda event: (events.append(event[1]), got.set()))
        launch = TrialLaunch(7, 0, 1, "sqlite://", tmp_path / "trial")
        value = client.submit(run_attempt, launch, 1, exits_with_three, "hpo-exits-test", pure=False).result()
        assert got.wait(30)
    assert value["returncode"] == 3 and "failing" in value["stderr_tail"] and value["worker"].startswith("tcp://")
    assert [{k: e[k] for k in ("trial_id", "attempt", "ended")} for e in events] == [
        {"trial_id": 7, "attempt": 1, "ended": value}
    ]


def test_results_arrive_in_the_database_although_the_controller_never_reads_the_trial_directory(tmp_path):
    def removing_workdir(launch, env):
        """The trial's directory disappears as soon as the trial exits: nothing is left to read."""
        cmd, env = build_launch(launch, env)
        workdir = launch.entry_args[launch.entry_args.index("--workdir") + 1]
        return ["/bin/sh", "-c", '"$@"; code=$?; rm -rf "$0"; exit $code', workdir, *cmd], env

    spec = make_spec(tmp_path, trials=1)
    storage, eid, status = drive(tmp_path, spec, build_runner(spec, launch_builder=removing_workdir))
    assert status == ExperimentStatus.FINISHED
    assert not list((tmp_path / "run" / "trials").glob("*"))
    assert len(storage.list_trials(eid)) == 1  # it ran (its folder is gone because it ran)
    for trial in storage.list_trials(eid):
        assert trial.state == TrialState.COMPLETED and trial.metrics["samples"] == 48
        evals = storage.get_metrics(trial.id, "mlm_accuracy")
        assert [m.samples for m in evals] == [16, 32, 48]
        assert max(m.value for m in evals) == pytest.approx(trial.best_mlm_accuracy)
        assert [m.value > 0 for m in storage.get_metrics(trial.id, "time_s")] == [True] * 3  # curves against time


PARENT = """
import sys, time
from pathlib import Path
from hpo.runners import process
if sys.argv[1] == "pre-exec":
    process.death_signal_wrapper = lambda: None
trial = process.TrialProcess.start(["sleep", "300"], {}, Path(sys.argv[2]), None, die_with_parent=True)
print(trial.popen.pid, flush=True)
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux only: PR_SET_PDEATHSIG")
@pytest.mark.parametrize("how", ["setpriv", "pre-exec"])
def test_a_trial_started_to_die_with_its_parent_dies_when_the_parent_is_killed(tmp_path, how):
    import subprocess
    import sys

    from hpo.runners.process import death_signal_wrapper

    if how == "setpriv" and death_signal_wrapper() is None:
        pytest.skip("util-linux's setpriv with --pdeathsig is not installed")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, how, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0] != b"sleep" and time.monotonic() < deadline:
        time.sleep(0.01)  # setpriv execs the command in the same process
    assert _alive(child) and Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), f"trial process {child} outlived its killed parent ({how})"


@pytest.fixture
def killable_scheduler():
    """A Dask scheduler and one worker as processes of their own (`dask scheduler`, `dask worker`), so that a test
    can SIGKILL the scheduler; yields the scheduler's address and its process."""
    import subprocess
    import sys

    from hpo.trial.launch import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
    dask = [sys.executable, "-m", "dask"]
    scheduler = subprocess.Popen([*dask, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                                  "--no-dashboard"], **quiet)  # fmt: skip
    worker = subprocess.Popen([*dask, "worker", address, "--nthreads", "1", "--no-dashboard"], **quiet)
    try:
        with distributed.Client(address, timeout=60) as client:
            client.wait_for_workers(1, timeout=120)
        yield address, scheduler
    finally:
        for process in (worker, scheduler):  # the worker's trial dies with it (PR_SET_PDEATHSIG)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_a_scheduler_lost_mid_trial_is_named_and_its_trial_left_for_the_resume(tmp_path, killable_scheduler):
    """The scheduler SIGKILLed while a trial runs: the runner says so (not that the trial's worker was lost, which
    would re-queue the trial on a cluster that is gone) and the study records the trial as interrupted, which
    `hpo resume` runs again once a scheduler is back."""
    address, scheduler = killable_scheduler
    # A target it cannot reach: the trial is still training when the scheduler goes (one that reached the demo's
    # target in the moment between the kill and the runner noticing it finished, rightly, as completed)
    spec = make_spec(tmp_path, trials=2, budget={"max_parallel": 1, "trial_timeout_s": 600},
                     runner={"name": "dask", "scheduler": address},
                     **{"budget.max_samples": 400_000, "eval.every_samples": 400,
                        "eval.target_mlm_accuracy": 0.999})  # fmt: skip

    def kill_the_scheduler_mid_trial(storage, eid):
        deadline = time.time() + 240
        while time.time() < deadline:
            if any(storage.get_metrics(t.id) for t in storage.list_trials(eid, state=TrialState.RUNNING)):
                os.killpg(scheduler.pid, signal.SIGKILL)
                return
            time.sleep(0.1)

    with pytest.raises(ResourceError, match=f"lost the Dask scheduler at {address} ") as raised:
        drive(tmp_path, spec, build_runner(spec), during=kill_the_scheduler_mid_trial)
    assert "hpo resume" in str(raised.value)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}")
    (trial,) = storage.list_trials(storage.get_experiment_by_name("exp").id)
    assert (trial.state, trial.attempt) == (TrialState.INTERRUPTED, 0), trial.reason
    assert f"lost the Dask scheduler at {address}" in trial.reason


def test_dask_refuses_a_cluster_without_workers_for_cpu_trials_naming_the_command_that_adds_one(tmp_path):
    with distributed.LocalCluster(n_workers=0, processes=True, dashboard_address=None) as cluster:
        spec = make_spec(tmp_path, runner={"name": "dask", "scheduler": cluster.scheduler_address})
        with pytest.raises(ResourceError) as refused:
            build_runner(spec)
    assert str(refused.value) == (
        f"runner.scheduler: the Dask cluster at {cluster.scheduler_address} has no worker; start one with "
        f"`dask worker {cluster.scheduler_address}`"
    )


def test_dask_says_a_cluster_whose_workers_all_left_is_empty_not_busy(tmp_path):
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        spec = make_spec(tmp_path, runner={"name": "dask", "scheduler": cluster.scheduler_address})
        runner = build_runner(spec)
        try:
            assert runner.why_waiting() == ""  # a free slot
            cluster.scale(0)
            deadline = time.monotonic() + 60
            while runner.capacity() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert runner.why_waiting() == (
                f"the Dask cluster at {cluster.scheduler_address} has no worker left: waiting for one to join"
            )
        finally:
            runner.close()


def test_a_cpu_trial_on_dask_gets_its_share_of_the_hosts_cores(tmp_path):
    """Dask's nanny starts its workers with OMP_NUM_THREADS=1, which every CPU trial inherited: a worker of one
    thread (one trial at a time) trained on one core of many. A trial now gets the host's cores divided among its
    workers' threads (here one), as the local runner divides them among its slots."""
    from hpo.runners.dask import DaskRunner

    spec = make_spec(tmp_path)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None, worker_dashboard_address=None) as cluster:  # fmt: skip
        ended = one_trial_ended(DaskRunner(cluster.scheduler_address, spec.resources, 1,
                                           launch_builder=says_its_threads), tmp_path)  # fmt: skip
    expected = len(os.sched_getaffinity(0))  # 2 or more where the suite runs: the nanny's 1 differs
    assert [(e.returncode, e.stderr_tail.strip()) for e in ended] == [(0, f"threads={expected}")]


def says_its_threads(spec, env):
    """A launch builder: the real launch's environment, and a command that prints the thread count it gives."""
    _, env = build_launch(spec, env)
    return ["/bin/sh", "-c", 'echo "threads=$OMP_NUM_THREADS" >&2'], env


def one_trial_ended(runner, tmp_path: Path) -> list:
    """Submit one trial to `runner`, wait for it (a minute at most) and close the runner; the ends it polled."""
    from hpo.runners.base import TrialLaunch

    try:
        runner.submit(TrialLaunch(1, 1, 1, "sqlite://", tmp_path / "trial"))
        deadline = time.monotonic() + 60
        ended = []
        while not ended and time.monotonic() < deadline:
            runner.wait(1.0)
            ended = runner.poll()
        return ended
    finally:
        runner.close()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs a process that may run on 2 cores or more")
def test_a_cpu_trial_shares_the_cores_this_process_may_run_on_not_the_machines(tmp_path):
    """Under a Slurm job's or a container's cpuset (here `sched_setaffinity` to one core) a one-slot CPU trial was
    given every core of the machine (os.cpu_count), oversubscribing the core it may use; it gets that one."""
    from hpo.runners.local import LocalRunner

    spec = make_spec(tmp_path, resources={"cpu_slots": 1})
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        ended = one_trial_ended(LocalRunner(spec.resources, 1, launch_builder=says_its_threads), tmp_path)
    finally:
        os.sched_setaffinity(0, allowed)
    assert [(e.returncode, e.stderr_tail.strip()) for e in ended] == [(0, "threads=1")]


def test_dask_refuses_data_a_worker_does_not_find_from_its_working_directory(tmp_path, monkeypatch):
    """The trials read data.train and data.eval on their worker, a relative path from the worker's working
    directory: a worker started elsewhere failed every trial of the experiment in seconds (`bad data`, the budget
    spent). `hpo run` now asks each worker first; a path every worker has passes."""
    from hpo.engine.local import check_trial_data_on_workers
    from hpo.errors import HpoError

    base = make_spec(tmp_path).resolved_base()["data"]  # the tiny shards, absolute paths under tmp_path
    relative = {f"data.{key}": os.path.relpath(base[key], tmp_path) for key in ("train", "eval")}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # where the worker starts (its processes inherit it)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None, worker_dashboard_address=None) as cluster:  # fmt: skip
        dask = {"name": "dask", "scheduler": cluster.scheduler_address}
        spec = make_spec(tmp_path, runner=dask, **relative)
        runner = build_runner(spec)
        try:
            with pytest.raises(HpoError) as refused:
                check_trial_data_on_workers(spec, runner)
            (worker,) = cluster.scheduler_info["workers"]
            assert str(refused.value) == (
                f"{spec.source}: on the Dask worker {worker}: data.train: no shard files found for "
                f"{relative['data.train']!r} (it does not exist; a relative path is read from the current directory, "
                f"{elsewhere}): give a directory with *.h5/*.hdf5 files, a file or a glob (create shards with "
                "`python -m trainer.data.prepare` or `python -m trainer.data.demo_corpus`); each worker reads the "
                "data itself: start it where a relative path names the shards, or give a path every worker has"
            )
            check_trial_data_on_workers(make_spec(tmp_path, runner=dask), runner)  # absolute paths it has: passes
        finally:
            runner.close()
