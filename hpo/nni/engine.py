"""The NNI engine: run an experiment as NNI experiments (one per `compare` arm, see `hpo.nni.config`), so the
NNI web UI shows its trials, and view or stop them afterwards.

Data flow. NNI's manager asks its tuner for parameters and starts trial processes (`hpo.nni.trial`); each trial
takes its parameters from NNI, records itself in our database (worker `nni:<NNI trial id>`) and reports to NNI.
This module starts the NNI experiments, prints the web UI address, watches NNI's REST API until an experiment is
done, and reconciles the trials that could not record themselves: a trial that died before it asked for its
parameters gets a row with the parameters NNI generated for it, a trial NNI ended (median-stop assessor, time
limit, stop) gets its ending. A stop (Ctrl-C, SIGTERM, a stop request in the database) stops the NNI experiment;
NNI cannot keep running trials across a restart, so they are recorded as interrupted (as the local engine
records the trials a stop ended), with a reason starting "interrupted:", and not charged to their arm.

Confirmation runs (`budget.confirm_seeds`). Once every arm's tuning is over, the confirmation runs are created
as the local engine creates them (`hpo.nni.confirm`: kind confirmation, the arm's best configuration, the seeds
after its own) and each arm's queued runs are an NNI experiment of their own (`hpo<id>-arm<i>-confirm<n>`, NNI's
GridSearch over the configuration and the seeds, `hpo.nni.config.confirmation_experiment_config`), so the NNI
web UI shows them; its trials run those rows (`hpo.nni.trial`). Under `confirm_seeds: auto` the next round is
created only when every arm finished the current one and the verdict at that look says "not yet".

Resume. A resumed arm is a new NNI experiment (NNI cannot resume running trials) for the arm's share less its
charged trials; its tuner gets another seed and, through NNI's import_data, the arm's completed trials with the
parameters NNI generated for them (read from the earlier NNI experiments' own databases), so it neither repeats
the first run's sequence nor re-runs a completed configuration it was told about. An interrupted tuning trial
cannot be handed to a new NNI trial (the tuner generates every configuration): the resume records it as failed,
its reason still starting "interrupted:" (never charged), and a new trial takes its place. An interrupted
confirmation run is queued again (the same row, its next attempt) and runs in a new confirmation round; finished
ones never run again.

Start-up failures. When an arm's NNI experiment fails before any of its trials started (NNI's manager exits or
does not answer, its tuner cannot be built, the manager stops answering), the error names the cause as NNI's
logs give it; the NNI experiment's files move to `<run dir>/nni/failed-start/<NNI id>` and it leaves the run
directory's list. Under `hpo run`, an experiment that recorded no trial at all is then removed from the
database, so the same `hpo run` starts afresh; otherwise it is failed, and `hpo resume` goes on.

Web UI links. Each time an NNI manager is started or reopened (`hpo webui`), the addresses of the experiment's
NNI web UIs are stored with the experiment (`ExperimentRecord.nni_webui`), where the report and the API read them.

Trial processes. Each NNI trial leads a process group of its own and records it as its pid (see
`hpo.nni.trial`); after a stop, what is left of a trial on this machine is ended by that group and NNI's trial id
in its processes' environment, never by the manager's group.

Secrets. The trial command carries no database URL (NNI shows it in its web UI, REST API and files, and `ps`
shows it to everyone): trials read it from `<run dir>/nni/database.url`, written with mode 0600.

Files: everything NNI writes lives under `<run dir>/nni` (HOME of the NNI manager, which keeps its list of
experiments there); `<run dir>/nni/experiments.json` lists the arms' NNI experiments with their ports.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpo.engine.liveness import Heartbeat
from hpo.engine.local import absolute_database_url, next_commands, print_summary
from hpo.errors import HpoError
from hpo.experiment.arms import ArmPlan, arm_plans
from hpo.nni.config import (
    confirmation_experiment_config,
    confirmation_nni_id,
    database_url_file,
    manager_host,
    nni_experiment_config,
    nni_home,
    nni_id,
    split_confirmation,
    trial_command,
)
from hpo.nni.confirm import queue_round, queued_confirmation, waiting
from hpo.nni.manager import (
    NniEngineError,
    NniExperiment,
    NniLaunchError,
    TunerLog,
    end_trial_processes,
    forget,
    load_experiments,
    log_errors,
    port_taken,
    require_node,
    rest,
    start_experiment,
    stop_all,
    stop_manager,
    view,
)
from hpo.nni.patch import require_patched
from hpo.objective import NOT_TOLD, tuner_feedback
from hpo.runners.resources import discover_gpus
from hpo.storage.base import NNI_WEBUI_KEY, ExperimentStatus
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from search_spaces.nni import from_nni_params

INTERRUPTED = "interrupted: "  # the reason's start of a trial a stop ended (never charged to its arm)
NNI_ERROR = "ended by an NNI error: "  # how `watch` says NNI ended an experiment itself
FAILED_START = "failed-start"  # <run dir>/nni/failed-start/<NNI id>: files of an NNI experiment that ran no trial
ENDED = ("SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED")
WORKER_PREFIX = "nni:"
POLL_S = 1.0
_NO_TUNER = "Tuner did not connect"  # NNI's error when its tuner process is not up within 10 s


# ------------------------------------------------------------------------------------------------ drive
def drive_nni(spec, storage, experiment_id: int, run_dir: Path, database_url: str, quiet: bool,
              resume: bool = False, port: int = 8080) -> int:  # fmt: skip
    """`hpo run` / `hpo resume` under engine nni: heartbeat, run the arms' NNI experiments, final status and
    summary; returns the process exit code."""

    note = {"text": "starting NNI"}
    heartbeat = Heartbeat(storage, experiment_id, note=lambda: note["text"]).start()
    status = ExperimentStatus.FAILED
    failed_start: NniStartError | None = None
    try:
        if resume:
            storage.set_experiment_status(experiment_id, ExperimentStatus.RUNNING)
        with sigterm_stops():
            try:
                ending = run_nni(spec, storage, experiment_id, run_dir, absolute_database_url(database_url),
                                 port=port, quiet=quiet, tick=lambda line: note.update(text=line))  # fmt: skip
            except NniStartError as e:
                failed_start, ending = e, "failed"
        status = ExperimentStatus(ending)
    finally:
        storage.set_experiment_status(experiment_id, status)
        heartbeat.stop()
    if failed_start is not None:
        raise start_failure(spec, storage, experiment_id, failed_start, resume)
    if status is ExperimentStatus.STOPPED:
        print(f"stopped; `hpo resume {spec.name}` runs the trials left", flush=True)
    if not quiet:
        print_summary(storage, experiment_id, spec, database_url)
        hpo = next_commands(database_url)[0]
        print(f"  {hpo} webui {spec.name}                 # browse the trials in the NNI web UI")
    return 0 if status is ExperimentStatus.FINISHED else 1


class NniStartError(NniEngineError):
    """An arm's NNI experiment failed before any of its trials started: its manager did not start or stopped
    answering, or NNI ended it before it ran a trial (a tuner that cannot be built). The message names the
    cause; `retry` is set when NNI only waited too little for a tuner that reported no error (a busy machine)."""

    def __init__(self, message: str, retry: bool = False) -> None:
        super().__init__(message)
        self.retry = retry


def start_failure(spec, storage, experiment_id: int, error: NniStartError, resume: bool) -> NniEngineError:
    """The error `hpo run` / `hpo resume` leaves with when NNI failed before any trial started. A run that
    recorded no trial at all is removed from the database (the NNI experiment's files were moved aside, see
    `_failed_start`), so the same `hpo run` can start over; anything else stays failed for `hpo resume`."""
    if not resume:
        with contextlib.suppress(HpoError):  # a trial that recorded itself meanwhile: the experiment stays
            storage.delete_experiment(experiment_id)
            return NniEngineError(f"{error}\nnothing was recorded: `hpo run` starts {spec.name} afresh once "
                                  "the cause is fixed")  # fmt: skip
    return NniEngineError(f"{error}\n{spec.name} is recorded as failed: `hpo resume {spec.name}` runs the trials "
                          "left once the cause is fixed")  # fmt: skip


class Terminated(KeyboardInterrupt):
    """SIGTERM reached the controller: it stops its NNI experiments as on Ctrl-C."""


@contextlib.contextmanager
def sigterm_stops():
    """While NNI experiments run, SIGTERM stops them as Ctrl-C does (NNI's managers run detached, in process
    groups of their own, so nothing else would end them, their tuners or their trials). The first SIGTERM
    interrupts; later ones are ignored so that they cannot cut the stop short (SIGKILL still ends the process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def interrupt(signum, frame):
        if not received:
            received.append(signum)
            raise Terminated

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ------------------------------------------------------------------------------------------------ run
def preflight() -> None:
    """Refuse, saying what to run, when NNI is missing, its bundled node is missing or cannot run, or its
    manager lacks the fix of `hpo.nni.patch`."""
    require_patched()
    require_node()


def run_nni(
    spec: Any,
    storage: Any,
    experiment_id: int,
    run_dir: Path,
    db_url: str,
    *,
    port: int = 8080,
    quiet: bool = False,
    tick: Callable[[str], None] | None = None,
    command_prefix: str = "",
    command: Callable[[str, int, int, Path, str | None], str] | None = None,
) -> str:
    """Run every arm's NNI experiment (the trials each arm has left) to the end; returns how the experiment
    ended: "finished", "stopped" or "failed".

    `tick(note)` is called at every poll; `command_prefix` is put in front of the trial command (tests use it
    to make a trial die before it asks for parameters). `command(db_url, experiment_id, arm, run_dir, user_home)`
    builds the shell command NNI runs for each trial of an arm (default: the trial entry, see
    `hpo.nni.config.trial_command`, which reads `db_url` from the run directory's user-only file rather than its
    command line; the controller-overhead benchmark runs its dummy trial instead)."""
    preflight()
    run_dir = Path(run_dir)
    nni_home(run_dir).mkdir(parents=True, exist_ok=True)
    write_database_url(run_dir, db_url)
    command = command or (lambda _url, eid, arm, rdir, home: trial_command(eid, arm, rdir, home))
    home = None if spec.resources.machines else _user_home()  # remote trials keep their user's HOME

    def shell(plan: ArmPlan) -> str:
        return command_prefix + command(db_url, experiment_id, plan.index, run_dir, home)

    stop_all(run_dir)  # the managers of a controller that died go on running their NNI experiments: end them
    _interrupt_leftovers(storage, experiment_id, INTERRUPTED + "NNI does not keep running trials across a restart")
    _settle_interrupted(storage, experiment_id)
    on_gpu = _on_gpu(spec)
    for plan in arm_plans(spec):
        plan = dataclasses.replace(plan, quota=plan.quota - _charged(storage, experiment_id, plan))
        if plan.quota <= 0:
            continue
        restart = sum(e.arm == plan.index and not e.confirmation for e in load_experiments(run_dir))
        config = nni_experiment_config(spec, plan, run_dir, shell(plan), Path.cwd(), on_gpu, restart=restart)
        history = finished_history(spec, storage, experiment_id, plan, run_dir)
        ending, jobs = _start_arm(spec, storage, experiment_id, run_dir, plan, config, port, tick, quiet, history)
        if ending != "done":
            return _ended(spec, storage, experiment_id, plan, jobs, ending, confirmation=False)

    def confirm(plan: ArmPlan, runs: list) -> str:  # one NNI experiment of the arm's queued confirmation runs
        config = confirmation_experiment_config(spec, plan, run_dir, shell(plan), Path.cwd(), on_gpu, runs[0].params,
                                                [run.seed for run in runs])  # fmt: skip
        batch = dataclasses.replace(plan, quota=len(runs))
        ending, jobs = _start_arm(spec, storage, experiment_id, run_dir, batch, config, port, tick, quiet,
                                  confirmation=True)  # fmt: skip
        return ending if ending == "done" else _ended(spec, storage, experiment_id, plan, jobs, ending, True)

    return run_confirmations(spec, storage, experiment_id, confirm)


def run_confirmations(spec, storage, experiment_id: int, confirm: Callable[[ArmPlan, list], str]) -> str:
    """Once every arm's tuning is over: the confirmation runs `hpo.nni.confirm.queue_round` creates, round after
    round, until no arm has a queued run left; `confirm(plan, runs)` runs an arm's queued runs of one configuration
    (under `run_nni`, as one NNI experiment) and says how that ended: "done", or "stopped" / "failed", which ends
    the experiment so. A queued run that was not run (its NNI experiment ended without a trial for that seed) is
    recorded as failed, so every round ends. Returns "finished", "stopped" or "failed" as `run_nni`."""
    while True:
        queue_round(spec, storage, experiment_id)
        ran = False
        for plan in arm_plans(spec):
            runs = waiting(storage, experiment_id, plan)
            if not runs:
                continue
            ran = True
            ending = confirm(plan, runs)
            if ending != "done":
                return ending
            _fail_unrun(storage, runs)
        if not ran:
            return "finished"


def _start_arm(spec, storage, experiment_id: int, run_dir: Path, plan: ArmPlan, config: dict, port: int, tick,
               quiet: bool, history: list | None = None, confirmation: bool = False) -> tuple[str, list]:  # fmt: skip
    """`run_arm`, started once more when NNI only waited too little for its tuner (a busy machine)."""
    args = (spec, storage, experiment_id, run_dir, plan, config, port, tick, quiet, history, confirmation)
    try:
        return run_arm(*args)
    except NniStartError as e:
        if not e.retry:
            raise
        _say(quiet, f"{e}; starting the arm's NNI experiment once more")
        return run_arm(*args)


def _ended(spec, storage, experiment_id: int, plan: ArmPlan, jobs: list, ending: str, confirmation: bool) -> str:
    """An arm's NNI experiment that did not finish: its unfinished trials recorded as interrupted; "failed" when
    NNI ended it with an error (said on stderr), else "stopped"."""
    _record_stopped(storage, experiment_id, plan, jobs, f"{INTERRUPTED}the NNI experiment was {ending}", confirmation)
    if ending.startswith(NNI_ERROR):
        print(f"error: {spec.name}{' ' + plan.label if plan.label else ''}: the NNI experiment {ending}",
              file=sys.stderr, flush=True)  # fmt: skip
        return "failed"
    return "stopped"


def _fail_unrun(storage, runs: list) -> None:
    """Queued confirmation runs that their NNI experiment ended without running: failed, with the reason."""
    for run in runs:
        with contextlib.suppress(HpoError):  # it ran (the usual case): its record is closed, or running
            if storage.get_trial(run.id).state is TrialState.QUEUED:
                reason = f"its NNI experiment ended without a trial for seed {run.seed}"
                storage.finish_trial(run.id, TrialResult(TrialState.FAILED, reason))


def run_arm(spec, storage, experiment_id: int, run_dir: Path, plan: ArmPlan, config: dict, port: int, tick,
            quiet: bool, history: list | None = None, confirmation: bool = False) -> tuple[str, list]:  # fmt: skip
    """Start one arm's NNI experiment (its tuning, or with `confirmation` a round of its confirmation runs, as many
    as `plan.quota`), give its tuner the arm's finished trials (`history`, a resume), watch it to its end and stop
    its manager; returns how it ended (see `watch`) and, unless it is done, NNI's trial jobs as last seen."""
    experiment = NniExperiment(plan.index, plan.label, _new_nni_id(run_dir, experiment_id, plan.index, confirmation),
                               host=manager_host(spec), confirmation=confirmation)  # fmt: skip
    busy = port_taken(port, experiment.host)
    try:
        start_experiment(run_dir, experiment, config, port)
    except NniLaunchError as e:
        raise _failed_start(run_dir, experiment, e.cause) from None
    except NniEngineError as e:  # no free port
        raise _failed_start(run_dir, experiment, str(e)) from None
    record_webui(storage, experiment_id, run_dir)
    if busy:
        _say(quiet, f"port {port}: {busy}; the NNI web UI takes port {experiment.port}")
    runs = f"{plan.quota} confirmation runs" if confirmation else f"{plan.quota} trials"
    _say(quiet, f"{spec.name}{' ' + plan.label if plan.label else ''}: NNI web UI at {experiment.url} "
                f"(NNI experiment {experiment.nni_id}, {runs})")  # fmt: skip
    trials_before = storage.count_trials(experiment_id)
    logs = nni_home(run_dir) / "nni-experiments" / experiment.nni_id / "log"
    tuner = TunerLog(logs)
    ending = "stopped by an error of the engine"
    try:
        if history:
            import_history(experiment, history, tuner=tuner)
            _say(quiet, f"gave NNI's tuner the {len(history)} finished trial(s) of the earlier run")
        ending = watch(spec, storage, experiment_id, plan, experiment, tick, quiet, tuner)
    except NniEngineError as e:  # the manager stopped answering
        ending = NNI_ERROR + str(e)
    except Terminated:
        ending = "stopped by SIGTERM"
    except KeyboardInterrupt:
        ending = "stopped by the user (Ctrl-C)"
    finally:  # never leave an NNI manager behind
        jobs = _jobs_or_none(experiment) if ending != "done" else []
        stop_manager(run_dir, experiment)
    if ending.startswith(NNI_ERROR) and not jobs and storage.count_trials(experiment_id) == trials_before:
        said = log_errors(logs)
        slow_tuner = _NO_TUNER in ending and not tuner.error()  # the tuner only started too slowly for NNI
        error = _failed_start(run_dir, experiment, said or ending.removeprefix(NNI_ERROR), retry=slow_tuner)
        record_webui(storage, experiment_id, run_dir)  # the stored links lose it with the run directory's list
        raise error
    return ending, jobs


def _failed_start(run_dir: Path, experiment: NniExperiment, cause: str, retry: bool = False) -> NniStartError:
    """An arm's NNI experiment that ran no trial: its files move to `<run dir>/nni/failed-start/<NNI id>` and it
    leaves the run directory's list, so the next start neither counts it as an earlier run of the arm (another
    tuner seed) nor meets its files; the error names the cause and where NNI's logs of it are."""
    forget(run_dir, experiment)
    source = nni_home(run_dir) / "nni-experiments" / experiment.nni_id
    kept = nni_home(run_dir) / FAILED_START / experiment.nni_id
    message = f"NNI experiment {experiment.nni_id} failed before any trial started: {cause}"
    if source.exists():
        shutil.rmtree(kept, ignore_errors=True)
        kept.parent.mkdir(parents=True, exist_ok=True)
        source.rename(kept)
        message += f"\n(NNI's logs: {kept / 'log'}, {nni_home(run_dir) / 'launch.log'})"
    return NniStartError(message, retry=retry)


def record_webui(storage, experiment_id: int, run_dir: Path) -> list[dict[str, Any]]:
    """Store where the NNI web UI of each of the experiment's NNI experiments was last served (read back as
    `ExperimentRecord.nni_webui`), for the report and the API; returns it."""
    links = [{"arm": e.label, "nni_experiment": e.nni_id, "url": e.url} for e in load_experiments(run_dir) if e.port]
    storage.annotate_experiment(experiment_id, NNI_WEBUI_KEY, links)
    return links


def _jobs_or_none(experiment: NniExperiment) -> list:
    with contextlib.suppress(HpoError):
        return rest(experiment.port, "trial-jobs")
    return []


def _record_stopped(storage, experiment_id: int, plan: ArmPlan, jobs: list, reason: str,
                    confirmation: bool = False) -> None:  # fmt: skip
    """After a stop: a trial NNI had started that had not recorded itself yet gets its row (`_adopt`); then every
    unfinished trial of NNI's is recorded as interrupted with the reason (NNI cannot resume them)."""
    workers = {t.worker for t in storage.list_trials(experiment_id)}
    for job in jobs:
        if job.get("status") == "RUNNING" and WORKER_PREFIX + job["trialJobId"] not in workers:
            _adopt(storage, experiment_id, plan, job, confirmation)
    _interrupt_leftovers(storage, experiment_id, reason)


def _adopt(storage, experiment_id: int, plan: ArmPlan, job: dict, confirmation: bool) -> int | None:
    """The trial of an NNI trial job that did not record itself, marked running under the job's worker: a new
    tuning trial with the parameters NNI generated for it, or (a confirmation round) the queued confirmation run
    with the seed and configuration NNI gave it; None when there is none (no parameters, or no longer queued)."""
    if confirmation:
        params, seed = split_confirmation(_generated(job))
        run = queued_confirmation(storage, experiment_id, plan.label, seed, params) if seed is not None else None
        if run is None:
            return None
        trial_id = run.id
    else:
        trial_id = storage.create_trial(experiment_id, TrialSpec(None, job_params(job, plan), plan.label))
    with contextlib.suppress(HpoError):  # the trial claimed its confirmation run just now: it runs under the worker
        storage.mark_trial_running(trial_id, worker=WORKER_PREFIX + job["trialJobId"])
    return trial_id


def write_database_url(run_dir: Path, db_url: str) -> Path:
    """Write the database URL where the NNI trials read it, readable by this user only (it may hold a password,
    and NNI shows a trial's command line to anyone who reaches its web UI)."""
    path = database_url_file(run_dir)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file left from before keeps its mode through O_CREAT
    with os.fdopen(fd, "w") as f:
        f.write(db_url)
    return path


def _charged(storage, experiment_id: int, plan: ArmPlan) -> int:
    """The arm's tuning trials that count against its share: finished, except those a stop interrupted (NNI
    cannot resume them; a new trial takes the place of each)."""
    finished = [s for s in TrialState if s.finished]
    rows = storage.list_trials(experiment_id, state=finished, arm=plan.label)
    return sum(row.kind is TrialKind.TUNING and row.arm == plan.label and not interrupted(row) for row in rows)


def interrupted(row) -> bool:
    """Whether a trial of the NNI engine was ended by a stop of its NNI experiment (never charged): INTERRUPTED,
    or, a tuning trial a resume replaced by a new one, failed with a reason starting "interrupted: "."""
    replaced = row.state is TrialState.FAILED and (row.reason or "").startswith(INTERRUPTED)
    return row.state is TrialState.INTERRUPTED or replaced


REPLACED = "; a resume replaced it by a new trial (NNI's tuner generates every configuration of an arm)"


def _settle_interrupted(storage, experiment_id: int) -> None:
    """What a resume does with the trials a stop interrupted (NNI cannot resume an NNI trial): a confirmation run
    is queued again as its next attempt (the same configuration and seed: `run_confirmations` runs it); a tuning
    trial cannot be handed to a new NNI trial, so it is recorded as failed with its reason ("interrupted: ...",
    never charged to its arm, see `interrupted`) and a new trial of the arm's tuner takes its place."""
    for row in storage.list_trials(experiment_id, state=TrialState.INTERRUPTED):
        reason = row.reason if (row.reason or "").startswith(INTERRUPTED) else INTERRUPTED + (row.reason or "a stop")
        with contextlib.suppress(HpoError):  # another controller settled it meanwhile
            if row.kind is TrialKind.CONFIRMATION:
                storage.requeue_trial(row.id, row.attempt, f"{reason}; re-queued")
            else:
                storage.finish_trial(row.id, TrialResult(TrialState.FAILED, reason + REPLACED))


def finished_history(spec, storage, experiment_id: int, plan: ArmPlan, run_dir: Path) -> list[dict[str, Any]]:
    """The arm's trials that gave its tuner a result, as NNI's import_data takes them: {"parameter": the
    parameters in NNI's form, as NNI generated them, "value": the final result the trial reported}."""
    generated = generated_parameters(run_dir, plan.index)
    history = []
    for row in storage.list_trials(experiment_id, state=TrialState.COMPLETED, arm=plan.label):
        told = tuner_feedback(spec, row.state, row.objective, row.metrics)
        job = (row.worker or "").removeprefix(WORKER_PREFIX)
        if row.kind is not TrialKind.TUNING or told is None or told is NOT_TOLD or job not in generated:
            continue
        history.append({"parameter": generated[job], "value": row.objective})
    return history


def generated_parameters(run_dir: Path, arm: int) -> dict[str, Any]:
    """{NNI trial id: its parameters in NNI's form} over the arm's earlier tuning NNI experiments, read from NNI's
    own database of each (`<experiment working dir>/<NNI id>/db/nni.sqlite`; their managers are stopped)."""
    found: dict[str, Any] = {}
    for experiment in load_experiments(run_dir):
        path = nni_home(run_dir) / "nni-experiments" / experiment.nni_id / "db" / "nni.sqlite"
        if experiment.arm != arm or experiment.confirmation or not path.exists():
            continue
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            events = db.execute("SELECT trialJobId, data FROM TrialJobEvent WHERE data LIKE '%\"parameters\"%'")
            for job, data in events:
                found.setdefault(job, json.loads(data)["parameters"])
    return found


def import_history(experiment: NniExperiment, history: list[dict[str, Any]], wait_s: float = 60.0,
                   tuner: TunerLog | None = None) -> None:  # fmt: skip
    """Send finished trials to the NNI experiment's tuner (NNI's import_data); NNI refuses until the tuner
    process is up, so this retries for up to `wait_s` (not once the `tuner`'s log shows an error)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            rest(experiment.port, "experiment/import-data", method="POST", body=history)
            return
        except NniEngineError:
            failed = tuner.error() if tuner is not None else None
            if failed:
                raise NniEngineError(f"its tuner failed: {failed}") from None
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _new_nni_id(run_dir: Path, experiment_id: int, arm: int, confirmation: bool = False) -> str:
    """The arm's NNI experiment id; a resumed arm gets a new one (`-r1`, `-r2`, ...), and each round of its
    confirmation runs one of its own (`-confirm1`, `-confirm2`, ...)."""
    taken = {e.nni_id for e in load_experiments(run_dir)}
    base = nni_id(experiment_id, arm)
    if confirmation:
        candidates = [confirmation_nni_id(experiment_id, arm, n) for n in range(1, len(taken) + 2)]
    else:
        candidates = [base] + [f"{base}-r{n}" for n in range(1, len(taken) + 2)]
    return next(c for c in candidates if c not in taken)


def watch(spec, storage, experiment_id: int, plan: ArmPlan, experiment: NniExperiment, tick, quiet: bool,
          tuner: TunerLog | None = None) -> str:  # fmt: skip
    """Poll NNI until the arm's experiment is done: "done", a stop reason, or "ended by an NNI error: ...". With
    the `tuner`'s log, an error of the tuner or the assessor ends it (NNI would go on RUNNING without them and
    start no more trials, or wait 10 s for a tuner that could not be built)."""
    reported = -1
    what = plan.label or "trials"
    if experiment.confirmation:
        what = f"{plan.label} confirmation runs" if plan.label else "confirmation runs"
    while True:
        status = rest(experiment.port, "check-status")
        jobs = rest(experiment.port, "trial-jobs")
        done = reconcile(spec, storage, experiment_id, plan, experiment, jobs)
        note = f"{what}: {done}/{plan.quota} done, NNI {status['status'].lower()}"
        if tick is not None:
            tick(note)
        if done != reported:
            _say(quiet, note)
            reported = done
        if status["status"] in ("DONE", "STOPPED") and done >= min(plan.quota, len(jobs)):
            return "done"
        if status["status"] == "ERROR":
            errors = "; ".join(str(e) for e in status.get("errors", [])) or "no message"
            return NNI_ERROR + errors
        if storage.is_stop_requested(experiment_id):
            return "stopped on request"
        failed = tuner.error() if tuner is not None else None
        if failed:
            return f"{NNI_ERROR}its tuner failed: {failed}"
        time.sleep(POLL_S)


def reconcile(spec, storage, experiment_id: int, plan: ArmPlan, experiment: NniExperiment, jobs: list) -> int:
    """Record NNI trials that ended without recording themselves (one that never recorded a row gets it from
    `_adopt`); returns how many of the NNI experiment's trials ended."""
    by_worker = {t.worker: t for t in storage.list_trials(experiment_id) if t.worker}
    ended = 0
    for job in jobs:
        if job.get("status") not in ENDED:
            continue
        ended += 1
        record = by_worker.get(WORKER_PREFIX + job["trialJobId"])
        if record is not None and record.state.finished:
            continue
        result = TrialResult(*_ending(spec, job, record is not None))
        trial_id = record.id if record else _adopt(storage, experiment_id, plan, job, experiment.confirmation)
        if trial_id is not None:
            storage.finish_trial(trial_id, result)
    return ended


