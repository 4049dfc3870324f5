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
import shutil
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpo.engine.liveness import Heartbeat, liveness
from hpo.engine.local import absolute_database_url, exit_code, next_commands, print_summary
from hpo.errors import HpoError
from hpo.experiment.arms import ArmPlan, arm_plans
from hpo.nni.config import (
    confirmation_experiment_config,
    manager_host,
    nni_experiment_config,
    nni_home,
    trial_command,
)
from hpo.nni.confirm import queue_round, waiting
from hpo.nni.jobs import (
    FAILED_START,
    INTERRUPTED,
    NNI_ERROR,
    NO_TUNER,
    STOPPED_FOR_DISK,
    charged,
    finished_history,
    import_history,
    interrupt_leftovers,
    jobs_or_none,
    new_nni_id,
    on_gpu,
    record_stopped,
    record_webui,
    say,
    settle_interrupted,
    user_home,
    watch,
    write_database_url,
)
from hpo.nni.manager import (
    NniEngineError,
    NniExperiment,
    NniLaunchError,
    TunerLog,
    check_port,
    end_managers_of,
    forget,
    is_answering,
    load_experiments,
    log_errors,
    passed_over,
    port_lost,
    require_node,
    start_experiment,
    stop_all,
    stop_manager,
    taken_from,
    view,
)
from hpo.nni.patch import require_patched
from hpo.storage.base import ExperimentStatus
from hpo.storage.retry import outage_bound
from hpo.trials import TrialResult, TrialState


# ------------------------------------------------------------------------------------------------ drive
def drive_nni(spec, storage, experiment_id: int, run_dir: Path, database_url: str, quiet: bool,
              resume: bool = False, port: int = 8080) -> int:  # fmt: skip
    """`hpo run` / `hpo resume` under engine nni: heartbeat, run the arms' NNI experiments, final status and
    summary; returns the process exit code."""

    note = {"text": "starting NNI"}
    heartbeat = Heartbeat(storage, experiment_id, note=lambda: note["text"]).start()
    storage.wait_for_outages(outage_bound(spec.database.outage_s))  # as the local engine's controller does
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
        if not heartbeat.lost:  # else another controller took the experiment over: its status is the other's
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
    return exit_code(status, storage, experiment_id, spec.name, quiet)


class NniStartError(NniEngineError):
    """An arm's NNI experiment failed before any of its trials started: its manager did not start or stopped
    answering, or NNI ended it before it ran a trial (a tuner that cannot be built). The message names the
    cause; `retry` is set when NNI only waited too little for a tuner that reported no error (a busy machine), or
    when another process took the web UI's port between its check and the manager's start; `retry_note` then says
    why in a line, for the start that follows."""

    def __init__(self, message: str, retry: bool = False, retry_note: str | None = None) -> None:
        super().__init__(message)
        self.retry, self.retry_note = retry, retry_note


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
    """SIGTERM (or SIGHUP) reached the controller: it stops its NNI experiments as on Ctrl-C; its argument names the
    signal."""


def _signal_name(signalled: Terminated) -> str:
    return str(signalled.args[0]) if signalled.args else "SIGTERM"


