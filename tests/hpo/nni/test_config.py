"""What an experiment file becomes under engine: nni (pure: no NNI manager), checked against NNI's own config
validation, and what the validation refuses."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from hpo.errors import ExperimentFileError
from hpo.experiment import experiment_from_dict
from hpo.experiment.arms import arm_plans
from hpo.nni.config import (
    CONFIRMATION_SEED,
    confirmation_experiment_config,
    confirmation_search_space,
    nni_experiment_config,
    split_confirmation,
    trial_command,
)
from search_spaces.nni import to_nni
from tests.hpo.nni.conftest import CONDITIONAL_SPACE, nni_experiment_data

ROOT = Path(__file__).resolve().parents[3]  # the folder that holds the hpo package

ARM_SPACE = {
    "optimizer.name": {"choice": ["adamw", "lamb"]},
    "optimizer.lr@lamb": {"float": [1e-3, 1e-2], "log": True, "when": {"optimizer.name": "lamb"}},
    "optimizer.lr@adamw": {"float": [1e-4, 1e-2], "log": True, "when": {"optimizer.name": "adamw"}},
}


def spec_of(tmp_path, tuner="nni_tpe", trials=6, parallel=2, engine="nni", resources=None, budget=None, seed=0,
            **kwargs):  # fmt: skip
    data = nni_experiment_data(tmp_path, tuner, trials, parallel, **kwargs)
    data["engine"], data["tuner"]["seed"] = engine, seed
    data["resources"].update(resources or {})
    data["budget"].update(budget or {})
    return experiment_from_dict(data, "exp.yaml", base_dir=tmp_path)


def nni_validates(config: dict) -> dict:
    from nni.experiment import ExperimentConfig

    return ExperimentConfig(**config).json()  # NNI's own checks (canonical form)


def test_arms_are_separate_nni_experiments_with_equal_shares(tmp_path):
    spec = spec_of(tmp_path, trials=6, space=ARM_SPACE, compare=["optimizer.name"])
    plans = arm_plans(spec)
    assert [(p.label, p.fixed, p.quota) for p in plans] == [
        ("optimizer.name=adamw", {"optimizer.name": "adamw"}, 3),
        ("optimizer.name=lamb", {"optimizer.name": "lamb"}, 3),
    ]
    assert plans[1].space.names == ["optimizer.lr@lamb"]  # the compare key is fixed, the other arm's lr dropped
    config = nni_validates(nni_experiment_config(spec, plans[1], tmp_path / "run", "true", tmp_path, on_gpu=False))
    assert config["maxTrialNumber"] == 3 and config["experimentName"] == "nniexp optimizer.name=lamb"
    assert config["searchSpace"] == {"optimizer.lr@lamb": {"_type": "loguniform", "_value": [1e-3, 1e-2]}}


def test_cpu_trials_and_tuners(tmp_path):
    spec = spec_of(tmp_path, tuner="nni_tpe", parallel=3, options={})
    config = nni_validates(nni_experiment_config(spec, arm_plans(spec)[0], tmp_path / "run", "true", tmp_path, False))
    assert config["trainingService"]["trialGpuNumber"] == 0 and config["trialConcurrency"] == 3
    assert config["searchSpace"] == to_nni(spec.space)
    assert config["tuner"] == {"name": "TPE", "classArgs": {"optimize_mode": "minimize", "seed": 0}}
    assert config["assessor"] == {"name": "Medianstop", "classArgs": {"optimize_mode": "maximize", "start_step": 2}}
    assert config["maxTrialDuration"] == "120s"
    assert config["experimentWorkingDirectory"] == str(tmp_path / "run" / "nni" / "nni-experiments")
    spec = spec_of(tmp_path, tuner="nni_random", options={"assessor": "none"})
    config = nni_validates(nni_experiment_config(spec, arm_plans(spec)[0], tmp_path, "true", tmp_path, False))
    assert config["tuner"] == {"name": "Random", "classArgs": {"optimize_mode": "minimize", "seed": 0}}
    assert "assessor" not in config
    # NNI's Anneal and Evolution take no seed: ours, seeded (hpo.nni.seeded), loaded by the manager by class name
    for tuner, name, extra in [("nni_anneal", "SeededAnneal", {}),
                               ("nni_evolution", "ManagerEvolution", {"population_size": 3})]:  # fmt: skip
        spec = spec_of(tmp_path, tuner=tuner, options={"assessor": "none"}, seed=7)
        config = nni_validates(nni_experiment_config(spec, arm_plans(spec)[0], tmp_path, "true", tmp_path, False))
        assert config["tuner"] == {"className": f"hpo.nni.seeded.{name}", "codeDirectory": str(ROOT),
                                   "classArgs": {"optimize_mode": "minimize", "seed": 7, **extra}}  # fmt: skip


def test_gpu_resources_map_to_nni_local_training_service(tmp_path):
    spec = spec_of(tmp_path, parallel=4, resources={"gpus": [0, 2], "gpus_per_trial": 1, "trials_per_gpu": 2})
    config = nni_validates(nni_experiment_config(spec, arm_plans(spec)[0], tmp_path, "true", tmp_path, on_gpu=True))
    service = config["trainingService"]
    assert (service["gpuIndices"], service["trialGpuNumber"], service["maxTrialNumberPerGpu"]) == ([0, 2], 1, 2)
    assert config["trialConcurrency"] == 4


def test_listed_machines_map_to_nni_remote_training_service(tmp_path):
    key = tmp_path / "id_ed25519"
    key.write_text("not read here: NNI only checks that the key file exists\n")
    machines = [{"host": "gpu-a", "user": "bert", "ssh_key_file": str(key), "python_path": "/opt/venv/bin",
                 "gpus": [0, 1, 2, 3]},
                {"host": "10.0.0.7", "port": 2222, "user": "bert", "ssh_key_file": str(key)}]  # fmt: skip
    spec = spec_of(tmp_path, parallel=6, resources={"gpus": "all", "gpus_per_trial": 1, "trials_per_gpu": 2,
                                                     "machines": machines})  # fmt: skip
    command = trial_command(3, 0, tmp_path / "run", None)
    config = nni_validates(nni_experiment_config(spec, arm_plans(spec)[0], tmp_path, command, tmp_path, True))
    service = config["trainingService"]
    assert service["platform"] == "remote" and service["trialGpuNumber"] == 1 and config["trialConcurrency"] == 6
    first, second = service["machineList"]
    assert (first["host"], first["port"], first["user"], first["sshKeyFile"]) == ("gpu-a", 22, "bert", str(key))
    assert (first["gpuIndices"], first["maxTrialNumberPerGpu"], first["pythonPath"]) == (
        [0, 1, 2, 3],
        2,
        "/opt/venv/bin",
    )
    assert (second["host"], second["port"], second.get("gpuIndices"), second.get("password")) == (
        "10.0.0.7",
        2222,
        None,
        None,
    )
    # On the machines: their own python3 (python_path first on PATH) and their user's HOME
    assert shlex.split(config["trialCommand"])[:3] == ["python3", "-m", "hpo.nni.trial"]


def test_gpu_ids_of_this_machine_beside_other_machines_are_refused_as_they_would_be_ignored(tmp_path):
    machines = [{"host": "gpu-a", "user": "bert", "gpus": [3]}]
    with pytest.raises(
        ExperimentFileError,
        match=r"resources.gpus: \[0, 1\] are GPU ids of this machine, but the "
        r"trials run on resources.machines, each on its own GPUs: give the ids per machine",
    ):
        spec_of(tmp_path, resources={"gpus": [0, 1], "machines": machines})
    spec = spec_of(tmp_path, resources={"gpus": "all", "machines": machines})  # the machine's own ids, as NNI gets them
    service = nni_experiment_config(spec, arm_plans(spec)[0], tmp_path, "true", tmp_path, True)["trainingService"]
    assert [m["gpuIndices"] for m in service["machineList"]] == [[3]] and "gpuIndices" not in service


def test_remote_trials_need_a_server_database_and_a_key_before_anything_is_written(tmp_path):
    from hpo.errors import ResourceError
    from hpo.nni.config import check_remote

    missing = tmp_path / "no-such-key"
    spec = spec_of(tmp_path, resources={"machines": [{"host": "h", "user": "u", "ssh_key_file": str(missing)}]})
    with pytest.raises(ResourceError, match=rf"^{spec.source}: resources.machines: .* sqlite:///x.db is a file"):
        check_remote(spec, "sqlite:///x.db")
    with pytest.raises(ResourceError, match=rf"^{spec.source}: resources.machines\[0\].ssh_key_file: {missing} is"):
        check_remote(spec, "postgresql+psycopg://u@db/hpo")
    check_remote(spec_of(tmp_path), "sqlite:///x.db")  # this machine only: any database
    with pytest.raises(ExperimentFileError, match="resources.machines: other machines run engine: nni trials"):
        spec_of(
            tmp_path, engine="local", tuner="random", options={}, resources={"machines": [{"host": "h", "user": "u"}]}
        )


def test_smac_custom_tuner_gets_our_space_with_its_conditions(tmp_path):
    spec = spec_of(tmp_path, tuner="nni_smac", options={"n_initial_configs": 2})
    config = nni_validates(nni_experiment_config(spec, arm_plans(spec)[0], tmp_path / "run", "true", tmp_path, False))
    tuner = config["tuner"]
    assert tuner["className"] == "hpo.nni.smac_tuner.SmacTuner"
    assert (Path(tuner["codeDirectory"]) / "hpo" / "nni" / "smac_tuner.py").is_file()
    assert tuner["classArgs"]["space"] == CONDITIONAL_SPACE  # `when` included: SMAC gets the condition
    assert tuner["classArgs"]["n_initial_configs"] == 2 and tuner["classArgs"]["n_trials"] == 6


def test_trial_command_restores_home_and_quotes_and_carries_no_database_url(tmp_path):
    run_dir = tmp_path / "a dir"
    words = shlex.split(trial_command(7, 1, run_dir, "/home/me"))
    assert words[0] == "HOME=/home/me"
    assert words[2:] == ["-m", "hpo.nni.trial", "--experiment-id", "7", "--arm", "1", "--run-dir", str(run_dir)]


def test_manager_listens_on_loopback_unless_the_file_or_remote_machines_ask_otherwise(tmp_path):
    from hpo.nni.config import manager_host

    key = tmp_path / "id"
    key.write_text("k")
    machines = {"machines": [{"host": "gpu-a", "user": "bert", "ssh_key_file": str(key)}]}
    assert manager_host(spec_of(tmp_path)) == "127.0.0.1"
    assert manager_host(spec_of(tmp_path, resources=machines)) is None  # remote trials report back over the network
    assert manager_host(spec_of(tmp_path, options={"webui_host": "10.1.2.3"})) == "10.1.2.3"
    assert manager_host(spec_of(tmp_path, options={"webui_host": "0.0.0.0"})) is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"tuner": "smac_bo"}, "tuner.name: engine: nni runs NNI's tuners .* Use nni_smac"),
        ({"options": {"population_size": 4}}, r"tuner.options.population_size: not an option of nni_tpe"),
        ({"options": {"assessor": "curvefitting"}}, "tuner.options.assessor: 'curvefitting'; use medianstop or none"),
        ({"resources": {"cpu_ranks_per_trial": 2}}, "resources: engine: nni runs single-rank trials"),
        ({"resources": {"memory_limit_mb": 1000}}, "resources.memory_limit_mb: NNI's training service cannot"),
        ({"options": {"webui_host": ""}}, "tuner.options.webui_host: ''; use an address of this machine"),
    ],
)
def test_what_nni_cannot_run_is_refused_naming_the_field(tmp_path, change, message):
    with pytest.raises(ExperimentFileError, match=f"^exp.yaml: {message}"):
        spec_of(tmp_path, **change)


def test_runner_preload_off_under_nni_is_refused_as_nni_starts_every_trial_itself(tmp_path):
    data = nni_experiment_data(tmp_path, "nni_tpe", 6, 2)
    data.update(engine="nni", runner={"preload": False})
    with pytest.raises(ExperimentFileError, match="^exp.yaml: runner.preload: false, but under engine: nni NNI's "
                                                  "manager starts every trial itself, without a launcher to fork "
                                                  "from: remove it$"):  # fmt: skip
        experiment_from_dict(data, "exp.yaml", base_dir=tmp_path)
    experiment_from_dict({**data, "runner": {"preload": True}}, "exp.yaml", base_dir=tmp_path)


MEDIANSTOP = {"assessor": "medianstop"}


@pytest.mark.parametrize(
    ("tuner", "options", "message"),
    [
        ("nni_evolution", {"population_size": 0}, r"population_size: expected a whole number from 1 to 99999 \(got 0"),
        ("nni_evolution", {"population_size": "abc"}, r"population_size: expected a whole number .* \(got 'abc'\)"),
        ("nni_evolution", {"population_size": 2.5}, r"population_size: expected a whole number .* \(got 2.5\)"),
        ("nni_smac", {"n_initial_configs": 0}, r"n_initial_configs: expected a whole number >= 1 \(got 0\)"),
        ("nni_smac", {"n_initial_configs": True}, r"n_initial_configs: expected a whole number >= 1 \(got True\)"),
        ("nni_tpe", {**MEDIANSTOP, "assessor_start_step": -3}, r"assessor_start_step: expected a whole number from 0 "),
        ("nni_tpe", {**MEDIANSTOP, "assessor_start_step": "abc"}, r"assessor_start_step: expected a whole number "),
        ("nni_tpe", {"assessor": "none", "assessor_start_step": 3}, r"assessor_start_step: applies to the medianstop"),
    ],
)
def test_tuner_options_nni_would_fail_on_or_ignore_are_refused_naming_the_option(tmp_path, tuner, options, message):
    """Refused at validation, before anything is written: NNI's manager passes these on, and its tuner or assessor
    fails on them (population_size 0: "The population is empty"; a text: a traceback of ours) or runs without them
    only once the experiment was recorded and its NNI experiment started."""
    with pytest.raises(ExperimentFileError, match=f"^exp.yaml: tuner.options.{message}"):
        spec_of(tmp_path, tuner=tuner, options=options)


@pytest.mark.parametrize("start_step", [-1, 0, 9999, 10000])
def test_assessor_start_step_takes_what_nnis_own_medianstop_check_takes(tmp_path, start_step):
    """NNI's own class-argument check of its Medianstop assessor is the reference (its manager does not run it)."""
    from nni.algorithms.hpo.medianstop_assessor import MedianstopClassArgsValidator
    from schema import SchemaError

    try:
        MedianstopClassArgsValidator().validate_class_args(optimize_mode="maximize", start_step=start_step)
        nni_takes = True
    except SchemaError:
        nni_takes = False
    try:
        spec = spec_of(tmp_path, options={**MEDIANSTOP, "assessor_start_step": start_step})
    except ExperimentFileError:
        assert not nni_takes
        return
    assert nni_takes
    config = nni_experiment_config(spec, arm_plans(spec)[0], tmp_path / "run", "true", tmp_path, False)
    assert config["assessor"]["classArgs"]["start_step"] == start_step


