"""The experiment file: presets load, trials become valid trainer configs, and malformed files fail clearly
(naming the file and the dotted field) without touching anything."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpo.errors import ExperimentFileError
from hpo.experiment import ExperimentSpec, experiment_from_dict, load_experiment
from hpo.experiment.arms import arm_dimensions, arm_of, arm_plans, arms, trial_config
from hpo.experiment.rungs import asha_plan
from search_spaces import SearchSpaceError, list_presets, preset_path
from trainer.config import TrainerConfig

ROOT_DIR = Path(__file__).resolve().parents[3]

TINY_BASE = {
    "device": "cpu",
    "model": {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
    },
    "optimizer": {"name": "lamb", "lr": 1e-3},
    "batch": {"global_batch_size": 32, "micro_batch_size": 16},
    "eval": {"every_samples": 256, "target_mlm_accuracy": 0.5},
    "budget": {"max_samples": 2048},
}


def make_experiment(**changes: Any) -> dict[str, Any]:
    """A small valid experiment (as parsed YAML) with top-level `changes` applied."""
    data = {
        "name": "tiny",
        "base_config": "base.yaml",
        "overrides": {"budget.max_samples": 4096},
        "space": {
            "optimizer.name": {"choice": ["adamw", "lamb"]},
            "optimizer.lr@lamb": {"float": [1e-3, 1e-2], "log": True, "when": {"optimizer.name": "lamb"}},
            "optimizer.lr@adamw": {"float": [1e-4, 1e-3], "log": True, "when": {"optimizer.name": "adamw"}},
            "optimizer.beta2": {"float": [0.7, 0.999], "when": {"optimizer.name": "lamb"}},
            "clipping.strategy": {"choice": ["none", "after_allreduce"]},
            "clipping.max_norm": {"float": [0.1, 10.0], "log": True, "when": {"clipping.strategy": {"not": "none"}}},
            "schedule.warmup_steps": {"int": [0, 20]},
        },
        "objective": {"metric": "samples_to_target", "direction": "minimize"},
        "compare": ["optimizer.name"],
        "allow_unequal_arms": "beta2 is tuned for LAMB only, to exercise a parameter of one arm",
        "tuner": {"name": "random", "seed": 1},
        "budget": {"trials": 4, "max_parallel": 2},
        "resources": {"gpus": "none", "cpu_slots": 2},
    }
    data.update(copy.deepcopy(changes))
    return data


def write_experiment(directory: Path, data: Any, name: str = "exp.yaml") -> Path:
    """Write base.yaml (a tiny trainer config) and the experiment file into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "base.yaml").write_text(yaml.safe_dump(TINY_BASE))
    path = directory / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(dict(data), sort_keys=False))
    return path


def files_under(directory: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in directory.rglob("*")}


# ------------------------------------------------------------------------------------------------ presets
@pytest.mark.parametrize("name", list_presets())
def test_presets_load_and_sampled_configurations_are_valid_trainer_configs(name):
    spec = load_experiment(preset_path(name))
    assert spec.name == name and spec.source == str(preset_path(name))
    labels = {arm_of(spec, a) for a in arms(spec)}
    assert len(labels) == len(arms(spec)) >= 2
    assert spec.budget.trials >= len(labels)
    for seed in range(20):
        params = spec.space.sample(seed)
        cfg = trial_config(spec, params)
        assert isinstance(cfg, TrainerConfig)
        for key, value in spec.space.trainer_values(params).items():
            section, leaf = key.split(".")
            assert getattr(getattr(cfg, section), leaf) == value
        assert arm_of(spec, params) in labels


def test_there_is_a_demo_cpu_variant_of_each_preset_on_the_tiny_model():
    presets = list_presets()
    assert len(presets) == 11  # the six above, adam_vs_lamb_demo_cpu_{nni,asha}, the two *_simulated, the GPU check
    for name in ("adam_vs_lamb", "clipping_strategies", "batch_scaling"):
        full, demo = load_experiment(preset_path(name)), load_experiment(preset_path(f"{name}_demo_cpu"))
        assert set(demo.compare) == set(full.compare)
        base = TrainerConfig.model_validate(demo.resolved_base())
        assert (base.model.hidden_size, base.model.num_hidden_layers, base.device) == (128, 2, "cpu")
        assert base.budget.max_time_s is None and 8 <= demo.budget.trials <= 12  # trials end by samples
        assert demo.resources.gpus == "none"
        assert TrainerConfig.model_validate(full.resolved_base()).model.hidden_size == 1024


def test_the_gpu_check_is_a_small_bert_with_dropout_four_trials_to_a_gpu_each_writing_its_mlperf_log():
    spec = load_experiment(preset_path("adam_vs_lamb_gpu_check"))
    base = TrainerConfig.model_validate(spec.resolved_base())
    assert spec.compare == ["optimizer.name"] and spec.budget.confirm_seeds == 2 and spec.budget.trials == 4
    assert (spec.resources.gpus, spec.resources.gpus_per_trial, spec.resources.trials_per_gpu) == ("all", 1, 4)
    assert spec.budget.max_parallel == 4  # the 4 tuning trials at once, then the 4 confirmation runs
    assert (base.model.num_hidden_layers, base.model.hidden_size, base.precision.dtype) == (4, 256, "bf16")
    assert base.model.attention_probs_dropout_prob == base.model.hidden_dropout_prob == 0.1
    assert base.log.mlperf == "mlperf.log" and base.budget.max_time_s is None  # trials end by samples


