"""The local engine: `hpo run` / `hpo resume` with our own study loop.

It puts the parts together in the order that keeps failures clean: check the resources (build the runner) and
the data the trials will read (`check_trial_data`) before anything is written, create or claim the experiment
(one live controller per experiment), then run the study loop with a heartbeat and a progress view beside it,
and leave the experiment with its final status. SIGTERM and SIGINT (Ctrl-C) stop the experiment as the API's
stop does: the loop ends every process of the running trials, records them as interrupted and leaves; `hpo
resume` runs them again.

While the database is away the controller waits for it, up to `database.outage_s` (HPO_DATABASE_OUTAGE_S wins;
`hpo.storage.retry`), and the progress line says so ("database unreachable for 42 s, retrying"); a signal still
stops it at once. Past the bound it stops as on SIGTERM and says that `hpo resume` continues the experiment once
the database is back (exit code 1).
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import sys
import threading
from pathlib import Path

import yaml

from hpo.engine.liveness import Heartbeat, controller_identity
from hpo.engine.progress import ProgressView, why_none_completed
from hpo.engine.study import Study
from hpo.errors import DatabaseUnavailableError, DiskFullError, HpoError, SchedulerLostError, StorageError
from hpo.evidence.confirmations import batch_verdict_lines, shown_batch_verdicts, stored_evidence, stored_verdict
from hpo.evidence.verdict import verdict_lines
from hpo.experiment.arms import arm_plans, in_arm_order
from hpo.files import full_disk, no_space
from hpo.simulation.cost import simulated_line
from hpo.storage import default_database_url
from hpo.storage.base import ExperimentStatus, Storage
from hpo.storage.engine import safe_url
from hpo.storage.retry import outage_bound
from hpo.trials import objective_text
from search_spaces.space import trainer_key
from trainer.config import config_from_dict
from trainer.data.checks import load_checked_samples
from trainer.data.shards import count_samples
from trainer.errors import DataError


def absolute_database_url(url: str) -> str:
    """The URL trial processes get: a relative SQLite path made absolute (workers may start elsewhere)."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/") and ":memory:" not in url:
        return prefix + str(Path(url.removeprefix(prefix)).resolve())
    return url


DATA_ROWS_CHECKED = 256  # rows of each data set checked at the start; every trial checks all before its first step


def check_trial_data(spec) -> None:
    """Refuse an experiment whose trials could only fail on their inputs (`bad data`, one after another): the base
    config's data.train and data.eval must name shards that exist, are BERT shards, and whose first rows fit the
    model (the trainer's own checks, on DATA_ROWS_CHECKED rows); a model.init_checkpoint must exist, and
    optimizer.impl apex must import. Relative paths are read from the working directory, as the trials read them.
    Keys the space tunes are checked by each trial."""
    cfg = config_from_dict(spec.resolved_base())
    tuned = {trainer_key(name) for name in spec.space.names}
    for key, path in _fixed_data(cfg, tuned).items():
        try:
            load_checked_samples(path, key, cfg.model, DATA_ROWS_CHECKED, cfg.data.max_seq_length)
        except DataError as e:
            raise HpoError(f"{spec.source}: {_named(spec, key)} = {path!r} (from {Path.cwd()}): {e}"
                           f"{_data_hint(path)}") from None  # fmt: skip
    if "data.train" not in tuned:
        _check_train_set_size(spec, cfg)
    start = cfg.model.init_checkpoint
    if "model.init_checkpoint" not in tuned and start is not None and not Path(start).expanduser().is_file():
        where = _named(spec, "model.init_checkpoint")
        raise HpoError(f"{spec.source}: {where} = {start!r} (from {Path.cwd()}): no such file; every trial would "
                       "start from it: point it at the checkpoint, or remove it")  # fmt: skip
    if "optimizer.impl" not in tuned and cfg.optimizer.impl == "apex" and importlib.util.find_spec("apex") is None:
        raise HpoError(
            f"{spec.source}: {_named(spec, 'optimizer.impl')} = apex, but NVIDIA apex cannot be imported here, "
            "where the trials run: install it (with its CUDA extensions), or set optimizer.impl: torch"
        )


