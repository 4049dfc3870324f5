"""Storage speed: how fast trials can stream metrics in, and how fast the best trial comes out of 100,000.

- ingestion: metric rows/s stored by one writer, batched the way a runner forwards a trainer's progress
  (50 reports of 4 values = 200 rows per `add_metrics` call) and one row per call (the worst case);
- best-trial latency: p50/p99 over `--queries` calls of `best_trial` (overall, per arm, per batch size) and
  `best_per_arm`, with `--trials` trials (80 % completed, 4 arms, 3 batch sizes) bulk-loaded first.

SQLite runs on a temporary file; PostgreSQL runs when `--postgres URL` or HPO_TEST_POSTGRES_URL is given, in a
throw-away schema that is dropped afterwards. Goals: >= 5,000 rows/s on SQLite (batched), p99 <= 20 ms.

    python bench/storage.py [--postgres postgresql+psycopg://postgres@127.0.0.1:5432/test] [--trials N]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from hpo.storage import MetricPoint, SqlStorage
from hpo.storage.engine import create_storage_engine
from hpo.storage.models import TrialModel
from hpo.trials import TrialSpec

ARMS = ["adam", "adam+bucketwise", "lamb", "lamb+bucketwise"]
BATCH_SIZES = [8192, 32768, 65536]
METRICS = ["loss", "mlm_accuracy", "lr", "seq_per_s"]
REPORTS_PER_CALL = 50
INSERT_CHUNK = 10_000


@contextlib.contextmanager
def sqlite_database() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield f"sqlite:///{directory}/bench.db"


@contextlib.contextmanager
def postgres_database(base_url: str) -> Iterator[str]:
    """A fresh schema in `base_url`'s database, dropped on exit."""
    schema = f"hpo_bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()


def ingestion_rate(storage: SqlStorage, experiment_id: int, reports_per_call: int, total_rows: int) -> float:
    """Metric rows/s for one trial streaming `total_rows` values, `reports_per_call` reports per call."""
    trial_id = storage.create_trial(experiment_id, TrialSpec(storage.next_trial_number(experiment_id), {}))
    names = METRICS if reports_per_call > 1 else METRICS[:1]
    calls = total_rows // (reports_per_call * len(names))
    start = time.perf_counter()
    for call in range(calls):
        steps = range(call * reports_per_call, (call + 1) * reports_per_call)
        points = [MetricPoint(step, step * 4096, {name: 1.0 / (step + 1) for name in names}) for step in steps]
        storage.add_metrics(trial_id, points)
    elapsed = time.perf_counter() - start
    return calls * reports_per_call * len(names) / elapsed


def load_trials(url: str, experiment_id: int, count: int, seed: int = 0) -> float:
    """Bulk-insert `count` finished/failed/queued trials straight into the table; returns seconds taken."""
    rng = random.Random(seed)
    now = datetime.now(timezone.utc)
    engine = create_storage_engine(url)
    start = time.perf_counter()
    with engine.begin() as connection:
        for first in range(0, count, INSERT_CHUNK):
            rows = [
                _trial_row(experiment_id, number, rng, now) for number in range(first, min(first + INSERT_CHUNK, count))
            ]
            connection.execute(TrialModel.__table__.insert(), rows)
    engine.dispose()
    return time.perf_counter() - start


def _trial_row(experiment_id: int, number: int, rng: random.Random, now: datetime) -> dict:
    state = rng.choices(["completed", "failed", "diverged", "timeout"], weights=[80, 10, 5, 5])[0]
    return {
        "experiment_id": experiment_id,
        "number": number,
        "state": state,
        "params": {"optimizer.lr": 10 ** rng.uniform(-4, -2), "optimizer.weight_decay": rng.uniform(0, 0.1)},
        "arm": rng.choice(ARMS),
        "budget": 1.0,
        "gpus": [number % 8],
        "global_batch_size": rng.choice(BATCH_SIZES),
        "objective": float(rng.randrange(1_000_000, 9_000_000, 4096)) if state == "completed" else None,
        "metrics": {},
        "created_at": now,
    }


def latency_ms(query: Callable[[int], object], repeats: int) -> tuple[float, float]:
    """(p50, p99) in milliseconds of `query(i)` for i in range(repeats), after a few warm-up calls."""
    for i in range(5):
        query(i)
    samples = []
    for i in range(repeats):
        start = time.perf_counter()
        query(i)
        samples.append((time.perf_counter() - start) * 1e3)
    percentiles = statistics.quantiles(samples, n=100, method="inclusive")
    return percentiles[49], percentiles[98]


def measure(url: str, trials: int, queries: int) -> list[tuple[str, str, str]]:
    """(measurement, result, goal) rows for one database."""
    rows = []
    with SqlStorage(url, upgrade=True) as storage:
        streams = storage.create_experiment("ingestion", {}, "minimize")
        batched = ingestion_rate(storage, streams, REPORTS_PER_CALL, total_rows=40_000)
        single = ingestion_rate(storage, streams, 1, total_rows=2_000)
        rows.append(("metric rows/s, 200 rows per call", f"{batched:,.0f}", ">= 5,000 (SQLite)"))
        rows.append(("metric rows/s, 1 row per call", f"{single:,.0f}", ""))

        experiment_id = storage.create_experiment("best-trials", {}, "minimize")
        seconds = load_trials(url, experiment_id, trials)
        rows.append((f"bulk load of {trials:,} trials", f"{seconds:.1f} s", ""))
        cases = {
            "best_trial overall": lambda i: storage.best_trial(experiment_id),
            "best_trial per arm": lambda i: storage.best_trial(experiment_id, arm=ARMS[i % len(ARMS)]),
            "best_trial per batch size": lambda i: storage.best_trial(
                experiment_id, global_batch_size=BATCH_SIZES[i % len(BATCH_SIZES)]
            ),
            f"best_per_arm ({len(ARMS)} arms)": lambda i: storage.best_per_arm(experiment_id),
        }
        for label, query in cases.items():
            p50, p99 = latency_ms(query, queries)
            rows.append((f"{label}, p50 / p99", f"{p50:.2f} / {p99:.2f} ms", "p99 <= 20 ms"))
    return rows


def print_table(results: list[tuple[str, str, str, str]]) -> None:
    header = ("backend", "measurement", "result", "goal")
    widths = [max(len(row[i]) for row in [header, *results]) for i in range(len(header))]
    for row in [header, tuple("-" * width for width in widths), *results]:
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--postgres", default=os.environ.get("HPO_TEST_POSTGRES_URL"), help="PostgreSQL URL")
    parser.add_argument("--trials", type=int, default=100_000, help="trials stored for the best-trial queries")
    parser.add_argument("--queries", type=int, default=200, help="timed calls per best-trial query")
    args = parser.parse_args()

    databases = [("SQLite", sqlite_database())]
    if args.postgres:
        databases.append(("PostgreSQL", postgres_database(args.postgres)))
    results = []
    for backend, database in databases:
        with database as url:
            results += [(backend, *row) for row in measure(url, args.trials, args.queries)]
    print_table(results)


if __name__ == "__main__":
    main()