def _ending(spec, job: dict, recorded: bool) -> tuple[TrialState, str]:
    """The state and reason of an NNI trial that ended without a final record in our database."""
    status, trial = job["status"], job["trialJobId"]
    seconds = (job.get("endTime", 0) - job.get("startTime", job.get("endTime", 0))) / 1000
    timeout = spec.budget.trial_timeout_s
    if timeout and seconds >= timeout:  # NNI shows a trial it ended at maxTrialDuration as EARLY_STOPPED too
        return TrialState.TIMEOUT, f"NNI ended trial {trial} at budget.trial_timeout_s ({timeout:g} s)"
    if status == "EARLY_STOPPED" and spec.tuner.options.get("assessor", "medianstop") == "medianstop":
        return TrialState.FAILED, "stopped early by NNI's median-stop assessor (its accuracy was below the median)"
    if not recorded:
        return TrialState.FAILED, f"NNI trial {trial} ended ({status}) before it asked for its parameters"
    return TrialState.FAILED, f"NNI trial {trial} ended ({status}) without a final result"


def job_params(job: dict, plan: ArmPlan) -> dict[str, Any]:
    """The parameters NNI recorded for a trial job of a tuning NNI experiment, flattened to our names, with the
    arm's fixed values."""
    generated = _generated(job)
    if not generated:
        return dict(plan.fixed)
    return {**plan.fixed, **from_nni_params(generated, plan.space)}


