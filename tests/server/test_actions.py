"""The stop action on a live experiment, refusals without a configured token, and a database that is down. A live
experiment's `hpo run` meets a real `hpo serve`; the other tests ask the API in the test's process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import httpx
import pytest
import yaml

from hpo.cli.main import FIXED_HASH_SEED
from hpo.experiment import load_experiment, stored_form
from hpo.runners.process import process_state
from hpo.storage import SqlStorage
from tests.polling import wait_for
from tests.server.conftest import TOKEN, api_in_process, make_experiment_file, start_server, stop_server


def test_a_paused_controller_keeps_its_experiment_and_a_stop_ends_it_once_it_runs_again(empty_database, tmp_path):
    """A live experiment's `hpo run` under a real `hpo serve`, in two parts on the one run.

    Paused: a controller stopped (`kill -STOP`, a loaded machine) stops heartbeating, but its process still runs on
    the server's machine: it shows as `unresponsive` (not `interrupted`, which `hpo resume` would take over), and
    DELETE and stop refuse as `hpo delete` does (hpo.engine.settle), naming its host and pid and what to do.

    Continued, it heartbeats again and the stop action ends the experiment: the controller notices and exits, the
    experiment is `stopped` with no trial running, the running trial is `interrupted` (a resume runs it again), and a
    second stop is a 409."""
    path = make_experiment_file(tmp_path, name="paused")
    spec = yaml.safe_load(path.read_text())
    spec["overrides"].update({"budget.max_samples": 10_000_000, "eval.target_mlm_accuracy": 1.0})  # runs until stopped
    spec["budget"].update({"trials": 2, "max_parallel": 1})
    # Learning rates that cannot diverge: the running trial must still be running when the stop arrives.
    spec["space"]["optimizer.lr"] = {"float": [1.0e-4, 1.0e-3], "log": True}
    path.write_text(yaml.safe_dump(spec))
    beat = {"HPO_HEARTBEAT_S": "0.5"}  # stale after 0.75 s, for the controller and the server alike
    env = {**os.environ, **beat, "PYTHONHASHSEED": FIXED_HASH_SEED}  # `hpo run` need not start itself again
    run = subprocess.Popen([sys.executable, "-m", "hpo", "--db", empty_database, "run", str(path), "--quiet",
                            "--run-dir", str(tmp_path / "run")], env=env)  # fmt: skip
    server = start_server(empty_database, tmp_path, **beat)
    token = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with server.client() as api:
            status = lambda: api.get("/experiments/paused").json()["status"]  # noqa: E731
            trials = wait_for(lambda: _running(api.get("/experiments/paused/trials", params={"state": "running"})))
            assert trials[0]["number"] == 0
            wait_for(lambda: status() == "live")  # its controller heartbeats
            run.send_signal(signal.SIGSTOP)
            wait_for(lambda: (process_state(run.pid) or "?")[0] == "T")
            wait_for(lambda: status() == "unresponsive")  # its heartbeat old, its process still here
            assert api.get("/experiments").json()["items"][0]["status"] == "unresponsive"
            page = api.get("/experiments/paused/report")
            assert page.status_code == 200 and "still runs on this machine" in page.text
            pid, host = run.pid, socket.gethostname()
            says = (f"experiment 'paused' is driven by a controller that still runs on this machine (pid {pid}), host "
                    f"{host}, though its last heartbeat is old: it is stopped (Ctrl-Z: `kill -CONT {pid}` continues "
                    f"it, `kill -9 {pid}` ends it)")  # fmt: skip
            deleted = api.delete("/experiments/paused", headers=token)
            assert (deleted.status_code, deleted.json()["detail"]) == (409, says)
            stopped = api.post("/experiments/paused/stop", headers=token)
            assert (stopped.status_code, stopped.json()["detail"]) == (409, says)
            assert api.get("/experiments/paused").json()["trials"]["running"] == 1  # kept whole
            run.send_signal(signal.SIGCONT)
            wait_for(lambda: status() == "live")  # it beats again: a stop now reaches it
            stopped = api.post("/experiments/paused/stop", headers=token)
            assert stopped.status_code == 200 and stopped.json()["stop_requested"] is True
            assert run.wait(timeout=60) == 1  # the controller noticed and stopped
            body = api.get("/experiments/paused").json()
            assert body["status"] == "stopped" and body["trials"]["running"] == 0
            assert api.get("/experiments/paused/trials/0").json()["state"] == "interrupted"  # resume runs it again
            assert api.post("/experiments/paused/stop", headers=token).status_code == 409
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGCONT)
            run.kill()
            run.wait()
        stop_server(server)


def test_stop_refuses_an_interrupted_experiment_whose_controller_is_gone(empty_database, tmp_path):
    """An experiment still RUNNING in the database whose controller died (no heartbeat): a 200 would promise a stop
    that no controller reads, and `hpo resume` clears the request."""
    path = make_experiment_file(tmp_path, name="orphan")
    spec = load_experiment(path)
    storage = SqlStorage(empty_database)
    storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)  # never claimed
    with api_in_process(empty_database) as api:
        assert api.get("/experiments/orphan").json()["status"] == "interrupted"
        refused = api.post("/experiments/orphan/stop", headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 409 and "hpo resume orphan" in refused.json()["detail"], refused.text
    assert storage.get_experiment_by_name("orphan").stop_requested is False


def _running(response: httpx.Response):
    return response.status_code == 200 and response.json()["items"]


def test_actions_are_refused_without_a_configured_token(tmp_path):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    spec = load_experiment(make_experiment_file(tmp_path))
    with SqlStorage(url, upgrade=True) as storage:  # driven by a live controller: a stop would reach it
        eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
        storage.claim_controller(eid, "other-host", 4242, stale_after_s=60)
    with api_in_process(url, token=None) as api:
        refused = api.post("/experiments/api-demo/stop", headers={"Authorization": f"Bearer {TOKEN}"})
        assert refused.status_code == 403 and "HPO_API_TOKEN" in refused.json()["detail"]
        assert api.post("/experiments/api-demo/stop").status_code == 403
        assert api.get("/experiments/api-demo").status_code == 200  # reads stay open


@pytest.mark.parametrize(
    "url, says",
    [
        ("postgresql+psycopg://postgres@127.0.0.1:1/hpo", "Check that the database server is running"),
        ("sqlite:///{tmp}/missing/hpo.db", "does not exist"),
        ("sqlite+pysqlite:///{tmp}/missing/hpo.db", "does not exist"),  # the driver named: the same file
    ],
    ids=["postgres-unreachable", "sqlite-missing", "sqlite-driver-missing"],
)
def test_a_database_that_is_down_gives_503_with_the_reason(url, says, tmp_path):
    with api_in_process(url.format(tmp=tmp_path)) as api:
        health = api.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert says in health.json()["detail"]
        for path in ("/experiments", "/experiments/x", "/experiments/x/trials/0/metrics", "/best?global_batch_size"
                     "=8&optimizer=lamb", "/experiments/x/export", "/experiments/x/best"):  # fmt: skip
            response = api.get(path)
            assert response.status_code == 503 and says in response.json()["detail"], path
    assert not (tmp_path / "missing").exists()  # a read never creates a database


def test_delete_removes_an_experiment_with_its_trials_and_refuses_a_live_one(empty_database, tmp_path):
    """`DELETE /experiments/{name}` (the token's): as `hpo delete` --yes; a controller that heartbeats keeps it."""
    from hpo.trials import TrialResult, TrialSpec, TrialState

    spec = load_experiment(make_experiment_file(tmp_path, name="gone"))
    storage = SqlStorage(empty_database)
    gone = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    for number in range(3):
        trial_id = storage.create_trial(gone, TrialSpec(number, {"optimizer.name": "lamb", "optimizer.lr": 1e-3}))
        storage.mark_trial_running(trial_id)
        storage.add_metrics(trial_id, [(1, 8, {"loss": 3.0, "mlm_accuracy": 0.1})])
        storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(number)))
    storage.claim_controller(gone, "other-host", 4242, stale_after_s=60)  # a live controller elsewhere
    token = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with api_in_process(empty_database) as api:
            assert api.delete("/experiments/gone").status_code == 401
            busy = api.delete("/experiments/gone", headers=token)
            assert busy.status_code == 409 and "live controller (host other-host, pid 4242" in busy.json()["detail"]
            assert api.get("/experiments/gone").json()["trials"]["completed"] == 3  # kept whole
            storage.release_controller(gone, "other-host", 4242)  # it ended
            deleted = api.delete("/experiments/gone", headers=token)
            assert deleted.status_code == 200, deleted.text
            assert deleted.json() == {"experiment": "gone", "trials": 3, "metric_values": 6,
                                      "run_dir": str(tmp_path / "run"),
                                      "detail": "deleted experiment 'gone': 3 trials, 6 metric values; its run "
                                                "directory stays"}  # fmt: skip
            for path in ("/experiments/gone", "/experiments/gone/best", "/experiments/gone/trials"):
                assert api.get(path).status_code == 404, path
            assert api.delete("/experiments/gone", headers=token).status_code == 404
    finally:
        storage.close()
    assert SqlStorage(empty_database).list_experiments() == []
