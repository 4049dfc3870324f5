"""What an experiment file writes is what runs, or it is refused before anything runs, naming the file and the field:
a setting nothing reads is refused whatever its value (the default too), a comparison whose verdict could never
decide is refused before it spends a trial, an override the space replaces in every trial is refused naming both,
and a choice written as a numeric string is the number the trainer reads, for every runner. Stored experiments, and
the copies `hpo plan` runs, still load."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hpo.experiment import experiment_from_dict, load_experiment
from hpo.experiment.arms import arm_labels, trial_config
from hpo.experiment.loading import spec_from_stored, stored_form
from hpo.runners import build_runner
from search_spaces import list_presets, preset_path
from tests.hpo.experiment.test_experiment import TINY_BASE, make_experiment, write_experiment
from tests.hpo.experiment.test_input_checks import DEMO_CPU, refusal, simulated


def plain(**changes: Any) -> dict[str, Any]:
    """A small valid CPU experiment of one arm under random search."""
    data = {"name": "plain", "base_config": str(DEMO_CPU), "space": {"optimizer.lr": {"float": [1e-3, 1e-2]}},
            "tuner": {"name": "random"}, "budget": {"trials": 2}, "resources": {"gpus": "none"}}  # fmt: skip
    return {**data, **changes}


# --------------------------------------------------------------------------------------------- settings not read
@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"tuner": {"name": "asha", "options": {"eta": 2}}, "budget": {"trials": 2, "eta": 3}},
         "budget.eta: 3, but tuner.options.eta sets asha's in its place: remove one of them"),
        ({"tuner": {"name": "asha", "options": {"max_samples": 65536}}, "budget": {"trials": 2, "max_budget": 1.0}},
         "budget.max_budget: 1, but tuner.options.max_samples sets asha's in its place: remove one of them"),
        ({"objective": {"metric": "best_mlm_accuracy", "penalty_factor": 2.0}},
         "objective.penalty_factor: 2, but it scores a run that misses the target under samples_to_target and "
         "time_to_target_s; best_mlm_accuracy scores the accuracy itself (0 for a run that did not end normally): "
         "remove it"),
        ({"tuner": {"name": "smac_bo"}, "budget": {"trials": 2, "eta": 3}},
         "budget.eta: 3, but tuner smac_bo trains every trial to the full budget; budget.min_budget, max_budget and "
         "eta are read by smac_hyperband and asha: remove it, or choose one of them"),
        ({"tuner": {"name": "smac_bo"}, "budget": {"trials": 2, "max_budget": 1.0}},
         "budget.max_budget: 1, but tuner smac_bo trains every trial to the full budget"),
    ],
    ids=["asha-option-beside-the-default-eta", "asha-option-beside-the-default-max-budget",
         "default-penalty-of-an-accuracy-metric", "default-eta-without-hyperband",
         "default-max-budget-without-hyperband"],
)  # fmt: skip
def test_a_setting_nothing_reads_is_refused_also_at_its_default_value(tmp_path, changes, says):
    """The default written is still a setting the file asks for: `eta: 3` beside asha's `options.eta: 2` ran with
    eta 2 and dropped budget.eta without a word."""
    path, message = refusal(tmp_path, plain(**changes))
    assert message.startswith(f"{path}: {says}"), message


def test_the_same_settings_load_where_they_are_read_or_not_written(tmp_path):
    for i, changes in enumerate([
        {"tuner": {"name": "smac_hyperband"}, "budget": {"trials": 2, "eta": 3, "max_budget": 1.0}},
        {"tuner": {"name": "asha", "options": {"eta": 2}}, "budget": {"trials": 2, "min_budget": 0.25}},
        {"tuner": {"name": "asha"}, "budget": {"trials": 2, "eta": 3}},
        {"objective": {"metric": "samples_to_target", "penalty_factor": 2.0}},
        {"objective": {"metric": "best_mlm_accuracy"}},
    ]):  # fmt: skip
        load_experiment(write_experiment(tmp_path / str(i), plain(**changes)))


def test_a_stored_experiment_that_wrote_a_setting_nothing_reads_is_still_read_as_it_ran(tmp_path):
    """Stored before the rule (its stored form wrote every field, read or not): read as it ran."""
    spec = experiment_from_dict(plain(), "exp.yaml", base_dir=tmp_path)
    stored = stored_form(spec, tmp_path / "run")
    stored["experiment"]["budget"] |= {"eta": 3, "min_budget": 1 / 9, "max_budget": 1.0}
    stored["experiment"]["objective"] |= {"metric": "final_mlm_accuracy", "penalty_factor": 2.0}
    again = spec_from_stored(SimpleNamespace(name="plain", spec=stored))
    assert (again.budget.eta, again.objective.penalty_factor) == (3, 2.0)


@pytest.mark.parametrize("name", list_presets())
def test_the_copies_hpo_plan_and_storage_make_of_a_preset_load_under_todays_rules(name):
    """`hpo plan` re-reads the self-contained form of a file under today's rules, and the stored form is the same:
    it leaves out what the experiment does not read (budget.eta of a smac_bo file, asha's budgets its options
    set), which a file may not write."""
    spec = load_experiment(preset_path(name))
    data = spec.self_contained()
    for section, field in spec.unread_fields():
        assert field not in data[section]
    again = experiment_from_dict(data, f"{name} (copy)")
    assert again.self_contained() == data


def test_the_asha_demo_is_planned(tmp_path):
    """Its tuner.options set eta, min_samples and max_samples; the plan's copy of it wrote budget.eta and the other
    budgets too, which asha's options replace."""
    from hpo.plan.forecast import PlanOptions, prepare_plan

    plan = prepare_plan(str(preset_path("adam_vs_lamb_demo_cpu_asha")), PlanOptions(repetitions=1))
    assert plan.spec.tuner.name == "asha" and plan.spec.tuner.options["eta"] == 3


