"""NNI's trial jobs as our database records them: watching an arm's NNI experiment until it is done, reconciling the
jobs that could not record themselves (a trial that died before it asked for its parameters gets a row with the
parameters NNI generated for it; a job NNI ended gets its ending), settling what a stop interrupted, and the history
a resumed arm's tuner is told (the parameters NNI generated, read from the earlier NNI experiments' databases).
`hpo.nni.engine` starts and stops the NNI experiments; this module only reads NNI and writes trial rows.
"""

import contextlib
import json
import os
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

from hpo.errors import HpoError
from hpo.experiment.arms import ArmPlan
from hpo.nni.config import (
    INTERRUPTED,
    confirmation_nni_id,
    database_url_file,
    nni_home,
    nni_id,
    split_confirmation,
)
from hpo.nni.confirm import queued_confirmation
from hpo.nni.manager import (
    NniEngineError,
    NniExperiment,
    TunerLog,
    end_trial_processes,
    load_experiments,
    rest,
)
from hpo.objective import NOT_TOLD, tuner_feedback
from hpo.runners.resources import discover_gpus, select_gpus
from hpo.storage.base import NNI_WEBUI_KEY
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from search_spaces.nni import from_nni_params

DISK_FULL = INTERRUPTED + "its disk is full: "  # a trial that could not write for a full disk (`hpo.nni.trial`)
STOPPED_FOR_DISK = "stopped for a full disk: "  # how `watch` says an arm's NNI experiment ended for one
NNI_ERROR = "ended by an NNI error: "  # how `watch` says NNI ended an experiment itself
FAILED_START = "failed-start"  # <run dir>/nni/failed-start/<NNI id>: files of an NNI experiment that ran no trial
ENDED = ("SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED")
WORKER_PREFIX = "nni:"
POLL_S = 1.0
NO_TUNER = "Tuner did not connect"  # NNI's error when its tuner process is not up within 10 s


def record_webui(storage, experiment_id: int, run_dir: Path) -> list[dict[str, Any]]:
    """Store where the NNI web UI of each of the experiment's NNI experiments was last served (read back as
    `ExperimentRecord.nni_webui`), for the report, the API and `hpo status`; returns it. The links are in the order
    of `<run dir>/nni/experiments.json`: by arm, and each arm's in the order they started (its tuning, a resume's
    new start, its confirmation rounds), so an arm's last link is its latest NNI experiment."""
    links = [{"arm": e.label, "nni_experiment": e.nni_id, "url": e.url} for e in load_experiments(run_dir) if e.port]
    storage.annotate_experiment(experiment_id, NNI_WEBUI_KEY, links)
    return links


def jobs_or_none(experiment: NniExperiment) -> list:
    with contextlib.suppress(HpoError):
        return rest(experiment.port, "trial-jobs")
    return []


def record_stopped(storage, experiment_id: int, plan: ArmPlan, jobs: list, reason: str,
                    confirmation: bool = False) -> None:  # fmt: skip
    """After a stop: a trial NNI had started that had not recorded itself yet gets its row (`_adopt`); then every
    unfinished trial of NNI's is recorded as interrupted with the reason (NNI cannot resume them)."""
    workers = {t.worker for t in storage.list_trials(experiment_id)}
    for job in jobs:
        if job.get("status") == "RUNNING" and WORKER_PREFIX + job["trialJobId"] not in workers:
            _adopt(storage, experiment_id, plan, job, confirmation)
    interrupt_leftovers(storage, experiment_id, reason)


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


def charged(storage, experiment_id: int, plan: ArmPlan) -> int:
    """The arm's tuning trials that count against its share: finished, except those a stop interrupted (NNI
    cannot resume them; a new trial takes the place of each)."""
    finished = [s for s in TrialState if s.finished]
    rows = storage.list_trials(experiment_id, state=finished, arm=plan.label)
    return sum(row.kind is TrialKind.TUNING and row.arm == plan.label and not interrupted(row) for row in rows)


