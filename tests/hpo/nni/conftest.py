"""Fixtures of the NNI engine tests: tiny experiments (the tiny BERT on random shards, a few steps) under NNI."""

from __future__ import annotations

from pathlib import Path

from hpo.experiment import experiment_from_dict
from hpo.storage import SqlStorage
from tests.hpo.engine.test_study import tiny_overrides

# clipping.max_norm exists only when clipping is on: a conditional space.
CONDITIONAL_SPACE = {
    "optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
    "clipping.strategy": {"choice": ["none", "after_allreduce"]},
    "clipping.max_norm": {"float": [0.5, 5.0], "when": {"clipping.strategy": {"not": "none"}}},
}


def nni_experiment_data(tmp_path: Path, tuner: str, trials: int, parallel: int, space=None, compare=(),
                        options=None, name="nniexp") -> dict:  # fmt: skip
    """An experiment file's contents (engine: nni) over the tiny BERT on random shards in tmp_path/data."""
    overrides = tiny_overrides(tmp_path / "data")  # the hpo tests' tiny BERT on random shards
    return {
        "name": name,
        "base_config": {},
        "overrides": overrides,
        "space": space or CONDITIONAL_SPACE,
        "compare": list(compare),
        "tuner": {"name": tuner, "seed": 0, "options": {"assessor": "none"} if options is None else options},
        "budget": {"trials": trials, "max_parallel": parallel, "trial_timeout_s": 120},
        "resources": {"gpus": "none", "cpu_slots": parallel},
        "engine": "nni",
    }


def make_nni_spec(tmp_path: Path, tuner: str, trials: int, parallel: int, **kwargs):
    """A validated engine: nni experiment (see `nni_experiment_data`)."""
    data = nni_experiment_data(tmp_path, tuner, trials, parallel, **kwargs)
    return experiment_from_dict(data, f"{data['name']}.yaml", base_dir=tmp_path)


def store_experiment(tmp_path: Path, spec) -> tuple[str, SqlStorage, int, Path]:
    """(database URL, storage, experiment id, run directory) of `spec` stored in tmp_path/hpo.db, nothing run yet."""
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    run_dir = tmp_path / "run"
    experiment_id = storage.create_experiment(spec.name, {"experiment": spec.self_contained(),
                                                          "run_dir": str(run_dir)}, spec.direction)  # fmt: skip
    return url, storage, experiment_id, run_dir
