"""The NNI managers of a run directory: start one (in a process whose HOME is the run directory's NNI
directory), reopen them in view mode, stop them, and talk to their REST API (`/api/v1/nni/...`).

`<run dir>/nni/experiments.json` lists the arms' NNI experiments (tuning and confirmation rounds) with their ports,
addresses and manager pids.

Address. NNI 3.0's manager listens on every interface and has no option for it; `listen_host.js` (loaded into
its node process through NODE_OPTIONS) makes it listen on the experiment's address instead (`manager_host`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
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
from hpo.runners.process import END_TRIAL_S, end_trial, pid_exists


class NniEngineError(HpoError):
    """An NNI experiment could not be started, viewed or stopped; the message says which and why."""


class NniLaunchError(NniEngineError):
    """NNI's launcher could not start (or view) an experiment's manager; `cause` says why in a few words."""

    def __init__(self, action: str, nni_id: str, cause: str, logs: str) -> None:
        super().__init__(f"NNI could not {action} experiment {nni_id}: {cause}\n(NNI's logs: {logs})")
        self.cause = cause


@dataclass
class NniExperiment:
    """One NNI experiment of an arm (its tuning, or a round of its confirmation runs) as recorded in
    `<run dir>/nni/experiments.json`."""

    arm: int
    label: str | None
    nni_id: str
    port: int | None = None
    pid: int | None = None  # the NNI manager's process while it runs
    host: str | None = "127.0.0.1"  # the address its manager listens on; None: every interface
    confirmation: bool = False  # a round of the arm's confirmation runs (its best configuration, other seeds)

    @property
    def url(self) -> str:
        loopback = self.host is not None and self.host in _LOOPBACK
        return f"http://{self.host if loopback else socket.gethostname()}:{self.port}"


_LOOPBACK = ("127.0.0.1", "localhost", "::1")
LISTEN_HOST_JS = Path(__file__).with_name("listen_host.js")


def start_experiment(run_dir: Path, experiment: NniExperiment, config: dict, port: int) -> NniExperiment:
    """Start an NNI manager for `config` on the first free port from `port` (on the experiment's address);
    records it in experiments.json."""
    home = nni_home(run_dir)
    config_path = home / f"{experiment.nni_id}.json"
    config_path.write_text(json.dumps(config, indent=1))
    experiment.port = free_port(port, experiment.host)
    out = _launch(home, ["start", str(config_path), experiment.nni_id, str(experiment.port)], experiment.host)
    experiment.pid = out["pid"]
    _save(run_dir, experiment)
    return experiment


def view(run_dir: Path, port: int = 8080) -> list[NniExperiment]:
    """Open every NNI experiment of a run directory in NNI's view mode (those still open are left as they are);
    one NNI's manager never made (a start stopped by Ctrl-C before it did) is left out, as NNI could only refuse to
    view it."""
    experiments = [e for e in load_experiments(run_dir) if created(run_dir, e.nni_id)]
    for experiment in experiments:
        if is_answering(experiment):
            continue
        experiment.port = free_port(port, experiment.host)
        args = ["view", experiment.nni_id, str(experiment.port)]
        try:
            experiment.pid = _launch(nni_home(run_dir), args, experiment.host)["pid"]
        except NniLaunchError as e:
            if not port_lost(e):
                raise
            experiment.port = free_port(experiment.port + 1, experiment.host)  # once more, on the next free port
            args[-1] = str(experiment.port)
            experiment.pid = _launch(nni_home(run_dir), args, experiment.host)["pid"]
        _save(run_dir, experiment)
    return experiments


def port_lost(error: NniLaunchError) -> bool:
    """Whether NNI's manager could not start because its port, free when `free_port` chose it, was taken in the
    meantime by another process (an experiment started on this machine in the same moment)."""
    return "EADDRINUSE" in error.cause


def created(run_dir: Path, nni_id: str) -> bool:
    """Whether NNI's manager made experiment `nni_id` in the run directory's NNI home (its own directory there)."""
    return (nni_home(run_dir) / "nni-experiments" / nni_id).is_dir()


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


def end_managers_of(nni_id: str) -> list[int]:
    """SIGKILL every process on this machine whose command line runs NNI experiment `nni_id` (`--experiment-id
    ID`): the manager a launcher started before it was interrupted, whose pid nothing recorded. Returns them."""
    needle = f"--experiment-id\0{nni_id}\0".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "cmdline").read_bytes():
                os.kill(int(entry.name), signal.SIGKILL)
                found.append(int(entry.name))
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue
    return found


NNI_TRIAL_ENV = "NNI_TRIAL_JOB_ID"  # NNI's manager puts it in the environment of every trial it starts


def end_trial_processes(job_id: str, group: int | None, timeout_s: float = END_TRIAL_S) -> list[int]:
    """SIGKILL what is left of NNI trial `job_id` on this machine (a manager that was killed leaves its trials
    running), and return once all of it has exited (`hpo.runners.process.end_trial`, which looks for the processes
    before it kills them: a rank dying with its torchrun gives up its environment before it has exited): its
    process `group` (the trial's own, see `hpo.nni.trial.lead_process_group`), but only where that group's leader is
    this trial, every process whose environment names the trial (NNI sets NNI_TRIAL_JOB_ID when it starts one; its
    children inherit it), and their descendants. A group that is not the trial's (an NNI manager's, or a pid used
    again since) is left alone: a manager's environment names no trial, nor is the manager a trial's descendant.
    Returns the pids it found."""
    needle = f"{NNI_TRIAL_ENV}={job_id}\0".encode()
    own = group if group and _environ_has(group, needle) else None
    return end_trial(job_id, own, timeout_s, variable=NNI_TRIAL_ENV)


def _environ_has(pid: int, needle: bytes) -> bool:
    """Whether process `pid`'s environment (as it was started) holds `needle`; False for a zombie or another
    user's process."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in f.read()
    except OSError:
        return False


def node_binary() -> Path:
    """The node NNI's launcher runs its manager with: the one bundled in the `nni_node` package."""
    import nni_node

    return Path(nni_node.__path__[0]) / "node"


def require_node() -> None:
    """Raise, naming the file, unless NNI's bundled node is there and runs (checked before anything is written:
    without it NNI's launcher fails with a connection error to a manager that never started)."""
    node = node_binary()
    fix = (
        "reinstall NNI (`pip install --force-reinstall nni==3.0`, then `python -m hpo.nni.patch`, which patches it "
        "again; in a checkout, `make setup` does both)"
    )
    if not os.access(node, os.X_OK):
        raise NniEngineError(f"NNI's bundled node ({node}) is missing or not executable; NNI's manager runs on it: "
                             + fix)  # fmt: skip
    try:
        done = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NniEngineError(f"NNI's bundled node ({node}) does not run ({e}); {fix}") from None
    if done.returncode != 0:
        raise NniEngineError(f"NNI's bundled node ({node}) does not run: {done.stderr.strip()[-300:]}; {fix}")


def is_answering(experiment: NniExperiment) -> bool:
    """Whether the experiment's NNI manager answers on its port (and is this experiment)."""
    if not experiment.port:
        return False
    try:
        return rest(experiment.port, "experiment", timeout=2).get("id") == experiment.nni_id
    except NniEngineError:
        return False


def _launch(home: Path, args: list[str], host: str | None) -> dict:
    env = {**os.environ, "HOME": str(home)}
    env.pop("HPO_NNI_HOST", None)
    if host is not None:
        require = f'--require "{LISTEN_HOST_JS}"'
        env.update(HPO_NNI_HOST=host, NODE_OPTIONS=f"{env.get('NODE_OPTIONS', '')} {require}".strip())
    log = home / "launch.log"
    cmd = [sys.executable, "-m", "hpo.nni.launch", *args]
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()  # before the launcher's own lines
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=f, text=True, timeout=120)
    lines = done.stdout.strip().splitlines()
    answer = _json_or_none(lines[-1]) if lines else None
    if done.returncode == 0 and answer and "pid" in answer:
        return answer
    nni_id, port = args[-2], args[-1]
    if answer and "error" in answer:
        cause = _start_failure(home, nni_id, port, answer["error"], answer.get("manager_exit"))
    else:
        cause = "\n  ".join(log.read_text().strip().splitlines()[-5:])
    raise NniLaunchError(args[0], nni_id, cause, f"{home / 'launch.log'}, {home / 'nni-experiments' / nni_id / 'log'}")


