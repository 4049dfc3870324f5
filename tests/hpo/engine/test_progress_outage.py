"""The progress view while the database is away: its status line says so, and says when it is back.

The database is away for real: another connection holds the SQLite file in exclusive locking mode, which shuts out
readers too (SQLite's waits shortened so the lock outlasts them within milliseconds).
"""

from __future__ import annotations

import io
import re
import sqlite3
from pathlib import Path

import pytest

from hpo.engine.progress import ProgressView
from hpo.errors import DatabaseUnavailableError
from hpo.storage import SqlStorage
from hpo.storage import engine as engine_module
from hpo.storage.retry import without_waiting


def assert_away_then_back(lines: list[str]) -> None:
    """The view's lines: the database away (an SQLite file locked by another connection: the line says so, not
    "unreachable"), back again, then the status line."""
    assert re.fullmatch(r"database locked by another writer for \d+ s, retrying \(the controller waits up to 600 s: "
                        r"database\.outage_s\)", lines[0])  # fmt: skip
    assert re.fullmatch(r"database reachable again \(it was away for at least \d+ s\)", lines[1])
    assert lines[2].startswith("trials: 0/4 done, 0 running, 4 waiting")


def test_the_status_line_says_the_database_is_unreachable_and_when_it_is_back(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 20)
    path = tmp_path / "hpo.db"
    storage = SqlStorage(f"sqlite:///{path}", upgrade=True)
    experiment_id = storage.create_experiment("x", {}, "minimize")
    storage.close()  # no pooled connection of its own: the lock below shuts it out
    out = io.StringIO()
    view = ProgressView(storage, experiment_id, total=4, stream=out, interval_s=0, outage_s=600)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE experiments SET controller_note = 'held'")
    try:
        view._tick()  # tries once: the view never waits for the database
    finally:
        holder.execute("COMMIT")
        holder.close()
    view._tick()
    assert_away_then_back(out.getvalue().splitlines())
    storage.close()


def test_the_status_line_says_so_while_reads_answer_but_writes_do_not(monkeypatch, tmp_path: Path):
    """Another writer keeps the file locked: the view's reads answer (WAL), the controller's writes do not. The line
    says the database is unreachable while the writes fail, and that it is back once one gets through."""
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 20)
    path = tmp_path / "hpo.db"
    storage = SqlStorage(f"sqlite:///{path}", upgrade=True)
    experiment_id = storage.create_experiment("x", {}, "minimize", controller=("host", 1))
    out = io.StringIO()
    view = ProgressView(storage, experiment_id, total=4, stream=out, interval_s=0, outage_s=600)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with without_waiting(), pytest.raises(DatabaseUnavailableError):
            storage.heartbeat(experiment_id, "host", 1, "")  # the controller's write, locked out
        view._tick()  # its reads answer
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    storage.heartbeat(experiment_id, "host", 1, "")  # a write gets through
    view._tick()
    assert_away_then_back(out.getvalue().splitlines())
    storage.close()


def test_past_the_bound_the_line_says_the_controller_stops_at_its_next_write(tmp_path: Path):
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    view = ProgressView(storage, 1, total=4, stream=io.StringIO(), interval_s=0, outage_s=10)
    assert view.outage_line(9.6) == "database unreachable for 10 s, retrying (the controller waits up to 10 s: " \
                                    "database.outage_s)"  # fmt: skip
    assert view.outage_line(48) == ("database unreachable for 48 s, past the 10 s the controller waits "
                                    "(database.outage_s): it stops at its next write")  # fmt: skip
    assert view.outage_line(8, "out of disk space") == (
        "database out of disk space for 8 s, retrying (the controller waits up to 10 s: database.outage_s)"
    )
    storage.close()
