"""REST API under load: requests/s, p50/p99 latency and CPU per request of every hot read endpoint, repeated.

For each database (SQLite on a temporary file; PostgreSQL when `--postgres URL` or HPO_TEST_POSTGRES_URL is
given, in a throw-away schema dropped afterwards): one experiment with `--trials` trials (80 % completed, 10 %
failed, two arms) is bulk-loaded, `hpo serve` runs as one uvicorn worker in a subprocess, every list page and
best config it will be asked is checked against an answer computed here from the rows, and a separate process
drives it (`--concurrency` connections, `--seconds` per endpoint, after a 1 s warm-up): wrk (Debian's package,
installed by `make bench-deps`) when present, else an async httpx client in Python.

The whole sequence of endpoints is run `--runs` times (default 3) and each endpoint is reported as the median
of its runs with their range. Around each measured run the CPU time of the server process, of the client (wrk),
of the database server's backends that serve this server (PostgreSQL; SQLite runs inside the server) and of the
whole machine (/proc/stat) is read: the CPU each takes per request, and how many cores everything else on the
machine used meanwhile ("other load"). The client shares the machine's cores with the server (and PostgreSQL),
so the figures are a lower bound of the server alone, and a run on a busy machine says so.

Endpoints (the trial-list pages are asked half-way into the experiment, the same page every request: a page a
dashboard polls; its finished trials' entries are kept by the server after the first ask):
best config; best config of one arm; best config of every arm (`/best/arms`); trial list by offset (a deep
OFFSET and a count of the whole experiment, no goal); trial list by cursor (`after`); by cursor filtered by
state (completed), by arm, by both, and by two states (completed or failed); the first page of the failed trials
(with `total`).
Goals: best configs >= 1,000 requests/s with p99 <= 20 ms; trial lists (but the offset page) >= 500
requests/s with p99 <= 50 ms.

    python -m bench.api_load [--trials 100000] [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]
    python -m bench.api_load --trials 2000 --seconds 1 --runs 1       # a smoke run: a minute, every figure printed
    python -m bench.api_load --no-sqlite --only 'trial list, by cursor' --postgres URL   # one endpoint, one database
    python -m bench.api_load --trials 100000 --profile 2000 --runs 0    # only where a request's time goes

`--profile N` also times N requests per endpoint inside this process (the app called directly through ASGI, no
HTTP, no client, the server stopped): microseconds per request, of which in the storage's methods and of which
in the database driver's execute (SQLAlchemy cursor events), and the functions with the most own time under
cProfile. Server CPU per request under load minus this is uvicorn's HTTP and the kernel's sockets.

Before each endpoint the server is left to drain (3x the previous endpoint's p99, at least 2 s, then a health check
answering within 50 ms): the requests a slow endpoint leaves running when the client stops must not land in the
next endpoint's figures. After the load, the trials table is analyzed (PostgreSQL: VACUUM ANALYZE), as
autovacuum would do within a minute, in the middle of some endpoint's measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
from sqlalchemy import Engine, event, select
from sqlalchemy.engine import make_url

from bench import machine
from bench.storage import INSERT_CHUNK, postgres_database, sqlite_database
from hpo.experiment import experiment_from_dict
from hpo.storage import SqlStorage
from hpo.storage.engine import create_storage_engine
from hpo.storage.models import ExperimentModel, TrialModel
from hpo.trial.launch import free_port

EXPERIMENT = "api-load"
ARMS = ("adamw", "lamb")
GLOBAL_BATCH = 32
BEST_GOAL = (1_000.0, 20.0)  # requests/s at least, p99 in ms at most
PAGE_GOAL = (500.0, 50.0)
BUSY_CORES = 0.25  # other load above this (cores, on average over a run) marks the run as taken on a busy machine
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PROJECT_ROOT = str(Path(__file__).resolve().parents[1])


def experiment_spec() -> dict:
    """A valid, self-contained experiment spec (the server parses it to build configs)."""
    data = {
        "name": EXPERIMENT, "base_config": {}, "overrides": {"batch.global_batch_size": GLOBAL_BATCH},
        "space": {"optimizer.name": {"choice": list(ARMS)}, "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}},
        "compare": ["optimizer.name"], "tuner": {"name": "random"}, "budget": {"trials": 100_000},
        "resources": {"gpus": "none"},
    }  # fmt: skip
    return experiment_from_dict(data).self_contained()


def fill(url: str, trials: int) -> float:
    """Create the experiment and bulk-insert `trials` trials; returns seconds taken."""
    start = time.perf_counter()
    with SqlStorage(url, upgrade=True) as storage:
        spec = experiment_spec()
        experiment_id = storage.create_experiment(EXPERIMENT, {"experiment": spec, "run_dir": "/tmp"}, "minimize")
    rng, now = random.Random(0), datetime.now(timezone.utc)
    engine = create_storage_engine(url)
    with engine.begin() as connection:
        for first in range(0, trials, INSERT_CHUNK):
            numbers = range(first, min(first + INSERT_CHUNK, trials))
            connection.execute(TrialModel.__table__.insert(), [_row(experiment_id, n, rng, now) for n in numbers])
        # what creating them one by one leaves (one version per trial): the server keeps an experiment's spec and
        # record only once its version shows a trial, and parsed the spec on every request of version 0
        versions = ExperimentModel.__table__
        connection.execute(versions.update().where(versions.c.id == experiment_id).values(trials_version=trials))
    # What autovacuum would do to a table grown by 100,000 rows, done now rather than in the middle of a measurement
    # (PostgreSQL's autovacuum otherwise starts within a minute of the load and its scan lands in whichever
    # endpoint runs then); SQLite gets its statistics too.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("VACUUM ANALYZE trials" if engine.dialect.name == "postgresql" else "ANALYZE")
    engine.dispose()
    return time.perf_counter() - start


def _row(experiment_id: int, number: int, rng: random.Random, now: datetime) -> dict:
    state = rng.choices(["completed", "failed", "diverged", "timeout"], weights=[80, 10, 5, 5])[0]
    optimizer = ARMS[number % 2]
    objective = float(rng.randrange(1_000_000, 9_000_000, 4096)) if state == "completed" else None
    return {
        "experiment_id": experiment_id, "number": number, "state": state,
        "params": {"optimizer.name": optimizer, "optimizer.lr": 10 ** rng.uniform(-4, -2)},
        "arm": f"optimizer.name={optimizer}", "budget": 1.0, "gpus": [number % 8], "global_batch_size": GLOBAL_BATCH,
        "objective": objective, "samples_to_target": int(objective) if objective else None,
        "best_mlm_accuracy": 0.72 if objective else 0.5, "metrics": {"status": "reached_target"}, "created_at": now,
        "started_at": now, "finished_at": now,
    }  # fmt: skip


def endpoints(trials: int) -> dict[str, str]:
    deep = max(1, trials // 2 - 50)  # the first trial number of the trial-list page, half-way in
    trials_path, lamb = f"/experiments/{EXPERIMENT}/trials?limit=50", "arm=optimizer.name%3Dlamb"
    return {
        "best config": f"/experiments/{EXPERIMENT}/best",
        "best config, one arm": f"/experiments/{EXPERIMENT}/best?{lamb}",
        "best config, every arm": f"/experiments/{EXPERIMENT}/best/arms",
        "trial list, by offset": f"{trials_path}&offset={deep}",
        "trial list, by cursor": f"{trials_path}&after={deep - 1}",
        "trial list, by state": f"{trials_path}&state=completed&after={deep - 1}",
        "trial list, by arm": f"{trials_path}&{lamb}&after={deep - 1}",
        "trial list, by state and arm": f"{trials_path}&state=completed&{lamb}&after={deep - 1}",
        "trial list, completed or failed": f"{trials_path}&state=completed&state=failed&after={deep - 1}",
        "trial list, failed, first page": f"{trials_path}&state=failed",
    }


def goal(name: str) -> tuple[float, float] | None:
    """(requests/s at least, p99 ms at most) of an endpoint; None for the offset page (a reference, no goal)."""
    if name.startswith("best"):
        return BEST_GOAL
    return None if name.endswith("by offset") else PAGE_GOAL


# -- checks: every answer measured is the right one ------------------------------------------------------------


def check_answers(base: str, paths: dict[str, str], url: str) -> None:
    """Each page and best config the load asks for equals the one computed here from the stored rows."""
    engine = create_storage_engine(url)
    with engine.connect() as connection:
        columns = (TrialModel.number, TrialModel.state, TrialModel.arm, TrialModel.objective)
        rows = connection.execute(select(*columns).order_by(TrialModel.number)).all()
    engine.dispose()
    for name, path in paths.items():
        answer = httpx.get(base + path, timeout=60)
        assert answer.status_code == 200, (name, answer.text)
        query = {key: values for key, values in parse_qs(urlsplit(path).query).items()}
        arm = query.get("arm", [None])[0]
        if name.startswith("best"):
            got = answer.json()
            got = (
                {a: best["trial"]["number"] for a, best in got.items()}
                if "every arm" in name
                else got["trial"]["number"]
            )
            assert got == _best(rows, arm, every_arm="every arm" in name), (name, got)
            continue
        states, after = query.get("state"), int(query.get("after", [-1])[0])
        offset, limit = int(query.get("offset", [0])[0]), int(query["limit"][0])
        matching = [n for n, s, a, _ in rows if (states is None or s in states) and arm in (None, a) and n > after]
        assert [t["number"] for t in answer.json()["items"]] == matching[offset : offset + limit], name


def _best(rows: list, arm: str | None, every_arm: bool) -> int | dict[str, int]:
    """The best trial's number by the storage contract: lowest objective among completed, ties by number."""
    if every_arm:
        return {a: _best(rows, a, False) for a in sorted({row[2] for row in rows})}
    completed = [(o, n) for n, s, a, o in rows if s == "completed" and o is not None and arm in (None, a)]
    return min(completed)[1]


