"""`hpo delete`: asks first, refuses while a controller drives the experiment, removes the experiment with its trials
and curves (nothing of another), keeps its files, and frees its name for the next `hpo run`."""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

from hpo.cli.main import main
from hpo.storage import SqlStorage
from hpo.trials import TrialResult, TrialSpec, TrialState
from tests.hpo.plan.test_plan import small_preset, write


def hpo(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpo", *args], capture_output=True, text=True, timeout=300, **kwargs)


def in_process(capsys, *args: str) -> subprocess.CompletedProcess:
    """`hpo ARGS` in this process (`hpo.cli.main.main`), with its exit code and output: where the command's outcome
    is under test, not its process (one is started for each to answer a question on a terminal, below)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["hpo", *args], code, out, err)


def recorded(db: str, name: str, trials: int, run_dir: Path | None = None) -> int:
    """Experiment `name` with `trials` finished trials of 2 reports of 2 values each (4 metric values a trial)."""
    with SqlStorage(db, upgrade=True) as storage:
        experiment_id = storage.create_experiment(name, {"run_dir": str(run_dir or "runs/x")}, "minimize")
        for number in range(trials):
            trial_id = storage.create_trial(experiment_id, TrialSpec(number, {"optimizer.lr": 1e-3}))
            storage.mark_trial_running(trial_id)
            storage.add_metrics(trial_id, [(1, 32, {"loss": 3.0, "acc": 0.1}), (2, 64, {"loss": 2.0, "acc": 0.2})])
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(number)))
    return experiment_id


def held(db: str) -> dict[str, int]:
    """Trials per experiment name in the database."""
    with SqlStorage(db) as storage:
        return {e.name: storage.count_trials(e.id) for e in storage.list_experiments()}


def test_delete_removes_the_experiment_with_its_trials_and_curves_and_keeps_its_files_and_the_others(tmp_path, capsys):
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    run_dir = tmp_path / "runs" / "gone"
    (run_dir / "trial_0").mkdir(parents=True)
    recorded(db, "kept", 2)
    gone = recorded(db, "gone", 3, run_dir)
    result = in_process(capsys, "--db", db, "delete", "gone", "--yes")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "deleted experiment 'gone': 3 trials, 12 metric values",
        f"its run directory stays, with the trials' logs and checkpoints (`hpo run` of the file again needs it gone, "
        f"or another --run-dir): `rm -r {run_dir}` removes it",
    ]
    assert held(db) == {"kept": 2} and (run_dir / "trial_0").is_dir()
    with SqlStorage(db) as storage:
        assert all(len(storage.get_metrics(t.id)) == 4 for t in storage.list_trials(storage.get_experiment_by_name(
            "kept").id))  # fmt: skip
    assert gone not in [e.id for e in SqlStorage(db).list_experiments()]
    again = in_process(capsys, "--db", db, "delete", "gone", "--yes")
    assert again.returncode == 2 and "no experiment named 'gone'" in again.stderr


def test_delete_asks_on_a_terminal_and_elsewhere_wants_yes(tmp_path):
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    recorded(db, "asked", 2)
    piped = hpo("--db", db, "delete", "asked", input="y\n")  # not a terminal: an answer on stdin does not count
    assert piped.returncode == 2 and "the input is not a terminal: add --yes" in piped.stderr
    assert held(db) == {"asked": 2}
    for answer, code, left in (("n", 1, {"asked": 2}), ("", 1, {"asked": 2}), ("y", 0, {})):
        out, status = on_a_terminal([sys.executable, "-m", "hpo", "--db", db, "delete", "asked"], answer)
        assert "delete experiment 'asked' (interrupted, 2 trials) and every curve recorded of it? [y/N]" in out, out
        assert status == code and held(db) == left, (answer, out)
        assert ("deleted experiment 'asked': 2 trials, 8 metric values" in out) == (answer == "y"), out


def on_a_terminal(argv: list[str], answer: str, timeout_s: float = 60.0) -> tuple[str, int]:
    """Run `argv` with a pseudo-terminal as its input and output, answer its question with `answer`; (what it wrote,
    its exit code). A process that neither asks nor ends within `timeout_s` fails the test rather than hang it."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    written, answered, deadline = b"", False, time.monotonic() + timeout_s
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no question and no end within {timeout_s:.0f} s; it wrote {written.decode()!r}"
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the process closed the terminal: it ended
                break
            if not chunk:
                break
            written += chunk
            if not answered and b"[y/N]" in written:
                os.write(leader, answer.encode() + b"\n")
                answered = True
    finally:
        os.close(leader)
        if process.poll() is None:
            process.kill()
    return written.decode(), process.wait(timeout=60)


def test_a_live_controller_keeps_its_experiment(tmp_path, capsys, monkeypatch):
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    experiment_id = recorded(db, "driven", 1)
    with SqlStorage(db) as storage:
        storage.claim_controller(experiment_id, "other-host", 4242, stale_after_s=60)  # it beats now
    result = in_process(capsys, "--db", db, "delete", "driven", "--yes")
    assert result.returncode == 2
    assert "driven by a live controller (host other-host, pid 4242" in result.stderr
    assert "stop it first" in result.stderr
    assert held(db) == {"driven": 1}
    monkeypatch.setenv("HPO_HEARTBEAT_S", "0.1")  # stale after 0.15 s
    time.sleep(0.3)
    stale = in_process(capsys, "--db", db, "delete", "driven", "--yes")
    assert stale.returncode == 0 and held(db) == {}  # once its heartbeat is older than the stale limit


def test_a_deleted_experiments_name_runs_again(tmp_path, capsys):
    """The simulated preset, small (8 trials): run, delete, move the run directory away, run again under the name.
    In this process (`hpo.cli.main.main`): the commands' outcome is under test here, not their process."""
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    data = small_preset(name="again")
    data["budget"]["trials"] = 8
    path = write(tmp_path / "again.yaml", data)
    run_dir = tmp_path / "run"
    assert main(["--db", db, "run", str(path), "--run-dir", str(run_dir), "--quiet"]) == 0, capsys.readouterr().err
    first = held(db)["again"]
    refused = main(["--db", db, "run", str(path), "--run-dir", str(run_dir), "--quiet"])
    assert refused == 2 and "or remove the one recorded with `hpo delete again`" in capsys.readouterr().err
    assert main(["--db", db, "delete", "again", "--yes"]) == 0
    shutil.rmtree(run_dir)
    capsys.readouterr()
    rerun = main(["--db", db, "run", str(path), "--run-dir", str(run_dir), "--quiet"])
    assert rerun == 0, capsys.readouterr().err
    assert held(db) == {"again": first}  # the same seeds: the same trials
