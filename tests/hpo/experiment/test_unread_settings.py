"""Settings the trials' runs would not read (`trainer.config.unread_settings`) are refused when the experiment file is
read, as `python -m trainer` refuses them, rather than failing every trial at its start: in the base config with its
overrides, and with each value the space tunes; checkpoint.every_samples without checkpoint.dir is read where the
controller gives each trial its checkpoint directory (Hyperband, ASHA). A stored experiment stays readable."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpo.errors import ExperimentFileError
from hpo.experiment import experiment_from_dict, load_experiment
from hpo.experiment.loading import spec_from_stored, stored_form
from hpo.trial.entry import trial_trainer_config
from tests.hpo.experiment.test_experiment import TINY_BASE, make_experiment, write_experiment
from tests.hpo.experiment.test_input_checks import refusal
from trainer.config import unread_settings


def test_checkpoints_every_so_many_samples_without_a_directory_are_refused_in_the_overrides(tmp_path):
    data = make_experiment(overrides={"budget.max_samples": 4096, "checkpoint.every_samples": 1024})
    path, message = refusal(tmp_path, data)
    assert message == (f"{path}: base_config + overrides: checkpoint.every_samples: 1024, but checkpoint.dir is "
                       "not set, so no checkpoint is saved: set checkpoint.dir, or remove "
                       "checkpoint.every_samples")  # fmt: skip
    with_dir = make_experiment(overrides={"budget.max_samples": 4096, "checkpoint.every_samples": 1024,
                                          "checkpoint.dir": "ck"})  # fmt: skip
    load_experiment(write_experiment(tmp_path / "with-dir", with_dir))


def test_under_hyperband_the_controller_gives_each_trial_its_checkpoint_directory_so_the_interval_is_read(tmp_path):
    data = make_experiment(overrides={"budget.max_samples": 4096, "checkpoint.every_samples": 1024},
                           tuner={"name": "smac_hyperband", "seed": 1})  # fmt: skip
    spec = load_experiment(write_experiment(tmp_path, data))
    record = SimpleNamespace(params={"optimizer.name": "lamb", "optimizer.lr@lamb": 1e-3, "optimizer.beta2": 0.9,
                                     "clipping.strategy": "none", "schedule.warmup_steps": 0},
                             budget=1.0, seed=None)  # fmt: skip
    cfg = trial_trainer_config(spec, record, tmp_path / "trial", tmp_path / "run")
    assert cfg.checkpoint.dir is not None and cfg.checkpoint.every_samples == 1024
    assert unread_settings(cfg) == {}  # what the trial's own run checks before any work


def test_no_resume_is_refused_without_a_directory_and_under_a_tuner_whose_every_trial_resumes(tmp_path):
    """checkpoint.resume: false is read only beside a checkpoint.dir of the file's own; Hyperband and ASHA give each
    trial its directory and resume every trial from its configuration's checkpoint (hpo.trial.entry)."""
    path, message = refusal(tmp_path / "a", make_experiment(overrides={"checkpoint.resume": False}))
    assert message == (f"{path}: base_config + overrides: checkpoint.resume: false, but checkpoint.dir is not set, so "
                       "there is no checkpoint to resume from: remove checkpoint.resume")  # fmt: skip
    load_experiment(write_experiment(tmp_path / "b", make_experiment(overrides={"checkpoint.resume": False,
                                                                                "checkpoint.dir": "ck"})))  # fmt: skip
    for overrides in ({"checkpoint.resume": False}, {"checkpoint.resume": False, "checkpoint.dir": "ck"}):
        data = make_experiment(overrides={"budget.max_samples": 4096, **overrides},
                               tuner={"name": "smac_hyperband", "seed": 1})  # fmt: skip
        path, message = refusal(tmp_path / str(len(overrides)), data)
        assert message == (f"{path}: base_config + overrides: checkpoint.resume: false, but tuner smac_hyperband "
                           "continues each promoted configuration from the checkpoint of its lower budget, so every "
                           "trial resumes: remove checkpoint.resume")  # fmt: skip


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"overrides": {"budget.max_samples": 4096, "schedule.total_steps": 64},
          "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
                    "schedule.horizon_samples": {"int": [2048, 8192]}}},
         "space.schedule.horizon_samples: with 2048: schedule.horizon_samples: 2048, but schedule.total_steps (64) "
         "sets the decay horizon, in steps: set one of them"),
        ({"overrides": {"budget.max_samples": 4096, "log.noise_scale_every": 8},
          "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
                    "log.noise_scale": {"choice": [True, False]}}},
         "space.log.noise_scale: with false: log.noise_scale_every: 8, but log.noise_scale is false, so no noise "
         "scale is measured: set log.noise_scale to true, or remove log.noise_scale_every (where a base config sets "
         "it, set log.noise_scale_every=null)"),
    ],
    ids=["a-tuned-horizon-beside-steps", "the-noise-scale-switched-off-by-a-choice"],
)  # fmt: skip
def test_a_tuned_value_that_leaves_a_setting_unread_is_refused_naming_it(tmp_path, changes, says):
    path, message = refusal(tmp_path, make_experiment(compare=[], allow_unequal_arms=None, **changes))
    assert message == f"{path}: {says}"


def test_a_stored_experiment_with_an_unread_setting_is_still_read_as_it_ran(tmp_path):
    data = make_experiment(base_config=TINY_BASE, overrides={"checkpoint.every_samples": 1024})
    with pytest.raises(ExperimentFileError, match="base_config \\+ overrides: checkpoint.every_samples: 1024"):
        experiment_from_dict(data, "<new>")
    stored = experiment_from_dict(data, "<stored>", current_rules=False)
    spec = spec_from_stored(SimpleNamespace(name="before", spec=stored_form(stored, tmp_path)))
    assert spec.resolved_base()["checkpoint"]["every_samples"] == 1024
