"""Experiment files refused with one clear line naming the file and the field, where they were read silently
otherwise or said it in pydantic's words: a key given twice, a boolean for a number, an empty section, an unknown
option or field without its valid names, a curve table that is not there, an assumption about a key not tuned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import trainer
from hpo.errors import ExperimentFileError
from hpo.experiment import experiment_from_dict, load_experiment
from hpo.simulation.table import TABLES
from tests.hpo.experiment.test_experiment import TINY_BASE, files_under, make_experiment, write_experiment

DEMO_CPU = Path(trainer.__file__).parent / "configs" / "demo_cpu.yaml"


def simulated(**changes: Any) -> dict[str, Any]:
    """A small valid experiment on the simulated runner (the shipped `curves` table)."""
    data = {
        "name": "sim",
        "base_config": str(DEMO_CPU),
        "overrides": {
            "budget.max_samples": 12288,
            "budget.max_time_s": None,
            "eval.every_samples": 1024,
            "eval.max_samples": 512,
            "eval.target_mlm_accuracy": 0.12,
            "batch.global_batch_size": 32,
            "batch.micro_batch_size": 4,
        },  # fmt: skip
        "space": {
            "optimizer.name": {"choice": ["adamw", "lamb"]},
            "optimizer.lr": {"float": [3.1623e-4, 0.1], "log": True},
        },  # fmt: skip
        "compare": ["optimizer.name"],
        "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 4, "max_parallel": 4},
        "runner": {"name": "simulated", "simulation": {"table": "curves"}},
    }
    data.update(changes)
    return data


def refusal(tmp_path: Path, text_or_data: str | dict[str, Any]) -> tuple[Path, str]:
    """(the file, the message) of an experiment file that must be refused; nothing may be written."""
    path = write_experiment(tmp_path, text_or_data)
    before = files_under(tmp_path)
    with pytest.raises(ExperimentFileError) as err:
        load_experiment(path)
    assert files_under(tmp_path) == before
    return path, str(err.value)


# ------------------------------------------------------------------------------------------------ keys given twice
VALID = yaml.safe_dump(make_experiment(), sort_keys=False)


def test_a_space_parameter_given_twice_is_refused_naming_the_line_and_the_key(tmp_path):
    text = VALID.replace("  schedule.warmup_steps:", "  optimizer.eps:\n    float: [1.0e-8, 1.0e-6]\n"
                         "  schedule.warmup_steps:\n    int: [0, 5]\n  schedule.warmup_steps:")  # fmt: skip
    path, message = refusal(tmp_path, text)
    first = text.splitlines().index("  schedule.warmup_steps:") + 1
    assert message == (f"{path}: line {first + 2}: space.schedule.warmup_steps: given twice (first on line {first}),"
                       " and only the last would count; keep one")  # fmt: skip


def test_a_section_given_twice_is_refused(tmp_path):
    path, message = refusal(tmp_path, VALID + "budget:\n  trials: 40\n")
    assert message.startswith(f"{path}: line {len(VALID.splitlines()) + 1}: budget: given twice (first on line ")


def test_a_key_given_twice_in_the_base_config_is_refused(tmp_path):
    path = write_experiment(tmp_path, make_experiment())
    base = tmp_path / "base.yaml"
    base.write_text(base.read_text() + "device: cuda\n")  # `device: cpu` is its first line
    with pytest.raises(ExperimentFileError) as err:
        load_experiment(path)
    assert str(err.value).startswith(f"{path}: base_config: {base}: line ")
    assert "device: given twice (first on line " in str(err.value)


def test_the_same_key_in_two_mappings_and_yaml_merge_keys_are_not_duplicates(tmp_path):
    assert load_experiment(write_experiment(tmp_path, VALID)).name == "tiny"  # `name` at the top and under tuner
    text = VALID.replace("tuner:\n", "tuner:\n  <<: {seed: 5}\n")  # a merged key, then the same key given
    assert load_experiment(write_experiment(tmp_path, text, "merged.yaml")).tuner.seed == 1  # the key given wins


# ------------------------------------------------------------------------------------------------ booleans
@pytest.mark.parametrize(
    ("changes", "field", "says"),
    [
        ({"budget": {"trials": True}}, "budget.trials", "expected a whole number, got true"),
        ({"budget": {"trials": 4, "max_parallel": False}}, "budget.max_parallel", "expected a whole number, got false"),
        ({"budget": {"trials": 4, "trial_timeout_s": True}}, "budget.trial_timeout_s", "expected a number, got true"),
        ({"tuner": {"name": "random", "seed": True}}, "tuner.seed", "expected a whole number, got true"),
        (
            {"resources": {"gpus": "none", "cpu_slots": True}},
            "resources.cpu_slots",
            "expected a whole number, got true",
        ),
        (
            {"overrides": {"budget.max_samples": True}},
            "overrides.budget.max_samples",
            "budget.max_samples takes a whole number, got true",
        ),  # the trainer would read it as 1
        (
            {"tuner": {"name": "asha", "options": {"min_samples": True}}},
            "tuner.options.min_samples",
            "expected a whole number, got true",
        ),
    ],
)
def test_a_boolean_for_a_number_is_refused_naming_the_field(tmp_path, changes, field, says):
    path, message = refusal(tmp_path, make_experiment(**changes))
    assert message == f"{path}: {field}: {says}"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"objective": {"metric": "samples_to_target", "direction": "minimize", "penalty_factor": float("inf")}},
         "objective.penalty_factor"),  # stored as null, the experiment could not be read back
        ({"runner": {"name": "simulated", "simulation": {"table": "curves", "sample_scale": float("inf")}}},
         "runner.simulation.sample_scale"),  # the simulated clock crashed on it, a trial left running
    ],
)  # fmt: skip
def test_an_infinite_number_is_refused_naming_the_field(tmp_path, changes, field):
    path, message = refusal(tmp_path, simulated(**changes))
    assert message == f"{path}: {field}: Input should be a finite number"


def test_a_boolean_for_a_number_in_the_base_config_is_refused_naming_it(tmp_path):
    base = tmp_path / "bool_base.yaml"
    base.write_text("device: cpu\nlog:\n  every_steps: true\n")  # the trainer read it as 1 (an override was refused)
    path, message = refusal(tmp_path, simulated(base_config=str(base)))
    assert "log.every_steps: takes a number, not true or false" in message and str(base) in message, message


def test_a_whole_number_may_be_written_as_in_the_trainer_config():
    """4.0 or "4" is 4, as the trainer's own integer fields read them; true is not."""
    spec = experiment_from_dict(make_experiment(base_config=TINY_BASE, budget={"trials": "4", "max_parallel": 2.0}))
    assert (spec.budget.trials, spec.budget.max_parallel) == (4, 2)