# ---------------------------------------------------------------------------------------- a verdict that decides
def test_one_confirmation_run_per_arm_is_refused_where_arms_are_compared(tmp_path):
    """The verdict needs at least 2 runs per arm: with 1 it ran every trial and said "a comparison needs at least 2
    per arm"."""
    data = make_experiment(budget={"trials": 4, "max_parallel": 2, "confirm_seeds": 1})
    path, message = refusal(tmp_path, data)
    assert message == (f"{path}: budget.confirm_seeds: 1, but the verdict compares each arm's confirmation runs and "
                       "needs at least 2 per arm, so it could never decide: set 2 or more, or auto (rounds until it "
                       "decides); or 0 for each arm's best configuration without a verdict")  # fmt: skip
    for i, seeds in enumerate([0, 2, "auto"]):  # 0: no confirmation run is spent; each arm's best all the same
        load_experiment(write_experiment(tmp_path / str(i), {**data, "budget": {"trials": 4, "confirm_seeds": seeds}}))
    alone = {**data, "compare": [], "allow_unequal_arms": None}  # one configuration re-run once: no verdict asked
    load_experiment(write_experiment(tmp_path / "alone", alone))
    assert experiment_from_dict(data, "stored", tmp_path, current_rules=False).budget.confirm_seeds == 1


def test_a_compare_of_one_arm_is_refused_naming_the_key(tmp_path):
    """A compared key with one value made one arm: every trial ran, then "one arm: nothing to compare"."""
    data = make_experiment(budget={"trials": 4, "confirm_seeds": 2}, allow_unequal_arms=None)
    data["space"] = {"optimizer.name": {"choice": ["lamb"]}, "optimizer.lr": {"float": [1e-3, 1e-2], "log": True}}
    path, message = refusal(tmp_path, data)
    assert message == (f"{path}: compare[0]: optimizer.name has one value in space (lamb), so there is one arm and "
                       "nothing to compare: give space.optimizer.name the values to compare, or remove compare (and "
                       "set optimizer.name in overrides)")  # fmt: skip
    both = {**data, "compare": ["optimizer.name", "clipping.strategy"]}
    both["space"] = {**data["space"], "clipping.strategy": {"choice": ["none", "after_allreduce"]}}
    spec = load_experiment(write_experiment(tmp_path / "both", both))  # arms differ in the other key: a comparison
    assert arm_labels(spec) == ["optimizer.name=lamb,clipping.strategy=none",
                                "optimizer.name=lamb,clipping.strategy=after_allreduce"]  # fmt: skip