def _generated(job: dict) -> dict[str, Any]:
    """The parameters (in NNI's form) NNI generated for a trial job; {} when it recorded none."""
    raw = job.get("hyperParameters") or []
    return json.loads(raw[0])["parameters"] if raw else {}


def _interrupt_leftovers(storage, experiment_id: int, reason: str) -> None:
    """Trials of NNI experiments that were stopped cannot go on: end what is left of those that ran on this
    machine (their NNI managers are stopped, but one that was killed leaves its trials running), then record
    them as interrupted with the reason, as the local engine records the trials a stop ended."""
    here = socket.gethostname()
    for record in storage.list_trials(experiment_id, state=[TrialState.QUEUED, TrialState.RUNNING]):
        if (record.worker or "").startswith(WORKER_PREFIX):
            if record.host in (None, here):  # None: it had not recorded itself (no pid either)
                end_trial_processes(record.worker.removeprefix(WORKER_PREFIX), record.pid if record.host else None)
            with contextlib.suppress(HpoError):  # it may have finished meanwhile
                storage.interrupt_trial(record.id, reason)


def _on_gpu(spec) -> bool:
    if spec.resources.gpus == "none":
        return False
    if spec.resources.machines:  # NNI's remote training service finds the machines' GPUs
        return True

    return bool(discover_gpus())