@contextlib.contextmanager
def sigterm_stops():
    """While NNI experiments run, SIGTERM (and SIGHUP, a closed terminal, unless under nohup) stops them as Ctrl-C
    does (NNI's managers run detached, in process groups of their own, so nothing else would end them, their tuners
    or their trials). The first signal interrupts; later ones are ignored so that they cannot cut the stop short
    (SIGKILL still ends the process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def interrupt(signum, frame):
        if not received:
            received.append(signum)
            raise Terminated(signal.Signals(signum).name)

    hangup = signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN  # a closed terminal, unless under nohup
    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)
                if sig == signal.SIGTERM or hangup}  # fmt: skip
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
    try:
        check_port(port)
    except NniEngineError as e:  # before anything is written: `start_failure` removes the experiment again
        raise NniStartError(str(e)) from None
    run_dir = Path(run_dir)
    nni_home(run_dir).mkdir(parents=True, exist_ok=True)
    write_database_url(run_dir, db_url)
    command = command or (lambda _url, eid, arm, rdir, home: trial_command(eid, arm, rdir, home))
    home = None if spec.resources.machines else user_home()  # remote trials keep their user's HOME

    def shell(plan: ArmPlan) -> str:
        return command_prefix + command(db_url, experiment_id, plan.index, run_dir, home)

    stop_all(run_dir)  # the managers of a controller that died go on running their NNI experiments: end them
    interrupt_leftovers(storage, experiment_id, INTERRUPTED + "NNI does not keep running trials across a restart")
    settle_interrupted(storage, experiment_id)
    gpu_trials = on_gpu(spec)
    for plan in arm_plans(spec):
        plan = dataclasses.replace(plan, quota=plan.quota - charged(storage, experiment_id, plan))
        if plan.quota <= 0:
            continue
        restart = sum(e.arm == plan.index and not e.confirmation for e in load_experiments(run_dir))
        config = nni_experiment_config(spec, plan, run_dir, shell(plan), Path.cwd(), gpu_trials, restart=restart)
        history = finished_history(spec, storage, experiment_id, plan, run_dir)
        ending, jobs = _start_arm(spec, storage, experiment_id, run_dir, plan, config, port, tick, quiet, history)
        if ending != "done":
            return _ended(spec, storage, experiment_id, plan, jobs, ending, confirmation=False)

    def confirm(plan: ArmPlan, runs: list) -> str:  # one NNI experiment of the arm's queued confirmation runs
        seeds = [run.seed for run in runs]
        config = confirmation_experiment_config(spec, plan, run_dir, shell(plan), Path.cwd(), gpu_trials,
                                                runs[0].params, seeds)  # fmt: skip
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
        say(quiet, f"{e.retry_note or e}; starting the arm's NNI experiment once more")
        return run_arm(*args)


def _ended(spec, storage, experiment_id: int, plan: ArmPlan, jobs: list, ending: str, confirmation: bool) -> str:
    """An arm's NNI experiment that did not finish: its unfinished trials recorded as interrupted; "failed" when
    NNI ended it with an error (said on stderr), else "stopped"."""
    record_stopped(storage, experiment_id, plan, jobs, f"{INTERRUPTED}the NNI experiment was {ending}", confirmation)
    if ending.startswith(NNI_ERROR):
        print(f"error: {spec.name}{' ' + plan.label if plan.label else ''}: the NNI experiment {ending}",
              file=sys.stderr, flush=True)  # fmt: skip
        return "failed"
    if ending.startswith(STOPPED_FOR_DISK):  # the trial is not charged: a resume runs another in its place
        print(f"stopped: {ending.removeprefix(STOPPED_FOR_DISK)}. Free space on that disk, then `hpo resume "
              f"{spec.name}` runs the trials left", file=sys.stderr, flush=True)  # fmt: skip
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
    experiment = NniExperiment(plan.index, plan.label, new_nni_id(run_dir, experiment_id, plan.index, confirmation),
                               host=manager_host(spec), confirmation=confirmation)  # fmt: skip
    taken = taken_from(port, experiment.host)
    try:
        start_experiment(run_dir, experiment, config, port)
    except NniLaunchError as e:
        if port_lost(e):  # the next start takes the next free port
            note = (f"port {experiment.port} was taken by another process as NNI's manager started "
                    f"({e.cause.rsplit(': ', 1)[-1]})")  # fmt: skip
            raise _failed_start(run_dir, experiment, e.cause, retry=True, retry_note=note) from None
        raise _failed_start(run_dir, experiment, e.cause) from None
    except NniEngineError as e:  # no free port
        raise _failed_start(run_dir, experiment, str(e)) from None
    except (Terminated, KeyboardInterrupt) as signalled:  # mid-start: a manager may run that nothing recorded
        if experiment.port is not None:  # a port was chosen: the launcher ran
            stop_manager(run_dir, experiment, wait_s=5.0)  # asks it to stop its trials; records it, using its id up
        end_managers_of(experiment.nni_id)
        return (f"stopped by {_signal_name(signalled)}" if isinstance(signalled, Terminated) else
                "stopped by the user (Ctrl-C)"), []  # fmt: skip
    logs = nni_home(run_dir) / "nni-experiments" / experiment.nni_id / "log"
    tuner = TunerLog(logs)
    ending, trials_before = "stopped by an error of the engine", None
    try:  # from here on a signal, like an error of the engine, ends the manager below
        record_webui(storage, experiment_id, run_dir)
        if skipped := passed_over(taken, experiment.port):
            say(quiet, skipped)
        runs = quota_text(plan.quota, confirmation)
        say(quiet, f"{spec.name}{' ' + plan.label if plan.label else ''}: NNI web UI at {experiment.url} "
                    f"(NNI experiment {experiment.nni_id}, {runs})")  # fmt: skip
        trials_before = storage.count_trials(experiment_id)
        if history:
            import_history(experiment, history, tuner=tuner)
            say(quiet, f"gave NNI's tuner the {len(history)} finished trial(s) of the earlier run")
        ending = watch(spec, storage, experiment_id, plan, experiment, tick, quiet, tuner)
    except NniEngineError as e:  # the manager stopped answering
        ending = NNI_ERROR + str(e)
    except Terminated as signalled:
        ending = f"stopped by {_signal_name(signalled)}"
    except KeyboardInterrupt:
        ending = "stopped by the user (Ctrl-C)"
    finally:  # never leave an NNI manager behind
        jobs = jobs_or_none(experiment) if ending != "done" else []
        stop_manager(run_dir, experiment)
    if ending.startswith(NNI_ERROR) and not jobs and storage.count_trials(experiment_id) == trials_before:
        said = log_errors(logs)
        slow_tuner = NO_TUNER in ending and not tuner.error()  # the tuner only started too slowly for NNI
        error = _failed_start(run_dir, experiment, said or ending.removeprefix(NNI_ERROR), retry=slow_tuner)
        record_webui(storage, experiment_id, run_dir)  # the stored links lose it with the run directory's list
        raise error
    return ending, jobs


def quota_text(quota: int, confirmation: bool) -> str:
    """What an arm's NNI experiment runs, as its start line says it: `2 trials`, `1 trial`, `3 confirmation runs`."""
    noun = "confirmation run" if confirmation else "trial"
    return f"{quota} {noun}{'' if quota == 1 else 's'}"


