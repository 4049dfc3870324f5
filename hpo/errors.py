"""The control plane's exceptions. Everything hpo raises on purpose derives from `HpoError`.

Messages say what was wrong, where (file, field, experiment, trial id) and what to do about it.
"""


class HpoError(Exception):
    """Root of all errors the control plane raises deliberately."""


class ExperimentFileError(HpoError):
    """An experiment file is malformed; the message names the file and the field."""


class StorageError(HpoError):
    """The database could not be read or written (connection, schema, constraint); never a raw SQLAlchemy error."""


class DatabaseUnavailableError(StorageError):
    """The database cannot be reached for now (its server down or restarting, the connection lost, an SQLite file
    locked by another process): transient, unlike a bad URL or a refused change. Raised once retrying has gone on
    for the bound (`database.outage_s`) or a caller that does not wait asked just once; the message says for how
    long it has been unreachable. `state` names what holds it up in a few words, for a progress line ("database
    <state> for 42 s"): unreachable, locked by another writer, out of disk space, ..."""

    state: str = "unreachable"

    def __init__(self, message: str, state: str | None = None) -> None:
        super().__init__(message)
        if state is not None:
            self.state = state


class BadDatabaseError(StorageError):
    """The URL reaches a database server or file that refuses it for good: no such database or user, a password
    refused, a file that is not SQLite. Bad input, nothing to wait for (`hpo` exits 2)."""


class NotFoundError(StorageError):
    """An experiment or trial id/name that does not exist."""


class StaleAttemptError(StorageError):
    """A trial process writes for an attempt that was replaced (its worker was lost and the trial re-queued)."""


class TrialClosedError(StorageError):
    """A trial process writes metrics for a trial whose record is closed (finished, or interrupted by a stop)."""


class TrialStateError(StorageError):
    """A trial is not in the state an action on it needs (an attempt cannot start a trial that is not queued: Dask
    ran the attempt again after its worker was lost, say)."""


class ControllerBusyError(HpoError):
    """Another live controller drives the experiment; the message names its host and pid."""


class ClaimLostError(ControllerBusyError):
    """A controller's write refused: another controller took its experiment over (`hpo resume` while this one seemed
    gone); the message names the other's host and pid."""


class SchemaOutOfDateError(StorageError):
    """The database schema is older than the code; run `hpo db upgrade`."""


class ResourceError(HpoError):
    """GPU/slot allocation is impossible as asked (e.g. more GPUs per trial than exist)."""


class SchedulerLostError(ResourceError):
    """The Dask scheduler went away while the experiment ran: the experiment is left stopped, its running trials
    interrupted, for `hpo resume` once a scheduler is back (the machine's state, not bad input)."""


class DiskFullError(HpoError):
    """A disk is full: under a trial's files (its attempt records nothing, the configuration is not to blame, and is
    queued again) or the controller's (the experiment is left stopped for `hpo resume`)."""
