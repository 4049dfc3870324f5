"""`hpo delete` as the user runs it: the wall time and peak memory of the whole process (interpreter start, imports
and the database included) removing the experiment of bench/commands.py (the simulated preset with `--trials`
tuning trials and its confirmation runs, each trial with its learning curve), beside `hpo status NAME` on the same
database in the same run (the baseline: a read command of the same experiment).

Each delete runs on a fresh copy of the stored experiment: a copy of the SQLite file, or on PostgreSQL a database
made from the stored one as its template (`CREATE DATABASE ... TEMPLATE`). The copies are timed apart from the
commands. Unless the database already holds the experiment (`sim<N>`), it is stored first with `hpo run` (as
bench/commands.py does it; 77 s at 10,000 trials on a 2-core machine).

    python -m bench.delete --trials 10000 --db sqlite:///runs/commands/hpo-10000.db
    python -m bench.delete --trials 10000 --db postgresql+psycopg://postgres@127.0.0.1:5432/commands10k
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.commands import ROOT, absolute, create, experiment_file, has_experiment, hpo
from bench.machine import cpu_model


def timed(url: str, *args: str) -> tuple[float, float, str]:
    """(seconds, peak resident MB, stdout) of `hpo --db URL ARGS` as a process of its own (its own rusage)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    started = time.monotonic()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen([sys.executable, "-m", "hpo", "--db", url, *args], stdout=out,
                                   stderr=subprocess.DEVNULL, env=env, cwd=ROOT)  # fmt: skip
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.monotonic() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            sys.exit(f"hpo {' '.join(args)} exited with {process.returncode}")
        out.seek(0)
        return seconds, usage.ru_maxrss / 1024, out.read().decode()


class Copies:
    """Fresh copies of the database at `url`, one a delete."""

    def __init__(self, url: str, directory: Path) -> None:
        self.url, self.directory, self.made = url, directory, 0
        self.sqlite = url.startswith("sqlite")

    def fresh(self) -> str:
        self.made += 1
        if self.sqlite:
            source = Path(make_url(self.url).database)
            target = self.directory / f"copy-{self.made}.db"
            with create_engine(self.url).connect() as connection:  # the log folded in: the file is the database
                connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            shutil.copyfile(source, target)
            return f"sqlite:///{target}"
        name = f"{make_url(self.url).database}_copy{self.made}"
        self._admin(
            f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}" TEMPLATE "{make_url(self.url).database}"'
        )
        return make_url(self.url).set(database=name).render_as_string(hide_password=False)

    def drop(self, url: str) -> None:
        if self.sqlite:
            Path(make_url(url).database).unlink(missing_ok=True)
        else:
            self._admin(f'DROP DATABASE IF EXISTS "{make_url(url).database}"')

    def _admin(self, *statements: str) -> None:
        engine = create_engine(make_url(self.url).set(database="postgres"), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                for statement in statements:
                    connection.execute(text(statement))
        finally:
            engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10_000, help="tuning trials of the experiment (default 10,000)")
    parser.add_argument("--db", required=True, help="database URL holding (or to hold) the experiment")
    parser.add_argument("--repeats", type=int, default=3, help="deletes timed, each on a fresh copy (default 3)")
    args = parser.parse_args(argv)
    url = absolute(args.db)
    with tempfile.TemporaryDirectory(prefix="bench-delete-") as tmp:
        directory = Path(tmp)
        name, _ = experiment_file(args.trials, directory)
        if not has_experiment(url, name):
            print(f"storing {name} with `hpo run` ({args.trials:,} trials) ...", file=sys.stderr, flush=True)
            create(url, args.trials, directory)
        hpo(url, "status", name)  # warm: the database in the page cache, the bytecode written
        copies, rows = Copies(url, directory), []
        load_before = os.getloadavg()
        for _ in range(args.repeats):
            status_s, status_mb, _ = timed(url, "status", name)
            started = time.monotonic()
            copy = copies.fresh()
            copy_s = time.monotonic() - started
            delete_s, delete_mb, said = timed(copy, "delete", name, "--yes")
            copies.drop(copy)
            rows.append((status_s, status_mb, copy_s, delete_s, delete_mb, said.splitlines()[0]))
        load_after = os.getloadavg()
    print(f"{name}: {url.split(':', 1)[0]}; {cpu_model()}, {os.cpu_count()} cores, load average {load_before[0]:.2f} "
          f"before, {load_after[0]:.2f} after; {rows[0][5]}")  # fmt: skip
    print(
        "| run | `hpo status NAME` | `hpo delete NAME --yes` | delete / status | delete's peak memory | copy made in |"
    )
    print("|---|---|---|---|---|---|")
    for i, (status_s, _, copy_s, delete_s, delete_mb, _) in enumerate(rows, 1):
        print(f"| {i} | {status_s:.2f} s | {delete_s:.2f} s | {delete_s / status_s:.1f}x | {delete_mb:.0f} MB | "
              f"{copy_s:.1f} s |")  # fmt: skip
    medians = [statistics.median(r[k] for r in rows) for k in (0, 3)]
    print(f"| median | {medians[0]:.2f} s | {medians[1]:.2f} s | {medians[1] / medians[0]:.1f}x | | |")


if __name__ == "__main__":
    main()