# -- the server and its CPU ------------------------------------------------------------------------------------


def start_server(url: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HPO_DATABASE_URL": url}
    process = subprocess.Popen([sys.executable, "-m", "hpo", "serve", "--port", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    base = f"http://127.0.0.1:{port}/api/v1"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return process, base
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("hpo serve did not become healthy within 60 s")


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (the first is field 3 of proc(5), the state)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far; 0 once it is gone."""
    try:
        fields = _stat(pid)
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime: fields 14 and 15 of proc(5)


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent not idle so far (every core; /proc/stat)."""
    with open("/proc/stat") as stat:
        ticks = [int(t) for t in stat.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / CLOCK_TICKS


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children (the load client runs as one)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class DatabaseBackends:
    """The PostgreSQL backends that serve the bench's server (found by the application name its URL sets), whose
    CPU time counts as the database's; None of it on SQLite (it runs inside the server). A backend that ends (the
    pool closes a connection beyond its size) is reaped by the postmaster, whose children's CPU time then holds
    it: on a database server that others use, their sessions' ended backends too."""

    def __init__(self, url: str) -> None:
        self.name, self.url, self._admin, self._postmaster = f"hpo-api-load-{uuid.uuid4().hex[:8]}", url, None, None
        if make_url(url).get_backend_name() == "postgresql":
            named = make_url(url).update_query_dict({"application_name": self.name})
            self.url, self._admin = named.render_as_string(hide_password=False), create_storage_engine(url)
            with self._admin.connect() as connection:
                self._postmaster = _stat(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar())[1]

    def pids(self) -> set[int]:
        if self._admin is None:
            return set()
        with self._admin.connect() as connection:
            query = "SELECT pid FROM pg_stat_activity WHERE application_name = %(name)s"
            return {pid for (pid,) in connection.exec_driver_sql(query, {"name": self.name})}

    def ended_cpu_s(self) -> float:
        """CPU seconds of every backend that ended so far (the postmaster's reaped children)."""
        if self._postmaster is None:
            return 0.0
        fields = _stat(int(self._postmaster))
        return (int(fields[13]) + int(fields[14])) / CLOCK_TICKS  # cutime, cstime: fields 16 and 17 of proc(5)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.dispose()


class CpuWindow:
    """CPU seconds taken by the server, the client, the database's backends and the whole machine between `start`
    and `stop`."""

    def __init__(self, server_pid: int, database: DatabaseBackends) -> None:
        self.server_pid, self.database = server_pid, database

    def start(self) -> None:
        self._pids = self.database.pids()
        self._backends = {pid: process_cpu_s(pid) for pid in self._pids}
        self._begin = (time.perf_counter(), process_cpu_s(self.server_pid), children_cpu_s(), machine_busy_s(),
                       self.database.ended_cpu_s())  # fmt: skip

    def stop(self, requests: int) -> dict:
        """ms of CPU per request of the server, the client and the database; the other load in cores; how many
        backends ended during the run (their CPU is read from the postmaster's reaped children)."""
        wall, server = time.perf_counter(), process_cpu_s(self.server_pid)
        client, busy, ended = children_cpu_s(), machine_busy_s(), self.database.ended_cpu_s()
        pids = self._pids | self.database.pids()  # backends opened during the run count from zero
        closed = {pid for pid in self._pids if not os.path.exists(f"/proc/{pid}")}
        live = sum(process_cpu_s(pid) - self._backends.get(pid, 0.0) for pid in pids if os.path.exists(f"/proc/{pid}"))
        wall0, server0, client0, busy0, ended0 = self._begin
        # an ended backend's whole life is in the postmaster's children's time: less what it had used before
        database = live + (ended - ended0) - sum(self._backends[pid] for pid in closed)
        used = {"server": server - server0, "client": client - client0, "database": database}
        per_request = {f"{who}_ms": 1e3 * seconds / max(requests, 1) for who, seconds in used.items()}
        other = max(0.0, (busy - busy0) - sum(used.values())) / (wall - wall0)
        return {**per_request, "other_cores": other, "ended_cpu_ms": 1e3 * (ended - ended0) / max(requests, 1)}


# -- load ------------------------------------------------------------------------------------------------------


def drive(url: str, seconds: float, concurrency: int) -> dict:
    """Run in the load process: as many requests as `concurrency` connections manage in `seconds`."""
    return asyncio.run(_drive(url, seconds, concurrency))


async def _drive(url: str, seconds: float, concurrency: int) -> dict:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        for _ in range(20):  # warm-up: connections, caches
            (await client.get(url)).raise_for_status()
        latencies: list[float] = []
        errors = 0
        end = time.perf_counter() + seconds

        async def connection() -> None:
            nonlocal errors
            while time.perf_counter() < end:
                start = time.perf_counter()
                response = await client.get(url)
                latencies.append(time.perf_counter() - start)
                errors += response.status_code != 200

        started = time.perf_counter()
        await asyncio.gather(*(connection() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"requests": len(latencies), "errors": errors, "rps": len(latencies) / elapsed,
            "p50_ms": cuts[49] * 1e3, "p99_ms": cuts[98] * 1e3}  # fmt: skip


def run_httpx(url: str, seconds: float, concurrency: int) -> dict:
    load = subprocess.run(
        [sys.executable, "-m", "bench.api_load", "--drive", url, "--seconds", str(seconds), "--concurrency",
         str(concurrency)], capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(load.stdout)


def run_wrk(url: str, seconds: float, concurrency: int) -> dict:
    """The load from wrk (Debian's `wrk`, a C client on one thread): far less CPU taken from the server."""
    done = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--latency", url],
                          capture_output=True, text=True, check=True)  # fmt: skip
    out = done.stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    return {"requests": requests, "errors": (int(bad.group(1)) if bad else 0) + socket_errors,
            "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50_ms": _wrk_ms(re.search(r"50%\s+([\d.]+\w+)", out).group(1)),
            "p99_ms": _wrk_ms(re.search(r"99%\s+([\d.]+\w+)", out).group(1))}  # fmt: skip


def _wrk_ms(value: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", value).groups()
    return float(number) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[unit]


def measure_once(url: str, seconds: float, concurrency: int, client: str, cpu: CpuWindow) -> dict:
    """One measured run of one endpoint, after a 1 s warm-up at 2 connections, with the CPU it took."""
    run = run_wrk if client == "wrk" else run_httpx
    run(url, 1.0, 2)
    cpu.start()
    result = run(url, seconds, concurrency)
    return {**result, **cpu.stop(result["requests"])}


def measure(url: str, args: argparse.Namespace) -> dict[str, list[dict]]:
    """Load the trials, serve them, check the answers, then run the sequence of endpoints `args.runs` times."""
    print(f"  loaded {args.trials:,} trials in {fill(url, args.trials):.1f} s", flush=True)
    paths = {name: path for name, path in endpoints(args.trials).items() if not args.only or name in args.only}
    database = DatabaseBackends(url)
    server, base = start_server(database.url)
    runs: dict[str, list[dict]] = {name: [] for name in paths}
    try:
        check_answers(base, paths, url)
        cpu, previous = CpuWindow(server.pid, database), None
        for sequence in range(args.runs):
            for name, path in paths.items():
                drain(base, previous)
                previous = measure_once(base + path, args.seconds, args.concurrency, args.client, cpu)
                runs[name].append(previous)
                print(f"  run {sequence + 1}  {name:<31} {_line(previous)}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
        database.close()
    if args.runs:
        print_summary(runs)
    if args.profile:
        print_profile(profile(url, paths, args.profile))
    return runs


def drain(base: str, previous: dict | None, quiet_ms: float = 50.0, limit_s: float = 60.0) -> None:
    """Let the requests of the previous endpoint that the client abandoned when it stopped (a slow page's
    thread-pool work and its database queries) end before the next endpoint is measured: a pause of 3x the
    previous endpoint's p99 (at least 2 s), then a health check answering within `quiet_ms`."""
    time.sleep(max(2.0, 3 * previous["p99_ms"] / 1e3) if previous else 0.0)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        started = time.perf_counter()
        httpx.get(f"{base}/health", timeout=30)
        if (time.perf_counter() - started) * 1e3 < quiet_ms:
            return
        time.sleep(0.5)


def _line(r: dict) -> str:
    return (f"{r['rps']:7.0f} req/s  p50 {r['p50_ms']:6.2f} ms  p99 {r['p99_ms']:6.2f} ms  CPU/request: server "
            f"{r['server_ms']:.2f} ms, client {r['client_ms']:.2f}, database {r['database_ms']:.2f}  other load "
            f"{r['other_cores']:.2f} cores  ({r['errors']} errors)")  # fmt: skip


# -- summary ---------------------------------------------------------------------------------------------------


def _spread(values: list[float], digits: int = 0) -> str:
    """'median (lowest-highest)', or the value alone for one run."""
    show = lambda v: f"{v:,.{digits}f}"  # noqa: E731
    middle = show(statistics.median(values))
    return middle if len(values) == 1 else f"{middle} ({show(min(values))}-{show(max(values))})"


def print_summary(runs: dict[str, list[dict]]) -> None:
    """A Markdown table: per endpoint the median of its runs and their range; whether its goal is met."""
    print(f"\n  median (range) of {max(len(r) for r in runs.values())} runs; CPU model: {cpu_model()}")
    print("| endpoint | req/s | p50 ms | p99 ms | server CPU ms/req | client | database | other load (cores) | goal |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, results in runs.items():
        if results:
            print(_summary_row(name, {key: [r[key] for r in results] for key in results[0]}))
    busy = max(statistics.median([r["other_cores"] for r in results]) for results in runs.values() if results)
    if any(r["ended_cpu_ms"] > 0.005 for results in runs.values() for r in results):
        print(
            "  +: includes database backends that ended during the run (the server's pool closes connections beyond "
            "its size; on a shared database server, other sessions' ended backends count too)"
        )
    if busy > BUSY_CORES:
        print(f"  BUSY MACHINE: other processes used up to {busy:.2f} cores (median of an endpoint's runs) while "
              "this measured; the figures are lower bounds, not this code's")  # fmt: skip


def _summary_row(name: str, column: dict[str, list[float]]) -> str:
    target, verdict = goal(name), "-"
    if target is not None:
        met = statistics.median(column["rps"]) >= target[0] and statistics.median(column["p99_ms"]) <= target[1]
        verdict = ("met" if met else "**not met**") + f" (>= {target[0]:,.0f}, p99 <= {target[1]:.0f} ms)"
    errors = sum(column["errors"])
    closed = "+" if max(column["ended_cpu_ms"]) > 0.005 else ""  # ended backends (other sessions' too) count
    return (f"| {name}{f' ({errors} errors)' if errors else ''} | {_spread(column['rps'])} | "
            f"{_spread(column['p50_ms'], 1)} | {_spread(column['p99_ms'], 1)} | {_spread(column['server_ms'], 2)} | "
            f"{_spread(column['client_ms'], 2)} | {_spread(column['database_ms'], 2)}{closed} | "
            f"{_spread(column['other_cores'], 2)} | {verdict} |")  # fmt: skip


def cpu_model() -> str:
    return f"{machine.cpu_model()}, {os.cpu_count()} cores"


# -- in-process profile ----------------------------------------------------------------------------------------


def profile(url: str, paths: dict[str, str], requests: int) -> dict[str, dict]:
    """Per endpoint, `requests` requests through the app in this process (see the module docstring)."""
    from server.app import API_PREFIX, create_app  # the bench's load process never needs the server's modules
    from server.settings import Settings

    app = create_app(Settings(database_url=url, api_access_log=False))
    storage = app.state.storage.get()
    try:
        return asyncio.run(_profile_all(app, {name: API_PREFIX + path for name, path in paths.items()}, requests))
    finally:
        storage.close()


async def _profile_all(app, paths: dict[str, str], requests: int) -> dict[str, dict]:
    found = {}
    storage = TimedStorage(app.state.storage.get())
    app.state.storage = storage  # the routes' storage dependency asks app.state.storage.get()
    for name, path in paths.items():
        call = _asgi_get(app, path)
        for _ in range(50):  # warm-up: the experiment, the spec, the kept answers and entries
            await call()
        storage.seconds = 0.0
        with DatabaseClock() as database, ResponseClock() as response:
            started, cpu_started = time.perf_counter(), time.process_time()
            for _ in range(requests):
                await call()
            total, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        in_storage = storage.seconds
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(requests):
            await call()
        profiler.disable()
        seconds = {"us": total, "cpu_us": cpu, "storage_us": in_storage, "database_us": database.seconds,
                   "response_us": response.seconds}  # fmt: skip
        found[name] = {
            **{key: 1e6 * value / requests for key, value in seconds.items()},
            "top": _top(profiler, requests),
        }
    return found


def _asgi_get(app, path: str) -> Callable:
    """A coroutine function that GETs `path` from the ASGI app and checks the answer is a 200."""
    route, _, query = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": route, "raw_path": route.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"bench")], "client": ("127.0.0.1", 1), "server": ("bench", 80)}  # fmt: skip

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def call() -> None:
        status = []

        async def send(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await app(dict(scope), receive, send)
        assert status == [200], (path, status)

    return call


class TimedStorage:
    """A storage holder for the app whose storage has every method call timed (the seconds add up in `seconds`)."""

    def __init__(self, storage) -> None:
        self._storage, self.seconds = storage, 0.0

    def get(self) -> TimedStorage:
        return self

    def __getattr__(self, name: str):
        method = getattr(self._storage, name)
        if not callable(method):
            return method

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


class DatabaseClock:
    """Seconds spent in the database driver's execute (SQLAlchemy cursor events on every engine) while entered."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def _before(self, connection, *_args) -> None:
        connection.info["bench_started"] = time.perf_counter()

    def _after(self, connection, *_args) -> None:
        self.seconds += time.perf_counter() - connection.info.pop("bench_started")

    def __enter__(self) -> DatabaseClock:
        event.listen(Engine, "before_cursor_execute", self._before)
        event.listen(Engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *exc_info) -> None:
        event.remove(Engine, "before_cursor_execute", self._before)
        event.remove(Engine, "after_cursor_execute", self._after)


class ResponseClock:
    """Seconds spent turning kept bodies into answers (`cached_json`: the ETag's hash, the If-None-Match check, the
    Response) while entered: the routes' own references to it are timed."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __enter__(self) -> ResponseClock:
        from server.routes import best, trials

        self._routes, original = (best, trials), best.cached_json

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        for module in self._routes:
            module.cached_json = timed
        self._original = original
        return self

    def __exit__(self, *exc_info) -> None:
        for module in self._routes:
            module.cached_json = self._original


def _top(profiler: cProfile.Profile, requests: int, count: int = 6) -> list[tuple[str, float]]:
    """The functions with the most own time under cProfile: (where, microseconds per request)."""
    entries = pstats.Stats(profiler).stats  # (file, line, function) -> (calls, primitive, own, cumulative, callers)
    ranked = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)[:count]
    return [(_where(key), 1e6 * own / requests) for key, (_, _, own, _, _) in ranked]


def _where(key: tuple) -> str:
    """`package/module.py:line(function)`, or a built-in's name."""
    file, line, function = key
    if file == "~":
        return function
    for root in ("site-packages/", f"{PROJECT_ROOT}/", "/lib/python"):
        file = file.split(root, 1)[-1]
    return f"{file}:{line}({function})"


def print_profile(found: dict[str, dict]) -> None:
    print("\n  in process (ASGI, no HTTP), microseconds per request:")
    print("| endpoint | total | CPU of this process | storage methods | of which database execute | answer: ETag, "
          "Response | the rest: routing, validation, the route |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, r in found.items():
        rest = r["us"] - r["storage_us"] - r["response_us"]
        print(f"| {name} | {r['us']:,.0f} | {r['cpu_us']:,.0f} | {r['storage_us']:,.0f} | {r['database_us']:,.0f} | "
              f"{r['response_us']:,.0f} | {rest:,.0f} |")  # fmt: skip
    for name, r in found.items():
        top = "; ".join(f"{where} {us:.0f}" for where, us in r["top"])
        print(f"  {name}, most own time under cProfile (us/request): {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000, help="trials to store (default 100,000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="load duration per endpoint and run (default 10)")
    parser.add_argument("--runs", type=int, default=3, help="times the whole sequence runs (default 3)")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent connections (default 16)")
    parser.add_argument("--postgres", default=os.environ.get("HPO_TEST_POSTGRES_URL"), help="PostgreSQL base URL")
    parser.add_argument("--client", choices=["wrk", "httpx"], default="wrk" if shutil.which("wrk") else "httpx",
                        help="load generator: wrk (`make bench-deps`; the default when installed) or an async "
                             "httpx client in a separate Python process")  # fmt: skip
    parser.add_argument(
        "--only",
        action="append",
        choices=list(endpoints(2)),
        metavar="ENDPOINT",
        help="measure only this endpoint (repeatable), e.g. --only 'trial list, by cursor'",
    )
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also time N requests per endpoint in process (where a request's time goes)")  # fmt: skip
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only (with --postgres)")
    parser.add_argument("--drive", help=argparse.SUPPRESS)  # internal: run as the load process against this URL
    args = parser.parse_args()
    if args.drive:
        print(json.dumps(drive(args.drive, args.seconds, args.concurrency)))
        return
    load = " / ".join(f"{average:.2f}" for average in os.getloadavg())
    print(f"API load: {args.trials:,} trials, one uvicorn worker, {args.concurrency} connections, {args.runs} runs "
          f"of {args.seconds:g} s per endpoint, client {args.client}; {cpu_model()}; load average {load} "
          f"(1/5/15 min) at {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}")  # fmt: skip
    if not args.no_sqlite:
        print("sqlite:", flush=True)
        with sqlite_database() as url:
            measure(url, args)
    if args.postgres:
        print("postgresql:", flush=True)
        with postgres_database(args.postgres) as url:
            measure(url, args)
    print(f"load average at the end {' / '.join(f'{a:.2f}' for a in os.getloadavg())}")


if __name__ == "__main__":
    main()
