"""bench.process_times refuses, before timing anything, a database that is not there and another checkout without
the demo corpus, naming each and what to do."""

from __future__ import annotations

import pytest

from bench import process_times


def test_a_missing_database_and_a_checkout_without_the_demo_corpus_are_named(tmp_path, capsys):
    db = tmp_path / "hpo.db"
    with pytest.raises(SystemExit) as refused:
        process_times.main(["--other", str(tmp_path), "--db", str(db)])
    assert refused.value.code == 2
    assert f"--db {db}: no such file" in capsys.readouterr().err
    db.write_bytes(b"")
    with pytest.raises(SystemExit) as refused:
        process_times.main(["--other", str(tmp_path), "--db", str(db)])
    assert refused.value.code == 2
    assert f"{tmp_path}/data/demo is missing: `make demo-data`" in capsys.readouterr().err
