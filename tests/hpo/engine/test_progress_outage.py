"""The progress view while the database is away: its status line says so, and says when it is back.

The database is away for real: another connection holds the SQLite file in exclusive locking mode, which shuts out
readers too (SQLite's waits shortened so the lock outlasts them within milliseconds).
"""

from __future__ import annotations

import io
import re
import sqlite3
from pathlib import Path

from hpo.engine.progress import ProgressView
from hpo.storage import SqlStorage
from hpo.storage import engine as engine_module
from hpo.storage import sql as sql_module


def test_the_status_line_says_the_database_is_unreachable_and_when_it_is_back(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 20)
    monkeypatch.setattr(sql_module, "LOCK_BACKOFF_S", 0.01)
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
    lines = out.getvalue().splitlines()
    assert re.fullmatch(r"database unreachable for \d+ s, retrying \(the controller waits up to 600 s: "
                        r"database\.outage_s\)", lines[0])  # fmt: skip
    assert re.fullmatch(r"database reachable again \(it was away for at least \d+ s\)", lines[1])
    assert lines[2].startswith("trials: 0/4 done, 0 running, 4 waiting")
    storage.close()