def _json_or_none(line: str) -> dict | None:
    with contextlib.suppress(ValueError):
        answer = json.loads(line)
        return answer if isinstance(answer, dict) else None
    return None


def _start_failure(home: Path, nni_id: str, port: str, error: str, manager_exit: int | None) -> str:
    """What went wrong when NNI's launcher could not start (or view) an experiment, in a few lines: how the
    manager ended, and what it said (its stderr, the errors in its log), rather than the launcher's traceback."""
    logs = home / "nni-experiments" / nni_id / "log"
    said = log_errors(logs)
    if manager_exit is not None and manager_exit >= 0:
        how = f"NNI's manager exited with code {manager_exit} before it answered on port {port}"
    elif manager_exit is not None:
        how = f"NNI's manager did not answer on port {port} and was ended (signal {-manager_exit})"
    else:
        how = error.splitlines()[0][:300] if error else "NNI's launcher failed"
    return how + (": " + said if said else " (it wrote no error)")


LOG_FILES = ("dispatcher.log", "nnictl_stderr.log", "nnimanager.log")  # the tuner's, the manager's stderr and log


def log_errors(logs: Path, limit: int = 3, files: tuple[str, ...] = LOG_FILES) -> str:
    """The errors an NNI experiment's manager and tuner wrote (in its `log` directory), one line each: the
    exception lines of the tuner's log and the manager's stderr, and the ERROR lines of the manager's log."""
    found: list[str] = []
    for name in files:
        with contextlib.suppress(OSError):
            for line in (logs / name).read_text(errors="replace").splitlines():
                line = line.strip()
                if " ERROR (" in line:
                    line = line.split(") ", 1)[-1]
                elif not _EXCEPTION_LINE.match(line):
                    continue
                line = line[:300]
                if not line or line.startswith(_SHUTDOWN_NOISE) or any(line in seen for seen in found):
                    continue
                found = [seen for seen in found if seen not in line] + [line]  # the longer line says more
    return "; ".join(found[:limit])  # the first errors are the cause; later ones follow from it