def test_the_asha_demo_is_the_cpu_demo_with_rungs_of_4096_and_12288_samples():
    demo, asha = (
        load_experiment(preset_path("adam_vs_lamb_demo_cpu")),
        load_experiment(preset_path("adam_vs_lamb_demo_cpu_asha")),
    )
    assert asha.resolved_base() == demo.resolved_base() and asha.space == demo.space  # only the tuner differs
    assert (asha.objective, asha.compare) == (demo.objective, demo.compare)
    base = TrainerConfig.model_validate(asha.resolved_base())
    plan = asha_plan(asha, base.budget.max_samples, base.eval.every_samples)
    # 12,288 / 3 = 4,096 is a multiple of eval.every_samples (1,024); 12,288 / 9 = 1,365 is below min_samples
    assert (base.budget.max_samples, base.eval.every_samples) == (12288, 1024)
    assert plan.samples == (4096, 12288) and plan.eta == 3 and plan.options.sampler == "model"
    assert (asha.budget.trials, asha.budget.max_parallel, asha.resources.cpu_slots) == (16, 2, 2)
    assert (asha.budget.confirm_seeds, asha.budget.confirmation_rounds) == ("auto", (3, 6))
    # the model needs 4 results at a rung, fewer than the 6 new configurations an arm draws in its 8 trials
    assert plan.options.min_points_in_model == 4 < len(arm_dimensions(asha)["optimizer.name=lamb"]) + 1
    params = asha.space.sample(0)
    low, top = trial_config(asha, params, fidelity=plan.budgets[0]), trial_config(asha, params)
    assert low.budget.max_samples == 4096 and top.budget.max_samples == 12288
    assert (low.schedule.horizon_samples, low.schedule.total_steps) == (12288, None)  # one LR schedule: the full run's
    assert (top.schedule.horizon_samples, top.schedule.total_steps) == (None, None)


def test_adam_vs_lamb_uses_arm_specific_learning_rates():
    spec = load_experiment(preset_path("adam_vs_lamb"))
    lamb = {"optimizer.name": "lamb", "optimizer.lr@lamb": 4e-3, "schedule.warmup_steps": 100}
    adamw = {"optimizer.name": "adamw", "optimizer.lr@adamw": 1.5e-3, "optimizer.beta2": 0.82}
    adamw["schedule.warmup_steps"] = 0
    assert trial_config(spec, lamb).optimizer.lr == 4e-3
    assert trial_config(spec, adamw).optimizer.lr == 1.5e-3 and trial_config(spec, adamw).optimizer.beta2 == 0.82
    assert arm_of(spec, lamb) == "optimizer.name=lamb"
    assert spec.space["optimizer.lr@lamb"].low == 3e-4 and spec.space["optimizer.lr@adamw"].high == 2e-3


# ------------------------------------------------------------------------------------------------ the spec
def test_relative_base_config_resolves_against_the_experiment_file(tmp_path, monkeypatch):
    path = write_experiment(tmp_path / "experiments", make_experiment())
    monkeypatch.chdir(tmp_path)  # the working directory must not matter
    spec = load_experiment(Path("experiments") / "exp.yaml")
    assert spec.resolved_base()["model"]["hidden_size"] == 32
    assert spec.resolved_base()["budget"]["max_samples"] == 4096  # the override
    assert spec.direction == "minimize"
    assert path.is_file()


def test_a_preset_copied_out_of_its_folder_is_told_where_its_base_config_is_read_from(tmp_path):
    copy_of = tmp_path / "my_adam_vs_lamb.yaml"
    copy_of.write_text(preset_path("adam_vs_lamb").read_text())  # its base_config: ../../trainer/configs/...
    with pytest.raises(ExperimentFileError) as e:
        load_experiment(copy_of)
    message = str(e.value)
    assert message.startswith(f"{copy_of}: base_config: file {tmp_path / '../../trainer/configs/bert_large.yaml'}")
    assert f"read from the experiment file's folder, {tmp_path}" in message
    assert "an absolute one, or the name of a shipped trainer config" in message
    copy_of.write_text(copy_of.read_text().replace("../../trainer", str(ROOT_DIR / "trainer")))  # as the message says
    assert load_experiment(copy_of).resolved_base()["model"]["hidden_size"] == 1024


def test_inline_base_config_and_self_contained_round_trip():
    spec = experiment_from_dict(make_experiment(base_config=TINY_BASE), "<test>")
    again = experiment_from_dict(spec.self_contained(), "<stored>")
    assert again.resolved_base() == spec.resolved_base()
    assert again.space == spec.space and again.compare == spec.compare
    assert isinstance(again, ExperimentSpec)


def test_trial_config_applies_parameters_on_base_and_overrides(tmp_path):
    spec = load_experiment(write_experiment(tmp_path, make_experiment()))
    params = {
        "optimizer.name": "adamw",
        "optimizer.lr@adamw": 5e-4,
        "clipping.strategy": "after_allreduce",
        "clipping.max_norm": 2.0,
        "schedule.warmup_steps": 7,
    }
    cfg = trial_config(spec, params)
    assert (cfg.optimizer.name, cfg.optimizer.lr, cfg.clipping.max_norm) == ("adamw", 5e-4, 2.0)
    assert cfg.schedule.warmup_steps == 7 and cfg.budget.max_samples == 4096
    assert cfg.optimizer.beta2 == 0.999  # inactive for adamw: the base value
    assert arm_of(spec, params) == "optimizer.name=adamw"
    with pytest.raises(SearchSpaceError, match="optimizer.lrr"):
        trial_config(spec, {**params, "optimizer.lrr": 1.0})


