"""bench.process_times refuses, before timing anything, another checkout without the demo corpus and a database
that is not there, naming each and what to do."""

from __future__ import annotations

import pytest

from bench import process_times


def test_a_checkout_without_the_demo_corpus_and_a_missing_database_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        process_times.main(["--other", str(tmp_path), "--db", str(tmp_path / "hpo.db")])
    assert refused.value.code == 2
    assert f"{tmp_path}/data/demo is missing: `make demo-data`" in capsys.readouterr().err
    (tmp_path / "data" / "demo").mkdir(parents=True)
    with pytest.raises(SystemExit) as refused:
        process_times.main(["--other", str(tmp_path), "--db", str(tmp_path / "hpo.db")])
    assert refused.value.code == 2
    assert f"--db {tmp_path / 'hpo.db'}: no such file" in capsys.readouterr().err
