"""A throw-away PostgreSQL cluster of a test's own, to stop and start while an experiment uses it.

`initdb` in a fresh temporary directory, `pg_ctl` on a free port (TCP on 127.0.0.1 only, its socket in that
directory), trust authentication. PostgreSQL refuses to run as root: where the tests run as root, every server
command runs as the `postgres` user (`runuser -u postgres --`), and the directory belongs to that user. The binaries
are found on PATH, else under /usr/lib/postgresql/<version>/bin (the newest), else in `HPO_TEST_PG_BIN`.

    with PostgresCluster.create() as cluster:      # initdb + start; stopped and removed afterwards
        url = cluster.url                          # postgresql+psycopg://postgres@127.0.0.1:PORT/postgres
        cluster.stop()                             # pg_ctl stop -m immediate: as if the server died
        cluster.start()
        cluster.freeze()                           # SIGSTOP: a server that stops answering, its port still open
        cluster.thaw()
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from hpo.trial.launch import free_port

BIN_ENV = "HPO_TEST_PG_BIN"
SERVER_USER = "postgres"


def postgres_bin() -> Path | None:
    """The directory of initdb and pg_ctl, or None when PostgreSQL's server programs are not installed."""
    candidates = [os.environ.get(BIN_ENV, "")]
    on_path = shutil.which("pg_ctl")
    candidates.append(str(Path(on_path).parent) if on_path else "")
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    return next((Path(c) for c in candidates if c and (Path(c) / "initdb").exists()), None)


def why_no_cluster() -> str | None:
    """Why a throw-away cluster cannot run here (a skip reason), or None when it can."""
    if postgres_bin() is None:
        return f"PostgreSQL's server programs (initdb, pg_ctl) are not installed; {BIN_ENV} names their directory"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root, and there is no {SERVER_USER!r} user to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return "running as root without runuser to run PostgreSQL as another user"
    return None


class PostgresCluster:
    def __init__(self, directory: Path, port: int) -> None:
        self.directory, self.port = directory, port
        self.data = directory / "data"
        self.log = directory / "server.log"
        self.bin = postgres_bin()

    @classmethod
    def create(cls) -> PostgresCluster:
        """A new cluster, initialized and started."""
        directory = Path(tempfile.mkdtemp(prefix="hpo-pg-"))
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(directory, user.pw_uid, user.pw_gid)
        cluster = cls(directory, free_port())
        try:
            cluster._run("initdb", "-D", str(cluster.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
            cluster.start()
        except BaseException:
            cluster.remove()
            raise
        return cluster

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Start the server and return once it accepts connections."""
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "120", "start")

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (`immediate`: every connection dropped at once, no shutdown checkpoint, as a crash)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")

    def freeze(self) -> None:
        """Stop the server's processes (SIGSTOP), not the server: its port still accepts connections and the kernel
        acknowledges what is sent, but nothing answers, as a server hung on its disk or a paused machine."""
        self._signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Let the frozen processes run again (SIGCONT)."""
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        """`signum` to every process of the server; one that exited since it was listed (the backend of a connection
        just closed) is passed over."""
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _processes(self) -> list[int]:
        """The postmaster and its children (the backends, one per connection, and the background workers)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError, IndexError):
                parent = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] if entry.name.isdigit() else ""
                if parent == str(postmaster):
                    children.append(int(entry.name))
        return [postmaster, *children]

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        if self.running():
            with contextlib.suppress(OSError, ValueError):
                self.thaw()  # a test that failed while the server was frozen: pg_ctl stop would wait on it
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bin / program), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, cwd=self.directory, timeout=180)
        if result.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise subprocess.CalledProcessError(result.returncode, command, result.stdout,
                                                f"{result.stderr}\n{log}")  # fmt: skip
