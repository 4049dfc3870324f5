"""`hpo db upgrade`, `hpo presets`, `hpo run` and `hpo resume`: the commands that write an experiment and drive it,
and the list of the experiment files that ship with hpo."""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import os
import shlex
import socket
import sys
from pathlib import Path

from hpo.cli.common import (
    directory_blocker,
    given,
    open_storage,
    refuse_imported,
    refuse_in_memory,
    runner_options,
    safe_url,
    tcp_port,
    waiting_note,
)
from hpo.engine.settle import settle_controller  # `hpo delete` and the API share it
from hpo.errors import HpoError, NotFoundError

NNI_PORT = 8080  # the first port tried for an NNI experiment's web UI (NNI's own default)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    import random

    from hpo.storage import current_revision, default_database_url, upgrade_database
    from hpo.storage.retry import Outage, call_with_retry, outage_bound

    url = args.db or default_database_url()
    refuse_in_memory(url)  # the upgrade would succeed on a database that is gone when the command ends
    # Waits for a database that is away (or a SQLite file another writer keeps locked) as the other commands that
    # write do, when HPO_DATABASE_OUTAGE_S says so: a migration is one transaction, and a try after one whose
    # answer was lost finds the schema at its revision.
    call_with_retry(lambda: upgrade_database(url), Outage(), outage_bound(0.0), random.Random(), waiting=waiting_note())
    print(f"database {safe_url(url)} is at revision {current_revision(url)}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    """The shipped experiment files, each by the name `hpo run` and `hpo plan` take, with its description."""
    import yaml

    from search_spaces import PRESETS_DIR, list_presets

    names = list_presets()
    width = max(map(len, names))
    for name in names:
        spec = yaml.safe_load((PRESETS_DIR / f"{name}.yaml").read_text()) or {}
        runner = (spec.get("runner") or {}).get("name") or spec.get("engine") or "local"
        print(f"{name:<{width}}  {runner:<9}  {spec.get('description', '')}")
    print(
        f"`hpo plan NAME` forecasts one, `hpo run NAME` runs it; to change one, copy its file from {PRESETS_DIR}"
        " and set its base_config to a shipped trainer config's name (demo_cpu, bert_large) or to your own file"
    )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from hpo.engine.liveness import controller_identity
    from hpo.engine.local import check_trial_data, check_trial_data_on_workers, describe_plan
    from hpo.experiment import stored_form
    from hpo.runners import build_runner, check_runner_options
    from hpo.storage import default_database_url
    from hpo.storage.engine import sqlite_file

    spec = _load_spec(args.experiment, args.engine)  # pure: a bad file writes nothing
    _check_outage_bound(spec)
    # resources are checked before anything is written (NNI's own training service places the nni engine's trials)
    _check_engine_options(spec, args)
    if spec.engine == "local":
        check_runner_options(spec, args.runner, args.scheduler)  # the options themselves, before data or a cluster
    run_dir = Path(args.run_dir or Path("runs") / spec.name).resolve()
    where = "--run-dir" if args.run_dir else f"the run directory (default runs/{spec.name}; --run-dir chooses one)"
    check_run_dir(run_dir, where)  # before the database is opened: a file in its way would stop the run later
    if spec.engine == "nni":
        from hpo.nni.engine import preflight
        from hpo.nni.jobs import check_gpus
        from hpo.nni.manager import load_experiments

        preflight()  # NNI installed and patched, before anything is written
        check_gpus(spec)  # and the GPUs it asks for here
        earlier = [e.nni_id for e in load_experiments(run_dir)]  # none where the run directory is new
        if earlier:  # a new run would count them as its own earlier runs: another tuner seed, their web UIs
            raise HpoError(f"{where}: the run directory {run_dir} holds the NNI experiments of an earlier run "
                           f"({', '.join(earlier)}): choose another --run-dir, or `hpo resume` the experiment that "
                           "ran there")  # fmt: skip
    leftovers = earlier_run_files(run_dir)
    url = args.db or default_database_url()
    if leftovers and (path := sqlite_file(url)) is not None and not path.exists():
        refuse_earlier_run(run_dir, where, leftovers)  # no database to find the experiment in: and none is made
    # The resources first (a GPU experiment on a machine without GPUs is told so before it is told its data is
    # missing there), then the data the trials could only fail on; both before anything is written.
    runner = build_runner(spec, args.runner, args.scheduler) if spec.engine == "local" else None
    claim = RunDirClaim(None)  # nothing held until claimed
    try:
        if _trials_run_here(spec, args.runner):
            check_trial_data(spec)
        elif spec.engine == "local" and (args.runner or spec.runner.name) == "dask":
            check_trial_data_on_workers(spec, runner)
        if spec.engine == "nni":
            from hpo.nni.config import check_remote

            check_remote(spec, url)  # remote trials need a server database and an SSH key, before any write
        storage = open_storage(url)
        _refuse_existing(storage, spec, args.experiment)
        refuse_earlier_run(run_dir, where, leftovers)  # after that: the same experiment again is told what it is
        make_run_dir(run_dir, where)  # made (and so surely usable) before the experiment is recorded
        claim = claim_run_dir(run_dir, where, spec.name)  # another experiment started there a moment ago: no files yet
        refuse_earlier_run(run_dir, where, earlier_run_files(run_dir))  # again, held: one that ended meanwhile
        if not args.quiet and runner is not None:
            print(describe_plan(spec, runner), file=sys.stderr)
        stored = ran_on(stored_form(spec, run_dir), args.runner, args.scheduler)
        experiment_id = storage.create_experiment(spec.name, stored, spec.direction, controller=controller_identity())
    except BaseException:
        if runner is not None:
            runner.close()
        claim.release()
        raise
    try:
        return _drive(spec, storage, experiment_id, run_dir, runner, url, args, resume=False)
    finally:
        claim.release()


def ran_on(stored: dict, runner: str | None, scheduler: str | None) -> dict:
    """The stored form of an experiment with the runner its trials run on: the file's, or the one --runner and
    --scheduler chose instead, so that `hpo resume` runs them there again without the options."""
    if runner is None and scheduler is None:
        return stored
    section = dict(stored["experiment"].get("runner") or {})
    section["name"] = runner or section.get("name", "local")
    if scheduler is not None:
        section["scheduler"] = scheduler
    if section["name"] != "dask":
        section.pop("scheduler", None)
    return {**stored, "experiment": {**stored["experiment"], "runner": section}}


def check_run_dir(path: Path, where: str, recorded: bool = False) -> None:
    """Refuse a run directory that could not be made or written (a file in its place or on its way, a directory
    that is not writable), naming it; makes nothing. `where` says where the path came from; `recorded`: the
    experiment's own (a resume), which cannot be chosen again, only made usable."""
    blocked = directory_blocker(path)
    if blocked is None:
        return
    why, probe = blocked
    if why == "unwritable":
        remedy = ("make it writable for this user (the run directory is recorded with the experiment)" if recorded
                  else "choose a directory you can write")  # fmt: skip
        raise HpoError(f"{where}: cannot make or write the run directory {path}: {probe} is not writable; {remedy}")
    what = "a broken symbolic link" if why == "link" else "a file"
    place = "is" if probe == path else f"cannot be a directory: {probe} is"
    remedy = ("move that file away (the run directory is recorded with the experiment)" if recorded
              else "choose a directory (it is made if missing) or move that file away")  # fmt: skip
    raise HpoError(f"{where}: the run directory {path} {place} {what}; {remedy}")


# What an experiment's trials and tuners write into its run directory. NNI's own files (nni/) are not here: a failed
# NNI start leaves them for its logs, and the same `hpo run` starts again there; an NNI experiment that did run is
# refused by its own check (`hpo.nni.manager.load_experiments`).
RUN_FILES = ("trials", "tuner", "checkpoints")


def earlier_run_files(path: Path) -> list[str]:
    """The entries of RUN_FILES in the run directory `path` that hold something (an unreadable one counts)."""
    found = []
    for name in RUN_FILES:
        try:
            if (path / name).is_dir() and any((path / name).iterdir()):
                found.append(name)
        except OSError:
            found.append(name)
    return found


def refuse_earlier_run(path: Path, where: str, found: list[str]) -> None:
    """Refuse, for a new experiment, a run directory that holds an earlier run's files: its trials would resume that
    run's checkpoints as their own (a finished one trains nothing and reports the earlier result) and write over its
    trial directories and tuner state."""
    if found:
        raise HpoError(
            f"{where}: the run directory {path} holds an earlier run's files ({', '.join(f'{n}/' for n in found)}): "
            "a new experiment there would resume that run's trials from their checkpoints and write over its files; "
            "choose another --run-dir (or move that directory away), or `hpo resume` the experiment that ran there"
        )


RUN_DIR_CLAIM = ".hpo-controller"  # in the run directory: locked by the controller that drives an experiment there


class RunDirClaim:
    """An exclusive lock on RUN_DIR_CLAIM in a run directory, held until `release` or the process's end, however
    it ends (the kernel lets it go; trial processes do not inherit it)."""

    def __init__(self, fd: int | None):
        self.fd = fd  # None: nothing held (a full disk: the claim file could not be made)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def claim_run_dir(path: Path, where: str, name: str, recorded: bool = False) -> RunDirClaim:
    """Hold the run directory while this controller drives experiment `name` there. Refused, naming the experiment
    that holds it, while another controller drives an experiment there: two experiments started there within
    moments of each other both saw it empty, and their trials would share trial directories. `recorded`: the
    experiment's own run directory (a resume), which cannot be chosen again: the refusal says what else to do."""
    claim = path / RUN_DIR_CLAIM
    try:
        fd = os.open(claim, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk: the controller stops on it, saying so
            return RunDirClaim(None)
        remedy = (f"move {claim} away, or make it a file this user can write (the run directory is recorded "
                  "with the experiment)" if recorded else "choose another directory")  # fmt: skip
        raise HpoError(f"{where}: cannot claim the run directory {path} ({claim}: {exc.strerror or exc}); "
                       f"{remedy}") from None  # fmt: skip
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):  # a file system without locks (some network mounts)
            os.close(fd)
            print(f"note: {where}: the run directory {path} cannot be locked here ({exc.strerror or exc}): nothing "
                  "stops another experiment from starting there meanwhile", file=sys.stderr)  # fmt: skip
            return RunDirClaim(None)
        holder = os.pread(fd, 400, 0).decode(errors="replace").strip() or "another experiment"
        os.close(fd)
        if recorded and holder.startswith(f"experiment {name} ("):  # its own controller: a resume of a live one
            raise HpoError(f"{where}: its controller runs it now{holder.removeprefix(f'experiment {name}')}; "
                           f"`hpo status {name}` shows its progress (`hpo resume` finishes an experiment whose "
                           "controller stopped)") from None  # fmt: skip
        remedy = ("wait until it ends, then resume again (the run directory is recorded with the experiment)"
                  if recorded else "choose another --run-dir, or wait until it ends")  # fmt: skip
        raise HpoError(f"{where}: the run directory {path} is in use by {holder}, whose trials write there; "
                       f"{remedy}") from None  # fmt: skip
    with contextlib.suppress(OSError):  # who holds it, for the refusal of another (not written on a full disk)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"experiment {name} (controller pid {os.getpid()} on {socket.gethostname()})\n".encode(), 0)
    return RunDirClaim(fd)


def make_run_dir(path: Path, where: str) -> None:
    """Make the run directory (and its parents), else an error naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HpoError(f"{where}: cannot make the run directory {path}: {exc.strerror or exc}; choose another "
                       "directory") from None  # fmt: skip


def _check_outage_bound(spec) -> None:
    """HPO_DATABASE_OUTAGE_S and HPO_HEARTBEAT_S, when set, must be numbers of seconds: refused before anything is
    written."""
    from hpo.engine.liveness import check_heartbeat_env
    from hpo.storage.retry import outage_bound

    outage_bound(spec.database.outage_s)
    check_heartbeat_env()


def _check_engine_options(spec, args: argparse.Namespace) -> None:
    """Options of one engine given to an experiment of the other are refused, not ignored."""
    if spec.engine == "nni" and (args.runner or args.scheduler):
        raise HpoError("--runner and --scheduler apply to engine: local; NNI's training service runs nni trials")
    if spec.engine != "nni" and args.port is not None:
        raise HpoError(f"--port applies to engine: nni (the first port tried for NNI's web UI); {spec.name} runs on "
                       f"engine: {spec.engine}, which has no web UI (`hpo serve` starts the REST API)")  # fmt: skip


def _trials_run_here(spec, runner: str | None) -> bool:
    """Whether the trials read this machine's files (the local runner, or NNI's local training service)."""
    if spec.engine == "nni":
        return not spec.resources.machines
    return (runner or spec.runner.name) == "local"


def _load_spec(path: str, engine: str | None):
    """The experiment file, validated as if it said `engine: ENGINE` when --engine is given."""
    from hpo.cli.common import note_unread_namesake
    from hpo.experiment import load_experiment

    note_unread_namesake(path)
    return load_experiment(path, engine=engine)  # its errors name the file and what is wrong


def _experiment_exists(storage, name: str) -> bool:
    try:
        storage.get_experiment_by_name(name)
    except NotFoundError:
        return False
    return True


def cmd_resume(args: argparse.Namespace) -> int:
    import hpo.engine.local  # noqa: F401  (the loop's modules, before the claim: Ctrl-C while they load leaves none)
    from hpo.engine.liveness import controller_identity, stale_after_s
    from hpo.experiment import spec_from_stored
    from hpo.runners import build_runner, check_runner_options
    from hpo.storage import default_database_url
    from hpo.storage.base import ExperimentStatus

    url = args.db or default_database_url()
    storage = open_storage(url, existing=True)
    record = storage.get_experiment_by_name(args.name)
    refuse_imported(record, "resume")
    if record.status is ExperimentStatus.FINISHED:  # nothing is left to run: nothing is written (its end time stays)
        print(f"experiment {record.name} is finished: nothing to resume (`hpo status {record.name}` and `hpo report "
              f"{record.name}` read it)", file=sys.stderr)  # fmt: skip
        from hpo.engine.local import exit_code

        return exit_code(record.status, storage, record.id, record.name, quiet=True)  # as its run's: 1 without a result
    spec = spec_from_stored(record)
    _check_outage_bound(spec)
    _check_engine_options(spec, args)
    if spec.engine == "nni":
        from hpo.nni.engine import preflight
        from hpo.nni.jobs import check_gpus

        preflight()  # NNI installed and patched, before the claim writes anything (as `hpo run` checks)
        check_gpus(spec)
    if spec.engine == "local":
        check_runner_options(spec, args.runner, args.scheduler)
    run_dir = Path(record.spec["run_dir"])
    where = f"experiment {record.name}"
    check_run_dir(run_dir, where, recorded=True)  # the stored run directory: checked before the claim
    runner = build_runner(spec, args.runner, args.scheduler) if spec.engine == "local" else None
    claim = RunDirClaim(None)  # nothing held until claimed
    try:
        make_run_dir(run_dir, where)
        record = settle_controller(storage, record, args.quiet)
        host, pid = controller_identity()
        # the run directory first: a resume it refuses (a controller paused there still holds it) must leave the
        # experiment's claim alone, which would otherwise pass to this process and stop the live one
        claim = claim_run_dir(run_dir, where, record.name, recorded=True)
        storage.claim_controller(record.id, host, pid, stale_after_s())  # refuses while another controller lives
    except BaseException:
        if runner is not None:
            runner.close()
        claim.release()
        raise
    try:
        return _drive(spec, storage, record.id, run_dir, runner, url, args, resume=True)
    finally:
        claim.release()


def _drive(spec, storage, experiment_id: int, run_dir: Path, runner, url: str, args: argparse.Namespace,
           resume: bool) -> int:  # fmt: skip
    """The experiment driven by its engine's controller to its end; the process exit code."""
    if spec.engine == "nni":
        from hpo.nni.engine import drive_nni

        return drive_nni(spec, storage, experiment_id, run_dir, url, args.quiet, resume=resume,
                         port=args.port or NNI_PORT)  # fmt: skip
    from hpo.engine.local import drive

    return drive(spec, storage, experiment_id, run_dir, runner, url, args.quiet, resume=resume)


