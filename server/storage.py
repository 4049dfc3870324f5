"""The server's view of the database: one storage opened on first use, and the experiments' parsed specs.

Opening is lazy so the server starts (and answers health checks with 503) while the database is still down,
and a read endpoint never creates a database: a missing SQLite file is reported, not made, and a SQLite file keeps
its journal mode. A database that goes away later is waited for briefly (WAIT_S, counted from the start of the
outage: hpo.storage.retry), then every request answers 503 at once until it is back; opening never waits for a
database that is down, so a server started before its database answers 503 without delay. Opening runs in a thread
of its own (StorageHolder): the requests that come meanwhile wait for that one attempt, never on the event loop, so
the routes that need no database (the OpenAPI document, the docs) answer at once; an attempt that gets no answer in
time holds every request as a missed deadline does (below).

A database server that stops answering without closing its connections (its process stopped or hung) is not an
outage the driver notices: each statement, and the commit or rollback that ends a write (the stop action's), has a
deadline instead (hpo/storage/deadline.py), `timeout_s` (the setting HPO_API_DATABASE_TIMEOUT_S) for the reads made
on the event loop, `/health` and an experiment's first lookup by name (server.deps), SLOW_READ_S for the others,
each then a 503; after a missed deadline every request answers 503 at once until a probe hears the database.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from hpo.errors import DatabaseUnavailableError, StorageError
from hpo.export.production import ExportError, production_config
from hpo.storage import SqlStorage, Storage
from hpo.storage.base import ExperimentRecord, TrialRecord, TrialVersion
from hpo.storage.deadline import PROBE_INTERVAL_S, quick_reads, unanswered
from hpo.storage.engine import DATABASE_URL_ENV, safe_url, sqlite_file
from search_spaces.errors import SearchSpaceError
from server.schemas import BestTrialPublic, TrialPublic
from trainer.errors import ConfigError

WAIT_S = 2.0  # how long requests wait for a database that went away (a restart's blip) before answering 503
SLOW_READ_S = 120.0  # a statement (or commit) in the thread pool (a report of 100,000 trials reads for seconds)
CONFIG_CACHE_SIZE = 1024
TRIAL_CACHE_SIZE = 20_000  # finished trials' list entries kept (about 0.5 KB each)


class StorageHolder:
    """Opens the storage on the first request that needs it (and again after a failed attempt), in a thread of its own.

    The requests that come while an attempt is under way wait for that attempt, each without holding anything (on
    the event loop they await it: `opened()`), and get its storage or its error. An attempt refused at once (a server
    that is down, a missing SQLite file) holds nothing: the next request tries again. One that got no answer in time
    (a server whose port accepts connections while its process is stopped or hung: the connection attempt's timeout,
    or a missed deadline of the schema check; hpo/storage/deadline.py) holds every request, which fails at once with
    the reason (another try would wait as long again), until a new attempt, made in the background PROBE_INTERVAL_S
    after the last one ended, gets an answer: as a storage's `held()` does after a missed deadline."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._storage: Storage | None = None
        self._changed = threading.Condition()
        self._opening: Future[Storage] | None = None  # the attempt under way that requests wait for
        self._held_since: float | None = None  # when an attempt first got no answer; None once one answered
        self._closed = False

    def get(self) -> Storage:
        """The storage, opened first where it is not yet: waits for the attempt under way (in a thread; on the event
        loop, await `opened()`); DatabaseUnavailableError at once while the database is held (see the class)."""
        storage = self._storage
        if storage is not None:
            self._check_file(storage)
            return storage
        return self._attempt().result()

    async def opened(self) -> Storage:
        """`get()` for the event loop: the attempt under way is awaited, so the loop serves other requests meanwhile."""
        storage = self._storage
        if storage is not None:
            self._check_file(storage)
            return storage
        return await asyncio.wrap_future(self._attempt())

    def _check_file(self, storage: Storage) -> None:
        """DatabaseUnavailableError where the SQLite file the storage opened was deleted or replaced since (`rm` and
        a new experiment: the server would go on reading the deleted file, its answers a database nobody sees; its
        caches hold that one's answers, so the server does not switch to the new file): one stat, microseconds."""
        if (path := storage.replaced_file()) is not None:
            raise DatabaseUnavailableError(f"the SQLite database {path} was deleted or replaced after `hpo serve` "
                                           "opened it: restart `hpo serve` to serve the file there now")  # fmt: skip

    def held(self) -> str | None:
        """Why no attempt is made now (the last ones got no answer in time), or None."""
        since = self._held_since
        if since is None:
            return None
        return (f"cannot use the database {safe_url(self.url)}: the database server gave no answer to the API's "
                f"connection within {self.timeout_s:g} s, {time.monotonic() - since:.0f} s ago, and has not answered "
                "since (its process may be stopped or hung); it is tried again in the background, and requests go "
                "through as soon as it answers")  # fmt: skip

    def _attempt(self) -> Future[Storage]:
        """The attempt to wait for: the one under way, else a new one (in a thread); DatabaseUnavailableError while
        held."""
        with self._changed:
            if self._storage is not None:  # opened meanwhile
                done: Future[Storage] = Future()
                done.set_result(self._storage)
                return done
            reason = self.held()
            if reason:
                raise DatabaseUnavailableError(reason)
            if self._closed:
                raise self._stopping()
            if self._opening is None:
                self._opening = Future()
                # running: a waiter that gives up (a client gone, its request cancelled) cannot cancel it for the others
                self._opening.set_running_or_notify_cancel()
                threading.Thread(target=self._open_until_answered, name="hpo-storage-open", daemon=True).start()
            return self._opening

    def _open_until_answered(self) -> None:
        """Open the storage; after an attempt that got no answer, hold requests and try again every
        PROBE_INTERVAL_S until one gets an answer (the storage, or an error: nothing held then)."""
        while True:
            storage: Storage | None = None
            error: Exception | None = None
            try:
                with quick_reads():  # the schema check under the short deadline, as on the event loop
                    storage = self._open()
            except Exception as exc:  # handed to the requests that wait for this attempt
                error = exc
            with self._changed:
                waiting, self._opening = self._opening, None
                again = error is not None and unanswered(error) and not self._closed
                if again:
                    if self._held_since is None:
                        self._held_since = time.monotonic()
                else:
                    self._held_since = None
                    if storage is not None and not self._closed:
                        self._storage = storage
                        storage = None  # kept
            if storage is not None:  # opened as the server stops: nobody holds it
                storage.close()
                error = self._stopping()
            if waiting is not None:
                if error is not None:
                    waiting.set_exception(error)
                else:
                    waiting.set_result(self._storage)
            if not again:
                return
            with self._changed:
                if not self._closed:
                    self._changed.wait(PROBE_INTERVAL_S)  # close() wakes it
                if self._closed:
                    return

    def _stopping(self) -> DatabaseUnavailableError:
        return DatabaseUnavailableError(f"cannot use the database {safe_url(self.url)}: the API server is stopping")

    def _open(self) -> Storage:
        path = sqlite_file(self.url)  # any SQLite URL (sqlite+pysqlite:/// too), never a file the server would make
        if path is not None and not path.exists():
            raise StorageError(
                f"the SQLite database {path} does not exist: run `hpo db upgrade` (or an experiment) with "
                f"{DATABASE_URL_ENV}={safe_url(self.url)} first"
            )
        # read_only: the file's journal mode is kept (setting WAL rewrites a file in another mode); a stop still
        # writes its row. The storage notes its file as it opens it: one replaced since is said (`_check_file`)
        storage = SqlStorage(self.url, read_only=True, deadlines=(self.timeout_s, max(SLOW_READ_S, self.timeout_s)))
        storage.wait_for_outages(WAIT_S)
        return storage

    def close(self) -> None:
        """Close the storage; an attempt under way closes what it opens, and no new one starts."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()  # a retry between two attempts ends now
        if self._storage is not None:
            self._storage.close()


def lasting(record: ExperimentRecord) -> bool:
    """Whether the experiment has had a trial, so what it is can be kept (by its id, never given twice; a request
    checks that it still exists, `server.deps.current_experiment`). A trial's creation moves `trials_version` on,
    and trials are removed only with their experiment."""
    return record.trials_version > 0


class SpecCache:
    """What never changes, computed once: experiments' ids, names and specs, the configs built from a spec and a
    finished trial's parameters, best-trial responses and finished trials' entries of the trial list.

    Experiments are never renamed, and their ids, like their trials', are never given twice (migration 0008). One
    may be removed before its first trial (an engine that could not start, see `Storage.delete_experiment`), and the
    next `hpo run` records the name again with another spec: so an experiment's record, spec and verdict are kept
    only once it has a trial (`lasting`). One with trials may be removed by `hpo delete`: every request that uses a
    kept record reads its version by id first, and forgets it when it is gone (`server.deps.current_experiment`)."""

    def __init__(self) -> None:
        self._specs: dict[int, Any] = {}
        self._experiments: dict[str, ExperimentRecord] = {}
        self._configs: OrderedDict[tuple[int, int], dict[str, Any]] = OrderedDict()
        self._best_json: OrderedDict[tuple[int, int], bytes] = OrderedDict()
        self._verdicts: OrderedDict[tuple, Any] = OrderedDict()
        self._trial_json: OrderedDict[TrialVersion, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def known_experiment(self, name: str) -> ExperimentRecord | None:
        """The record of `name` as first read: only its fixed fields (id, name, direction, spec) are current."""
        return self._experiments.get(name)

    def remember_experiment(self, record: ExperimentRecord) -> None:
        if not lasting(record):
            return
        with self._lock:
            self._experiments[record.name] = record

    def forget_experiment(self, record: ExperimentRecord) -> None:
        """Forget a kept experiment that is gone from the database (`hpo delete`) and what was kept of it by id."""
        with self._lock:
            if (kept := self._experiments.get(record.name)) is not None and kept.id == record.id:
                del self._experiments[record.name]
            self._specs.pop(record.id, None)

    def known_best_json(self, record: ExperimentRecord, trial_id: int) -> bytes | None:
        """`best_json` of the trial with this id if it was made before, else None."""
        return self._best_json.get((record.id, trial_id))

    def best_json(self, record: ExperimentRecord, trial: TrialRecord) -> bytes:
        """The JSON body of a best-trial response (`BestTrialPublic`) of a finished trial."""
        key = (record.id, trial.id)
        body = self._best_json.get(key)
        if body is None:
            body = BestTrialPublic.from_record(record, trial, self.config(record, trial)).model_dump_json().encode()
            with self._lock:
                self._best_json[key] = body
                while len(self._best_json) > CONFIG_CACHE_SIZE:
                    self._best_json.popitem(last=False)
        return body

    def known_trial_json(self, version: TrialVersion) -> bytes | None:
        """The JSON of a finished trial as the trial list shows it (`TrialPublic`), if kept for this version."""
        return self._trial_json.get(version)

    def trial_json(self, trial: TrialRecord) -> bytes:
        """`TrialPublic` of `trial` as JSON; kept (by id, state and attempt) once the trial is finished, since a
        finished trial is written once and a re-queue raises its attempt."""
        version = TrialVersion(trial.id, trial.number, trial.state, trial.attempt)
        body = self._trial_json.get(version)
        if body is None:
            body = TrialPublic.from_record(trial).model_dump_json().encode()
            if trial.state.finished:
                with self._lock:
                    self._trial_json[version] = body
                    while len(self._trial_json) > TRIAL_CACHE_SIZE:
                        self._trial_json.popitem(last=False)
        return body

    def known_verdict(self, key: tuple) -> Any:
        """The verdict remembered under `key` (experiment, status, trial counts), or None."""
        return self._verdicts.get(key)

    def remember_verdict(self, key: tuple, verdict: Any) -> None:
        with self._lock:
            self._verdicts[key] = verdict
            while len(self._verdicts) > CONFIG_CACHE_SIZE:
                self._verdicts.popitem(last=False)

    def spec(self, record: ExperimentRecord):
        spec = self._specs.get(record.id)
        if spec is None:
            from hpo.experiment import spec_from_stored  # the trainer config models: built on first use

            spec = spec_from_stored(record)
            if not lasting(record):
                return spec
            with self._lock:
                self._specs[record.id] = spec
        return spec

    def config(self, record: ExperimentRecord, trial: TrialRecord) -> dict[str, Any]:
        """The production config of a finished trial (see hpo.export.production.production_config)."""
        key = (record.id, trial.id)
        config = self._configs.get(key)
        if config is None:
            try:
                config = production_config(self.spec(record), trial)
            except (SearchSpaceError, ConfigError) as exc:  # stored params the stored spec no longer accepts
                raise ExportError(f"trial {trial.number} of {record.name} has no valid trainer config: {exc}") from exc
            with self._lock:
                self._configs[key] = config
                while len(self._configs) > CONFIG_CACHE_SIZE:
                    self._configs.popitem(last=False)
        return config
