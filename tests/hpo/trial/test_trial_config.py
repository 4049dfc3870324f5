"""hpo.trial.entry.trial_trainer_config: what one trial trains. Paths a base config or the overrides name for a
production run (`checkpoint.dir`, `log.mlperf`) are each trial's own, under its directory: trials that shared a
checkpoint directory would resume one another's runs (another optimizer's weights), and a shared MLPerf log would
keep only the last trial's events."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpo.experiment import stored_form
from hpo.storage import SqlStorage
from hpo.trial.entry import trial_trainer_config
from hpo.trials import TrialSpec
from tests.hpo.engine.test_study import make_spec


@pytest.mark.parametrize("where", ["absolute", "relative"])
def test_a_checkpoint_directory_and_an_mlperf_log_of_the_base_config_are_each_trials_own(tmp_path, where):
    shared = tmp_path / "shared" if where == "absolute" else Path("shared")
    space = {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}}
    paths = {"checkpoint.dir": str(shared / "ckpt"), "log.mlperf": str(shared / "result_0.txt")}
    spec = make_spec(tmp_path, space=space, compare=["optimizer.name"], **paths)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, tmp_path / "run"), spec.direction)
    configs = {}
    for number, optimizer in enumerate(("adamw", "lamb")):
        params = {"optimizer.name": optimizer, "optimizer.lr": 1e-3}
        trial = storage.get_trial(storage.create_trial(eid, TrialSpec(None, params)))
        workdir = tmp_path / "run" / "trials" / f"{number:05d}"
        configs[optimizer] = (workdir, trial_trainer_config(spec, trial, workdir, tmp_path / "run"))
    own = {"absolute": ("checkpoints", "mlperf/result_0.txt"), "relative": ("shared/ckpt", "shared/result_0.txt")}
    ckpt, log = own[where]
    for workdir, cfg in configs.values():
        assert (Path(cfg.checkpoint.dir), Path(cfg.log.mlperf)) == (workdir / ckpt, workdir / log)
        assert cfg.checkpoint.resume  # a re-run attempt of the trial continues its own run
    assert configs["adamw"][1].checkpoint.dir != configs["lamb"][1].checkpoint.dir
    # the exported production config keeps the paths as the experiment names them (hpo.export.production)
    assert spec.resolved_base()["checkpoint"]["dir"] == str(shared / "ckpt")
