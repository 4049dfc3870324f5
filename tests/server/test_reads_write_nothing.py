"""The read endpoints leave a SQLite file as they found it: not a byte of it changes, its journal mode included
(a database copied with `.backup` or `VACUUM INTO`, or switched out of WAL for a network file system, stays so)."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

from tests.server.conftest import EXPERIMENT, api_in_process

READS = ("/health", "/experiments", f"/experiments/{EXPERIMENT}", f"/experiments/{EXPERIMENT}/trials",
         f"/experiments/{EXPERIMENT}/trials/0", f"/experiments/{EXPERIMENT}/trials/0/metrics",
         f"/experiments/{EXPERIMENT}/best", f"/experiments/{EXPERIMENT}/best/arms",
         f"/experiments/{EXPERIMENT}/export", "/best?global_batch_size=8&optimizer=lamb")  # fmt: skip


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def journal_mode(path: Path) -> str:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as connection:  # a read-only look: changes nothing
        return connection.execute("PRAGMA journal_mode").fetchone()[0]


def test_reads_leave_a_sqlite_file_in_another_journal_mode_byte_for_byte(finished_experiment, tmp_path):
    database = tmp_path / "copy.db"
    shutil.copyfile(Path(finished_experiment("sqlite").removeprefix("sqlite:///")), database)
    with sqlite3.connect(database) as connection:  # the file as a `.backup` or a network file system has it
        assert connection.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    before = digest(database)
    with api_in_process(f"sqlite:///{database}") as api:  # the API in this process: its storage, its connections
        for path in READS:
            response = api.get(path)
            assert response.status_code in (200, 404), (path, response.text)
            assert digest(database) == before, path
    assert digest(database) == before and journal_mode(database) == "delete"
    assert not (tmp_path / "copy.db-wal").exists()