def test_trial_config_fidelity_shortens_the_run_but_keeps_the_schedule(tmp_path):
    spec = load_experiment(write_experiment(tmp_path, make_experiment()))
    params = {"optimizer.name": "lamb", "optimizer.lr@lamb": 2e-3, "optimizer.beta2": 0.9}
    params |= {"clipping.strategy": "none", "schedule.warmup_steps": 0}
    full, third = trial_config(spec, params), trial_config(spec, params, fidelity=1 / 3)
    assert full.budget.max_samples == 4096 and full.schedule.total_steps is None
    assert third.budget.max_samples == 1365
    assert (third.schedule.horizon_samples, third.schedule.total_steps) == (4096, None)  # the full run's horizon
    overrides = {"budget.max_samples": 4096, "schedule.total_steps": 500}  # a horizon the file fixes in steps
    fixed = load_experiment(write_experiment(tmp_path / "fixed", make_experiment(overrides=overrides)))
    third = trial_config(fixed, params, fidelity=1 / 3)
    assert (third.schedule.horizon_samples, third.schedule.total_steps, third.budget.max_samples) == (None, 500, 1365)
    with pytest.raises(ValueError, match="fidelity"):
        trial_config(spec, params, fidelity=0)


def test_comparing_clipping_strategies_that_clip_before_the_all_reduce_needs_several_ranks_per_trial():
    """With one process there is no all-reduce and no DDP bucket: before_allreduce and bucketwise clip the whole
    gradient by max_norm, as after_allreduce does, so arms of them on one rank per trial train alike. Such a file
    was accepted and spent its budget on identical arms; it is refused, naming the field and what to change."""
    space = {
        "clipping.strategy": {"choice": ["none", "after_allreduce", "before_allreduce", "bucketwise"]},
        "clipping.max_norm": {"float": [0.1, 10.0], "log": True, "when": {"clipping.strategy": {"not": "none"}}},
        "optimizer.lr": {"float": [1e-3, 1e-2], "log": True},
    }
    allow = "strategy none has no clipping.max_norm to tune"
    one_rank = make_experiment(base_config=TINY_BASE, space=space, compare=["clipping.strategy"],
                               allow_unequal_arms=allow)  # fmt: skip
    with pytest.raises(ExperimentFileError, match=(
        r"^<test>: compare: clipping.strategy compares before_allreduce and bucketwise on 1 rank per trial "
        r"\(resources.cpu_ranks_per_trial\).*; give each trial several ranks"
    )):  # fmt: skip
        experiment_from_dict(one_rank, "<test>")
    on_gpus = {**one_rank, "resources": {"gpus": "all", "gpus_per_trial": 1}}
    with pytest.raises(ExperimentFileError, match=r"on 1 rank per trial \(resources.gpus_per_trial\)"):
        experiment_from_dict(on_gpus, "<test>")
    two_ranks = {**one_rank, "resources": {"gpus": "none", "cpu_slots": 1, "cpu_ranks_per_trial": 2}}
    assert experiment_from_dict(two_ranks, "<test>").compare == ["clipping.strategy"]
    where_it_differs = {**one_rank, "space": {**space, "clipping.strategy": {"choice": ["none", "after_allreduce"]}}}
    assert experiment_from_dict(where_it_differs, "<test>").compare == ["clipping.strategy"]  # differ on one rank


def test_arms_cover_every_combination_of_compare_keys():
    spec = experiment_from_dict(
        make_experiment(base_config=TINY_BASE, compare=["optimizer.name", "clipping.strategy"]), "<test>"
    )
    labels = [arm_of(spec, a) for a in arms(spec)]
    assert labels == [
        "optimizer.name=adamw,clipping.strategy=none",
        "optimizer.name=adamw,clipping.strategy=after_allreduce",
        "optimizer.name=lamb,clipping.strategy=none",
        "optimizer.name=lamb,clipping.strategy=after_allreduce",
    ]
    no_compare = make_experiment(base_config=TINY_BASE, compare=[], allow_unequal_arms=None)
    no_compare = experiment_from_dict(no_compare, "<test>")
    assert arms(no_compare) == [{}] and arm_of(no_compare, {"optimizer.name": "lamb"}) is None


def compared_only(tmp_path: Path, tuner: str, engine: str = "local") -> Path:
    """AdamW against LAMB at one fixed configuration each: the space is the compared key alone, so an arm has
    nothing to tune; on the simulated runner over the shipped curve table, at a point it recorded."""
    data = {"name": f"fixed_{tuner}", "base_config": "demo_cpu",
            "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}},
            "overrides": {"optimizer.lr": 0.001, "schedule.warmup_steps": 0, "eval.every_samples": 1024,
                          "eval.max_samples": 512, "eval.target_mlm_accuracy": 0.12, "budget.max_samples": 12288},
            "compare": ["optimizer.name"], "tuner": {"name": tuner},
            "budget": {"trials": 2, "confirm_seeds": 2, "max_parallel": 2},
            "runner": {"name": "simulated", "simulation": {"table": "curves"}}, "engine": engine,
            "resources": {"gpus": "none"}}  # fmt: skip
    return write_experiment(tmp_path, data, f"fixed_{tuner}.yaml")