@pytest.mark.parametrize("budget", [{"confirm_seeds": 3}, {"confirm_seeds": "auto", "max_confirm_seeds": 6}])
def test_confirmation_seeds_run_under_nni(tmp_path, budget):
    spec = spec_of(tmp_path, space=ARM_SPACE, compare=["optimizer.name"], budget=budget)
    assert spec.engine == "nni" and spec.budget.confirmation_rounds[0] == 3


BEST = {"optimizer.name": "lamb", "optimizer.lr@lamb": 0.0031622776601683794}


def test_a_confirmation_round_is_nni_grid_search_over_the_configuration_and_its_seeds(tmp_path):
    spec = spec_of(tmp_path, tuner="nni_smac", parallel=4, space=ARM_SPACE, compare=["optimizer.name"],
                   options={"assessor": "medianstop"}, budget={"confirm_seeds": 3})  # fmt: skip
    lamb, seeds = arm_plans(spec)[1], [1235, 1236, 1237]
    raw = confirmation_experiment_config(spec, lamb, tmp_path / "run", "true", tmp_path, False, BEST, seeds)
    config = nni_validates(raw)
    assert config["experimentName"] == "nniexp optimizer.name=lamb confirmations"
    assert config["tuner"] == {"name": "GridSearch"} and "assessor" not in config  # every run is evidence
    assert config["maxTrialNumber"] == 3 and config["trialConcurrency"] == 3  # one trial per seed, all at once
    assert config["searchSpace"] == {
        "optimizer.name": {"_type": "choice", "_value": ["lamb"]},
        "optimizer.lr@lamb": {"_type": "choice", "_value": [BEST["optimizer.lr@lamb"]]},
        CONFIRMATION_SEED: {"_type": "choice", "_value": [1235, 1236, 1237]},
    }
    tuning = nni_experiment_config(spec, lamb, tmp_path / "run", "true", tmp_path, False)
    for key in ("trialCommand", "trainingService", "maxTrialDuration", "experimentWorkingDirectory"):
        assert raw[key] == tuning[key]  # the arm's trials, resources and time limit
    one = confirmation_experiment_config(spec, lamb, tmp_path / "run", "true", tmp_path, False, BEST, [1238])
    assert nni_validates(one)["trialConcurrency"] == 1
    with pytest.raises(ValueError, match="needs at least one seed"):
        confirmation_experiment_config(spec, lamb, tmp_path / "run", "true", tmp_path, False, BEST, [])