def interrupted(row) -> bool:
    """Whether a trial of the NNI engine was ended by a stop of its NNI experiment (never charged): INTERRUPTED,
    or, a tuning trial a resume replaced by a new one, failed with a reason starting "interrupted: "."""
    failed = row.state is TrialState.FAILED and (row.reason or "").startswith(INTERRUPTED)
    return row.state is TrialState.INTERRUPTED or failed


REPLACED = "; a resume replaced it by a new trial (NNI's tuner generates every configuration of an arm)"


def settle_interrupted(storage, experiment_id: int) -> None:
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


def new_nni_id(run_dir: Path, experiment_id: int, arm: int, confirmation: bool = False) -> str:
    """The arm's NNI experiment id; a resumed arm gets a new one (`-r1`, `-r2`, ...), and each round of its
    confirmation runs one of its own (`-confirm1`, `-confirm2`, ...)."""
    taken = {e.nni_id for e in load_experiments(run_dir)}
    base = nni_id(experiment_id, arm)
    if confirmation:
        candidates = [confirmation_nni_id(experiment_id, arm, n) for n in range(1, len(taken) + 2)]
    else:
        candidates = [base] + [f"{base}-r{n}" for n in range(1, len(taken) + 2)]
    return next(c for c in candidates if c not in taken)


# NNI's experiment statuses in words (its NO_MORE_TRIAL read as "nothing runs", while trials it submitted run on)
_NNI_STATUS_WORDS = {
    "INITIALIZED": "starting",
    "RUNNING": "running",
    "NO_MORE_TRIAL": "running its last trials (none left to submit)",
    "TUNER_NO_MORE_TRIAL": "running its last trials (its tuner proposes no more)",
    "STOPPING": "stopping",
    "STOPPED": "stopped",
    "DONE": "done",
    "ERROR": "error",
}


def nni_status_words(status: str) -> str:
    """What NNI's experiment status `status` means, in words (an unknown one as NNI says it, in lower case)."""
    return _NNI_STATUS_WORDS.get(status, status.lower())


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
        if full := _full_disk_trial(storage, experiment_id):  # the next trials would meet the same disk
            return STOPPED_FOR_DISK + full
        note = f"{what}: {done}/{plan.quota} done, NNI {nni_status_words(status['status'])}"
        if tick is not None:
            tick(note)
        if done != reported:
            say(quiet, note)
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


def _full_disk_trial(storage, experiment_id: int) -> str | None:
    """'trial N could not write its files: the disk under ... is full (...)' for a trial of the experiment that
    stopped for a full disk (recorded interrupted with `DISK_FULL`), else None."""
    for row in storage.list_trials(experiment_id, state=TrialState.INTERRUPTED):
        if (row.reason or "").startswith(DISK_FULL):
            return f"trial {row.number} could not write its files: {row.reason.removeprefix(DISK_FULL)}"
    return None


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
        if record is not None and (record.state.finished or record.state is TrialState.INTERRUPTED):
            continue  # it recorded itself (interrupted: a stop, a full disk)
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
    reason = f"NNI trial {trial} ended ({status}) without a final result"
    if status == "USER_CANCELED":  # NNI 3.0's status of a trial whose process a signal ended (it keeps no signal)
        reason += (": its process was killed by a signal (the out-of-memory killer, `kill`) or the trial was "
                   "cancelled in NNI's web UI")  # fmt: skip
    return TrialState.FAILED, reason


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


def interrupt_leftovers(storage, experiment_id: int, reason: str) -> None:
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


def check_gpus(spec) -> None:
    """Where the trials run on this machine (NNI's local training service), the GPUs `resources.gpus` asks for are
    there, as the local engine checks them (ResourceError saying what to do): NNI would put them on the CPU."""
    if spec.resources.gpus != "none" and not spec.resources.machines:
        select_gpus(discover_gpus(), spec.resources.gpus)


def on_gpu(spec) -> bool:
    if spec.resources.gpus == "none":
        return False
    if spec.resources.machines:  # NNI's remote training service finds the machines' GPUs
        return True

    return bool(discover_gpus())


def user_home() -> str:
    return os.environ.get("HOME") or str(Path.home())


def say(quiet: bool, line: str) -> None:
    if not quiet:
        print(line, flush=True)