def check_trial_data_on_workers(spec, runner) -> None:
    """The dask runner's trials read the base config's data.train and data.eval on their workers, a relative path
    from the worker's working directory: a path that names no shard there failed every trial of the experiment in
    seconds (`bad data`, its budget spent). Refused before anything is written, naming the worker. Keys the space
    tunes are checked by each trial."""
    from trainer.data.shards import missing_shards

    paths = _fixed_data(config_from_dict(spec.resolved_base()), {trainer_key(name) for name in spec.space.names})
    if not paths:
        return
    for worker, problem in sorted(runner.on_workers(missing_shards, paths).items()):
        if problem:
            raise HpoError(f"{spec.source}: on the Dask worker {worker}: {problem}; each worker reads the data "
                           "itself: start it where a relative path names the shards, or give a path every worker "
                           "has")  # fmt: skip


def _fixed_data(cfg, tuned: set[str]) -> dict[str, str]:
    """The base config's data.train and data.eval by key, less those the space tunes (each trial checks its own)."""
    return {key: path for key, path in (("data.train", cfg.data.train), ("data.eval", cfg.data.eval))
            if key not in tuned}  # fmt: skip


def _check_train_set_size(spec, cfg) -> None:
    """Refuse global batch sizes the base config's training set cannot fill (the trainer refuses each such trial:
    every step would train the whole set, a smaller batch than the one compared): the largest the experiment can
    run, fixed or tuned (a choice's largest value, a range's upper end)."""
    from hpo.experiment.checks import key_values

    key = "batch.global_batch_size"
    values = key_values(spec, cfg, key)
    if values is None:  # a range: its upper end
        field = next(name for name in spec.space.names if trainer_key(name) == key)
        values = (f"space.{field}", [spec.space[field].high])
    field, batches = values
    largest = max(b for b in batches if isinstance(b, int) and not isinstance(b, bool))
    try:
        sequences = count_samples(cfg.data.train)
    except DataError:
        return  # read above: the trainer's own checks say what is wrong
    if sequences < largest:
        where = field or _named(spec, key)
        raise HpoError(f"{spec.source}: {where}: a global batch of {largest:,}, but {_named(spec, 'data.train')} = "
                       f"{cfg.data.train!r} holds {sequences:,} sequences; every trial at that batch would be "
                       f"refused: give data.train at least {largest:,} sequences, or a batch of at most "
                       f"{sequences:,}")  # fmt: skip


def _named(spec, key: str) -> str:
    """How a message names trainer `key` of the experiment file: `overrides.KEY` where the file overrides it, else
    `base_config KEY`."""
    from hpo.experiment.checks import where_set

    where = where_set(spec, None, key)
    return f"{where} {key}" if where == "base_config" else where


def _data_hint(path: str) -> str:
    if Path(path).parts[:2] == ("data", "demo"):
        return ("; make the demo corpus with `python -m trainer.data.demo_corpus --out data/demo` (in a checkout of "
                "the project, `make demo-data` runs it)")  # fmt: skip
    return "; point the base config (or `overrides:`) at your shards"


def describe_plan(spec, runner) -> str:
    """What is about to run: each arm's tuned dimensions and trial budget, the runner, the confirmations."""
    lines = [f"experiment {spec.name}: {spec.budget.trials} trials, tuner {spec.tuner.name} (seed {spec.tuner.seed}), "
             f"at most {spec.budget.max_parallel} at once; {runner.describe()}"]  # fmt: skip
    max_samples = spec.resolved_base()["budget"]["max_samples"]
    for plan in arm_plans(spec):
        dims = ", ".join(f"{name} {_range(plan.space[name])}" for name in plan.space.names) or "-"
        lines.append(f"  arm {plan.label or 'all'}: {plan.quota} trials of at most {max_samples:,} samples, "
                     f"{len(plan.space)} dimension(s): {dims}")  # fmt: skip
    if spec.allow_unequal_arms:
        lines.append(f"  the arms tune different dimensions: {spec.allow_unequal_arms}")
    if spec.budget.sequential:
        rounds, margin = spec.budget.confirmation_rounds, 100 * spec.verdict.margin
        lines.append(f"  then, as soon as an arm's tuning is over, its best configuration in rounds of {rounds[0]} "
                     f"more seeds until the verdict decides (winner, or equivalent within ±{margin:g} %), at most "
                     f"{rounds[-1]}")  # fmt: skip
    elif spec.budget.confirm_seeds:
        lines.append(f"  then, as soon as an arm's tuning is over, its best configuration {spec.budget.confirm_seeds} "
                     "more times with other seeds")  # fmt: skip
    return "\n".join(lines)