@pytest.mark.parametrize("tuner", ["grid", "random", "smac_bo"])
def test_arms_with_nothing_to_tune_run_their_one_configuration(tmp_path, tuner, capsys):
    """The study runs an arm with nothing to tune (hpo.engine.study) and a grid counts it one combination, but the
    file never loaded: building the arm's empty sub-space raised a traceback. Now each arm trains its fixed
    configuration, then its confirmation runs, and the verdict compares them."""
    from hpo.cli.main import main

    path = compared_only(tmp_path, tuner)
    spec = load_experiment(path)
    assert [(plan.label, len(plan.space), plan.quota) for plan in arm_plans(spec)] == [
        ("optimizer.name=adamw", 0, 1), ("optimizer.name=lamb", 0, 1)]  # fmt: skip
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["--db", db, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["--db", db, "best", spec.name, "--per-arm"]) == 0
    best = yaml.safe_load(capsys.readouterr().out)
    for optimizer in ("adamw", "lamb"):
        arm = best[f"optimizer.name={optimizer}"]
        assert arm["params"] == {"optimizer.name": optimizer} and arm["evidence"]["runs"] == 2
    assert best["verdict"]["runs_per_arm"] == {"optimizer.name=adamw": 2, "optimizer.name=lamb": 2}


def test_under_the_nni_engine_an_arm_with_nothing_to_tune_is_refused_naming_it():
    """NNI's tuners need a search space: such a file is refused as it loads, naming the arm, not started."""
    data = make_experiment(base_config=TINY_BASE, space={"optimizer.name": {"choice": ["adamw", "lamb"]}},
                           allow_unequal_arms=None, engine="nni", tuner={"name": "nni_tpe"})  # fmt: skip
    with pytest.raises(ExperimentFileError, match=r"<test>: space: arm optimizer.name=adamw has nothing to tune"):
        experiment_from_dict(data, "<test>")
    tuned = make_experiment(base_config=TINY_BASE, engine="nni", tuner={"name": "nni_tpe"})
    assert experiment_from_dict(tuned, "<test>").engine == "nni"  # the shipped shape: a space to tune in each arm


