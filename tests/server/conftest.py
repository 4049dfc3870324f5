"""A real API server over the data of a real tiny experiment, on SQLite and (marker `postgres`) on PostgreSQL.

Per backend and test session: a fresh database (a SQLite file, or a PostgreSQL schema of its own that is dropped
afterwards), `hpo db upgrade`, one `hpo run` of a 4-trial random-search ADAM-vs-LAMB experiment on the tiny
trainer (in the test process; SQLite: once for every pytest-xdist worker, each serving a copy of its own), and
`hpo serve` in a subprocess on a free port with a token for actions.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from hpo.cli.main import FIXED_HASH_SEED
from hpo.cli.main import main as hpo_main
from hpo.storage import SqlStorage
from hpo.trial.launch import free_port
from tests.hpo.engine.test_study import tiny_overrides as hpo_tiny_overrides
from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV, postgres_schema_url
from tests.sessionwide import built_once

TOKEN = "s3cret-test-token"
EXPERIMENT = "api-demo"
BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.hookimpl(tryfirst=True)  # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items) -> None:
    """The PostgreSQL variants of this folder's tests are slow (`make test-all`) but tests/server/test_api.py's: the
    API over a PostgreSQL database of a real experiment runs by default, and the storage contract covers the rest of
    PostgreSQL's side (tests/hpo/storage/test_contract.py)."""
    here = Path(__file__).parent
    for item in items:
        params = getattr(item, "callspec", None)
        if (item.path.parent == here and item.path.name != "test_api.py" and params is not None
                and "postgresql" in params.params.values()):  # fmt: skip
            item.add_marker(pytest.mark.slow)


def tiny_overrides(data_dir: Path, **extra) -> dict:
    """The hpo tests' seconds-long tiny trainer, with a target low enough that most trials reach it. Which of the
    learning rates near 1e3 diverge depends on every rounding and dropout draw of the run: the attention kernel is
    named (the padded grid) so that the API's experiment has the diverged trial and the best trials it was written
    for, whatever kernel `auto` takes."""
    return hpo_tiny_overrides(data_dir, **{"eval.target_mlm_accuracy": 0.008, "model.attention": "padded", **extra})


def make_experiment_file(directory: Path, name: str = EXPERIMENT) -> Path:
    """A 4-trial random search over two arms; learning rates up to 1e4 make some trials diverge."""
    spec = {
        "name": name, "base_config": {},
        "overrides": tiny_overrides(directory / "data"),
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]},
                  "optimizer.lr": {"float": [1.0e-3, 1.0e4], "log": True}},
        "compare": ["optimizer.name"], "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 4, "max_parallel": 2, "trial_timeout_s": 120},
        "resources": {"gpus": "none", "cpu_slots": 2},
    }  # fmt: skip
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def hpo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpo", *args], capture_output=True, text=True, timeout=300, env=env or dict(os.environ)
    )


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT/api/v1
    database_url: str
    process: subprocess.Popen
    run_dir: Path

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)


