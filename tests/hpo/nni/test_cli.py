"""`hpo run --engine nni` and `hpo webui` through the real command line, NNI manager and trainer trials."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import FIXED_HASH_SEED
from hpo.errors import SchemaOutOfDateError
from hpo.experiment import experiment_from_dict, stored_form
from hpo.nni.jobs import REPLACED
from hpo.nni.manager import NniEngineError, load_experiments, rest
from hpo.nni.patch import compat_js, unpatch_text
from hpo.runners.resources import discover_gpus
from hpo.storage import SqlStorage
from hpo.trials import TrialState
from tests.hpo.nni.conftest import nni_experiment_data


def hpo(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "hpo", "--db", f"sqlite:///{tmp_path / 'hpo.db'}", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)  # fmt: skip


def hpo_here(tmp_path, monkeypatch, capsys, *args) -> subprocess.CompletedProcess:
    """`hpo` as `hpo(...)` runs it, in this process (`hpo.cli.main.main`, no interpreter start): for a command that
    is refused before it starts anything."""
    from hpo.cli.main import main

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    code = main(["--db", f"sqlite:///{tmp_path / 'hpo.db'}", *args])
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["hpo", *args], code, out, err)


@pytest.mark.nni
@pytest.mark.slow
def test_run_under_nni_then_webui_reopens_and_closes_it(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=2)
    del data["engine"]  # given on the command line instead
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    run = hpo(tmp_path, "run", "exp.yaml", "--engine", "nni", "--run-dir", "run", "--port", "18400")
    assert run.returncode == 0, run.stderr
    served = re.search(r"nniexp: NNI web UI at (http://\S+:\d+) \(NNI experiment hpo1-arm0, 2 trials\)", run.stdout)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}")
    stored = storage.get_experiment_by_name("nniexp").nni_webui  # what the report and the API link to
    assert stored == [{"arm": None, "nni_experiment": "hpo1-arm0", "url": served.group(1)}]
    rows = storage.list_trials(storage.get_experiment_by_name("nniexp").id)
    assert [t.state.value for t in rows] == ["completed", "completed"]

    with socket.socket() as taken:  # the first port tried is in use: webui says so, as run does, and takes another
        taken.bind(("127.0.0.1", 18410))
        taken.listen()
        webui = hpo(tmp_path, "webui", "nniexp", "--port", "18410")
    assert webui.returncode == 0, webui.stderr
    port = int(re.search(r"NNI web UI at http://\S+:(\d+) \(NNI experiment hpo1-arm0\)", webui.stdout).group(1))
    assert port != 18410 and "port 18410: in use on" in webui.stdout
    assert f"the NNI web UI takes port {port}" in webui.stdout
    assert storage.get_experiment_by_name("nniexp").nni_webui[0]["url"].endswith(f":{port}")  # reopened there
    jobs = rest(port, "trial-jobs")
    assert sorted(j["trialJobId"] for j in jobs) == sorted(t.worker.removeprefix("nni:") for t in rows)
    assert all(j["status"] == "SUCCEEDED" for j in jobs)
    numbers = {t.worker.removeprefix("nni:"): t.number for t in rows}
    for job in jobs:  # NNI's final result carries our trial number (NNI's "Trial No." is its own)
        final = job["finalMetricData"][0]["data"]
        while isinstance(final, str):
            final = json.loads(final)
        assert final["trial"] == numbers[job["trialJobId"]]
    assert f"--db sqlite:///{tmp_path / 'hpo.db'} webui nniexp" in run.stdout  # the summary's next commands
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/detail", timeout=10) as response:
        assert "<title>Neural Network Intelligence</title>" in response.read().decode()

    stop = hpo(tmp_path, "webui", "nniexp", "--stop")
    assert stop.returncode == 0 and "closed the NNI web UI of nniexp" in stop.stdout
    with pytest.raises(NniEngineError, match="does not answer"):
        rest(port, "check-status", timeout=2)
    trials = hpo(tmp_path, "trials", "nniexp")
    assert trials.returncode == 0 and trials.stdout.count("completed") == 2

    # `hpo delete` closes the NNI web UI of the experiment it removes
    port = int(re.search(r"NNI web UI at http://\S+:(\d+)", hpo(tmp_path, "webui", "nniexp").stdout).group(1))
    assert rest(port, "check-status")["status"] in ("STOPPED", "VIEWED", "DONE")
    deleted = hpo(tmp_path, "delete", "nniexp", "--yes")
    assert deleted.returncode == 0 and "closed its NNI web UI (1 NNI experiment(s))" in deleted.stdout, deleted
    with pytest.raises(NniEngineError, match="does not answer"):
        rest(port, "check-status", timeout=2)


def test_webui_refuses_an_experiment_of_the_local_engine(tmp_path, monkeypatch, capsys):
    data = nni_experiment_data(tmp_path, "random", trials=2, parallel=1, options={})
    data["engine"] = "local"
    spec = experiment_from_dict(data, "exp.yaml", base_dir=tmp_path)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    webui = hpo_here(tmp_path, monkeypatch, capsys, "webui", "nniexp")
    assert webui.returncode == 2
    assert "experiment 'nniexp' ran under engine: local; the NNI web UI shows engine: nni experiments" in webui.stderr
    assert not (tmp_path / "run").exists()  # nothing written


def stored_nni_experiment(tmp_path):
    """(storage, id) of an engine: nni experiment stored as `hpo run` stores it, nothing run."""
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=1)
    spec = experiment_from_dict(data, "exp.yaml", base_dir=tmp_path)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    return storage, storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)


def test_webui_stop_refuses_a_live_experiment_whose_managers_run_its_trials(tmp_path, monkeypatch, capsys):
    """`hpo webui NAME --stop` stopped every manager of the run directory, a live experiment's too: its run then
    failed ("does not answer GET /check-status") with its running trial interrupted."""
    storage, experiment_id = stored_nni_experiment(tmp_path)
    storage.claim_controller(experiment_id, "here", os.getpid(), stale_after_s=60)  # heartbeats now: live
    stop = hpo_here(tmp_path, monkeypatch, capsys, "webui", "nniexp", "--stop")
    assert stop.returncode == 2, stop.stderr
    assert "experiment 'nniexp' is live: its controller's NNI managers run its trials" in stop.stderr


def test_resume_with_an_unpatched_nni_is_refused_before_the_claim_writes(tmp_path):
    """`hpo run` checks NNI before it writes; `hpo resume` claimed the experiment and marked it running first, then
    refused, leaving a stopped experiment failed."""
    import nni_node

    storage, experiment_id = stored_nni_experiment(tmp_path)
    storage.set_experiment_status(experiment_id, "stopped")
    before = storage.get_experiment(experiment_id)
    fake = tmp_path / "fake" / "nni_node"  # NNI as it is installed, less the patch
    (fake / "training_service" / "v3").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "training_service" / "v3" / "compat.js").write_text(unpatch_text(compat_js().read_text()))
    (fake / "node").symlink_to(Path(nni_node.__file__).parent / "node")
    path = os.pathsep.join([str(fake.parent), *sys.path])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONHASHSEED": FIXED_HASH_SEED}  # `hpo resume` does not re-start
    resume = subprocess.run([sys.executable, "-m", "hpo", "--db", f"sqlite:///{tmp_path / 'hpo.db'}", "resume",
                             "nniexp"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert resume.returncode == 2 and "lacks the fix" in resume.stderr, resume.stderr
    after = storage.get_experiment(experiment_id)
    assert (after.status.value, after.heartbeat_at, after.controller_pid) == ("stopped", before.heartbeat_at,
                                                                               before.controller_pid)  # fmt: skip


def test_a_new_run_into_a_run_directory_holding_another_runs_nni_experiments_is_refused(tmp_path, monkeypatch, capsys):
    """A fresh `hpo run` (another database) there counted them as its own earlier runs: its first NNI experiment
    took another tuner seed (hpo1-arm0-r1) and its stored web UI links listed the old ones."""
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=1)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    earlier = [{"arm": 0, "label": None, "nni_id": "hpo1-arm0", "port": 8080, "pid": None}]
    (tmp_path / "run" / "nni").mkdir(parents=True)
    (tmp_path / "run" / "nni" / "experiments.json").write_text(json.dumps(earlier))
    run = hpo_here(tmp_path, monkeypatch, capsys, "run", "exp.yaml", "--run-dir", "run")
    assert run.returncode == 2, run.stderr
    assert "holds the NNI experiments of an earlier run (hpo1-arm0): choose another --run-dir" in run.stderr
    assert not (tmp_path / "hpo.db").exists()  # nothing written


def test_remote_machines_with_a_sqlite_database_are_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=2)
    data["resources"]["machines"] = [{"host": "gpu-a", "user": "bert"}]
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    run = hpo_here(tmp_path, monkeypatch, capsys, "run", "exp.yaml", "--run-dir", "run")
    assert run.returncode != 0
    assert "resources.machines: trials on other machines record themselves in the database" in run.stderr
    assert not (tmp_path / "hpo.db").exists() and not (tmp_path / "run").exists()


@pytest.mark.skipif(bool(discover_gpus()), reason="this machine has GPUs: the refusal is of a machine without")
# [0] is slow: [all] is the same refusal under nni, and tests/hpo/runners/test_resources.py's
# test_gpus_asked_for_on_a_machine_without_any_are_refused_not_run_on_cpu[requested1] refuses [0] itself
@pytest.mark.parametrize("gpus", ["all", pytest.param([0], marks=pytest.mark.slow)])
def test_gpus_asked_for_on_a_machine_without_are_refused_under_nni_as_under_the_local_engine(
    tmp_path, gpus, monkeypatch, capsys
):
    """engine: nni passed NNI `trialGpuNumber: 0` and trained a GPU file on the CPU, where the local engine refuses
    it; run and resume now refuse it before anything is written, with the local engine's message."""
    data = nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=1)
    data["resources"] = {"gpus": gpus, "gpus_per_trial": 1}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    run = hpo_here(tmp_path, monkeypatch, capsys, "run", "exp.yaml", "--run-dir", "run")
    assert run.returncode == 2, run.stderr
    assert "but this machine has no GPU" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "hpo.db").exists()