# -------------------------------------------------------------------------------------------- overrides vs space
@pytest.mark.parametrize(
    ("overrides", "space", "says"),
    [
        ({"optimizer.beta2": 0.9}, {"optimizer.beta2": {"float": [0.7, 0.999]}},
         "overrides.optimizer.beta2: space.optimizer.beta2 tunes optimizer.beta2 too, in every trial, so this value "
         "would never be read: remove it from overrides, or the parameter from space"),
        ({"optimizer.lr": 0.001}, {"optimizer.beta2": {"float": [0.7, 0.999]}},  # beta2 in both arms: equal arms
         "overrides.optimizer.lr: space.optimizer.lr@lamb and space.optimizer.lr@adamw tune optimizer.lr too, one of "
         "them in every trial, so this value would never be read"),
    ],
    ids=["one-parameter", "one-per-arm"],
)  # fmt: skip
def test_an_override_the_space_tunes_in_every_trial_is_refused_naming_both(tmp_path, overrides, space, says):
    data = make_experiment(overrides={"budget.max_samples": 4096, **overrides}, allow_unequal_arms=None)
    data["space"] |= space
    path, message = refusal(tmp_path, data)
    assert message.startswith(f"{path}: {says}"), message


def test_an_override_read_where_the_space_does_not_set_it_loads(tmp_path):
    """Where a `when` leaves some trials the base value, the override is theirs; the run length is read from the
    base config whatever the space sets (fidelities, rungs, the most samples a trial trains)."""
    data = make_experiment(overrides={"budget.max_samples": 4096, "optimizer.beta2": 0.95})  # beta2: LAMB's only
    assert load_experiment(write_experiment(tmp_path / "a", data)).overrides["optimizer.beta2"] == 0.95
    run_length = make_experiment(overrides={"budget.max_samples": 4096, "eval.every_samples": 256})
    run_length["space"] |= {"budget.max_samples": {"choice": [2048, 4096]}, "eval.every_samples": {"choice": [256]}}
    load_experiment(write_experiment(tmp_path / "b", run_length))
    stored = make_experiment(overrides={"budget.max_samples": 4096, "optimizer.lr": 0.001})
    assert experiment_from_dict(stored, "hpo-built", base_dir=tmp_path / "a").overrides["optimizer.lr"] == 0.001


# ----------------------------------------------------------------------------------------------- numeric strings
def test_a_numeric_string_among_the_choices_is_the_number_the_trainer_reads_on_every_runner(tmp_path):
    """`{choice: [0, "40"]}`: the local runner trained warmup 40 (the trainer reads "40" as 40), the simulated runner
    refused it, saying its table had no runs at warmup 40 and had warmup 40."""
    space = {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"float": [3.1623e-4, 0.1], "log": True},
             "schedule.warmup_steps": {"choice": [0, "40"]}}  # fmt: skip
    path = write_experiment(tmp_path, simulated(space=space))
    spec = load_experiment(path)
    assert spec.space["schedule.warmup_steps"].choices == (0, 40)
    build_runner(spec).close()  # the table has runs at every choice
    assert trial_config(spec, {"optimizer.name": "lamb", "optimizer.lr": 0.01, "schedule.warmup_steps": 40}
                        ).schedule.warmup_steps == 40  # fmt: skip
    assert spec_from_stored(SimpleNamespace(name="sim", spec=stored_form(spec, tmp_path / "run"))).space[
        "schedule.warmup_steps"].choices == (0, 40)  # fmt: skip


def test_numeric_strings_are_read_in_compared_choices_and_in_when_clauses(tmp_path):
    data = make_experiment(compare=["schedule.warmup_steps"], allow_unequal_arms="lr at warmup 8 only, beta2 at 0")
    data["space"] = {
        "schedule.warmup_steps": {"choice": ["0", "8"]},
        "optimizer.lr": {"float": [1e-3, 1e-2], "log": True, "when": {"schedule.warmup_steps": "8"}},
        "optimizer.beta2": {"float": [0.7, 0.999], "when": {"schedule.warmup_steps": {"in": ["0"]}}},
    }
    data["overrides"] = {"budget.max_samples": 4096, "optimizer.name": "lamb"}
    spec = load_experiment(write_experiment(tmp_path, data))
    assert spec.space["schedule.warmup_steps"].choices == (0, 8)
    assert spec.space.to_dict()["optimizer.lr"]["when"] == {"schedule.warmup_steps": 8}
    assert spec.space.to_dict()["optimizer.beta2"]["when"] == {"schedule.warmup_steps": {"in": [0]}}
    assert arm_labels(spec) == ["schedule.warmup_steps=0", "schedule.warmup_steps=8"]


def test_a_stored_experiment_keeps_its_choices_as_its_trials_have_them():
    data = make_experiment(base_config=TINY_BASE)
    data["space"]["schedule.warmup_steps"] = {"choice": [0, "40"]}
    assert experiment_from_dict(data, "stored", current_rules=False).space["schedule.warmup_steps"].choices == (0, "40")
    assert experiment_from_dict(data, "new").space["schedule.warmup_steps"].choices == (0, 40)
