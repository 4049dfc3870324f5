"""Writers queueing for one SQLite file: how long a single write waits for the write lock when many processes write
at once, against SQLite's busy timeout (`hpo.storage.engine.SQLITE_BUSY_TIMEOUT_MS`), past which a write counts as
an outage. `--processes` writer processes each store `--writes` metric points, one `add_metrics` call each, as fast
as they can and without waiting (`without_waiting`: a write that outlasts the busy timeout raises). Reported: the
writes that failed (goal 0), the longest single write and the longest process.

    python -m bench.sqlite_contention                     # 16 processes x 300 writes
    python -m bench.sqlite_contention --processes 32 --writes 200
"""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

from bench.commands import cpu_model
from hpo.errors import DatabaseUnavailableError
from hpo.storage import SqlStorage
from hpo.storage.engine import SQLITE_BUSY_TIMEOUT_MS
from hpo.storage.retry import without_waiting
from hpo.trials import TrialSpec


def write(url: str, trial_id: int, writes: int, results) -> None:
    """One writer: `writes` single-point writes to its trial; puts (failed, longest write s, total s)."""
    storage = SqlStorage(url)
    failed, longest, start = 0, 0.0, time.monotonic()
    for i in range(writes):
        began = time.monotonic()
        try:
            with without_waiting():
                storage.add_metrics(trial_id, [(i, 32 * i, {"loss": 1.0 / (i + 1)})])
        except DatabaseUnavailableError:
            failed += 1
        longest = max(longest, time.monotonic() - began)
    storage.close()
    results.put((failed, longest, time.monotonic() - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--writes", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpo-contention-") as folder:
        url = f"sqlite:///{Path(folder) / 'hpo.db'}"
        with SqlStorage(url, upgrade=True) as storage:
            experiment = storage.create_experiment("contention", {}, "minimize")
            trials = [storage.create_trial(experiment, TrialSpec(None, {"x": i})) for i in range(args.processes)]
        results = multiprocessing.Queue()
        writers = [multiprocessing.Process(target=write, args=(url, t, args.writes, results)) for t in trials]
        for writer in writers:
            writer.start()
        outcomes = [results.get() for _ in writers]
        for writer in writers:
            writer.join()
    print(f"{args.processes} processes x {args.writes} writes on one SQLite file; {cpu_model()}; "
          f"busy timeout {SQLITE_BUSY_TIMEOUT_MS / 1000:g} s")  # fmt: skip
    print(f"failed writes: {sum(o[0] for o in outcomes)} (goal 0); longest single write: "
          f"{max(o[1] for o in outcomes):.2f} s; longest process: {max(o[2] for o in outcomes):.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
