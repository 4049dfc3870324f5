"""What an experiment file becomes under `engine: nni`: one NNI experiment per `compare` arm, and its config.

Arms. Each arm is its own NNI experiment over the arm's sub-space (compare keys fixed), with the arm's equal
share of `budget.trials` as NNI's `maxTrialNumber`; the arms run one after another, each with the experiment's
full concurrency and resources. So every arm gets the same trial budget and its own tuner (as under the local
engine), and the median-stop assessor compares a trial only with trials of its own arm: one NNI experiment over
all arms would let the slower-learning arm's trials be stopped because of the other arm's curves.

Tuners (`tuner.name`): NNI's built-in TPE, Random, Anneal (hyperopt) and Evolution, and `nni_smac`, SMAC3's
Bayesian optimization running inside NNI as a custom tuner (`hpo.nni.smac_tuner`), which reads our own search
space, conditions included. Each gets `tuner.seed` (with the arm's index and a resume's count added); NNI's
Anneal and Evolution take no seed, so they run as custom tuners that seed them (`hpo.nni.seeded`). NNI's GP and
Metis tuners are not offered: both fail on the search spaces here
(GP cannot take nested choices, Metis takes no log scales or nested choices), and NNI's own SMAC tuner needs
SMAC 0.x.

`tuner.options` under engine nni: `assessor` (`medianstop`, the default, or `none`), `assessor_start_step`
(intermediate results a trial reports before the assessor may stop it; default 2), `webui_host` (the address
NNI's manager, its web UI and REST API, listens on; see `manager_host`), `population_size` (nni_evolution) and
`n_initial_configs` (nni_smac). Anything else is refused.

Confirmation runs (`budget.confirm_seeds`). Each arm's best configuration re-run with other training seeds is
an NNI experiment of its own per arm and round (`confirmation_experiment_config`): NNI's GridSearch tuner over a
space of single-value choices (the configuration, so the web UI shows it) and a choice of the round's seeds
(`CONFIRMATION_SEED`), one trial per seed, without an assessor (every run is evidence, see `hpo.evidence.verdict`).

Machines. Without `resources.machines` the trials run on this machine (NNI's local training service, with
`gpuIndices` / `trialGpuNumber` / `maxTrialNumberPerGpu` from `resources`). With machines listed they run on
those (NNI's remote training service over SSH with a key; per machine its GPU ids): each machine needs this
project installed (its `python_path`), the run directory's path writable, and the database reachable, so a
SQLite file is refused (`check_remote`).

This module is pure: it builds plain mappings and never imports nni.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import hpo
from hpo.errors import ExperimentFileError, ResourceError
from search_spaces.nni import to_nni

# `plan` below is an hpo.experiment.arms.ArmPlan, not imported: hpo.experiment's checks import this module

NNI_TUNERS = ("nni_tpe", "nni_random", "nni_anneal", "nni_evolution", "nni_smac")
# NNI built-in tuner name of each of our tuner names (nni_smac is a custom tuner).
_BUILTIN = {"nni_tpe": "TPE", "nni_random": "Random"}
SEEDED_TUNER_CLASSES = {"nni_anneal": "hpo.nni.seeded.SeededAnneal", "nni_evolution": "hpo.nni.seeded.ManagerEvolution"}
_COMMON_OPTIONS = ("assessor", "assessor_start_step", "webui_host")
_OPTIONS = {"nni_evolution": ("population_size",), "nni_smac": ("n_initial_configs",)}
SMAC_TUNER_CLASS = "hpo.nni.smac_tuner.SmacTuner"


def check_nni_spec(spec: Any, source: str) -> None:
    """Refuse, naming the field, what the NNI engine cannot run or would ignore."""
    name = spec.tuner.name
    if name not in NNI_TUNERS:
        suggestion = {"smac_bo": "nni_smac", "random": "nni_random"}.get(name, "nni_smac or nni_tpe")
        raise ExperimentFileError(
            f"{source}: tuner.name: engine: nni runs NNI's tuners ({', '.join(NNI_TUNERS)}); "
            f"{name} runs under engine: local. Use {suggestion}"
        )
    allowed = _COMMON_OPTIONS + _OPTIONS.get(name, ())
    for key in spec.tuner.options:
        if key not in allowed:
            raise ExperimentFileError(f"{source}: tuner.options.{key}: not an option of {name} under engine: nni "
                                      f"(it understands {', '.join(allowed)}); remove it")  # fmt: skip
    assessor = spec.tuner.options.get("assessor", "medianstop")
    if assessor not in ("medianstop", "none"):
        raise ExperimentFileError(f"{source}: tuner.options.assessor: {assessor!r}; use medianstop or none")
    _check_whole_numbers(spec, source)
    host = spec.tuner.options.get("webui_host")
    if host is not None and (not isinstance(host, str) or not host.strip()):
        raise ExperimentFileError(f"{source}: tuner.options.webui_host: {host!r}; use an address of this machine "
                                  "such as 127.0.0.1 (the default) or 0.0.0.0 (every interface)")  # fmt: skip
    runner = getattr(spec, "runner", None)
    if runner is not None and runner.name != "local":
        raise ExperimentFileError(f"{source}: runner.name: {runner.name} runs engine: local trials; NNI's own "
                                  "training service runs engine: nni trials (remove runner)")  # fmt: skip
    res = spec.resources
    if res.gpus_per_trial > 1 or res.cpu_ranks_per_trial > 1:
        raise ExperimentFileError(
            f"{source}: resources: engine: nni runs single-rank trials (gpus_per_trial: 1, cpu_ranks_per_trial: 1); "
            "multi-rank trials run under engine: local"
        )
    if res.memory_limit_mb is not None:
        raise ExperimentFileError(
            f"{source}: resources.memory_limit_mb: NNI's training service cannot limit a trial's memory; "
            "remove it or use engine: local"
        )


# Whole-number options under engine nni and the values each takes: from NNI's own class-argument checks (Medianstop's
# start_step 0..9999, Evolution's population_size up to 99999), less what fails or means nothing once NNI runs it
# (population_size 0: "RuntimeError: The population is empty"; no initial design for SMAC, as under smac_bo).
_WHOLE_NUMBER_OPTIONS = {"assessor_start_step": (0, 9999), "population_size": (1, 99999),
                         "n_initial_configs": (1, None)}  # fmt: skip


def _check_whole_numbers(spec: Any, source: str) -> None:
    """The whole-number options, which NNI's manager would pass on unchecked: a wrong one fails (or asks for
    something else) only once the tuner or assessor runs, after the experiment was written."""
    options = spec.tuner.options
    for key, (low, high) in _WHOLE_NUMBER_OPTIONS.items():
        if key not in options:
            continue
        value = options[key]
        whole = isinstance(value, int) and not isinstance(value, bool)
        if not whole or value < low or (high is not None and value > high):
            span = f"from {low} to {high}" if high is not None else f">= {low}"
            raise ExperimentFileError(f"{source}: tuner.options.{key}: expected a whole number {span} (got {value!r})")
    if "assessor_start_step" in options and options.get("assessor", "medianstop") == "none":
        raise ExperimentFileError(f"{source}: tuner.options.assessor_start_step: applies to the medianstop assessor, "
                                  "and assessor is none; remove it or use assessor: medianstop")  # fmt: skip


INTERRUPTED = "interrupted: "  # the reason's start of a trial a stop ended (never charged to its arm)


def replaced_by_resume(kind: str, state: str, reason: str | None) -> bool:
    """Whether a trial row (its kind, state and reason, as stored) is a tuning trial a stop interrupted and a resume
    replaced by a new trial (see `hpo.nni.jobs.settle_interrupted`): never charged to its arm, so it is no trial of
    the arm's budget.trials share, which the new trial fills."""
    return kind == "tuning" and state == "failed" and (reason or "").startswith(INTERRUPTED)