def _user_home() -> str:
    return os.environ.get("HOME") or str(Path.home())


def _say(quiet: bool, line: str) -> None:
    if not quiet:
        print(line, flush=True)


# ------------------------------------------------------------------------------------------------ webui
def webui(record, stop: bool = False, port: int = 8080, storage=None) -> int:
    """`hpo webui NAME [--stop]`: reopen an NNI experiment's web UI in view mode (or close it); exit code. With
    `storage`, the addresses it opens are stored (`record_webui`), so the report and the API link to them."""

    name = record.name
    if record.spec["experiment"].get("engine") != "nni":
        raise HpoError(f"experiment {name!r} ran under engine: local; the NNI web UI shows engine: nni "
                       f"experiments (`hpo trials {name}` lists its trials)")  # fmt: skip
    run_dir = Path(record.spec["run_dir"])
    if stop:
        stopped = stop_all(run_dir)
        print(f"closed the NNI web UI of {name} ({len(stopped)} NNI experiment(s))" if stopped else
              f"the NNI web UI of {name} is not open")  # fmt: skip
        return 0
    experiments = view(run_dir, port)
    if not experiments:
        raise HpoError(f"experiment {name!r} has no NNI experiment in {run_dir / 'nni'}; it never started under NNI")
    if storage is not None:
        record_webui(storage, record.id, run_dir)
    for e in experiments:
        print(f"{name}{' ' + e.label if e.label else ''}: NNI web UI at {e.url} (NNI experiment {e.nni_id})")
    print(f"`hpo webui {name} --stop` closes it")
    return 0
