"""The trial side: run one trial attempt and record it straight into the experiment's database.

    python -m hpo.trial.entry --db URL --trial-id ID --attempt N --workdir DIR

Every runner launches this (under torchrun when a trial has several ranks). Rank 0 claims the QUEUED trial
for its attempt (recording host, process group, worker and GPUs), builds the trainer config from the stored
experiment and the trial's parameters, trains with a reporter that writes each intermediate record into the
trial's metrics, and records the final result. The working directory holds `trial.yaml` and `report.jsonl`
for people, and checkpoints; only trials that die without a final record are reconciled by the controller. A
process whose attempt was replaced (its worker was lost), or whose record was closed under it (finished or
interrupted by a stop), is refused by the storage, records nothing more and leaves with one line on stderr.
Under torchrun each rank dies with torchrun (`die_with_launcher`), and only rank 0 records and prints the outcome.

A database that is away: every call waits for it, retrying, up to `database.outage_s` (HPO_DATABASE_OUTAGE_S;
`hpo.storage.retry`), except the intermediate metrics, which are tried once and kept in memory while it is away
(training goes on; a later record tries them again, after pauses that double from `KEPT_RETRY_S` to
`KEPT_RETRY_MAX_S` seconds). The outcome is written to `outcome.json` in the working directory before it is stored
and removed once it is (`hpo.trial.outcome`), so a trial that gives up on the database, or is killed while it waits,
leaves it for the controller or `hpo resume`.

Exit codes: the trainer's (`trainer.result.TrainStatus.exit_code`), 2 for a configuration the trainer
rejects, 4 when the trial could not be claimed or recorded (not queued, another attempt, or its record closed),
5 when the database stayed unreachable for longer than the bound (the outcome, if any, kept in `outcome.json`),
6 for another database error (no such trial, a schema that needs `hpo db upgrade`), which the message names, 7 when
the attempt failed because the disk of its directory or checkpoints is full: it records nothing, and the controller
queues the trial again and stops the experiment until there is space (`hpo.engine.study`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from hpo.errors import (
    DatabaseUnavailableError,
    DiskFullError,
    HpoError,
    StaleAttemptError,
    StorageError,
    TrialClosedError,
    TrialStateError,
)
from hpo.experiment import spec_from_stored
from hpo.experiment.arms import checkpoint_name, continues_from_checkpoint, trial_config
from hpo.files import full_disk
from hpo.objective import trial_result
from hpo.storage import SqlStorage
from hpo.storage.base import MetricPoint, Storage, TrialRecord
from hpo.storage.engine import sqlite_file
from hpo.storage.retry import outage_bound, without_waiting
from hpo.trial.outcome import EXIT_DATABASE_UNREACHABLE, EXIT_DISK_FULL, OUTCOME_FILE, forget_outcome, keep_outcome
from hpo.trials import TrialResult, TrialState

EXIT_NOT_CLAIMED = 4
EXIT_STORAGE_ERROR = 6
# Intermediate values kept in the database (the trainer's progress and eval records).
METRIC_KEYS = (
    "loss", "train_mlm_accuracy", "lr", "sequences_per_s", "tokens_per_s", "token_imbalance",
    "mlm_accuracy", "mlm_loss", "nsp_accuracy", "time_s", "noise_scale", "grad_sq_norm_small", "grad_sq_norm_big",
)  # fmt: skip
WORKER_ENV = "HPO_WORKER"  # set by the runner: where this trial runs (a Dask worker address, a slot)
TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun in each rank's environment


# While the database is away, kept metric points are tried again after a pause that doubles from KEPT_RETRY_S to
# KEPT_RETRY_MAX_S: each try at an SQLite file another writer keeps locked holds training for SQLite's busy timeout.
KEPT_RETRY_S = 5.0
KEPT_RETRY_MAX_S = 60.0


class DatabaseReporter:
    """A trainer `Reporter` that appends each intermediate record to the trial's metrics. While the database is
    away the points are kept (`pending`, each with the time it was measured) and training goes on; a later
    record, or `flush`, stores them."""

    def __init__(self, storage: Storage, trial_id: int, attempt: int, clock: Callable[[], float] = time.monotonic):
        self.storage, self.trial_id, self.attempt = storage, trial_id, attempt
        self.result = None
        self.pending: list[MetricPoint] = []
        self._clock = clock
        self._failed_at: float | None = None  # when the last try met an unreachable database
        self._pause_s = KEPT_RETRY_S  # the pause before the next try while it is away

    def intermediate(self, metrics: dict[str, Any]) -> None:
        values = {k: float(v) for k in METRIC_KEYS if _is_number(v := metrics.get(k))}
        if values:
            point = MetricPoint(int(metrics.get("step", 0)), metrics.get("samples"), values)
            if self._failed_at is not None:  # the database is away: kept, with the time it was measured
                point = point._replace(at=datetime.now(timezone.utc))
            self.pending.append(point)
            if self._failed_at is None or self._clock() - self._failed_at >= self._pause_s:
                with contextlib.suppress(DatabaseUnavailableError), without_waiting():
                    self.flush()

    def flush(self) -> None:
        """Store the kept points (waiting for the database as the storage does); DatabaseUnavailableError keeps
        them, stamped with the time they were measured."""
        if not self.pending:
            return
        try:
            self.storage.add_metrics(self.trial_id, self.pending, attempt=self.attempt)
        except DatabaseUnavailableError:
            now = datetime.now(timezone.utc)
            self.pending = [p if p.at else p._replace(at=now) for p in self.pending]
            if self._failed_at is not None:  # away since an earlier try: wait longer before the next
                self._pause_s = min(KEPT_RETRY_MAX_S, self._pause_s * 2)
            self._failed_at = self._clock()
            raise
        self.pending, self._failed_at, self._pause_s = [], None, KEPT_RETRY_S

    def final(self, result) -> None:
        self.result = result


class FanOutReporter:
    """Sends every record to several reporters (the database, a JSON-lines file, NNI)."""

    def __init__(self, reporters: Sequence[Any]):
        self.reporters = list(reporters)

    def intermediate(self, metrics: dict[str, Any]) -> None:
        for reporter in self.reporters:
            reporter.intermediate(metrics)

    def final(self, result) -> None:
        for reporter in self.reporters:
            reporter.final(result)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def trial_trainer_config(spec, record: TrialRecord, workdir: Path, run_dir: Path | None):
    """The trainer config of one trial: the experiment's base + the trial's parameters at its budget, its
    seed for a confirmation run, its reports in its work directory, and its own checkpoint directory.

    Paths the experiment names for its production run are each trial's own, under its work directory: a relative
    `log.mlperf` or `checkpoint.dir` there as it is, an absolute one as `mlperf/<its file name>` or `checkpoints`
    (trials that shared a checkpoint directory would resume one another's runs; a shared MLPerf log would keep
    the last trial's events only). Hyperband and ASHA continue a promoted configuration from its checkpoint: a
    directory shared by the budgets of one configuration and training seed, under the run directory."""
    cfg = trial_config(spec, record.params, fidelity=min(record.budget, 1.0))
    log = {"jsonl": str(workdir / "report.jsonl")}
    if cfg.log.mlperf is not None:
        log["mlperf"] = str(workdir / _own(Path(cfg.log.mlperf), Path("mlperf") / Path(cfg.log.mlperf).name))
    updates: dict[str, Any] = {"log": cfg.log.model_copy(update=log)}
    if record.seed is not None:
        updates["seed"] = record.seed
    if continues_from_checkpoint(spec):
        seed = updates.get("seed", cfg.seed)
        ckpt = (run_dir or workdir) / "checkpoints" / checkpoint_name(record.params, seed)
        updates["checkpoint"] = cfg.checkpoint.model_copy(update={"dir": str(ckpt), "resume": True})
    elif cfg.checkpoint.dir is not None:  # a re-run attempt of the trial continues its own run
        ckpt = workdir / _own(Path(cfg.checkpoint.dir), Path("checkpoints"))
        updates["checkpoint"] = cfg.checkpoint.model_copy(update={"dir": str(ckpt)})
    return cfg.model_copy(update=updates)


def _own(path: Path, instead: Path) -> Path:
    """Where a path the experiment names goes in a trial's work directory: a relative one as it is."""
    return instead if path.is_absolute() else path


def run_trial(
    storage: Storage, trial_id: int, attempt: int, workdir: Path, extra_reporters: Sequence[Any] = ()
) -> TrialResult:
    """Claim, train and record one attempt of a trial; returns what was recorded."""
    # The trainer imports torch: here, not at the top, so that the trial claims its attempt without it where the
    # launcher holds no torch (a GPU trial's: hpo.runners.preload).
    from trainer.errors import ConfigError, FinalSaveError
    from trainer.report import JsonLinesReporter
    from trainer.train import train

    started = time.monotonic()
    record = storage.get_trial(trial_id)
    experiment = storage.get_experiment(record.experiment_id)
    spec = spec_from_stored(experiment)
    storage.wait_for_outages(outage_bound(spec.database.outage_s))
    workdir.mkdir(parents=True, exist_ok=True)
    rank0 = is_rank_zero()
    if rank0:
        storage.mark_trial_running(trial_id, _visible_gpus(), pid=os.getpgrp(), host=socket.gethostname(),
                                   worker=os.environ.get(WORKER_ENV), attempt=attempt)  # fmt: skip
    run_dir = Path(experiment.spec["run_dir"]) if experiment.spec.get("run_dir") else None
    try:
        cfg = trial_trainer_config(spec, record, workdir, run_dir)
    except (ConfigError, HpoError, ValueError) as e:  # a configuration the trainer rejects: a failed trial
        result = TrialResult(TrialState.FAILED, f"invalid trial config: {e}", metrics={"error": "config"})
        if rank0:
            record_outcome(DatabaseReporter(storage, trial_id, attempt), workdir, result)
        return result
    (workdir / "trial.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    database = DatabaseReporter(storage, trial_id, attempt)
    jsonl = JsonLinesReporter(cfg.log.jsonl)
    try:
        # train's own return value: only rank 0 reports a final record (database.result is None on the others)
        try:
            trained = train(cfg, FanOutReporter([database, jsonl, *extra_reporters]))
        except FinalSaveError as e:  # the result stands; a continuation (Hyperband, ASHA) starts from the last save
            print(f"warning: {e}", file=sys.stderr)
            trained = e.result
        result = trial_result(spec, trained, cfg, time.monotonic() - started)
    except ConfigError as e:  # valid on paper, refused on this machine (e.g. fp16 without a GPU)
        result = TrialResult(TrialState.FAILED, f"invalid trial config: {e}", metrics={"error": "config"})
    finally:
        jsonl.close()
    if result.state is TrialState.FAILED and (
        (full := full_disk(workdir)) or result.metrics.get("error") == "disk_full"
    ):
        raise DiskFullError(f"{full or result.reason}; the attempt records no result")
    if rank0:
        record_outcome(database, workdir, result)
    return result


def record_outcome(database: DatabaseReporter, workdir: Path, result: TrialResult) -> None:
    """Keep the outcome in `workdir` (hpo.trial.outcome), store the kept metric points and the result (waiting for
    the database up to the bound), then drop the file. DatabaseUnavailableError leaves it for the controller. A disk
    too full for the file (ENOSPC) does not hold the result back: it is stored without it (the file is for a database
    that is away; a trial that trained to its end would otherwise be queued to train again)."""
    try:
        keep_outcome(workdir, database.trial_id, database.attempt, result, database.pending)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
    database.flush()
    database.storage.finish_trial(database.trial_id, result, attempt=database.attempt)
    forget_outcome(workdir)


def _visible_gpus() -> list[int] | None:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible:
        return None
    try:
        return [int(g) for g in visible.split(",")]
    except ValueError:
        return None  # UUIDs: keep the planned ids


def _who(args) -> str:
    """The trial as people know it: its number (its work directory's name, `trials/NNNNN`), with its row id, which
    differs from it wherever the database holds other experiments."""
    name = Path(args.workdir).name
    return f"trial {int(name)} (id {args.trial_id})" if name.isdigit() else f"trial id {args.trial_id}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpo.trial.entry", description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True, help="the experiment's database URL")
    parser.add_argument("--trial-id", type=int, required=True, help="the trial's id in that database")
    parser.add_argument("--attempt", type=int, required=True, help="the attempt this process runs")
    parser.add_argument("--workdir", type=Path, required=True, help="where trial.yaml, logs and checkpoints go")
    args = parser.parse_args(argv)
    if TORCHRUN_ENV in os.environ:  # a rank: it must not outlive torchrun
        from hpo.runners.process import die_with_launcher

        die_with_launcher()
    from trainer.distributed import cleanup  # torch: see run_trial

    if (path := sqlite_file(args.db)) is not None and not path.is_file():  # not made anew, empty, by the trial
        print(f"error: {_who(args)} attempt {args.attempt}: the SQLite database {path} is not there (deleted or moved "
              "after the experiment started)", file=sys.stderr)  # fmt: skip
        return EXIT_STORAGE_ERROR
    try:
        # the bound of the environment or the default until the stored experiment says its own (run_trial)
        with SqlStorage(args.db, outage_s=outage_bound()) as storage:
            result = run_trial(storage, args.trial_id, args.attempt, args.workdir)
    except DatabaseUnavailableError as e:
        kept = args.workdir / OUTCOME_FILE
        where = f"; its outcome is kept in {kept} for the controller or `hpo resume`" if kept.exists() else ""
        print(f"error: {_who(args)} attempt {args.attempt}: {e}{where}", file=sys.stderr)
        return EXIT_DATABASE_UNREACHABLE
    except (StaleAttemptError, TrialClosedError, TrialStateError) as e:  # the trial is not this attempt's (now)
        print(f"error: {_who(args)} attempt {args.attempt}: {e}", file=sys.stderr)
        return EXIT_NOT_CLAIMED
    except StorageError as e:  # another database error (no such trial, a schema to upgrade): said, not taken for one
        print(f"error: {_who(args)} attempt {args.attempt}: {e}", file=sys.stderr)
        return EXIT_STORAGE_ERROR
    except (DiskFullError, OSError) as e:  # a full disk is the machine's fault: the controller queues it again
        if isinstance(e, OSError) and e.errno != errno.ENOSPC:
            raise
        with contextlib.suppress(OSError):  # its log may be on that disk
            print(f"error: {_who(args)} attempt {args.attempt}: {e}", file=sys.stderr)
        return EXIT_DISK_FULL
    finally:
        cleanup()
    if is_rank_zero():
        print(f"{_who(args)}: {result.state.value}" + (f" ({result.reason})" if result.reason else ""),
              file=sys.stderr)  # fmt: skip
    if result.metrics.get("error") == "config":
        return 2
    return {"completed": 0, "diverged": 3}.get(result.state.value, 1)


if __name__ == "__main__":
    from hpo.trial.exit import exit_recorded

    exit_recorded(main())