def nni_id(experiment_id: int, arm: int) -> str:
    """The NNI experiment id of an arm (unique within the experiment's run directory)."""
    return f"hpo{experiment_id}-arm{arm}"


TRIAL_MODULE = "hpo.nni.trial"


def trial_command(experiment_id: int, arm: int, run_dir: Path, user_home: str | None,
                  module: str = TRIAL_MODULE) -> str:  # fmt: skip
    """The shell command NNI runs for every trial: our trial entry, with the user's HOME back (NNI's manager
    runs with HOME in the run directory, where it keeps its experiment list). It carries no database URL: NNI
    shows the command in its web UI, its REST API and `ps`, so the trial reads the URL from the run directory's
    user-only file (`database_url_file`). `module` is the Python module run with `-m`; another one must take the
    trial entry's arguments (the controller-overhead benchmark's dummy trial does). For remote machines
    (`user_home` None) the command runs the machine's `python3` (NNI puts the machine's `python_path` first on
    PATH) and keeps the remote user's HOME."""
    python = sys.executable if user_home is not None else "python3"
    args = [python, "-m", module, "--experiment-id", str(experiment_id), "--arm", str(arm), "--run-dir", str(run_dir)]
    command = " ".join(shlex.quote(a) for a in args)
    return command if user_home is None else f"HOME={shlex.quote(user_home)} {command}"


