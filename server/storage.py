"""The server's view of the database: one storage opened on first use, and the experiments' parsed specs.

Opening is lazy so the server starts (and answers health checks with 503) while the database is still down,
and a read endpoint never creates a database: a missing SQLite file is reported, not made, and a SQLite file keeps
its journal mode. A database that goes away later is waited for briefly (WAIT_S, counted from the start of the
outage: hpo.storage.retry), then every request answers 503 at once until it is back; opening never waits, so a
server started before its database answers 503 without delay.

A database server that stops answering without closing its connections (its process stopped or hung) is not an
outage the driver notices: each statement, and the commit or rollback that ends a write (the stop action's), has a
deadline instead (hpo/storage/deadline.py), `timeout_s` (the setting HPO_API_DATABASE_TIMEOUT_S) for the reads made
on the event loop, `/health` and an experiment's first lookup by name (server.deps), SLOW_READ_S for the others,
each then a 503; after a missed deadline every request answers 503 at once until a probe hears the database.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from hpo.errors import StorageError
from hpo.export.production import ExportError, production_config
from hpo.storage import SqlStorage, Storage
from hpo.storage.base import ExperimentRecord, TrialRecord, TrialVersion
from hpo.storage.engine import DATABASE_URL_ENV, safe_url, sqlite_file
from search_spaces.errors import SearchSpaceError
from server.schemas import BestTrialPublic, TrialPublic
from trainer.errors import ConfigError

WAIT_S = 2.0  # how long requests wait for a database that went away (a restart's blip) before answering 503
SLOW_READ_S = 120.0  # a statement (or commit) in the thread pool (a report of 100,000 trials reads for seconds)
CONFIG_CACHE_SIZE = 1024
TRIAL_CACHE_SIZE = 20_000  # finished trials' list entries kept (about 0.5 KB each)


class StorageHolder:
    """Opens the storage on the first request that needs it (and again after a failed attempt)."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.url, self.timeout_s = url, timeout_s
        self._storage: Storage | None = None
        self._lock = threading.Lock()

    def get(self) -> Storage:
        if self._storage is None:
            with self._lock:
                if self._storage is None:
                    self._storage = self._open()
        return self._storage

    def _open(self) -> Storage:
        path = sqlite_file(self.url)  # any SQLite URL (sqlite+pysqlite:/// too), never a file the server would make
        if path is not None and not path.exists():
            raise StorageError(
                f"the SQLite database {path} does not exist: run `hpo db upgrade` (or an experiment) with "
                f"{DATABASE_URL_ENV}={safe_url(self.url)} first"
            )
        # read_only: the file's journal mode is kept (setting WAL rewrites a file in another mode); a stop still
        # writes its row
        storage = SqlStorage(self.url, read_only=True, deadlines=(self.timeout_s, max(SLOW_READ_S, self.timeout_s)))
        storage.wait_for_outages(WAIT_S)
        return storage

    def close(self) -> None:
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