# ------------------------------------------------------------------------------------------------ empty sections
@pytest.mark.parametrize(("section", "remove"), [("resources", True), ("budget", False), ("tuner", True)])
def test_a_section_with_every_line_commented_out_is_called_empty(tmp_path, section, remove):
    text = yaml.safe_dump(make_experiment(), sort_keys=False)
    lines = text.splitlines()
    start = lines.index(f"{section}:")
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith(" ")), len(lines))
    lines[start + 1 : end] = [f"#{line}" for line in lines[start + 1 : end]]
    path, message = refusal(tmp_path, "\n".join(lines) + "\n")
    hint = "give its fields, or remove it to use the defaults" if remove else "give its fields"
    assert message == f"{path}: {section}: empty (nothing under it, or every line under it commented out); {hint}"


# ------------------------------------------------------------------------------------------------ one line each
@pytest.mark.parametrize("value", ["three", -1, 2.5, True])
def test_confirm_seeds_that_is_neither_a_number_nor_auto_is_one_line(tmp_path, value):
    path, message = refusal(tmp_path, make_experiment(budget={"trials": 4, "confirm_seeds": value}))
    shown = "true" if value is True else repr(value)
    expected = f"budget.confirm_seeds: expected a whole number of seeds (0 to 10,000) or auto, got {shown}"
    assert message == f"{path}: {expected}"


def test_an_unknown_asha_option_names_the_valid_ones(tmp_path):
    path, message = refusal(tmp_path, make_experiment(tuner={"name": "asha", "options": {"etaa": 3}}))
    assert message == (f"{path}: tuner.options.etaa: not an option of asha (it understands eta, min_samples, "
                       "max_samples, sampler, min_points_in_model, random_fraction; did you mean eta?)")  # fmt: skip


