"""The bound on waiting for an unreachable database: `database.outage_s` in the experiment file, overridden by
HPO_DATABASE_OUTAGE_S; a bad value of either is refused naming it, before anything is written."""

from __future__ import annotations

import pytest

from hpo.cli.main import main
from hpo.errors import ExperimentFileError
from hpo.experiment import experiment_from_dict
from tests.hpo.cli.test_cli import small_experiment


def test_the_file_sets_the_bound_and_a_negative_one_is_refused_naming_the_field(tmp_path):
    data = {"name": "x", "base_config": {}, "space": {"optimizer.lr": {"float": [1e-4, 1e-2]}},
            "budget": {"trials": 1}}  # fmt: skip
    assert experiment_from_dict(data, "x.yaml").database.outage_s == 600
    assert experiment_from_dict({**data, "database": {"outage_s": 30}}, "x.yaml").database.outage_s == 30
    with pytest.raises(ExperimentFileError, match=r"x\.yaml.*database\.outage_s"):
        experiment_from_dict({**data, "database": {"outage_s": -1}}, "x.yaml")


def test_a_bad_environment_value_stops_hpo_run_before_anything_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HPO_DATABASE_OUTAGE_S", "ten minutes")
    db_file = tmp_path / "hpo.db"
    assert main(["--db", f"sqlite:///{db_file}", "run", small_experiment(tmp_path)]) == 2
    assert "HPO_DATABASE_OUTAGE_S='ten minutes': expected the seconds to wait" in capsys.readouterr().err
    assert not db_file.exists()