def manager_host(spec: Any) -> str | None:
    """The address NNI's manager listens on: `tuner.options.webui_host`, else 127.0.0.1 (NNI's web UI and REST
    API have no login, and show every trial), except with `resources.machines`, whose trials report back to the
    manager over the network: then every interface (None, NNI's own default)."""
    host = spec.tuner.options.get("webui_host")
    if host is not None:
        return None if host in ("0.0.0.0", "::", "*") else host
    return None if spec.resources.machines else "127.0.0.1"


def database_url_file(run_dir: Path) -> Path:
    """The file (mode 0600) from which NNI trials read the database URL, kept out of NNI's view."""
    return nni_home(run_dir) / "database.url"


def nni_experiment_config(
    spec: Any, plan: Any, run_dir: Path, command: str, code_dir: Path, on_gpu: bool, restart: int = 0
) -> dict[str, Any]:
    """NNI's experiment config (the camelCase mapping `nni.experiment.ExperimentConfig(**config)` takes).
    `restart` counts the arm's earlier NNI experiments (a resume): its tuner gets another seed, so that it does
    not propose the first run's sequence again (the finished trials reach it through NNI's import_data)."""
    budget, res = spec.budget, spec.resources
    if res.machines:
        per_gpu = res.trials_per_gpu if on_gpu else 1
        machines = [_machine(m, per_gpu) for m in res.machines]
        service: dict[str, Any] = {"platform": "remote", "reuseMode": False, "machineList": machines}
    else:
        service = {"platform": "local", "useActiveGpu": True}
    if on_gpu and res.machines:  # per machine: its GPU ids and trials per GPU (`_machine`)
        service["trialGpuNumber"] = res.gpus_per_trial
        concurrency = budget.max_parallel
    elif on_gpu:
        service.update(trialGpuNumber=res.gpus_per_trial, maxTrialNumberPerGpu=res.trials_per_gpu)
        if isinstance(res.gpus, list):
            service["gpuIndices"] = list(res.gpus)
        concurrency = budget.max_parallel
    else:
        service["trialGpuNumber"] = 0
        concurrency = min(budget.max_parallel, res.cpu_slots * max(1, len(res.machines)))
    config: dict[str, Any] = {
        "experimentName": f"{spec.name} {plan.label}" if plan.label else spec.name,
        "searchSpace": to_nni(plan.space),
        "trialCommand": command,
        "trialCodeDirectory": str(code_dir),
        "trialConcurrency": concurrency,
        "maxTrialNumber": plan.quota,
        "tuner": _tuner(spec, plan, run_dir, restart),
        "trainingService": service,
        "experimentWorkingDirectory": str(nni_home(run_dir) / "nni-experiments"),
    }
    if budget.trial_timeout_s:
        config["maxTrialDuration"] = f"{math.ceil(budget.trial_timeout_s)}s"
    if spec.tuner.options.get("assessor", "medianstop") == "medianstop":
        start = int(spec.tuner.options.get("assessor_start_step", 2))
        config["assessor"] = {"name": "Medianstop", "classArgs": {"optimize_mode": "maximize", "start_step": start}}
    return config


CONFIRMATION_SEED = "confirmation_seed"  # the NNI parameter that carries a confirmation run's training seed
CONFIRMATION_TUNER = "GridSearch"  # NNI's tuner that hands out each point of a finite space once, in order


def confirmation_nni_id(experiment_id: int, arm: int, n: int) -> str:
    """The NNI experiment id of an arm's `n`-th confirmation round (1, 2, ...; a resume starts another)."""
    return f"{nni_id(experiment_id, arm)}-confirm{n}"


def confirmation_search_space(params: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, Any]:
    """The NNI search space of one arm's confirmation round: each parameter of the configuration as a choice of its
    one value (the web UI shows the configuration), and the round's training seeds, so that GridSearch generates
    one parameter set per seed, in the seeds' order."""
    space: dict[str, Any] = {name: {"_type": "choice", "_value": [value]} for name, value in params.items()}
    space[CONFIRMATION_SEED] = {"_type": "choice", "_value": list(seeds)}
    return space