def _refuse_existing(storage, spec, experiment: str) -> None:
    """`hpo run` of an experiment whose name the database holds: refused, with what to do by its state (read it,
    watch its controller, resume it) or how to run it anew under another name."""
    from hpo.engine.liveness import liveness
    from hpo.runners.process import controller_gone_here, controller_here
    from hpo.storage.base import ExperimentStatus
    from search_spaces import shipped_preset

    if not _experiment_exists(storage, spec.name):
        return
    existing = storage.get_experiment_by_name(spec.name)
    host, pid = existing.controller_host, existing.controller_pid
    running = existing.status is not ExperimentStatus.FINISHED and (
        (liveness(existing) == "live" and not controller_gone_here(host, pid))
        or controller_here(host, pid, existing.heartbeat_at)
    )
    if existing.status is ExperimentStatus.FINISHED:
        then = f"`hpo status {spec.name}` and `hpo report {spec.name}` read it"
    elif running:
        then = f"its controller runs now (`hpo status {spec.name}` shows its progress)"
    else:
        then = f"use `hpo resume {spec.name}` to finish it"
    rename = (f"copy {spec.source} and change its `name:`" if shipped_preset(experiment) else
              f"change `name:` in {experiment}")  # fmt: skip
    if not running:  # a live controller keeps its experiment
        rename += f", or remove the one recorded with `hpo delete {shlex.quote(spec.name)}`"
    raise HpoError(f"experiment {spec.name!r} already exists (status {existing.status.value}); {then}, or {rename}")