def _failed_start(run_dir: Path, experiment: NniExperiment, cause: str, retry: bool = False,
                  retry_note: str | None = None) -> NniStartError:  # fmt: skip
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
    return NniStartError(message, retry=retry, retry_note=retry_note)


# ------------------------------------------------------------------------------------------------ webui
def webui(record, stop: bool = False, port: int = 8080, storage=None) -> int:
    """`hpo webui NAME [--stop]`: reopen an NNI experiment's web UI in view mode (or close it); exit code. With
    `storage`, the addresses it opens are stored (`record_webui`), so the report and the API link to them."""

    name = record.name
    if record.spec["experiment"].get("engine") != "nni":
        raise HpoError(f"experiment {name!r} ran under engine: local; the NNI web UI shows engine: nni "
                       f"experiments (`hpo trials {name}` lists its trials)")  # fmt: skip
    run_dir = Path(record.spec["run_dir"])
    live = liveness(record) == "live"
    if stop and live:  # its managers run its trials: closing them would end the experiment
        raise HpoError(
            f"experiment {name!r} is live: its controller's NNI managers run its trials, and `--stop` "
            "would end them; stop the experiment itself (Ctrl-C where `hpo run` runs, or the API's "
            f"POST /experiments/{name}/stop); `hpo webui {name} --stop` then closes what it left"
        )
    if stop:
        stopped = stop_all(run_dir)
        print(f"closed the NNI web UI of {name} ({len(stopped)} NNI experiment(s))" if stopped else
              f"the NNI web UI of {name} is not open")  # fmt: skip
        return 0
    closed = [e.nni_id for e in load_experiments(run_dir) if not is_answering(e)]
    experiments = view(run_dir, port)
    if not experiments:
        raise HpoError(f"experiment {name!r} has no NNI experiment in {run_dir / 'nni'}; it never started under NNI")
    if storage is not None:
        record_webui(storage, record.id, run_dir)
    opened = next((e for e in experiments if e.nni_id in closed), None)
    if opened is not None and (skipped := passed_over(taken_from(port, opened.host), opened.port)):
        print(skipped)  # as `hpo run` says it: the ports tried before were taken
    for e in experiments:
        print(f"{name}{' ' + e.label if e.label else ''}: NNI web UI at {e.url} (NNI experiment {e.nni_id})")
    shown = {e.nni_id for e in experiments}
    for nni_id in [e.nni_id for e in load_experiments(run_dir) if e.nni_id not in shown]:
        print(f"note: NNI experiment {nni_id} was never made (its start was stopped before NNI's manager made it): "
              "it has nothing to show")  # fmt: skip
    if live:  # `--stop` is refused while its managers run its trials
        print(f"it closes when the experiment ends; after a stop, `hpo webui {name} --stop` closes what it left")
    else:
        print(f"`hpo webui {name} --stop` closes it")
    return 0