def _range(param) -> str:
    """`[0.001, 0.02] log`, `[0, 40]` or `{a, b}`: what one dimension spans."""
    if hasattr(param, "choices"):
        return "{" + ", ".join(map(str, param.choices)) + "}"
    return f"[{param.low:g}, {param.high:g}]" + (" log" if param.log else "")


def drive(spec, storage: Storage, experiment_id: int, run_dir: Path, runner, database_url: str, quiet: bool,
          resume: bool) -> int:  # fmt: skip
    """Run the study loop under a heartbeat and a progress view; returns the process exit code."""

    run_dir.mkdir(parents=True, exist_ok=True)
    # The heartbeat from the start: while the tuners load (seconds), readers see a live controller, not a dead one
    heartbeat = Heartbeat(storage, experiment_id, note=lambda: "loading its tuners").start()
    study = load_study(spec, storage, experiment_id, run_dir, runner, database_url, heartbeat)
    if study is None:
        return 1
    heartbeat.note = lambda: study.note
    bound = outage_bound(spec.database.outage_s)
    storage.wait_for_outages(bound, stop=lambda: study.stop_reason)  # a signal ends the wait at once
    study.claim_lost = lambda: heartbeat.lost
    study.controller = controller_identity()  # its trials are created only while the claim is this one's
    total = spec.budget.trials + spec.budget.most_confirm_seeds * len(study.arms)
    view = None if quiet else ProgressView(storage, experiment_id, total, outage_s=bound, spec=spec)
    status = None
    try:
        with stop_on_signals(study):
            if resume:
                storage.set_experiment_status(experiment_id, ExperimentStatus.RUNNING)
                study.restore()
            if view:
                view.start()
            try:
                status = study.run()
            except KeyboardInterrupt:  # before the handlers were in place, or from a thread's wait
                study.stop(STOP_REASONS[signal.SIGINT])
                status = ExperimentStatus.STOPPED
            except OSError as e:  # a tuner that cannot write its files (its trials were ended: Study.run)
                _stop_if_disk_full(e, storage, experiment_id, spec.name, run_dir)
                raise
            except SchedulerLostError:  # its running trials were recorded interrupted: stopped, for `hpo resume`
                with contextlib.suppress(StorageError):
                    storage.set_experiment_status(experiment_id, ExperimentStatus.STOPPED)
                raise
        try:
            if not (heartbeat.lost or study.lost_claim):  # else the experiment is the other controller's now
                storage.set_experiment_status(experiment_id, status)
        except DatabaseUnavailableError as exc:  # still away: it stays RUNNING, and shows as interrupted
            study.database_error = study.database_error or str(exc)
    finally:
        heartbeat.beat()  # the study's last note (the final round of confirmations) for the view's last line
        if view:
            view.stop(ended=status is ExperimentStatus.FINISHED)
        heartbeat.stop()
        runner.close()
    lost = (heartbeat.lost or study.lost_claim) and ("deleted" if heartbeat.deleted else "taken")
    return say_how_it_ended(study, status, lost or None, spec, storage, experiment_id, database_url, quiet)


def load_study(spec, storage: Storage, experiment_id: int, run_dir: Path, runner, database_url: str,
               heartbeat: Heartbeat) -> Study | None:  # fmt: skip
    """The study, its runner attached and its tuners loaded; None where Ctrl-C came first (the experiment then is
    stopped, the claim released, and what to do said). Until the signal handlers are in place (the tuners' imports
    take seconds) Ctrl-C arrives here as KeyboardInterrupt, and is noted as it is raised: compiled code that cannot
    raise it swallows it (scipy's Sobol set-up, as SMAC3 builds its initial design, prints "Exception ignored" and
    goes on with its state half made), and the run went on as if no Ctrl-C had come, proposing other trials."""
    interrupted = []

    def note_and_raise(signum, frame) -> None:
        interrupted.append(signum)
        raise KeyboardInterrupt

    noting = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler)  # fmt: skip
    previous = signal.signal(signal.SIGINT, note_and_raise) if noting else None
    try:
        runner.attach(storage, experiment_id)
        study = Study(spec, storage, experiment_id, run_dir, runner, absolute_database_url(database_url))
        if interrupted:  # swallowed where it was raised: the tuners may be half made
            raise KeyboardInterrupt
        return study
    except KeyboardInterrupt:
        runner.close()
        storage.set_experiment_status(experiment_id, ExperimentStatus.STOPPED)
        heartbeat.stop()  # and the claim released: the next controller may resume at once
        print(f"stopped (Ctrl-C) while it loaded its tuners; `hpo resume {spec.name}` runs the experiment",
              file=sys.stderr)  # fmt: skip
        return None
    except BaseException as e:
        heartbeat.stop()
        runner.close()
        _stop_if_disk_full(e, storage, experiment_id, spec.name, run_dir)  # the tuner's files (SMAC3's scenario)
        raise
    finally:
        if noting:
            signal.signal(signal.SIGINT, previous)