def test_an_unknown_smac_option_gets_a_did_you_mean(tmp_path):
    path, message = refusal(tmp_path, make_experiment(tuner={"name": "smac_bo", "options": {"retrain_afer": 3}}))
    assert message.endswith("not an option of smac_bo (it understands n_initial_configs, retrain_after; did you "
                            "mean retrain_after?)")  # fmt: skip


@pytest.mark.parametrize(
    ("runner", "field", "hint"),
    [
        ({"name": "simulated", "simulation": {"table": "curves", "tabel": "x"}}, "runner.simulation.tabel", "table"),
        (
            {
                "name": "simulated",
                "simulation": {"table": "curves", "handicaps": {"sgd": {"curves_of": "adamw", "dealy_samples": 9}}},
            },
            "runner.simulation.handicaps.sgd.dealy_samples",
            "delay_samples",
        ),  # fmt: skip
    ],
)
def test_an_unknown_field_of_a_nested_section_gets_a_did_you_mean(tmp_path, runner, field, hint):
    path, message = refusal(tmp_path, simulated(runner=runner))
    assert message == f"{path}: {field}: unknown field (did you mean {hint}?)"


# ------------------------------------------------------------------------------------------------ the simulation
@pytest.mark.parametrize("table", ["nonexistent.jsonl", "."])
def test_a_curve_table_that_is_not_there_names_the_file_and_the_field(tmp_path, table):
    path, message = refusal(tmp_path, simulated(runner={"name": "simulated", "simulation": {"table": table}}))
    what = "does not exist" if table != "." else "is not a file"
    assert message.startswith(f"{path}: runner.simulation.table: the curve table {(tmp_path / table).resolve()} "
                              f"{what} (a relative path is read from the experiment file's directory); name a "
                              "table shipped with hpo (curves, ")  # fmt: skip


