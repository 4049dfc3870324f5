"""SIGTERM to `hpo run` under engine nni stops the NNI experiment as Ctrl-C does: afterwards no NNI manager,
tuner dispatcher or trial process of it is alive (a real `python -m hpo run`, NNI manager and trainer trials)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hpo.nni.manager import NniEngineError, load_experiments, rest
from hpo.storage import SqlStorage
from hpo.trials import TrialState
from tests.hpo.nni.conftest import nni_experiment_data
from tests.processes import alive

pytestmark = [pytest.mark.nni, pytest.mark.slow]


def descendants(root: int) -> dict[int, str]:
    """{pid: command line} of every living descendant of `root`, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found[pid] = _cmdline(pid)
                frontier.append(pid)
    return found


def _cmdline(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")).decode(errors="replace")
    except OSError:
        return ""


def test_sigterm_stops_the_nni_manager_its_tuner_and_its_trials(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_tpe", trials=6, parallel=2)
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(data))
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    run = subprocess.Popen([sys.executable, "-m", "hpo", "--db", db, "run", "exp.yaml", "--run-dir", "run",
                            "--port", "18600"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)  # fmt: skip
    run_dir = tmp_path / "run"
    processes: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            experiments = load_experiments(run_dir) if (run_dir / "nni").exists() else []
            if experiments and experiments[0].pid:
                manager = experiments[0].pid
                processes = {manager: _cmdline(manager), **descendants(manager)}
                if any("hpo.nni.trial" in c for c in processes.values()):
                    break
            time.sleep(0.2)
        assert any("hpo.nni.trial" in c for c in processes.values()), "no trial process was seen running"
        assert any("-m nni --exp_params" in c for c in processes.values()), processes  # the tuner's dispatcher
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, err
    assert "Traceback" not in err, err
    assert "stopped; `hpo resume nniexp` runs the trials left" in out
    left = {pid: command for pid, command in processes.items() if alive(pid)}
    assert not left, f"still alive after SIGTERM: {left}"
    with pytest.raises(NniEngineError):
        rest(load_experiments(run_dir)[0].port, "check-status", timeout=2)
    storage = SqlStorage(db)
    record = storage.get_experiment_by_name("nniexp")
    assert record.status.value == "stopped"
    unfinished = storage.list_trials(record.id, state=[TrialState.QUEUED, TrialState.RUNNING])
    assert unfinished == []
    assert os.path.exists(run_dir / "nni" / "experiments.json")