@pytest.mark.nni
@pytest.mark.slow
def test_controller_sigkill_then_resume_under_nni(tmp_path):
    """NNI cannot keep trials running across a restart: `hpo resume` stops the dead controller's NNI manager,
    records its unfinished trials as interrupted, then, as new trials replace them, as failed with that reason
    (never charged), and runs the rest in a new NNI experiment."""
    import os
    import signal
    import time

    data = nni_experiment_data(tmp_path, "nni_random", trials=4, parallel=2)
    # 600 steps and 4 evaluations: still training when the resume starts, even on a busy machine (at 200 steps
    # the trials could finish before it), and well within the time limit
    data["overrides"].update({"budget.max_samples": 4800, "eval.every_samples": 1200})
    data["budget"]["trial_timeout_s"] = 600
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    env = {**os.environ, "HPO_HEARTBEAT_S": "1"}
    cmd = [sys.executable, "-m", "hpo", "--db", db]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    run = [*cmd, "run", "exp.yaml", "--run-dir", "run", "--port", "18500", "--quiet"]
    controller = subprocess.Popen(run, cwd=tmp_path, env=env, **quiet)
    storage = None
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            time.sleep(0.2)
            if not (tmp_path / "hpo.db").exists():
                continue
            try:
                storage = storage or SqlStorage(db)
            except SchemaOutOfDateError:  # the controller is still migrating the new database
                continue
            experiments = storage.list_experiments()
            running = storage.list_trials(experiments[0].id, state=TrialState.RUNNING) if experiments else []
            if any(storage.get_metrics(t.id) for t in running):  # mid-training
                break
        controller.send_signal(signal.SIGKILL)
        controller.wait(timeout=30)
    finally:
        if controller.poll() is None:
            controller.kill()
    eid = storage.get_experiment_by_name("nniexp").id
    cut = {t.id for t in storage.list_trials(eid, state=TrialState.RUNNING)}
    assert cut, "no trial was running when the controller was killed"
    while "interrupted" not in subprocess.run([*cmd, "status"], capture_output=True, text=True, env=env).stdout:
        time.sleep(0.2)

    resume = subprocess.run([*cmd, "resume", "nniexp"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert resume.returncode == 0, resume.stderr[-3000:]
    rows = storage.list_trials(eid)
    assert sorted(t.number for t in rows) == list(range(len(rows)))  # no number twice
    interrupted = [t for t in rows if t.state.value == "failed" and t.reason.startswith("interrupted: NNI does not")]
    assert cut <= {t.id for t in interrupted}  # the trials the dead controller's NNI experiment was running
    assert all(t.reason.endswith(REPLACED) for t in interrupted)  # replaced by new trials
    # interrupted trials are not charged: the resumed arm ran others in their place, up to the configured total
    assert len(rows) - len(interrupted) == 4
    assert all(t.state.value == "completed" for t in rows if t not in interrupted)
    experiments = {e.nni_id: e for e in load_experiments(tmp_path / "run")}
    assert set(experiments) == {"hpo1-arm0", "hpo1-arm0-r1"}  # the resumed arm ran as a new NNI experiment
    assert all(e.pid is None for e in experiments.values())  # no manager left behind
    assert "finished" in subprocess.run([*cmd, "status"], capture_output=True, text=True, env=env).stdout


@pytest.mark.parametrize("signalled", ["Terminated", "KeyboardInterrupt"])
def test_a_signal_while_an_arms_manager_starts_ends_that_manager_and_stops_the_arm(tmp_path, monkeypatch, signalled):
    """SIGTERM or Ctrl-C while NNI's launcher was starting an arm's manager left the manager running (it later ran
    the arm's trials after `hpo run` had exited) and the run failed with a traceback. Here the start is cut as the
    signal cuts it: the launcher has started a process that runs the experiment (`--experiment-id ID`) and nothing
    recorded its pid yet."""
    from hpo.experiment.arms import arm_plans
    from hpo.nni import engine

    storage, experiment_id = stored_nni_experiment(tmp_path)
    spec = experiment_from_dict(nni_experiment_data(tmp_path, "nni_random", trials=2, parallel=1), "exp.yaml",
                                base_dir=tmp_path)  # fmt: skip
    started: list[subprocess.Popen] = []

    def start_cut_by_the_signal(run_dir, experiment, config, port):
        experiment.port = port  # chosen before the launcher runs, as start_experiment does
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--experiment-id",
                                         experiment.nni_id, "--port", str(port)]))  # fmt: skip
        time.sleep(0.5)  # the manager is up before the signal arrives
        raise engine.Terminated() if signalled == "Terminated" else KeyboardInterrupt()

    monkeypatch.setattr(engine, "start_experiment", start_cut_by_the_signal)
    (tmp_path / "run" / "nni").mkdir(parents=True)
    ending, jobs = engine.run_arm(spec, storage, experiment_id, tmp_path / "run", arm_plans(spec)[0], {}, 18999,
                                  tick=None, quiet=True)  # fmt: skip
    assert (ending, jobs) == ("stopped by SIGTERM" if signalled == "Terminated" else "stopped by the user (Ctrl-C)",
                              [])  # fmt: skip
    assert started[0].wait(timeout=10) == -9  # the manager nothing had recorded is ended
    # and its id is on the run directory's list, so the next start takes another (not the killed one's files)
    assert [e.nni_id for e in load_experiments(tmp_path / "run")] == ["hpo1-arm0"]
