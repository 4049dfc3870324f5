"""REST API under load: requests/s and p50/p99 latency of the best-config and trial-list endpoints.

For each database (SQLite on a temporary file; PostgreSQL when `--postgres URL` or HPO_TEST_POSTGRES_URL is
given, in a throw-away schema dropped afterwards): one experiment with `--trials` trials (80 % completed, two
arms) is bulk-loaded, `hpo serve` runs as one uvicorn worker in a subprocess, and a separate process drives
it (`--concurrency` connections, `--seconds` per endpoint, after a warm-up): wrk (Debian's package, installed
by `make bench-deps`) when present, else an async httpx client in Python.
The client shares the machine's cores with the server, so the figures are a lower bound of the server alone.
The trial list is asked for the same page half-way into the experiment two ways: by offset (`offset=N`, which
pays a deep OFFSET and a count of the whole experiment) and by cursor (`after=N-1`, an index range, no count).
Goals: best config >= 1,000 requests/s with p99 <= 20 ms; trial list by cursor >= 500 requests/s with p99 <= 50 ms.

    python -m bench.api_load [--trials 100000] [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test]
    python -m bench.api_load --trials 2000 --seconds 1        # a smoke run: seconds, every figure printed
    python -m bench.api_load --no-sqlite --only 'trial list, by cursor' --postgres URL   # one endpoint, one database

Before each endpoint the server is left to drain (3x the previous endpoint's p99, at least 2 s, then a health check
answering within 50 ms): the requests a slow endpoint leaves running when the client stops must not land in the
next endpoint's figures. After the load, the trials table is analyzed (PostgreSQL: VACUUM ANALYZE), as
autovacuum would do within a minute, in the middle of some endpoint's measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

import httpx

from bench.storage import INSERT_CHUNK, postgres_database, sqlite_database
from hpo.experiment import experiment_from_dict
from hpo.storage import SqlStorage
from hpo.storage.engine import create_storage_engine
from hpo.storage.models import TrialModel
from hpo.trial.launch import free_port

EXPERIMENT = "api-load"
ARMS = ("adamw", "lamb")
GLOBAL_BATCH = 32


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
    return {
        "best config": f"/experiments/{EXPERIMENT}/best",
        "best config, one arm": f"/experiments/{EXPERIMENT}/best?arm=optimizer.name%3Dlamb",
        "trial list, by offset": f"/experiments/{EXPERIMENT}/trials?limit=50&offset={deep}",
        "trial list, by cursor": f"/experiments/{EXPERIMENT}/trials?limit=50&after={deep - 1}",
        "trial list, filtered": f"/experiments/{EXPERIMENT}/trials?state=completed&arm=optimizer.name%3Dlamb&limit=50",
    }


def check_trial_pages(base: str, paths: dict[str, str]) -> None:
    """Both ways of paging must answer the same page (or the figures compare different work)."""
    by_offset = httpx.get(base + paths["trial list, by offset"], timeout=30).json()
    by_cursor = httpx.get(base + paths["trial list, by cursor"], timeout=30).json()
    numbers = [trial["number"] for trial in by_offset["items"]]
    assert numbers and numbers == [trial["number"] for trial in by_cursor["items"]], (by_offset, by_cursor)
    assert by_cursor["total"] is None and by_cursor["next"] == by_offset["next"]


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


def drive_wrk(url: str, seconds: float, concurrency: int) -> dict:
    """The same load from wrk (Debian's `wrk`, a C client on one thread): far less CPU taken from the server."""
    warm = subprocess.run(["wrk", "-t1", "-c2", "-d1s", url], capture_output=True, text=True, check=True)
    assert "Requests/sec" in warm.stdout, warm.stdout
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


def measure(url: str, trials: int, seconds: float, concurrency: int, client: str,
            only: list[str] | None = None) -> list[tuple[str, dict]]:  # fmt: skip
    print(f"  loaded {trials:,} trials in {fill(url, trials):.1f} s", flush=True)
    server, base = start_server(url)
    try:
        results = []
        paths = endpoints(trials)
        check_trial_pages(base, paths)
        for name, path in paths.items():
            if only and name not in only:
                continue
            drain(base, results[-1][1] if results else None)
            if client == "wrk":
                results.append((name, drive_wrk(base + path, seconds, concurrency)))
                print(f"  {name:<26} {_line(results[-1][1])}", flush=True)
                continue
            load = subprocess.run(
                [sys.executable, "-m", "bench.api_load", "--drive", base + path, "--seconds", str(seconds),
                 "--concurrency", str(concurrency)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            results.append((name, json.loads(load.stdout)))
            print(f"  {name:<26} {_line(results[-1][1])}", flush=True)
        return results
    finally:
        server.terminate()
        server.wait(timeout=30)


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
    return f"{r['rps']:8.0f} req/s   p50 {r['p50_ms']:6.2f} ms   p99 {r['p99_ms']:6.2f} ms   ({r['errors']} errors)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=100_000, help="trials to store (default 100,000)")
    parser.add_argument("--seconds", type=float, default=10.0, help="load duration per endpoint (default 10)")
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
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only (with --postgres)")
    parser.add_argument("--drive", help=argparse.SUPPRESS)  # internal: run as the load process against this URL
    args = parser.parse_args()
    if args.drive:
        print(json.dumps(drive(args.drive, args.seconds, args.concurrency)))
        return
    cores = os.cpu_count()
    print(f"API load: {args.trials:,} trials, one uvicorn worker, {args.concurrency} connections, {cores} cores, "
          f"client {args.client}")  # fmt: skip
    if not args.no_sqlite:
        print("sqlite:", flush=True)
        with sqlite_database() as url:
            measure(url, args.trials, args.seconds, args.concurrency, args.client, args.only)
    if args.postgres:
        print("postgresql:", flush=True)
        with postgres_database(args.postgres) as url:
            measure(url, args.trials, args.seconds, args.concurrency, args.client, args.only)


if __name__ == "__main__":
    main()
