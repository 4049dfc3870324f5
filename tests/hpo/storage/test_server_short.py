"""A PostgreSQL server short of a resource for a while (its disk full, out of memory: SQLSTATE class 53) or a database
closed to connections (`ALLOW_CONNECTIONS false`) is an outage the storage waits for (hpo/storage/retry.py), with a
message that says what happened; other refusals stay errors at once.

The classification runs on the driver's own exception classes; the waits on a real server: a trigger that raises
SQLSTATE 53100 while a flag row says so (the test clears the flag from another connection once the write has been
tried a few times), and a database of the test's own closed with `ALLOW_CONNECTIONS false` and its connections cut.
No test asserts a duration measured on the wall clock.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

import hpo.storage.retry as retry
from hpo.errors import DatabaseUnavailableError
from hpo.storage import SqlStorage
from hpo.storage.engine import is_transient, sqlstate, storage_error
from tests.hpo.storage.conftest import POSTGRES_SKIP_REASON, POSTGRES_URL_ENV, postgres_schema_url

psycopg = pytest.importorskip("psycopg")

URL = "postgresql+psycopg://hpo:s3cret@db.example:5432/hpo"
DISK_FULL = 'could not extend file "base/16384/16397": No space left on device'
CLOSED = ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  database "hpo" is not '
          "currently accepting connections")  # fmt: skip
SERVER_TO_CHECK = "Check that the database server is running"


def server_error(code: str | None, message: str, wrapper: type = OperationalError) -> Exception:
    """The SQLAlchemy error for psycopg's exception of SQLSTATE `code` (None: one libpq raises, with no SQLSTATE, as
    for a refused connection attempt)."""
    orig = psycopg.OperationalError(message) if code is None else psycopg.errors.lookup(code)(message)
    return wrapper("INSERT INTO experiments ...", {}, orig)


@pytest.mark.parametrize(
    "code, message",
    [("53000", "too many dynamic shared memory segments"), ("53100", DISK_FULL), ("53200", "out of memory"),
     ("53300", "remaining connection slots are reserved for roles with the SUPERUSER attribute"),
     (None, CLOSED)],
)  # fmt: skip
def test_a_server_short_of_a_resource_or_a_database_closed_to_connections_is_an_outage(code, message):
    error = server_error(code, message)
    assert sqlstate(error) == code and is_transient(error)
    translated = storage_error(error, URL)
    assert type(translated) is DatabaseUnavailableError and "s3cret" not in str(translated)
    assert SERVER_TO_CHECK not in str(translated) and "HPO_DATABASE_OUTAGE_S" in str(translated)


@pytest.mark.parametrize(
    "code, message, wrapper",
    [("53400", "too many grouping sets present (maximum 4096)", OperationalError),  # the same on every try
     ("55000", "cannot alter type of a column used by a view or rule", OperationalError),
     ("55P03", 'could not obtain lock on row in relation "trials"', OperationalError),
     ("42601", 'syntax error at or near "SELEC"', ProgrammingError),
     ("23505", 'duplicate key value violates unique constraint "uq_trials_number"', IntegrityError),
     ("28P01", 'password authentication failed for user "hpo"', OperationalError),
     (None, 'connection failed: FATAL:  database "hpo" does not exist', OperationalError)],
)  # fmt: skip
def test_other_refusals_are_not_an_outage(code, message, wrapper):
    error = server_error(code, message, wrapper)
    assert not is_transient(error)
    assert not isinstance(storage_error(error, URL), DatabaseUnavailableError)


def test_a_full_disk_says_so_and_what_to_do_not_to_check_the_server():
    translated = str(storage_error(server_error("53100", f"{DISK_FULL}\nHINT:  Check free disk space."), URL))
    assert translated.startswith(
        f"the database server of postgresql+psycopg://hpo:***@db.example:5432/hpo reported its disk full: {DISK_FULL}. "
        "Free space on the disk of its data directory"
    ), translated
    assert SERVER_TO_CHECK not in translated and translated.endswith("seconds to wait for it.")


def test_a_database_closed_to_connections_says_how_it_opens_again():
    translated = str(storage_error(server_error(None, CLOSED), URL))
    assert "is closed to connections" in translated and "ALLOW_CONNECTIONS true" in translated, translated
    assert SERVER_TO_CHECK not in translated


# -- on a real server ------------------------------------------------------------------------------------------


@pytest.fixture
def short_pauses(monkeypatch) -> None:
    """The pauses between a write's tries start at 20 ms, not 250 ms (hpo.storage.retry.backoff): the tries and
    what they say are the same, the waits between them shorter."""
    backoff = retry.backoff
    monkeypatch.setattr(retry, "backoff", lambda rng: backoff(rng, base_s=0.02))


@pytest.fixture
def postgres_url() -> Iterator[str]:
    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(POSTGRES_SKIP_REASON)
    yield base_url


@pytest.fixture
def full_disk(postgres_url: str) -> Iterator[tuple[str, threading.Event]]:
    """A migrated schema of its own whose `experiments` and `trials` refuse every insert and update with SQLSTATE
    53100 (disk_full) while its flag row says so: the URL, and an event that clears the flag once set."""
    url = next(schema := postgres_schema_url(postgres_url))
    name = make_url(url).query["options"].partition("=")[2]
    SqlStorage(url, upgrade=True).close()
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE TABLE "{name}".disk_full (is_full BOOLEAN NOT NULL)')
        connection.exec_driver_sql(f'INSERT INTO "{name}".disk_full VALUES (true)')
        connection.exec_driver_sql(f"""
            CREATE FUNCTION "{name}".refuse_when_full() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF (SELECT is_full FROM "{name}".disk_full) THEN
                    RAISE EXCEPTION 'could not extend file "base/16384/16397": No space left on device'
                        USING ERRCODE = 'disk_full', HINT = 'Check free disk space.';
                END IF;
                RETURN NEW;
            END $$""")  # fmt: skip
        for table in ("experiments", "trials"):
            connection.exec_driver_sql(f'CREATE TRIGGER refuse_when_full BEFORE INSERT OR UPDATE ON "{name}".{table} '
                                       f'FOR EACH ROW EXECUTE FUNCTION "{name}".refuse_when_full()')  # fmt: skip
    freed = threading.Event()

    def free_once_told() -> None:
        if freed.wait(timeout=60):
            with admin.connect() as connection:
                connection.exec_driver_sql(f'UPDATE "{name}".disk_full SET is_full = false')

    freer = threading.Thread(target=free_once_told)
    freer.start()
    try:
        yield url, freed
    finally:
        freed.set()
        freer.join()
        admin.dispose()
        next(schema, None)  # drops the schema


@pytest.mark.postgres
def test_a_write_waits_for_a_server_whose_disk_is_full_and_goes_on_once_it_has_space(full_disk, short_pauses):
    url, freed = full_disk
    told: list[str] = []
    states: set[str] = set()  # what the progress line says the database is, while the write waits

    def waiting(error: DatabaseUnavailableError, _bound_s: float) -> None:  # before each pause
        told.append(str(error))
        states.add(storage.outage_state())
        if len(told) == 3:  # tried three times: the disk gets space
            freed.set()

    with SqlStorage(url, outage_s=60, on_wait=waiting) as storage:
        experiment_id = storage.create_experiment("patient", {}, "minimize")
        assert [e.name for e in storage.list_experiments()] == ["patient"]
        assert storage.get_experiment(experiment_id).name == "patient"
        assert storage.unreachable_for() is None
    assert len(told) >= 3 and all("reported its disk full: could not extend file" in text for text in told), told
    assert states == {"out of disk space"}


@pytest.mark.postgres
def test_past_its_bound_a_write_gives_up_saying_the_servers_disk_is_full(full_disk):
    url, _freed = full_disk
    with SqlStorage(url, outage_s=1) as storage:
        with pytest.raises(DatabaseUnavailableError) as raised:
            storage.create_experiment("impatient", {}, "minimize")
        assert storage.list_experiments() == []
    message = str(raised.value)
    assert "reported its disk full: could not extend file" in message and "Free space on the disk" in message
    assert "unreachable for" in message and "database.outage_s = 1 s" in message and SERVER_TO_CHECK not in message


@pytest.mark.postgres
def test_without_waiting_a_full_disk_fails_at_once_as_an_outage_not_as_a_wrong_server(full_disk):
    url, _freed = full_disk
    with SqlStorage(url) as storage, pytest.raises(DatabaseUnavailableError, match="reported its disk full"):
        storage.create_experiment("hasty", {}, "minimize")


@pytest.mark.postgres
def test_a_write_waits_for_a_database_closed_to_connections_and_goes_on_once_it_opens(postgres_url, short_pauses):
    """The tester's case: `ALTER DATABASE ... ALLOW_CONNECTIONS false` and the connections cut. The cut connections
    were an outage already; the new ones the server refused ended the command."""
    name = f"hpo_test_closed_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    told: list[str] = []
    opened = threading.Event()

    def waiting(error: DatabaseUnavailableError, _bound_s: float) -> None:
        told.append(str(error))
        if "is closed to connections" in str(error) and not opened.is_set():
            opened.set()
            with admin.connect() as connection:
                connection.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')

    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        url = make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
        with SqlStorage(url, upgrade=True, outage_s=60, on_wait=waiting) as storage:
            storage.create_experiment("before", {}, "minimize")
            with admin.connect() as connection:
                connection.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
                connection.exec_driver_sql(
                    f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
                )
            storage.create_experiment("after", {}, "minimize")
            assert sorted(e.name for e in storage.list_experiments()) == ["after", "before"]
        assert opened.is_set() and told, told
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