def say_how_it_ended(study: Study, status: ExperimentStatus | None, lost: str | None, spec, storage: Storage,
                     experiment_id: int, database_url: str, quiet: bool) -> int:  # fmt: skip
    """Say why the study stopped where it did not finish (its claim lost: `taken` by another controller or the
    experiment `deleted`; its workers gone, a full disk, the database away, a signal) and what to do, print the
    summary unless `quiet`; the process exit code."""
    if lost == "deleted":
        print(f"stopped: experiment {spec.name!r} was deleted (`hpo delete` while this controller seemed gone: paused "
              "or cut off from the database for longer than its heartbeat allows); this one ended its trials' "
              "processes", file=sys.stderr)  # fmt: skip
        return 1
    if lost:
        print(f"stopped: another controller took {spec.name!r} over (`hpo resume` while this one seemed gone: paused "
              "or cut off from the database for longer than its heartbeat allows); this one ended its trials' "
              "processes and left the experiment to it", file=sys.stderr)  # fmt: skip
        return 1
    if study.workers_error or study.disk_error:
        print(f"stopped: {study.workers_error or study.disk_error}", file=sys.stderr)
        return 1
    if study.database_error:
        then = f"`hpo resume {spec.name}` stores what they kept and finishes the experiment"
        print(f"stopped: {study.database_error}\nIts running trials were ended; once the database is back, {then}",
              file=sys.stderr)  # fmt: skip
        return 1
    if status is ExperimentStatus.STOPPED:
        print(f"stopped; `hpo resume {spec.name}` finishes the experiment", file=sys.stderr)
    if not quiet:
        print_summary(storage, experiment_id, spec, database_url=database_url)
    return exit_code(status, storage, experiment_id, spec.name, quiet)


def exit_code(status: ExperimentStatus | None, storage: Storage, experiment_id: int, name: str, quiet: bool) -> int:
    """0 for an experiment that finished with a result; 1 for one that stopped, or finished without a completed
    trial (every trial failed: nothing to export, and a script must not take it for a result; the summary says
    so, and a quiet run says it here)."""
    if status is not ExperimentStatus.FINISHED:
        return 1
    if storage.best_trial_id(experiment_id) is None:
        if quiet:
            print(f"no trial completed; {why_none_completed(storage, experiment_id, name)}", file=sys.stderr)
        return 1
    return 0


def _stop_if_disk_full(error: BaseException, storage: Storage, experiment_id: int, name: str, run_dir: Path) -> None:
    """Where the controller's own write failed on a full disk (`error`), the experiment is left stopped, for `hpo
    resume`, and DiskFullError says so; any other error is left to the caller."""
    if (full := no_space(error)) is None:
        return
    with contextlib.suppress(StorageError):
        storage.set_experiment_status(experiment_id, ExperimentStatus.STOPPED)
    raise DiskFullError(f"the controller could not write its files: {full_disk(run_dir) or full}. Free space on that "
                        f"disk, then `hpo resume {name}` runs the experiment")  # fmt: skip


STOP_REASONS = {
    signal.SIGINT: "interrupted by the user (Ctrl-C); `hpo resume` runs it again",
    signal.SIGTERM: "the controller was terminated (SIGTERM); `hpo resume` runs it again",
    signal.SIGHUP: "the controller's terminal closed (SIGHUP); `hpo resume` runs it again",
}


