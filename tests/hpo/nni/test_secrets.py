"""The database password stays out of NNI's view, and NNI's manager listens on 127.0.0.1 only by default.

A real NNI manager runs two tiny trials recording themselves in PostgreSQL through a URL with a password (the
test server may ignore it: trust authentication). While they run, the test reads every process's command line
(what `ps` shows), NNI's REST API and every file NNI wrote, and the manager's listening sockets in /proc.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from hpo.nni.engine import run_nni
from hpo.nni.manager import load_experiments, rest
from hpo.storage import SqlStorage
from hpo.trials import TrialState
from tests.hpo.nni.conftest import make_nni_spec
from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV, postgres_schema_url

pytestmark = [pytest.mark.nni, pytest.mark.slow, pytest.mark.postgres]
PORT = 18550
PASSWORD = "SECRET-nni-7f3a"
REST_PATHS = (
    "experiment",
    "check-status",
    "trial-jobs",
    "job-statistics",
    "metric-data",
    "export-data",
    "experiment-metadata",
    "experiments-info",
)


@pytest.fixture
def url_with_password():
    base = os.environ.get(POSTGRES_URL_ENV)
    if not base:
        pytest.skip(POSTGRES_SKIP_REASON)
    parsed = make_url(base)
    if parsed.password:  # a server that checks passwords: use its own, whatever it is
        password = parsed.password
    else:
        password = PASSWORD
        base = parsed.set(password=password).render_as_string(hide_password=False)
    for url in postgres_schema_url(base):
        yield url, password


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every socket the process listens on, from /proc/net/tcp{,6}."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hex_address, hex_port = local.split(":")
            raw = bytes.fromhex(hex_address)
            # /proc prints the address as 32-bit words in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(hex_port, 16)))
    return found


class Observer:
    """Called at every poll while trials run: records command lines, REST answers and listening sockets."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.seen, self.listening, self.rest = run_dir, "", None, {}

    def __call__(self, note: str) -> None:
        experiment = load_experiments(self.run_dir)[0]
        jobs = rest(experiment.port, "trial-jobs")
        if self.listening is not None or not any(j["status"] == "RUNNING" for j in jobs):
            return
        self.seen = subprocess.run(["ps", "-eo", "args", "-ww"], capture_output=True, text=True, check=True).stdout
        self.rest = {path: json.dumps(rest(experiment.port, path)) for path in REST_PATHS}
        self.listening = listening_addresses(experiment.pid)
        self.port = experiment.port


def test_no_password_in_commands_nni_files_or_rest_and_the_manager_listens_on_loopback(tmp_path, url_with_password):
    url, password = url_with_password
    spec = make_nni_spec(tmp_path, "nni_random", trials=2, parallel=2)
    storage = SqlStorage(url, upgrade=True)
    run_dir = tmp_path / "run"
    eid = storage.create_experiment(spec.name, {"experiment": spec.self_contained(), "run_dir": str(run_dir)},
                                    spec.direction)  # fmt: skip
    observer = Observer(run_dir)
    ending = run_nni(spec, storage, eid, run_dir, url, port=PORT, quiet=True, tick=observer)

    assert ending == "finished"
    rows = storage.list_trials(eid)
    assert [t.state for t in rows] == [TrialState.COMPLETED] * 2  # the trials reached the database
    assert observer.listening is not None, "no poll saw a running trial"
    assert "hpo.nni.trial" in observer.seen  # the trials' command lines were among those read
    assert password not in observer.seen
    for path, body in observer.rest.items():
        assert password not in body, f"NNI's REST API /{path} shows the password"
    assert "hpo.nni.trial" in observer.rest["experiment"]  # the trial command is in NNI's config, without it
    url_file = run_dir / "nni" / "database.url"
    for path in (run_dir / "nni").rglob("*"):
        if path.is_file() and path != url_file:
            assert password not in path.read_text(errors="replace"), f"{path} holds the password"
    assert url_file.read_text() == url and stat.S_IMODE(url_file.stat().st_mode) == 0o600
    assert observer.listening == {("127.0.0.1", observer.port)}