def test_nni_grid_search_hands_out_the_configuration_once_per_seed_in_order():
    from nni import NoMoreTrialError
    from nni.algorithms.hpo.gridsearch_tuner import GridSearchTuner

    tuner = GridSearchTuner()
    tuner.update_search_space(confirmation_search_space({**BEST, "schedule.warmup_steps": 12}, [1235, 1236, 1237]))
    generated = [split_confirmation(tuner.generate_parameters(i)) for i in range(3)]
    assert generated == [({**BEST, "schedule.warmup_steps": 12}, seed) for seed in (1235, 1236, 1237)]
    assert isinstance(generated[0][0]["schedule.warmup_steps"], int)  # values come back as given
    with pytest.raises(NoMoreTrialError):
        tuner.generate_parameters(3)
    assert split_confirmation({"optimizer.lr": 0.01}) == ({"optimizer.lr": 0.01}, None)  # a tuning trial's


def test_nni_tuners_need_engine_nni(tmp_path):
    """Or the simulated runner, where they run in-process (tests/hpo/simulation/test_nni_tuners.py)."""
    expected = r"tuner.name: nni_tpe runs with engine: nni, or in-process on the simulated runner \(runner: simulated\)"
    with pytest.raises(ExperimentFileError, match=expected):
        spec_of(tmp_path, engine="local", options={})