def test_every_arm_gets_the_same_number_of_trials_or_the_file_says_why_not():
    """5 trials over 2 arms would give the first arm 3 and the other 2: refused in a new file, with the budgets
    that split; allowed with a reason; read as it ran when stored."""
    space = {"optimizer.name": {"choice": ["adamw", "lamb"]},
             "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}}  # fmt: skip
    odd = make_experiment(base_config=TINY_BASE, space=space, allow_unequal_arms=None, budget={"trials": 5})
    with pytest.raises(ExperimentFileError) as refused:
        experiment_from_dict(odd, "exp.yaml")
    assert str(refused.value) == (
        "exp.yaml: budget.trials: 5 trials do not split equally over the 2 arms (optimizer.name=adamw, "
        "optimizer.name=lamb): the first 1 would get one trial more, which favours them; use 4 or 6, or say why "
        "with allow_unequal_arms: <reason>"
    )
    said = experiment_from_dict({**odd, "allow_unequal_arms": "a smoke test"}, "exp.yaml")
    assert [plan.quota for plan in arm_plans(said)] == [3, 2]
    assert [plan.quota for plan in arm_plans(experiment_from_dict(odd, "stored", current_rules=False))] == [3, 2]
    even = {**odd, "budget": {"trials": 6}, "allow_unequal_arms": "a smoke test"}
    with pytest.raises(ExperimentFileError, match="the same dimensions with the same number of trials; remove it"):
        experiment_from_dict(even, "exp.yaml")


def test_choices_the_trainer_reads_as_one_value_are_refused_in_a_new_file():
    """4 and "4" are one warmup to the trainer: the tuner would count one configuration twice."""
    data = make_experiment(base_config=TINY_BASE)
    data["space"]["schedule.warmup_steps"] = {"choice": [4, "4"]}
    with pytest.raises(ExperimentFileError) as refused:
        experiment_from_dict(data, "exp.yaml")
    assert str(refused.value) == ("exp.yaml: space.schedule.warmup_steps: choices 4 and '4' are one value to the "
                                  "trainer (schedule.warmup_steps = 4); keep one")  # fmt: skip
    assert experiment_from_dict(data, "stored", current_rules=False).space["schedule.warmup_steps"].choices == (4, "4")


# ------------------------------------------------------------------------------------------------ objective
def objective_spec(**objective: Any) -> ExperimentSpec:
    data = make_experiment(base_config=TINY_BASE, objective=objective, budget={"trials": 4, "trial_timeout_s": 100})
    return experiment_from_dict(data, "<test>")


# ------------------------------------------------------------------------------------------------ bad files
def space_with(**params: Any) -> dict[str, Any]:
    space = make_experiment()["space"]
    space.update(params)
    return {"space": space}


class Whole(dict):
    """A complete experiment document (rather than top-level changes to the valid one)."""


def without(key: str) -> Whole:
    return Whole({k: v for k, v in make_experiment().items() if k != key})


LAMB_ONLY = {"optimizer.name": "lamb"}

# (id, the file's content: top-level changes to the valid experiment, a `Whole` document or a text, the field
# the message names, and a fragment of what it says)
MALFORMED: list[tuple[str, Any, str, str]] = [
    ("bad_yaml", "name: tiny\nspace: {optimizer.lr: [1, 2\n", "line 3", "not valid YAML"),
    ("tab_indentation", "name: tiny\nspace:\n\toptimizer.lr: 1\n", "line 3", "not valid YAML"),
    ("top_level_list", "- name\n- tiny\n", "top level", "must be a mapping"),
    ("empty_file", "", "top level", "the experiment file is empty"),
    ("unknown_top_level_key", {"tunner": {"name": "random"}}, "tunner", "did you mean tuner"),
    ("missing_name", without("name"), "name", "required"),
    ("name_not_a_slug", {"name": "My Experiment!"}, "name", "expected a slug"),
    ("name_ending_in_a_newline", {"name": "tiny\n"}, "name", "expected a slug"),  # `name: |` in YAML
    ("missing_space", without("space"), "space", "required"),
    ("missing_budget", without("budget"), "budget", "required"),
    ("empty_space", {"space": {}}, "space", "non-empty mapping"),
    ("unknown_space_key", space_with(**{"foo.bar": {"float": [0, 1]}}), "space.foo.bar", "not a trainer config key"),
    (
        "misspelled_trainer_key",
        space_with(**{"optimizer.lrr": {"float": [0.1, 1]}}),
        "space.optimizer.lrr",
        "did you mean optimizer.lr",
    ),
    ("space_key_is_a_section", space_with(optimizer={"float": [0.1, 1]}), "space.optimizer", "is a section"),
    (
        "wrong_type_bound",
        space_with(**{"optimizer.lr": {"float": ["a", 1]}}),
        "space.optimizer.lr",
        "not a finite number",
    ),
    (
        "range_not_a_list",
        space_with(**{"optimizer.eps": {"float": 0.1}}),
        "space.optimizer.eps",
        "expected [low, high]",
    ),
    ("empty_range", space_with(**{"optimizer.eps": {"float": []}}), "space.optimizer.eps", "expected [low, high]"),
    (
        "low_above_high",
        space_with(**{"schedule.warmup_steps": {"int": [20, 0]}}),
        "space.schedule.warmup_steps",
        "low must be < high",
    ),
    (
        "low_equals_high",
        space_with(**{"optimizer.eps": {"float": [1e-6, 1e-6]}}),
        "space.optimizer.eps",
        "low must be < high",
    ),
    (
        "log_range_not_positive",
        space_with(**{"optimizer.weight_decay": {"float": [0.0, 0.1], "log": True}}),
        "space.optimizer.weight_decay",
        "log range needs low > 0",
    ),
    ("empty_choices", space_with(**{"balance.method": {"choice": []}}), "space.balance.method", "empty"),
    (
        "invalid_choice_for_trainer",
        space_with(**{"optimizer.name": {"choice": ["adamw", "lamb", "sgd"]}}),
        "space.optimizer.name",
        "choice 'sgd' is not valid",
    ),
    (
        "bound_invalid_for_trainer",
        space_with(**{"optimizer.beta1": {"float": [0.5, 1.0]}}),
        "space.optimizer.beta1",
        "bound 1.0 is not valid",
    ),
    (
        "float_range_on_int_field",
        space_with(**{"schedule.warmup_steps": {"float": [0, 20]}}),
        "space.schedule.warmup_steps",
        "is an integer",
    ),
    (
        "float_range_on_the_micro_batch",  # an integer field that also takes auto
        space_with(**{"batch.micro_batch_size": {"float": [4, 16]}}),
        "space.batch.micro_batch_size",
        "is an integer; use int: [low, high]",
    ),
    (
        "unknown_param_field",
        space_with(**{"optimizer.eps": {"float": [1e-9, 1e-6], "lg": True}}),
        "space.optimizer.eps",
        "unknown field 'lg'",
    ),
    (
        "condition_on_unknown_key",
        space_with(**{"optimizer.beta1": {"float": [0.6, 0.9], "when": {"optimizer.nam": "lamb"}}}),
        "space.optimizer.beta1",
        "did you mean 'optimizer.name'",
    ),
    (
        "condition_on_non_categorical",
        space_with(**{"optimizer.beta1": {"float": [0.6, 0.9], "when": {"schedule.warmup_steps": 3}}}),
        "space.optimizer.beta1",
        "not categorical",
    ),
    (
        "condition_value_not_a_choice",
        space_with(**{"optimizer.beta1": {"float": [0.6, 0.9], "when": {"optimizer.name": "sgd"}}}),
        "space.optimizer.beta1",
        "'sgd' is not among the choices",
    ),
    (
        "condition_bad_operator",
        space_with(**{"optimizer.beta1": {"float": [0.6, 0.9], "when": {"optimizer.name": {"ne": "lamb"}}}}),
        "space.optimizer.beta1",
        "{not: value}",
    ),
    (
        "condition_cycle",
        space_with(
            **{
                "balance.method": {"choice": ["none", "stratified"], "when": {"precision.dtype": "fp32"}},
                "precision.dtype": {"choice": ["fp32", "bf16"], "when": {"balance.method": "none"}},
            }
        ),
        "space.balance.method",
        "cycle",
    ),
    (
        "overlapping_arm_ranges",
        space_with(**{"optimizer.lr@all": {"float": [1e-4, 1e-2]}}),
        "space.optimizer.lr@all",
        "same trainer key optimizer.lr",
    ),
    ("unknown_tuner", {"tuner": {"name": "hyperopt"}}, "tuner.name", "smac_bo"),
    ("nni_tuner_on_local_engine", {"tuner": {"name": "nni_tpe"}}, "tuner.name", "engine: nni"),
    ("unknown_tuner_option_field", {"tuner": {"name": "random", "sed": 1}}, "tuner.sed", "did you mean seed"),
    (
        "grid_over_a_range",
        {"tuner": {"name": "grid"}},
        "space.optimizer.lr@",
        "tuner grid needs every parameter a choice",
    ),
    (
        "grid_with_other_trials_than_its_size",
        {
            "tuner": {"name": "grid"},
            "budget": {"trials": 5},
            "allow_unequal_arms": None,
            "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"choice": [0.001, 0.01]}},
        },
        "budget.trials",
        "optimizer.name=lamb 2 combination(s) (5 trials asked); set budget.trials: 4",
    ),
    (
        "smac_retrain_after_zero",
        {"tuner": {"name": "smac_bo", "options": {"retrain_after": 0}}},
        "tuner.options.retrain_after",
        "a whole number >= 1",
    ),
    (
        "smac_initial_configs_not_a_number",
        {"tuner": {"name": "smac_bo", "options": {"n_initial_configs": "ten"}}},
        "tuner.options.n_initial_configs",
        "a whole number >= 1 (got 'ten')",
    ),
    ("unknown_engine", {"engine": "ray"}, "engine", "'local' or 'nni'"),
    ("unknown_objective_metric", {"objective": {"metric": "loss"}}, "objective.metric", "samples_to_target"),
    (
        "bad_direction",
        {"objective": {"metric": "samples_to_target", "direction": "down"}},
        "objective.direction",
        "'minimize' or 'maximize'",
    ),
    (
        "direction_against_metric",
        {"objective": {"metric": "samples_to_target", "direction": "maximize"}},
        "objective.direction",
        "must be minimized",
    ),
    (
        "penalty_factor_not_above_one",
        {"objective": {"penalty_factor": 1.0}},
        "objective.penalty_factor",
        "greater than 1",
    ),
    ("time_objective_without_cap", {"objective": {"metric": "time_to_target_s"}}, "objective.metric", "time cap"),
    ("compare_key_not_in_space", {"compare": ["optimizer.nme"]}, "compare[0]", "did you mean optimizer.name"),
    ("compare_non_categorical", {"compare": ["schedule.warmup_steps"]}, "compare[0]", "categorical"),
    ("compare_conditional", {"compare": ["optimizer.name", "clipping.max_norm"]}, "compare[1]", "categorical"),
    (
        "compare_key_with_condition",
        {
            **space_with(**{"balance.method": {"choice": ["none", "stratified"], "when": LAMB_ONLY}}),
            "compare": ["balance.method"],
        },
        "compare[0]",
        "has a `when` condition",
    ),
    ("compare_listed_twice", {"compare": ["optimizer.name", "optimizer.name"]}, "compare", "listed twice"),
    ("negative_trials", {"budget": {"trials": -3}}, "budget.trials", "greater than or equal to 1"),
    # counts past any real experiment (a typo): a billion slots or trials filled the memory of `hpo plan` and `run`
    ("a_billion_trials", {"budget": {"trials": 10**9}}, "budget.trials", "less than or equal to 1000000"),
    ("a_billion_slots", {"budget": {"trials": 4, "max_parallel": 10**9}}, "budget.max_parallel", "less than or equal"),
    (
        "a_billion_cpu_slots",
        {"resources": {"gpus": "none", "cpu_slots": 10**9}},
        "resources.cpu_slots",
        "or equal to 1024",
    ),
    (
        "a_billion_confirm_seeds",
        {"budget": {"trials": 4, "confirm_seeds": 10**9}},
        "budget.confirm_seeds",
        "0 to 10,000",
    ),
    ("trials_fewer_than_arms", {"budget": {"trials": 1}}, "budget.trials", "2 arms"),
    ("misspelled_budget_field", {"budget": {"trials": 4, "trails": 5}}, "budget.trails", "did you mean trials"),
    (
        "hyperband_min_not_below_max",
        {"tuner": {"name": "smac_hyperband"}, "budget": {"trials": 4, "min_budget": 1.0}},
        "budget.min_budget",
        "< budget.max_budget",
    ),
    (
        "hyperband_min_before_first_eval",
        {"tuner": {"name": "smac_hyperband"}, "budget": {"trials": 4, "min_budget": 0.05}},
        "budget.min_budget",
        "before the first evaluation",
    ),
    (
        "gpus_per_trial_zero",
        {"resources": {"gpus_per_trial": 0}},
        "resources.gpus_per_trial",
        "greater than or equal to 1",
    ),
    ("gpus_not_a_list", {"resources": {"gpus": "some"}}, "resources.gpus", "expected all, none"),
    ("gpus_duplicated", {"resources": {"gpus": [0, 0]}}, "resources.gpus", "distinct"),
    (
        "more_gpus_per_trial_than_listed",
        {"resources": {"gpus": [0, 1], "gpus_per_trial": 4}},
        "resources.gpus_per_trial",
        "only 2 listed",
    ),
    (
        "gpu_sharing_with_multi_gpu_trials",
        {"resources": {"gpus": [0, 1], "gpus_per_trial": 2, "trials_per_gpu": 2}},
        "resources.trials_per_gpu",
        "gpus_per_trial: 1",
    ),
    (
        "auto_micro_batch_on_a_shared_gpu",
        {"resources": {"gpus": [0], "trials_per_gpu": 2}, "overrides": {"batch.micro_batch_size": "auto"}},
        "overrides.batch.micro_batch_size",
        "trials_per_gpu 2 has trials share one",
    ),
    (
        "auto_micro_batch_in_the_space_on_a_shared_gpu",
        {
            **space_with(**{"batch.micro_batch_size": {"choice": [8, "auto"]}}),
            "resources": {"gpus": [0], "trials_per_gpu": 2},
        },
        "space.batch.micro_batch_size",
        "set a number, or trials_per_gpu: 1",
    ),
    (
        "auto_micro_batch_on_cpu_slots_side_by_side",
        {"resources": {"gpus": "none", "cpu_slots": 2}, "overrides": {"batch.micro_batch_size": "auto"}},
        "overrides.batch.micro_batch_size",
        "resources.cpu_slots 2 runs trials side by side: set a number",
    ),
    (
        "auto_micro_batch_not_divisible_by_ranks",
        {"resources": {"gpus": "none", "cpu_ranks_per_trial": 3}, "overrides": {"batch.micro_batch_size": "auto"}},
        "overrides.batch.micro_batch_size",
        "not a multiple of the ranks per trial (3 CPU ranks)",
    ),
    (
        "batch_not_divisible_by_ranks",
        {"resources": {"gpus": "none", "cpu_ranks_per_trial": 3}},
        "base_config",
        "not a multiple",
    ),
    (
        "arm_batch_not_divisible",
        space_with(**{"batch.global_batch_size": {"choice": [32, 40]}}),
        "space.batch.global_batch_size",
        "40 is not a multiple",
    ),
    ("base_config_missing", {"base_config": "nowhere.yaml"}, "base_config", "does not exist"),
    ("base_config_invalid", {"base_config": {"optimizer": {"lr": -1.0}}}, "base_config", "optimizer.lr"),
    ("base_config_unknown_key", {"base_config": {"optimiser": {"lr": 1.0}}}, "base_config", "optimiser"),
    ("base_config_wrong_type", {"base_config": 3}, "base_config", "path to a trainer YAML"),
    (
        "override_unknown_key",
        {"overrides": {"optimizer.lrr": 1e-3}},
        "overrides.optimizer.lrr",
        "did you mean optimizer.lr",
    ),
    (
        "override_invalid_value",
        {"overrides": {"budget.max_samples": -5}},
        "overrides.budget.max_samples",
        "greater than or equal to 1",
    ),
    ("overrides_not_a_mapping", {"overrides": ["budget.max_samples=5"]}, "overrides", "valid dictionary"),
    (
        "seed_beyond_what_the_database_keeps",
        {"overrides": {"seed": 2**31 - 2}, "budget": {"trials": 4, "max_parallel": 2, "confirm_seeds": 2}},
        "overrides.seed",
        "seed 2147483646: the confirmation runs train with the seeds after it, up to 2147483648",
    ),
    ("tuner_seed_negative", {"tuner": {"name": "smac_bo", "seed": -1}}, "tuner.seed", "-1 is outside 0 to 2**32 - 1"),
    ("tuner_seed_too_large", {"tuner": {"name": "smac_bo", "seed": 2**40}}, "tuner.seed", "outside 0 to 2**32 - 1"),
    (
        "memory_limit_too_small",
        {"resources": {"gpus": "none", "memory_limit_mb": 1}},
        "resources.memory_limit_mb",
        "greater than or equal to 1000",
    ),
    (
        "cuda_device_on_cpu_slots",
        {"resources": {"gpus": "none"}, "overrides": {"device": "cuda"}},
        "overrides.device",
        "device cuda, but resources.gpus: none runs every trial on the CPU, where there is no CUDA device",
    ),
    (
        "fp16_in_the_space_on_cpu_slots",
        {**space_with(**{"precision.dtype": {"choice": ["bf16", "fp16"]}}), "resources": {"gpus": "none"}},
        "space.precision.dtype",
        "fp16 needs a CUDA device",
    ),
    (
        "varlen_on_cpu_slots",
        {"resources": {"gpus": "none"}, "overrides": {"model.attention": "varlen"}},
        "overrides.model.attention",
        "the varlen kernel needs CUDA",
    ),
    (
        "cudnn_attention_on_cpu_slots",
        {"resources": {"gpus": "none"}, "overrides": {"model.varlen_kernel": "cudnn"}},
        "overrides.model.varlen_kernel",
        "model.varlen_kernel cudnn, but resources.gpus: none runs every trial on the CPU, where cuDNN's varlen "
        "attention needs CUDA",
    ),
    (
        "fused_kernels_in_the_space_on_cpu_slots",
        {**space_with(**{"model.fused_gelu": {"choice": [False, True]}}), "resources": {"gpus": "none"}},
        "space.model.fused_gelu",
        "model.fused_gelu True, but resources.gpus: none runs every trial on the CPU, where the fused kernels are "
        "Triton's",
    ),
]


@pytest.mark.parametrize(("content", "field", "fragment"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_experiment_files_name_the_file_and_the_field(tmp_path, content, field, fragment):
    data = content if isinstance(content, (str, Whole)) else make_experiment(**content)
    path = write_experiment(tmp_path, data)
    before = files_under(tmp_path)
    with pytest.raises(ExperimentFileError) as err:
        load_experiment(path)
    message = str(err.value)
    assert message.startswith(f"{path}: "), message
    assert f"{field}" in message, message
    assert fragment in message, message
    assert files_under(tmp_path) == before  # loading is pure: nothing written


def test_there_are_at_least_thirty_malformed_cases():
    assert len(MALFORMED) >= 30


@pytest.mark.parametrize("which", ["experiment file", "base_config"])
def test_a_file_that_is_not_utf8_is_named_with_the_byte(tmp_path, which):
    path = write_experiment(tmp_path, make_experiment())
    broken = path if which == "experiment file" else tmp_path / "base.yaml"
    text = broken.read_bytes()
    broken.write_bytes(text + b"# caf\xe9\n")  # Latin-1
    with pytest.raises(ExperimentFileError) as err:
        load_experiment(path)
    where = f"{path}: " if which == "experiment file" else f"{path}: base_config: {broken}: "
    assert str(err.value) == f"{where}not UTF-8 text (byte 0xe9 at offset {len(text) + 5}): save it as UTF-8"


def test_a_missing_experiment_file_is_named(tmp_path):
    with pytest.raises(ExperimentFileError, match=f"{tmp_path / 'nope.yaml'}: the experiment file does not exist"):
        load_experiment(tmp_path / "nope.yaml")


def test_experiment_from_dict_names_its_source():
    with pytest.raises(ExperimentFileError, match=r"^<api>: budget.trials: "):
        experiment_from_dict(make_experiment(base_config=TINY_BASE, budget={"trials": 0}), "<api>")


def test_loading_a_valid_file_writes_nothing(tmp_path):
    path = write_experiment(tmp_path, make_experiment())
    before = files_under(tmp_path)
    load_experiment(path)
    assert files_under(tmp_path) == before


def test_an_auto_micro_batch_loads_where_each_trial_has_its_device_to_itself(tmp_path):
    resources = {"gpus": [0, 1], "gpus_per_trial": 2}
    data = make_experiment(overrides={"batch.micro_batch_size": "auto"}, resources=resources)
    spec = load_experiment(write_experiment(tmp_path, data))
    assert spec.overrides["batch.micro_batch_size"] == "auto"


def test_a_copied_preset_names_its_base_config_by_the_shipped_configs_name(tmp_path):
    """A preset copied elsewhere: its relative base_config no longer resolves, and the error says what may be given
    instead; the name of a shipped trainer config resolves from any folder (a file of that name beside it wins)."""
    copy_path = tmp_path / "mine.yaml"
    text = preset_path("adam_vs_lamb_demo_cpu").read_text()
    copy_path.write_text(text)
    with pytest.raises(ExperimentFileError, match="or the name of a shipped trainer config: bert_large, demo_cpu"):
        load_experiment(copy_path)
    named = text.replace("base_config: ../../trainer/configs/demo_cpu.yaml", "base_config: demo_cpu")
    assert named != text
    copy_path.write_text(named)
    assert load_experiment(copy_path)._base == load_experiment(preset_path("adam_vs_lamb_demo_cpu"))._base
    (tmp_path / "demo_cpu").write_text("seed: 11\n")  # a file of that name in the copy's folder is read instead
    assert load_experiment(copy_path)._base["seed"] == 11


def test_a_base_config_that_is_not_yaml_is_named_with_its_line_in_one_line(tmp_path):
    (tmp_path / "base.yaml").write_text("model:\n  hidden_size: [1, 2\n")
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**make_experiment(), "base_config": "base.yaml"}))
    with pytest.raises(ExperimentFileError) as err:
        load_experiment(path)
    message = str(err.value)
    assert message.startswith(f"{path}: base_config: {tmp_path / 'base.yaml'}: line 3, column 1: not valid YAML (")
    assert "\n" not in message and "<unicode string>" not in message, message


@pytest.mark.parametrize("text", ["", "\n  \n", "# nothing yet\n", "---\n", "null\n"])
def test_a_base_config_file_that_sets_nothing_is_refused_and_braces_are_every_default(tmp_path, text):
    """As the trainer refuses such a config file: an empty base config would tune BERT-large with every default."""
    (tmp_path / "base.yaml").write_text(text)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({**make_experiment(), "base_config": "base.yaml"}))
    with pytest.raises(ExperimentFileError) as err:
        load_experiment(path)
    assert str(err.value) == (f"{path}: base_config: {tmp_path / 'base.yaml'} sets nothing (it is empty, or only "
                              "comments or null): write {} in it to start from every default (BERT-large), or the "
                              "keys to set")  # fmt: skip
    (tmp_path / "base.yaml").write_text("{}\n")
    assert load_experiment(path).self_contained()["base_config"] == {"budget": {"max_samples": 4096}}  # its override
