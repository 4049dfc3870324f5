"""What the API's statement deadline (hpo/storage/deadline.py) costs a read: the same one-row read (an experiment
looked up by a name no experiment has, as `/health` does) on two storages of one PostgreSQL database, one without
deadlines and one with the API's (5 s and 120 s), `--rounds` rounds of `--reads` reads each, the two alternating
which goes first; the median microseconds a read of each, and their ratio.

    python -m bench.statement_deadline --db postgresql+psycopg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from bench.machine import cpu_model
from hpo.errors import NotFoundError
from hpo.storage import SqlStorage
from server.storage import SLOW_READ_S


def per_read_us(storage: SqlStorage, reads: int) -> float:
    started = time.perf_counter()
    for _ in range(reads):
        with contextlib.suppress(NotFoundError):
            storage.get_experiment_by_name("-")
    return (time.perf_counter() - started) / reads * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.statement_deadline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="a PostgreSQL URL (its schema is made or upgraded)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--reads", type=int, default=1000)
    args = parser.parse_args(argv)
    plain = SqlStorage(args.db, upgrade=True)
    watched = SqlStorage(args.db, deadlines=(5.0, SLOW_READ_S))
    times: dict[str, list[float]] = {"without": [], "with": []}
    for round_ in range(args.rounds):
        pairs = [("without", plain), ("with", watched)]
        for name, storage in pairs if round_ % 2 == 0 else pairs[::-1]:
            times[name].append(per_read_us(storage, args.reads))
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{cpu_model()}; {args.rounds} rounds of {args.reads:,} reads")
    for name, median in medians.items():
        print(f"{name} deadlines: {median:.1f} us a read (rounds: {', '.join(f'{v:.0f}' for v in times[name])})")
    print(f"with / without: {medians['with'] / medians['without']:.3f}")
    plain.close()
    watched.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