def test_nni_trials_that_ended_without_a_record_get_the_right_reason(tmp_path):
    from hpo.nni.jobs import _ending
    from hpo.trials import TrialState

    def job(status, seconds):
        return {"status": status, "trialJobId": "AbC12", "startTime": 1_000, "endTime": 1_000 + 1000 * seconds}

    medianstop = spec_of(tmp_path, options={"assessor": "medianstop"})  # trial_timeout_s: 120
    no_assessor = spec_of(tmp_path, options={"assessor": "none"})
    # NNI shows a trial it ended at maxTrialDuration as EARLY_STOPPED: a timeout, not the assessor
    assert _ending(medianstop, job("EARLY_STOPPED", 120), True)[0] == TrialState.TIMEOUT
    state, reason = _ending(medianstop, job("EARLY_STOPPED", 30), True)
    assert state == TrialState.FAILED and "median-stop assessor" in reason
    state, reason = _ending(no_assessor, job("EARLY_STOPPED", 30), True)
    assert state == TrialState.FAILED and reason == "NNI trial AbC12 ended (EARLY_STOPPED) without a final result"
    assert "before it asked for its parameters" in _ending(no_assessor, job("FAILED", 1), False)[1]


def test_the_nni_demo_preset_is_the_cpu_demo_under_nni():
    from hpo.experiment import load_experiment
    from search_spaces import preset_path

    local, nni = (load_experiment(preset_path(n)) for n in ("adam_vs_lamb_demo_cpu", "adam_vs_lamb_demo_cpu_nni"))
    assert nni.engine == "nni" and nni.tuner.name == "nni_smac"
    assert nni.budget.confirm_seeds == "auto"  # confirmation runs: the demo can name a winner
    assert nni.budget.confirmation_rounds == local.budget.confirmation_rounds
    assert nni.space.to_dict() == local.space.to_dict() and nni.compare == local.compare
    assert nni.resolved_base() == local.resolved_base() and nni.budget.trials == local.budget.trials
    assert (nni.objective, nni.resources) == (local.objective, local.resources)
    assert [p.quota for p in arm_plans(nni)] == [5, 5]
