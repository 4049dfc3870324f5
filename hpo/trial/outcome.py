"""A trial's outcome kept in its directory until the database has it.

Before a trial process stores how its attempt ended, it writes the outcome to `outcome.json` in its directory: the
trial id, the attempt, the result, and the metric points it has not stored yet (those it kept while the database
was away, with the time each was measured). It removes the file once the database has both. So a trial that
cannot reach the database when it finishes loses nothing: it retries for `database.outage_s`, and if it gives up
or is killed first (a stop, the controller giving up on the same outage), the file stays, and whoever next finds
the attempt unfinished stores it (`store_kept_outcome`): the controller when the attempt's process ends without a
result in the database, and `hpo resume` for every trial it would otherwise run again. Writing it is safe however
often it happens: a metric value and a result already stored are not stored twice (`hpo.storage.base.Storage`).

The file is written whole or not at all (a temporary file renamed over it). A file of another attempt or another
trial (a directory is per trial number) is never stored. Only a controller that can read the trial's directory
(the local runner, or a filesystem shared with the workers) recovers an outcome; elsewhere the trial runs again.

A trial process that could not reach the database within the bound exits with `EXIT_DATABASE_UNREACHABLE`; without
a kept outcome (it never got to train) the controller re-queues the trial rather than fail it: the database, not
its configuration, is to blame. Likewise one whose disk filled up exits with `EXIT_DISK_FULL` and records nothing:
the controller re-queues the trial and stops the experiment until there is space (`hpo.engine.study`). A disk too
full for the file alone does not hold an outcome back: it is stored without the file (`hpo.trial.entry`).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from hpo.errors import DatabaseUnavailableError, StorageError
from hpo.files import write_whole
from hpo.storage.base import MetricPoint, Storage
from hpo.trials import TrialResult, TrialState

OUTCOME_FILE = "outcome.json"
EXIT_DATABASE_UNREACHABLE = 5  # a trial process gave up on an unreachable database
EXIT_DISK_FULL = 7  # a trial process could not write its directory or checkpoints: its disk is full


def keep_outcome(workdir: Path, trial_id: int, attempt: int, result: TrialResult,
                 points: list[MetricPoint]) -> Path:  # fmt: skip
    """Write the attempt's outcome (its result and its metric points not stored yet) to `workdir/outcome.json`."""
    path = Path(workdir) / OUTCOME_FILE
    data = {
        "trial_id": trial_id,
        "attempt": attempt,
        "result": {**asdict(result), "state": result.state.value},
        "points": [[p.step, p.samples, dict(p.values), p.at.isoformat() if p.at else None] for p in points],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(data, default=float))  # nothing half-written is left, on a full disk either
    return path


def kept_outcome(workdir: Path, trial_id: int, attempt: int) -> tuple[TrialResult, list[MetricPoint]] | None:
    """The outcome kept in `workdir` for this trial and attempt, or None (no file, another attempt's, unreadable)."""
    try:
        data = json.loads((Path(workdir) / OUTCOME_FILE).read_text())
        if (data["trial_id"], data["attempt"]) != (trial_id, attempt):
            return None
        fields = dict(data["result"])
        result = TrialResult(**{**fields, "state": TrialState(fields["state"])})
        points = [MetricPoint(step, samples, values, datetime.fromisoformat(at) if at else None)
                  for step, samples, values, at in data["points"]]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return result, points


def forget_outcome(workdir: Path) -> None:
    """The database has the outcome: remove the file."""
    with contextlib.suppress(FileNotFoundError):
        (Path(workdir) / OUTCOME_FILE).unlink()


def store_kept_outcome(storage: Storage, workdir: Path, trial_id: int, attempt: int) -> bool:
    """Store the outcome kept in `workdir` for this trial's attempt (its metric points, then its result); whether
    there was one and it is stored now. A trial the database closed otherwise meanwhile (stopped, re-queued) keeps
    that record: the kept outcome is then dropped."""
    kept = kept_outcome(workdir, trial_id, attempt)
    if kept is None:
        return False
    result, points = kept
    try:
        if points:
            storage.add_metrics(trial_id, points, attempt=attempt)
        storage.finish_trial(trial_id, result, attempt=attempt)
    except DatabaseUnavailableError:
        raise  # still away: the file stays for the next try
    except StorageError:  # closed otherwise meanwhile (stopped, re-queued, finished differently): that record stands
        forget_outcome(workdir)
        return False
    forget_outcome(workdir)
    return True