def start_server(database_url: str, run_dir: Path, token: str | None = TOKEN, ready: str = "/health",
                 **settings: str) -> Server:  # fmt: skip
    """`hpo serve` in a subprocess; returns once it answers `ready` (whatever the database's state; a path that needs
    no database leaves the database untried). `settings`: more environment variables, e.g. HPO_API_ACCESS_LOG="0"."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HPO_API_")}
    env["PYTHONHASHSEED"] = FIXED_HASH_SEED  # `hpo serve` need not start itself again
    env["HPO_DATABASE_URL"] = database_url
    env.update(settings)
    if token is not None:
        env["HPO_API_TOKEN"] = token
    log = open(run_dir / f"server-{port}.log", "w")  # noqa: SIM115 - closed by stop_server
    process = subprocess.Popen(
        [sys.executable, "-m", "hpo", "serve", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    server = Server(f"http://127.0.0.1:{port}/api/v1", database_url, process, run_dir)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"hpo serve exited with {process.returncode}: {Path(log.name).read_text()}")
        try:
            httpx.get(f"{server.url}{ready}", timeout=2)
            return server
        except httpx.TransportError:
            time.sleep(0.1)
    stop_server(server)
    raise RuntimeError("hpo serve did not answer within 60 s")


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


@contextlib.contextmanager
def api_in_process(database_url: str, token: str | None = TOKEN, **settings) -> Iterator[httpx.Client]:
    """The API over `database_url` on a real uvicorn server in a thread of this process (lifespan included), on a
    free port: for tests of what the API answers, not of `hpo serve` itself, without an interpreter's start. Its
    paths, as a `Server.client()`'s, are under /api/v1. `settings`: more of server.settings.Settings' fields, e.g.
    api_database_timeout_s=2 (as HPO_API_DATABASE_TIMEOUT_S=2 sets it for `hpo serve`)."""
    import threading

    import uvicorn

    from server.app import create_app
    from server.settings import Settings

    app = create_app(Settings(database_url=database_url, api_token=token, **settings))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"uvicorn did not start on port {port}")
        time.sleep(0.01)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def run_experiment(database_url: str, directory: Path) -> None:
    """`hpo db upgrade` and `hpo run` of the tiny experiment into `database_url`, in this process (no interpreter
    start; the trials are processes of their own, as ever), its file, data and run directory under `directory`."""
    experiment = make_experiment_file(directory)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        for args in (["db", "upgrade"], ["run", str(experiment), "--run-dir", str(directory / "run"), "--quiet"]):
            assert hpo_main(["--db", database_url, *args]) == 0, err.getvalue()


def _sqlite_experiment(directory: Path) -> Path:
    run_experiment(f"sqlite:///{directory / 'hpo.db'}", directory)
    return directory / "hpo.db"


@pytest.fixture(scope="session")
def finished_experiment(request, tmp_path_factory) -> Iterator:
    """`finished_experiment(backend)`: the URL of a database holding the tiny experiment, finished through
    `hpo run` (once per backend and session; PostgreSQL schemas are dropped at the end). SQLite: a copy of the
    worker's own of the file `hpo run` wrote once for every worker."""
    made: dict[str, str] = {}
    cleanups: list[Iterator[str]] = []

    def make(backend: str) -> str:
        if backend not in made:
            directory = tmp_path_factory.mktemp(backend)
            if backend == "sqlite":
                shutil.copyfile(
                    built_once(tmp_path_factory, "server-finished-experiment", _sqlite_experiment), directory / "hpo.db"
                )
                made[backend] = f"sqlite:///{directory / 'hpo.db'}"
                return made[backend]
            base_url = os.environ.get(POSTGRES_URL_ENV)
            if not base_url:
                pytest.skip(POSTGRES_SKIP_REASON)
            schema = postgres_schema_url(base_url)
            url = next(schema)
            cleanups.append(schema)
            run_experiment(url, directory)
            made[backend] = url
        return made[backend]

    yield make
    for schema in cleanups:
        for _ in schema:  # runs the generator's cleanup: DROP SCHEMA
            pass


@pytest.fixture(params=BACKENDS)
def empty_database(request, tmp_path) -> Iterator[str]:
    """A migrated database of its own on each backend (the shared one holds the finished experiment)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'hpo.db'}"
        SqlStorage(url, upgrade=True).close()
        yield url
        return
    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(POSTGRES_SKIP_REASON)
    for url in postgres_schema_url(base_url):
        SqlStorage(url, upgrade=True).close()
        yield url


@pytest.fixture(scope="session", params=BACKENDS)
def database_url(request, finished_experiment) -> str:
    return finished_experiment(request.param)


@pytest.fixture(scope="session")
def server(database_url, tmp_path_factory) -> Iterator[Server]:
    running = start_server(database_url, tmp_path_factory.mktemp("server"))
    yield running
    stop_server(running)


@pytest.fixture(scope="session")
def api(server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client
