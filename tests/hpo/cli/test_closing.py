"""A command closes the database it opened when it returns: SQLite's write-ahead log is folded into the file by
`hpo run` itself, so a read command run afterwards in the same process (as tests and the server run them) finds
nothing to fold and leaves the file's bytes as they were."""

from __future__ import annotations

import gc
from pathlib import Path

from hpo.cli.main import main
from tests.hpo.simulation.test_simulated_runner import experiment_file


def database_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("hpo.db*"))}


def test_a_command_returns_with_its_database_closed_and_a_read_after_it_writes_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    path = experiment_file(tmp_path, "closing", trials=12, slots=4)
    gc.disable()  # what the run leaves open must not be closed by a collection at a moment of chance
    try:
        assert main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
        after_run = database_files(tmp_path)
        assert list(after_run) == ["hpo.db"]  # no -wal or -shm: every connection closed, the log folded in
        assert main(["--db", url, "status", "closing"]) == 0
        assert main(["--db", url, "best", "closing", "--per-arm"]) == 0
        assert main(["--db", url, "status", "nope"]) == 2
    finally:
        gc.enable()
    assert database_files(tmp_path) == after_run