# --------------------------------------------------------------------------- plan


def add_db(sub) -> None:
    """`hpo db upgrade`."""
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="db_command", required=True,
                                                                      metavar="upgrade")  # fmt: skip
    db.add_parser("upgrade", help="create or migrate the schema to the current version").set_defaults(fn=cmd_db_upgrade)


def add_presets(sub) -> None:
    """`hpo presets`."""
    presets = sub.add_parser("presets", help="the experiment files that ship with hpo, by name")
    presets.set_defaults(fn=cmd_presets)


def add_run(sub) -> None:
    """`hpo run`."""
    run = sub.add_parser("run", help="run an experiment file (live progress; Ctrl-C stops, resume finishes)")
    run.add_argument("experiment", help="the experiment YAML file, or a shipped preset's name (`hpo presets`)")
    run.add_argument(
        "--run-dir", type=given("a directory"), help="where trial configs, logs and checkpoints go (default runs/NAME)"
    )
    run.add_argument("--engine", choices=["local", "nni"], help="override the file's engine (default: the file's)")
    run.add_argument("--port", type=tcp_port, help=f"engine nni: first port tried for its web UI (default {NNI_PORT})")
    runner_options(run)
    run.add_argument("--quiet", action="store_true", help="no progress display and no summary")
    run.set_defaults(fn=cmd_run)


def add_resume(sub) -> None:
    """`hpo resume`."""
    resume = sub.add_parser("resume", help="finish an experiment whose controller died or was stopped")
    resume.add_argument("name", help="the experiment's name")
    resume.add_argument("--port", type=tcp_port,
                        help=f"engine nni: first port tried for its web UI (default {NNI_PORT})")  # fmt: skip
    runner_options(resume)
    resume.add_argument("--quiet", action="store_true", help="no progress display and no summary")
    resume.set_defaults(fn=cmd_resume)