@pytest.mark.parametrize("years", [9.9, 10.1])
def test_a_throughput_that_makes_one_trial_last_past_ten_simulated_years_is_refused_before_anything(
    tmp_path, capsys, years
):
    """The curves table's budget is 12,288 table samples of 256 samples each (the default sample_scale): one trial
    lasts 12,288 x 256 / samples_per_s seconds. Past 10 years (a typo: its clock would leave the calendar mid-run)
    `hpo run` refuses the file and writes no database; under it, the runner is built."""
    from hpo.cli.main import main
    from hpo.runners.simulated import SimulatedRunner

    rate = 12_288 * 256 / (years * 365.25 * 86400)
    runner = {"name": "simulated", "simulation": {"table": "curves", "samples_per_s": rate}}
    data = simulated(runner=runner)
    data["overrides"]["schedule.warmup_steps"] = 40  # a warm-up the table recorded
    path = write_experiment(tmp_path, data)
    db = tmp_path / "hpo.db"
    if years < 10:
        SimulatedRunner(load_experiment(path), 4)
        return
    assert main(["--db", f"sqlite:///{db}", "run", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{path}: runner.simulation: at {rate:.4g} samples/s a slot" in err
    assert f"one trial of the table's 12,288 samples would take {years:.3g} simulated years" in err
    assert "check samples_per_s and sample_scale" in err and not db.exists() and not (tmp_path / "run").exists()


def test_a_stored_experiment_whose_table_has_gone_is_still_read(tmp_path):
    table = tmp_path / "gone.jsonl"
    table.write_text((TABLES / "curves.jsonl").read_text())
    runner = {"name": "simulated", "simulation": {"table": str(table)}}
    spec = load_experiment(write_experiment(tmp_path, simulated(runner=runner)))
    table.unlink()
    assert experiment_from_dict(spec.self_contained(), "stored").runner.simulation.table == str(table)


@pytest.mark.parametrize(
    ("assumed", "says"),
    [
        (
            ["optimizer.betaa1"],
            "optimizer.betaa1 is not a key of space that the curve table does not vary, so "
            "assuming it has no effect states nothing (did you mean optimizer.beta1?); it takes these keys of space: "
            "optimizer.beta1",
        ),  # fmt: skip
        (["optimizer.lr"], "optimizer.lr is read by a simulated trial (the curve table varies it"),
    ],
)
def test_an_assumption_about_a_key_the_space_does_not_tune_is_refused(tmp_path, assumed, says):
    space = {**simulated()["space"], "optimizer.beta1": {"choice": [0.8, 0.9]}}
    runner = {"name": "simulated", "simulation": {"table": "curves", "assume_no_effect": assumed}}
    path, message = refusal(tmp_path, simulated(space=space, compare=["optimizer.name", "optimizer.beta1"],
                                                runner=runner, budget={"trials": 4}))  # fmt: skip
    assert message.startswith(f"{path}: runner.simulation.assume_no_effect[0]: {says}"), message
    runner["simulation"]["assume_no_effect"] = ["optimizer.beta1"]  # what `hpo plan` writes: a compared key
    load_experiment(write_experiment(tmp_path, simulated(space=space, compare=["optimizer.name", "optimizer.beta1"],
                                                         runner=runner, budget={"trials": 4}), "ok.yaml"))  # fmt: skip


@pytest.mark.parametrize("field", ["gpus_per_trial", "trials_per_gpu"])
def test_gpus_asked_of_an_experiment_without_gpus_are_refused_not_ignored(tmp_path, field):
    """resources.gpus: none with 8 GPUs per trial (a GPU preset switched to the CPU): the 8 were ignored without a
    word and each trial trained on one CPU process."""
    data = simulated(resources={"gpus": "none", "cpu_slots": 1, field: 8})
    path, message = refusal(tmp_path, data)
    assert message.startswith(f"{path}: resources.{field}: 8, but resources.gpus is none: the trials run on the CPU"), (
        message
    )
    assert message.endswith(f"remove {field} (or set resources.gpus to GPUs)")
    load_experiment(write_experiment(tmp_path, simulated(resources={"gpus": "none", "cpu_slots": 1, field: 1})))


@pytest.mark.parametrize(
    ("resources", "says"),
    [
        ({"gpus": [0, 1]}, "resources.gpus: [0, 1] are GPU ids of this machine, but the dask runner places trials on "
                           "the GPUs its workers declare (dask worker --resources GPU=N): set resources.gpus to all "
                           "(or none)"),
        ({"trials_per_gpu": 2}, "resources.trials_per_gpu: 2, but the dask runner gives each trial whole GPUs of a "
                                "worker (resources.gpus_per_trial of them), never a share of one: remove it"),
        ({"gpus": "none", "cpu_slots": 2}, "resources.cpu_slots: 2, but the dask runner runs a CPU trial on each "
                                           "thread of its workers (dask worker --nthreads N): remove it, and give the "
                                           "workers the threads"),
    ],
    ids=["gpu-ids", "trials-per-gpu", "cpu-slots"],
)  # fmt: skip
def test_resources_the_dask_runner_would_not_read_are_refused(tmp_path, resources, says):
    dask = {"name": "dask", "scheduler": "tcp://127.0.0.1:8786"}
    data = {"name": "on_dask", "base_config": str(DEMO_CPU), "space": {"optimizer.lr": {"float": [1e-3, 1e-2]}},
            "budget": {"trials": 2}, "runner": dask}  # fmt: skip
    path, message = refusal(tmp_path, {**data, "resources": resources})
    assert message == f"{path}: {says}", message
    load_experiment(write_experiment(tmp_path, {**data, "resources": {"gpus": "all", "trials_per_gpu": 1}}))


@pytest.mark.parametrize(
    ("runner", "says"),
    [
        ({"name": "dask"}, "runner.scheduler: the dask runner needs a scheduler address"),
        ({"name": "local", "scheduler": "tcp://127.0.0.1:8786"},
         "runner.scheduler: only the dask runner uses a scheduler (runner.name is local): remove it, or set "
         "runner.name: dask"),
        ({"name": "simulated", "scheduler": "tcp://127.0.0.1:8786", "simulation": {"table": "curves"}},
         "runner.scheduler: only the dask runner uses a scheduler (runner.name is simulated): remove it, or set "
         "runner.name: dask"),
    ],
    ids=["dask-without", "local", "simulated"],
)  # fmt: skip
def test_a_scheduler_address_is_refused_where_no_dask_runner_reads_it(tmp_path, runner, says):
    path, message = refusal(tmp_path, simulated(runner=runner))
    assert message == f"{path}: {says}", message
    if runner["name"] == "simulated":  # the same file without the address is valid: the refusal is of it alone
        load_experiment(write_experiment(tmp_path, simulated(runner={**runner, "scheduler": None})))


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"budget": {"trials": 2, "eta": 4}}, "budget.eta: 4, but tuner random trains every trial to the full "
                                              "budget; budget.min_budget, max_budget and eta are read by "
                                              "smac_hyperband and asha: remove it, or choose one of them"),
        ({"budget": {"trials": 2, "min_budget": 0.25}}, "budget.min_budget: 0.25, but tuner random trains every"),
        ({"objective": {"metric": "best_mlm_accuracy", "penalty_factor": 3.0}},
         "objective.penalty_factor: 3, but it scores a run that misses the target under samples_to_target and "
         "time_to_target_s; best_mlm_accuracy scores the accuracy itself (0 for a run that did not end normally): "
         "remove it"),
        ({"tuner": {"name": "asha", "options": {"eta": 2}}, "budget": {"trials": 2, "eta": 4}},
         "budget.eta: 4, but tuner.options.eta sets asha's in its place: remove one of them"),
        ({"tuner": {"name": "asha", "options": {"sampler": "random", "random_fraction": 0.5}}},
         "tuner.options.random_fraction: read where asha samples from its model, and sampler is random: remove it, "
         "or set sampler: model"),
    ],
    ids=["eta-without-hyperband", "min-budget-without-hyperband", "penalty-of-an-accuracy-metric",
         "asha-eta-twice", "asha-model-options-with-random-sampling"],
)  # fmt: skip
def test_settings_no_part_of_the_experiment_would_read_are_refused(tmp_path, changes, says):
    data = {"name": "unread", "base_config": str(DEMO_CPU), "space": {"optimizer.lr": {"float": [1e-3, 1e-2]}},
            "tuner": {"name": "random"}, "budget": {"trials": 2}, "resources": {"gpus": "none"}}  # fmt: skip
    path, message = refusal(tmp_path, {**data, **changes})
    assert message.startswith(f"{path}: {says}"), message
    read = {**data, "tuner": {"name": "smac_hyperband"}, "budget": {"trials": 2, "eta": 4, "min_budget": 0.25},
            "objective": {"metric": "samples_to_target", "penalty_factor": 3.0}}  # fmt: skip
    load_experiment(write_experiment(tmp_path / "read", read))


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"resources": {"gpus": "none", "memory_limit_mb": 4000}},
         "resources.memory_limit_mb: 4000, but the simulated runner starts no process: remove it"),
        ({"resources": {"gpus": "none", "cpu_slots": 4}},
         "resources.cpu_slots: 4, but its slots are budget.max_parallel, each as fast as resources.gpus_per_trial "
         "whole GPUs: remove it"),
        ({"resources": {"trials_per_gpu": 2}}, "resources.trials_per_gpu: 2, but its slots are budget.max_parallel"),
        ({"runner": {"name": "simulated", "preload": False, "simulation": {"table": "curves"}}},
         "runner.preload: false, but the simulated runner starts no process: remove it"),
    ],
    ids=["memory-limit", "cpu-slots", "trials-per-gpu", "preload-off"],
)  # fmt: skip
def test_what_the_simulated_runner_would_not_read_is_refused(tmp_path, changes, says):
    path, message = refusal(tmp_path, simulated(**changes))
    assert message.startswith(f"{path}: {says}"), message


def test_a_real_file_with_host_limits_is_planned_without_them(tmp_path):
    """`hpo plan` of a CPU file with a memory limit and two slots: the simulated runner reads neither, so the plan
    leaves them out, on the default table as on a table it moves the file onto."""
    from hpo.plan.forecast import PlanOptions, prepare_plan

    real = {k: v for k, v in simulated(resources={"gpus": "none", "memory_limit_mb": 4000, "cpu_slots": 2}).items()
            if k != "runner"}  # fmt: skip
    plan = prepare_plan(str(write_experiment(tmp_path, real)), PlanOptions(repetitions=1))
    assert plan.moved and (plan.spec.resources.memory_limit_mb, plan.spec.resources.cpu_slots) == (None, 1)
    moved = {**real, "space": {**real["space"], "optimizer.beta2": {"float": [0.9, 0.999]}}}  # the table lacks beta2
    plan = prepare_plan(str(write_experiment(tmp_path / "moved", moved)), PlanOptions(repetitions=1))
    assert plan.assumptions and (plan.spec.resources.memory_limit_mb, plan.spec.resources.cpu_slots) == (None, 1)
