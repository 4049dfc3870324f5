"""bench.delete: every delete runs on a fresh copy of the stored experiment (the stored one stays whole), and its
line names what was removed: as many trials and metric values as the database held."""

from __future__ import annotations

import sqlite3

import pytest

from bench import delete


@pytest.mark.slow  # a benchmark's check (make test-all): `hpo delete` itself in tests/hpo/cli/test_delete.py
def test_each_delete_removes_a_fresh_copy_and_the_stored_experiment_stays(tmp_path, capsys):
    db = tmp_path / "hpo.db"
    delete.main(["--trials", "8", "--db", f"sqlite:///{db}", "--repeats", "2"])
    out = capsys.readouterr().out.splitlines()
    with sqlite3.connect(db) as connection:
        trials = connection.execute("SELECT count(*) FROM trials").fetchone()[0]
        values = connection.execute("SELECT count(*) FROM trial_metrics").fetchone()[0]
        names = connection.execute("SELECT name FROM experiments").fetchall()
    assert names == [("sim8",)] and trials >= 8 and values > trials  # tuning trials and confirmation runs, curves
    assert out[0].endswith(f"deleted experiment 'sim8': {trials:,} trials, {values:,} metric values")
    rows = [line for line in out if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 2 and out[-1].startswith("| median |")
    assert list(tmp_path.iterdir()) == [db] or all(p.name.startswith("hpo.db") for p in tmp_path.iterdir())