def confirmation_experiment_config(spec: Any, plan: Any, run_dir: Path, command: str, code_dir: Path, on_gpu: bool,
                                   params: Mapping[str, Any], seeds: Sequence[int]) -> dict[str, Any]:  # fmt: skip
    """NNI's experiment config of one arm's confirmation round: the arm's trial command, resources and time limit
    (`nni_experiment_config`), the configuration and the seeds as its space (`confirmation_search_space`), NNI's
    GridSearch tuner, one trial per seed, and no assessor (a confirmation run is evidence: it runs to its end)."""
    if not seeds:
        raise ValueError(f"a confirmation round of {plan.label or 'the experiment'} needs at least one seed")
    config = nni_experiment_config(spec, plan, run_dir, command, code_dir, on_gpu)
    config.pop("assessor", None)
    config.update(
        experimentName=f"{config['experimentName']} confirmations",
        searchSpace=confirmation_search_space(params, seeds),
        maxTrialNumber=len(seeds),
        trialConcurrency=min(config["trialConcurrency"], len(seeds)),
        tuner={"name": CONFIRMATION_TUNER},
    )
    return config


def split_confirmation(generated: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The parameters NNI generated for a trial, as (the configuration, its confirmation seed): the seed is None
    for a tuning trial (its tuner's space has no `CONFIRMATION_SEED`)."""
    params = dict(generated)
    return params, params.pop(CONFIRMATION_SEED, None)


def _machine(machine: Any, trials_per_gpu: int) -> dict[str, Any]:
    """NNI's RemoteMachineConfig of one `resources.machines` entry (a key, never a password)."""
    entry: dict[str, Any] = {"host": machine.host, "port": machine.port, "user": machine.user,
                             "sshKeyFile": str(Path(machine.ssh_key_file).expanduser()), "useActiveGpu": True,
                             "maxTrialNumberPerGpu": trials_per_gpu}  # fmt: skip
    if machine.python_path:
        entry["pythonPath"] = machine.python_path
    if machine.gpus is not None:
        entry["gpuIndices"] = list(machine.gpus)
    return entry


def check_remote(spec: Any, db_url: str) -> None:
    """Before anything is written: what remote trials need from this controller (raises ResourceError)."""
    machines = spec.resources.machines
    if not machines:
        return
    if db_url.startswith("sqlite"):
        raise ResourceError(
            f"{spec.source}: resources.machines: trials on other machines record themselves in the database, and "
            f"{db_url} is a file on this one; use a server database they can reach (--db postgresql+psycopg://USER@HOST/DB)"
        )
    for i, machine in enumerate(machines):
        key = Path(machine.ssh_key_file).expanduser()
        if not key.is_file():
            raise ResourceError(f"{spec.source}: resources.machines[{i}].ssh_key_file: {key} is not a file; NNI "
                                f"reaches {machine.user}@{machine.host} over SSH with a private key")  # fmt: skip


RESTART_SEED_STEP = 7919  # a resumed arm's tuner seed: seed + arm + this * restart (never another arm's seed)


def _tuner(spec: Any, plan: Any, run_dir: Path, restart: int = 0) -> dict[str, Any]:
    name, options = spec.tuner.name, spec.tuner.options
    seed = spec.tuner.seed + plan.index + RESTART_SEED_STEP * restart
    if name == "nni_smac":
        folder = f"arm{plan.index}" + (f"-r{restart}" if restart else "")
        args = {"space": plan.space.to_dict(), "seed": seed, "n_trials": plan.quota, "optimize_mode": spec.direction,
                "output_dir": str(nni_home(run_dir) / "smac" / folder),
                "n_initial_configs": options.get("n_initial_configs")}  # fmt: skip
        return {"className": SMAC_TUNER_CLASS, "codeDirectory": str(Path(hpo.__file__).parent.parent),
                "classArgs": args}  # fmt: skip
    args = {"optimize_mode": spec.direction, "seed": seed}
    if name in SEEDED_TUNER_CLASSES:  # NNI's own, which take no seed, seeded (hpo.nni.seeded)
        if name == "nni_evolution":
            args["population_size"] = int(options.get("population_size", default_population(plan.quota)))
        return {"className": SEEDED_TUNER_CLASSES[name], "codeDirectory": str(Path(hpo.__file__).parent.parent),
                "classArgs": args}  # fmt: skip
    return {"name": _BUILTIN[name], "classArgs": args}


def default_population(quota: int) -> int:
    """nni_evolution's population_size when the file sets none: half the arm's trials, between 2 and 32."""
    return max(2, min(32, quota // 2))


def nni_home(run_dir: Path) -> Path:
    """Where NNI's files of an experiment live: its HOME (experiment list) and experiment directories."""
    return Path(run_dir) / "nni"