class TunerLog:
    """Follows the log of an NNI experiment's tuner process (`dispatcher.log`: NNI's tuner and assessor run there).
    When the tuner or the assessor raises, NNI logs it there and carries on RUNNING without them, starting no
    trial again; when it cannot be built, NNI's manager waits 10 s for it. `error()` says what went wrong."""

    def __init__(self, logs: Path) -> None:
        self.logs, self.offset, self.failed = logs, 0, False

    def error(self) -> str | None:
        """What the tuner process reported as an error (its exception), once it has logged one; else None."""
        if not self.failed:
            start = max(0, self.offset - len(_ERROR_MARK))  # again: a mark written across two reads
            try:
                with (self.logs / "dispatcher.log").open("rb") as f:
                    f.seek(start)
                    new = f.read()
            except OSError:
                return None
            self.offset = start + len(new)
            self.failed = _ERROR_MARK in new
        if not self.failed:
            return None
        return log_errors(self.logs, files=("dispatcher.log",)) or "see its dispatcher.log"


_ERROR_MARK = b" ERROR ("  # how NNI's Python logging marks an error line
_SHUTDOWN_NOISE = "Error during shutting down"  # NNI 3.0's manager stopping after an error it already reported
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit)|Error)(: |$)")


def rest(port: int | None, path: str, method: str = "GET", timeout: float = 10, body: Any = None) -> Any:
    """One call to the NNI manager's REST API (`/api/v1/nni/<path>`, `body` sent as JSON), decoded from JSON."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/nni/{path}", data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except (urllib.error.URLError, OSError) as e:
        raise NniEngineError(f"the NNI manager on port {port} does not answer {method} /{path}: {e}") from None
    return json.loads(body) if body else None


def free_port(start: int, host: str | None = "127.0.0.1") -> int:
    """The first port from `start` that the NNI manager can take: free on every address it will listen on
    (`host`, or every interface when None), with nothing listening on localhost (NNI's own clients and its
    tuner reach the manager at localhost, which may be [::1] before 127.0.0.1)."""
    check_port(start)
    taken, last = taken_from(start, host), min(start + 199, 65535)
    if len(taken) > last - start:
        raise NniEngineError(f"no free port in {start}..{last} for the NNI web UI (port {start}: {taken[0][1]}); "
                             "free one or give another with --port")  # fmt: skip
    return start + len(taken)


def taken_from(start: int, host: str | None = "127.0.0.1") -> list[tuple[int, str]]:
    """The ports from `start` on that the NNI manager cannot take, each with why (`port_taken`), up to the first it
    can (200 ports at most)."""
    taken = []
    for port in range(start, min(start + 199, 65535) + 1):
        why = port_taken(port, host)
        if why is None:
            break
        taken.append((port, why))
    return taken


def passed_over(taken: list[tuple[int, str]], chosen: int) -> str:
    """`port 8080: in use on 127.0.0.1 (...); port 8081: ...; the NNI web UI takes port 8082`, or "" when the
    web UI takes the port asked for (`taken`: `taken_from` that port)."""
    said = [f"port {port}: {why}" for port, why in taken if port < chosen]
    return "; ".join(said) + f"; the NNI web UI takes port {chosen}" if said else ""


def check_port(port: int) -> None:
    """Refuse a --port that is no TCP port (the socket calls would raise OverflowError)."""
    if not 0 < port < 65536:
        raise NniEngineError(f"--port {port} is not a TCP port (1 to 65535); give one such as 8080")


def port_taken(port: int, host: str | None) -> str | None:
    """Why the NNI manager could not take `port` ("in use on [::1]", ...), or None when it can."""
    for family, address in _bind_addresses(host):
        try:
            with socket.socket(family) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6 and address == "::":
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # node listens on both stacks
                s.bind((address, port))
        except OSError as e:
            if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):  # no such stack here: node skips it too
                continue
            return f"in use on {_shown(address)} ({e.strerror})"
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family) as s:
            s.settimeout(1)
            with contextlib.suppress(OSError):
                if s.connect_ex((address, port)) == 0:
                    return f"something listens on {_shown(address)}"
    return None


def _bind_addresses(host: str | None) -> list[tuple[int, str]]:
    if host is None:
        return [(socket.AF_INET6, "::")] if socket.has_ipv6 else [(socket.AF_INET, "0.0.0.0")]
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({(family, info[0]) for family, _, _, _, info in infos})


def _shown(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def load_experiments(run_dir: Path) -> list[NniExperiment]:
    """The NNI experiments recorded for a run directory (empty when it never ran under NNI)."""
    path = nni_home(run_dir) / "experiments.json"
    if not path.exists():
        return []
    return [NniExperiment(**e) for e in json.loads(path.read_text())]


def forget(run_dir: Path, experiment: NniExperiment) -> None:
    """Take an NNI experiment off the run directory's list (one that failed before any trial started)."""
    path = nni_home(run_dir) / "experiments.json"
    kept = [e for e in load_experiments(run_dir) if e.nni_id != experiment.nni_id]
    if path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(e) for e in kept], indent=1))
        tmp.replace(path)


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
