"""The NNI managers of a run directory: start one (in a process whose HOME is the run directory's NNI
directory), reopen them in view mode, stop them, and talk to their REST API (`/api/v1/nni/...`).

`<run dir>/nni/experiments.json` lists the arms' NNI experiments with their ports and manager pids.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpo.errors import HpoError
from hpo.nni.config import nni_home
from hpo.runners.process import pid_exists


class NniEngineError(HpoError):
    """An NNI experiment could not be started, viewed or stopped; the message says which and why."""


@dataclass
class NniExperiment:
    """One arm's NNI experiment as recorded in `<run dir>/nni/experiments.json`."""

    arm: int
    label: str | None
    nni_id: str
    port: int | None = None
    pid: int | None = None  # the NNI manager's process while it runs

    @property
    def url(self) -> str:
        return f"http://{socket.gethostname()}:{self.port}"


def start_experiment(run_dir: Path, experiment: NniExperiment, config: dict, port: int) -> NniExperiment:
    """Start an NNI manager for `config` on the first free port from `port`; records it in experiments.json."""
    home = nni_home(run_dir)
    config_path = home / f"{experiment.nni_id}.json"
    config_path.write_text(json.dumps(config, indent=1))
    experiment.port = free_port(port)
    out = _launch(home, ["start", str(config_path), experiment.nni_id, str(experiment.port)])
    experiment.pid = out["pid"]
    _save(run_dir, experiment)
    return experiment


def view(run_dir: Path, port: int = 8080) -> list[NniExperiment]:
    """Open every NNI experiment of a run directory in NNI's view mode (those still open are left as they are)."""
    experiments = load_experiments(run_dir)
    for experiment in experiments:
        if is_answering(experiment):
            continue
        experiment.port = free_port(port)
        experiment.pid = _launch(nni_home(run_dir), ["view", experiment.nni_id, str(experiment.port)])["pid"]
        _save(run_dir, experiment)
    return experiments


def stop_all(run_dir: Path) -> list[NniExperiment]:
    """Stop every NNI manager of a run directory that still runs; returns those it stopped."""
    stopped = []
    for experiment in load_experiments(run_dir):
        if is_answering(experiment):
            stop_manager(run_dir, experiment)
            stopped.append(experiment)
    return stopped


def stop_manager(run_dir: Path | None, experiment: NniExperiment, wait_s: float = 20.0) -> None:
    """Ask the NNI manager to stop (it stops its trials) and wait for its process to end (killed after wait_s)."""
    with contextlib.suppress(NniEngineError):
        rest(experiment.port, "experiment", method="DELETE")
    deadline = time.monotonic() + wait_s
    while experiment.pid and _alive(experiment.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if experiment.pid and _alive(experiment.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(experiment.pid, signal.SIGKILL)
    experiment.pid = None
    if run_dir is not None:
        _save(run_dir, experiment)


def is_answering(experiment: NniExperiment) -> bool:
    """Whether the experiment's NNI manager answers on its port (and is this experiment)."""
    if not experiment.port:
        return False
    try:
        return rest(experiment.port, "experiment", timeout=2).get("id") == experiment.nni_id
    except NniEngineError:
        return False


def _launch(home: Path, args: list[str]) -> dict:
    env = {**os.environ, "HOME": str(home)}
    log = home / "launch.log"
    cmd = [sys.executable, "-m", "hpo.nni.launch", *args]
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=f, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = log.read_text().strip().splitlines()[-5:]
        raise NniEngineError(f"NNI could not {args[0]} experiment {args[-2]}:\n  " + "\n  ".join(tail) +
                             f"\n(full log: {log})")  # fmt: skip
    return json.loads(lines[-1])


def rest(port: int | None, path: str, method: str = "GET", timeout: float = 10) -> Any:
    """One call to the NNI manager's REST API (`/api/v1/nni/<path>`), decoded from JSON."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/nni/{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except (urllib.error.URLError, OSError) as e:
        raise NniEngineError(f"the NNI manager on port {port} does not answer {method} /{path}: {e}") from None
    return json.loads(body) if body else None


def free_port(start: int) -> int:
    """The first port from `start` on which nothing listens."""
    for port in range(start, start + 200):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise NniEngineError(f"no free port in {start}..{start + 199} for the NNI web UI")


def load_experiments(run_dir: Path) -> list[NniExperiment]:
    """The NNI experiments recorded for a run directory (empty when it never ran under NNI)."""
    path = nni_home(run_dir) / "experiments.json"
    if not path.exists():
        return []
    return [NniExperiment(**e) for e in json.loads(path.read_text())]


def _save(run_dir: Path, experiment: NniExperiment) -> None:
    recorded = {e.nni_id: e for e in load_experiments(run_dir)}
    recorded[experiment.nni_id] = experiment
    path = nni_home(run_dir) / "experiments.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([asdict(e) for e in sorted(recorded.values(), key=lambda e: e.arm)], indent=1))
    tmp.replace(path)


def _alive(pid: int) -> bool:
    if not pid_exists(pid):
        return False
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # a zombie child of ours
            return False
    return True