@contextlib.contextmanager
def stop_on_signals(study):
    """While inside: SIGTERM, SIGINT and SIGHUP (its terminal closed) ask `study` to stop at the loop's next turn
    (within a poll interval) rather than raise wherever the controller happens to be (between starting a trial process
    and noting it, a process would be lost); its trials end with it, not left to train for hours. A signal ignored
    when the controller started (`nohup hpo run ...` ignores SIGHUP) stays ignored."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread can take signals
        yield
        return

    def ask_to_stop(signum: int, _frame) -> None:
        study.stop_reason = study.stop_reason or STOP_REASONS[signal.Signals(signum)]

    previous = {sig: signal.signal(sig, ask_to_stop) for sig in STOP_REASONS
                if signal.getsignal(sig) is not signal.SIG_IGN}  # fmt: skip
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def print_summary(storage: Storage, experiment_id: int, spec, database_url: str | None = None) -> None:
    """The counts, the best configuration per arm (or overall), the verdict, and the commands to go on (as they
    run from this directory: with this run's database, and this interpreter when `hpo` is not on PATH)."""
    counts = storage.count_trials_by_state(experiment_id)
    print(f"\nexperiment {spec.name}: " + (", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "no trial"))
    simulated = simulated_line(spec, storage.list_trials(experiment_id))
    if simulated:
        print(simulated)
    best = storage.best_per_arm(experiment_id) if spec.compare else {}
    overall = storage.best_trial(experiment_id)
    for arm, trial in in_arm_order(spec, best).items():
        print(f"\nbest for {arm}: trial {trial.number}, {describe_best(trial, spec)}")
        print(_indent(yaml.safe_dump(trial.params, sort_keys=False)))
    if not best and overall is not None:
        print(f"\nbest: trial {overall.number}, {describe_best(overall, spec)}")
        print(_indent(yaml.safe_dump(overall.params, sort_keys=False)))
    if overall is None:
        print(f"no trial completed; {why_none_completed(storage, experiment_id, spec.name)}")
        return
    if spec.compare:
        evidence = stored_evidence(storage, experiment_id)
        verdict = evidence.verdict(spec)
        print("\n" + "\n".join([*verdict_lines(verdict, spec.budget.confirmation_plan()),
                                 *batch_verdict_lines(spec, shown_batch_verdicts(spec, evidence))]))  # fmt: skip
    hpo, python = next_commands(database_url)
    print("next:")
    print(f"  {hpo} trials {spec.name}          # every trial, with its state, reason and objective")
    if spec.compare:
        print(f"  {hpo} best {spec.name} --per-arm  # the winners and the verdict again, as YAML")
    else:
        print(f"  {hpo} best {spec.name}            # the best configuration again, as YAML")
    print(f"  {hpo} export {spec.name} -o best.yaml && {python} -m trainer --config best.yaml  # train the best")


def next_commands(database_url: str | None) -> tuple[str, str]:
    """How to call `hpo` (with `--db` unless the URL is the default one) and Python from this directory."""
    import os
    import shlex
    import shutil

    python = Path(sys.executable).absolute()  # not resolved: a virtualenv's python is a link to the system's
    found = {name: shutil.which(name) for name in ("python", "hpo")}
    # `python` and `hpo` on the PATH are this environment's (its bin/ folder; sys.executable may be python3.11)
    on_path = all(path and Path(path).absolute().parent == python.parent for path in found.values())
    here = shlex.quote(os.path.relpath(python) if python.is_relative_to(Path.cwd()) else str(python))
    python, hpo = ("python", "hpo") if on_path else (here, f"{here} -m hpo")
    if database_url and absolute_database_url(database_url) != absolute_database_url(default_database_url()):
        hpo += f" --db {shlex.quote(safe_url(database_url))}"
    return hpo, python


def experiment_verdict(storage: Storage, experiment_id: int, spec):
    """The verdict of a compare experiment from its stored trials (see hpo/evidence/verdict.py)."""
    return stored_verdict(storage, experiment_id, spec)


def describe_best(trial, spec) -> str:
    objective, metric = objective_text(trial.objective), spec.objective.metric
    if trial.samples_to_target is None and metric in ("samples_to_target", "time_to_target_s"):
        parts = [f"target not reached: objective {objective} (the penalty {metric} takes)"]
    else:
        parts = [f"{metric} {objective}"]
    if trial.best_mlm_accuracy is not None:
        parts.append(f"best mlm_accuracy {trial.best_mlm_accuracy:.4f}")
    return ", ".join(parts)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines())
