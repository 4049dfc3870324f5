"""bench/api_load.py's data: what the server sees of an experiment whose trials were created one by one."""

from __future__ import annotations

from bench import api_load
from hpo.storage import SqlStorage
from server.storage import SpecCache, lasting


def test_the_bulk_loaded_experiment_has_a_version_per_trial_and_its_spec_is_kept(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'bench.db'}"
    api_load.fill(url, 20)
    with SqlStorage(url) as storage:
        record = storage.get_experiment_by_name(api_load.EXPERIMENT)
    assert record.trials_version == 20  # as 20 calls of create_trial leave it
    assert lasting(record)
    import hpo.experiment

    parsed = []
    real = hpo.experiment.spec_from_stored
    monkeypatch.setattr(hpo.experiment, "spec_from_stored", lambda r: parsed.append(r.id) or real(r))
    specs = SpecCache()
    assert specs.spec(record) is specs.spec(record)
    assert parsed == [record.id]  # parsed once, not per request
