"""Database URLs and engines: where the database is, how connections are set up, how errors are worded.

The database URL is `HPO_DATABASE_URL` when set, else the SQLite file `$HPO_HOME/hpo.db`, where `HPO_HOME`
defaults to `./.hpo` relative to the current directory (the directory is created on first use).
PostgreSQL URLs look like `postgresql+psycopg://user:password@host:5432/dbname`.

SQLite connections get WAL mode (readers never block the writer), a 10 s busy timeout, foreign keys on, and
`synchronous=NORMAL` (in WAL mode this cannot corrupt the file; a power loss may drop the last commits).
Write transactions start with `BEGIN IMMEDIATE` so two writers queue on the busy timeout instead of failing
when one upgrades a read lock. A lock held past the busy timeout is an outage like a server that is down: the
storage's retry (hpo/storage/retry.py) waits for it up to `database.outage_s`, and the progress line says so.
PostgreSQL connection attempts give up after 10 s (`CONNECT_TIMEOUT_S`).

Errors that say the database is away for now (`is_transient`: refused or cut connections, a server shutting down
or starting up, a server short of disk, memory or connection slots (SQLSTATE class 53), a database closed to
connections, SQLite's "database is locked" or "database or disk is full") become DatabaseUnavailableError,
which callers may retry (hpo/storage/retry.py); a wrong host, user or database name stays a plain StorageError.

A pooled connection that sat idle for a second or more (`PING_AFTER_IDLE_S`) is pinged before it is handed out, so
one that the server closed meanwhile (a restart) is replaced instead of failing the caller; a connection in
steady use is not pinged (a ping is a round trip, as long as the API's hottest reads themselves).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    NoSuchModuleError,
    OperationalError,
    SQLAlchemyError,
)

from hpo.errors import BadDatabaseError, DatabaseUnavailableError, StorageError
from hpo.storage.deadline import NoAnswer, StatementDeadline

DATABASE_URL_ENV = "HPO_DATABASE_URL"
HOME_ENV = "HPO_HOME"
DEFAULT_HOME = ".hpo"
SQLITE_BUSY_TIMEOUT_MS = 10_000  # a write queues this long for other writers; longer is an outage (hpo.storage.retry)
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite file
CONNECT_TIMEOUT_S = 10  # PostgreSQL: how long a connection attempt may take
DEAD_CONNECTION_S = 18  # PostgreSQL: how long a connection may go unanswered before it counts as lost
PING_AFTER_IDLE_S = 1.0  # PostgreSQL: a pooled connection idle this long is pinged before it is handed out
# Execution option that asks for `BEGIN IMMEDIATE` on SQLite (ignored by other backends).
WRITE_OPTION = "hpo_write"


def default_database_url() -> str:
    """`HPO_DATABASE_URL`, else `sqlite:///<abs path of $HPO_HOME (default ./.hpo)>/hpo.db`."""
    url = os.environ.get(DATABASE_URL_ENV, "").strip()
    if url:
        return url
    home = Path(os.environ.get(HOME_ENV, "").strip() or DEFAULT_HOME)
    return f"sqlite:///{(home / 'hpo.db').resolve()}"


def parse_url(url: str | URL) -> URL:
    """`make_url`, where every URL no connection could use raises ArgumentError: one that does not parse, a port
    that is not a number (SQLAlchemy's parser raises a ValueError), a password with an `@` not written `%40` (the
    URL's first `@` ends the password, and the rest of it would be taken for the host, or with a `/`, `?` or `#`
    after that `@` for the database or the query: `_password_end`)."""
    at_sign = ArgumentError("its password holds an '@' not written %40: a URL's first '@' ends its password, and the "
                            "rest of the password would be taken for the host or the database. Percent-encode the "
                            "password ('@' as %40, each of : / ? # [ ] % as %XX, as Python's "
                            "urllib.parse.quote(password, safe='') writes it), or give it as ?password=... "
                            "(percent-encoded too)")  # fmt: skip
    if isinstance(url, str) and _password_end(url) is not None:
        raise at_sign
    try:
        parsed = make_url(url)
        if isinstance(url, str) and "@" in url and parsed.host != make_url(_mask_query_passwords(url)).host:
            raise at_sign  # `?password=a@b`: SQLAlchemy took `b` for the host (and what was before for a password)
    except ValueError as exc:  # int() of the port
        rest = str(url).partition("://")[2]
        # After a password's first '@' SQLAlchemy reads host and port up to the next '/' or '?': another '@' there
        # (`u:p@ss:w@host:5432`, `u:p@ss@[::1]:5432`) is the password's, and 5432 no wrong port.
        if ":" in rest.partition("@")[0] and "@" in re.split(r"[/?]", rest.partition("@")[2], maxsplit=1)[0]:
            raise at_sign from exc
        port = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2].rpartition(":")[2]
        raise ArgumentError(f"its port {port!r} is not a number") from exc
    if parsed.host and "@" in parsed.host:
        raise at_sign
    return parsed


def safe_url(url: str | URL) -> str:
    """The URL as it may appear in messages and logs: the password masked, also one in the query (libpq takes
    `?password=` and `?sslpassword=`) and one with an `@` not percent-encoded (all of it up to the `@` that
    `_password_end` finds before the host, whatever `/`, `?` or `#` it holds)."""
    if isinstance(url, str):
        url = _mask_query_passwords(url)
        end = _password_end(url)
        if end is not None:
            url = f"{_USER_AND_PASSWORD.match(url).group('user')}:***{url[end:]}"
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return "<unparsable database URL>"
    if parsed.host and "@" in parsed.host:
        parsed = parsed.set(password="hidden", host=parsed.host.rpartition("@")[2])
    shown = parsed.render_as_string(hide_password=True)
    return _mask_query_passwords(shown)


# `scheme://user:password@` as SQLAlchemy reads it: the password ends at the first '@'.
_USER_AND_PASSWORD = re.compile(r"(?P<user>[\w+]+://[^:/]*):[^@]*@")
# What follows the '@' that ends the password, where nothing of the password is left in it: a host (an IPv6 one in
# brackets), a port, a database, a query; an '@' may be in the query only (a path: `?sslrootcert=/a@b/root.crt`).
_HOST_ON = re.compile(r"(?:\[[^\]/?#@]*\]|[^/:?#@\[\]]*)(?::\d*)?(?:/[^?@]*)?(?:\?(?P<query>.*))?", re.DOTALL)
_QUERY_PAIR = re.compile(r"[A-Za-z_][\w.-]*=[^&]*")
# In a query: an '@' followed by a host with a port or a database, as the '@' that ended a password would be.
_HOST_IN_QUERY = re.compile(r"@[^/:?#@&=\[\]]+(?::\d+)?/|@[^/:?#@&=\[\]]+:\d+(?:&|$)")
_QUERY_PASSWORD = re.compile(r"([?&](?:ssl)?password=)[^&]*")


def _mask_query_passwords(url: str) -> str:
    return _QUERY_PASSWORD.sub(r"\1***", url)


def _password_end(url: str) -> int | None:
    """Where the password of `url` ends (the index of its '@') when it holds an '@' not written %40: SQLAlchemy ends
    it at its first '@' and reads the rest as host, port, database or query (`u:p@ss/w#rd@db:5432/hpo`: the host
    `ss` and the database `w#rd@db:5432/hpo`). The password then runs to the first '@' after which only a host,
    port, database and query follow (`_HOST_ON`), or to the last '@' where none does. None for a URL without a
    password or whose password SQLAlchemy reads whole."""
    found = _USER_AND_PASSWORD.match(url)
    if found is None or "@" not in url[found.end() :] or _host_on(url[found.end() :]):
        return None
    ats = [i for i in range(found.end(), len(url)) if url[i] == "@"]
    return next((i for i in ats if _host_on(url[i + 1 :])), ats[-1])


def _host_on(rest: str) -> bool:
    """Whether `rest`, what follows a URL's '@', is a host and what may follow it, with nothing of a password."""
    matched = _HOST_ON.fullmatch(rest)
    if matched is None:
        return False
    query = matched.group("query")
    if query is None or "@" not in query:
        return True
    return all(_QUERY_PAIR.fullmatch(pair) for pair in query.split("&")) and not _HOST_IN_QUERY.search(query)


def create_storage_engine(url: str, read_only: bool = False, one_shot: bool = False, writes: bool = True,
                          deadline: StatementDeadline | None = None) -> Engine:  # fmt: skip
    """An engine for `url` with the project's connection settings; a bad URL raises StorageError. `read_only`: for
    readers that must leave a SQLite file as they found it (no directory made, its journal mode kept); `one_shot`
    too, a command's reads over in moments: a SQLite file it may not write, closed by its last writer, is read as
    an immutable file (see `_sqlite_engine`). `writes=False` (with `read_only`): a command that only reads opens a
    SQLite file read-only, so that its last connection's close does not fold a log left by a writer that died into
    the file. `deadline`: on a database server, each statement, commit, rollback, ping and connection attempt fails
    after its seconds (hpo/storage/deadline.py); ignored for SQLite."""
    try:
        parsed = parse_url(url)
        if parsed.drivername == "postgres":  # Heroku's and libpq's spelling, which SQLAlchemy no longer takes
            parsed = parsed.set(drivername="postgresql+psycopg")
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_engine(parsed, read_only, one_shot=read_only and one_shot, writes=writes or not read_only)
        connect_args = server_connect_args(parsed, deadline.seconds if deadline else CONNECT_TIMEOUT_S)
        engine = create_engine(parsed, json_serializer=dumps_json, connect_args=connect_args)
        _ping_idle_connections(engine, deadline)
        if deadline is not None:
            deadline.install(engine)
        return engine
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raw = str(url)
        if "://" not in raw and not set("@:?") & set(raw):  # a file's path given for a URL (no password to hide)
            raise StorageError(
                f"the database URL {raw!r} is a file's path, not a URL: for a SQLite file give "
                f"sqlite:///{Path(raw).expanduser().resolve()} (with --db, or in {DATABASE_URL_ENV})"
            ) from exc
        raise StorageError(
            f"cannot use the database URL {safe_url(url)}: {exc}. Expected e.g. sqlite:///path/hpo.db or "
            f"postgresql+psycopg://user@host:5432/dbname (with --db, or in {DATABASE_URL_ENV})."
        ) from exc


def server_connect_args(url: URL, connect_timeout_s: float = CONNECT_TIMEOUT_S) -> dict[str, Any]:
    """Driver arguments for a database server (each unless the URL sets its own): on PostgreSQL a server that cannot
    be reached fails after `connect_timeout_s` (whole seconds, at least 2: psycopg's least) instead of the operating
    system's minutes, and a connection whose server stopped answering (the network between dropped it; TCP would
    retransmit for about 15 minutes) fails after DEAD_CONNECTION_S: sent data unacknowledged that long, or an idle
    connection whose keepalive probes get no answer. The API reads its hottest answers on its event loop, which such
    a connection would hold (a server process that stops while its machine answers: hpo/storage/deadline.py)."""
    if url.get_backend_name() != "postgresql":
        return {}
    wanted = {"connect_timeout": max(2, math.ceil(connect_timeout_s)), "keepalives": 1,
              "keepalives_idle": DEAD_CONNECTION_S // 2, "keepalives_interval": DEAD_CONNECTION_S // 6,
              "keepalives_count": 3,
              "tcp_user_timeout": DEAD_CONNECTION_S * 1000}  # fmt: skip
    return {key: value for key, value in wanted.items() if key not in url.query}


def _ping_idle_connections(engine: Engine, deadline: StatementDeadline | None = None) -> None:
    """SQLAlchemy's pre-ping (`pool_pre_ping`), for connections idle PING_AFTER_IDLE_S or more only: a dead one is
    replaced, as the pool retries a checkout that raises DisconnectionError (a replaced connection's `info` starts
    empty, so it is not pinged again). A ping past `deadline` fails the checkout instead: a server that does not
    answer would not answer a new connection either, and trying one would wait out another deadline."""

    def checked_in(_dbapi_connection: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return  # new, or in steady use
        try:
            with deadline.watch(dbapi_connection) if deadline else contextlib.nullcontext():
                engine.dialect.do_ping(dbapi_connection)  # the dialect's own (psycopg's keeps autocommit as it was)
        except NoAnswer as exc:  # the pool invalidates the connection
            raise OperationalError("ping", None, exc, connection_invalidated=True) from exc
        except engine.dialect.loaded_dbapi.Error as exc:
            raise DisconnectionError(f"a pooled connection idle for a while no longer answers: {exc}") from exc

    event.listen(engine, "checkin", checked_in)
    event.listen(engine, "checkout", checked_out)


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL (`sqlite:///`, `sqlite+pysqlite:///`, ...); None for another database, an
    in-memory one, a `file:` URI or a URL that does not parse (opening it says what is wrong)."""
    try:
        parsed = parse_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return None if parsed.database.startswith("file:") else Path(parsed.database)


def in_memory_sqlite(url: str) -> bool:
    """An in-memory SQLite URL (`sqlite://`, `sqlite:///`, `sqlite:///:memory:`): a database gone with its process."""
    try:
        parsed = parse_url(url)
    except ArgumentError:
        return False
    return parsed.get_backend_name() == "sqlite" and parsed.database in (None, "", ":memory:")


def _sqlite_engine(url: URL, read_only: bool = False, one_shot: bool = False, writes: bool = True) -> Engine:
    if not read_only and url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        directory = Path(url.database).parent
        try:
            directory.mkdir(parents=True, exist_ok=True)  # SQLite creates the file but not its directory
        except OSError as exc:  # bad input (a path no database can be at), exit 2 from the CLI
            raise BadDatabaseError(
                f"cannot create the directory {directory} for the SQLite database: {exc}. Set {HOME_ENV} or "
                f"{DATABASE_URL_ENV} to a writable place."
            ) from exc
    if one_shot and _unwritable_and_closed(url.database):
        # Opened as usual, SQLite would leave -wal and -shm files beside a WAL file it may only read: an immutable
        # file is read without them, and without locks, so only by a command's reads of moments, never by a
        # long-lived reader (the API's): a writer that starts later would go unseen.
        url = url.set(database=f"file:{quote(str(Path(url.database).resolve()))}",
                      query={"immutable": "1", "uri": "true"})  # fmt: skip
    elif not writes and (path := _sqlite_path(url.database)) is not None and Path(f"{path}-wal").exists():
        # A log beside the file (a writer's, or one that a killed controller left): read-only, a connection reads
        # what the log holds and never checkpoints it into the file when it closes, as the last one to close would.
        # Without a log the file is opened as usual: read-only, SQLite would leave an empty -wal and -shm behind.
        url = url.set(database=f"file:{quote(str(path.resolve()))}", query={"mode": "ro", "uri": "true"})
    engine = create_engine(url, json_serializer=dumps_json, connect_args={"check_same_thread": False})
    configure = _configure_sqlite_reader if read_only else _configure_sqlite_connection
    event.listen(engine, "connect", configure)
    event.listen(engine, "begin", _begin_sqlite_transaction)
    return engine


def _sqlite_path(database: str | None) -> Path | None:
    """The file a SQLite URL's database names, where it is a plain path to an existing file."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database) if Path(database).is_file() else None


def _unwritable_and_closed(database: str | None) -> bool:
    """A SQLite file in WAL mode (its header's versions 2) that exists, that this process may not write, and that
    has no -wal or -journal file (its last writer closed it, so the file holds every commit)."""
    path = _sqlite_path(database)
    if path is None or os.access(path, os.W_OK) or any(Path(f"{path}{s}").exists() for s in ("-wal", "-journal")):
        return False
    try:
        with path.open("rb") as file:
            header = file.read(20)
    except OSError:
        return False
    return header[:16] == SQLITE_MAGIC and header[18:20] == b"\x02\x02"


def _configure_sqlite_connection(dbapi_connection: Any, _record: Any, journal: bool = True) -> None:
    # Autocommit at the driver level: pysqlite's own implicit BEGIN would defeat BEGIN IMMEDIATE
    # (and make DDL non-transactional); `_begin_sqlite_transaction` emits BEGIN itself.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    if journal:  # WAL, so readers and the writer do not block each other; the mode is kept in the file
        cursor.execute("PRAGMA journal_mode = WAL")
    cursor.execute("PRAGMA synchronous = NORMAL")
    cursor.execute("PRAGMA foreign_keys = ON")
    cursor.close()


def _configure_sqlite_reader(dbapi_connection: Any, record: Any) -> None:
    """As `_configure_sqlite_connection`, but the file's journal mode is left as it is: setting it writes."""
    _configure_sqlite_connection(dbapi_connection, record, journal=False)


def _begin_sqlite_transaction(connection: Any) -> None:
    write = connection.get_execution_options().get(WRITE_OPTION, False)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def dumps_json(value: Any) -> str:
    """JSON for the database: NaN/inf become null (neither SQL JSON type accepts them), numpy scalars numbers."""
    return json.dumps(_finite(value), allow_nan=False, default=_json_default)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars, 0-d tensors: a controller may hand those over as params
        return _finite(value.item())
    raise TypeError(f"{type(value).__name__} is not JSON serializable: {value!r}")


def is_locked_error(exc: BaseException) -> bool:
    """Whether `exc` is SQLite's "database is locked/busy", which goes away if retried."""
    text = str(getattr(exc, "orig", exc)).lower()
    return isinstance(exc, OperationalError) and ("database is locked" in text or "database is busy" in text)


# What a database that is away for a while says, in the driver's words (psycopg/libpq and sqlite3): the server is
# down or restarting, the connection broke, the file is locked or its disk full. A wrong host name, user,
# password or database name is not among them: retrying those only delays the message that says what to fix.
TRANSIENT_MESSAGES = (
    "connection refused",
    "connection reset",
    "connection timed out",
    "timeout expired",
    "server closed the connection unexpectedly",
    "terminating connection",
    "the database system is shutting down",
    "the database system is starting up",
    "the database system is not yet accepting connections",
    "the database system is in recovery mode",
    "sorry, too many clients already",
    "consuming input failed",
    "could not receive data from server",
    "could not send data to server",
    "ssl connection has been closed unexpectedly",
    "the connection is lost",
    "the connection is closed",
    "no route to host",
    "network is unreachable",
    "broken pipe",
    "deadlock detected",
    "database is locked",
    "database is busy",
    "database or disk is full",
    "is not currently accepting connections",  # ALTER DATABASE ... ALLOW_CONNECTIONS false (SQLSTATE 55000)
)
# SQLSTATEs of a server short of a resource for now, class 53 "insufficient resources": its disk full (53100), out of
# memory (53200), no connection slot free (53300), or another (53000). The statement's transaction was rolled back,
# so the call runs again whole as after a lost connection. Not 53400 (configuration_limit_exceeded): a statement
# over a limit the server is configured with fails the same way on every try.
TRANSIENT_SQLSTATES = frozenset({"53000", "53100", "53200", "53300"})
DISK_FULL_SQLSTATE = "53100"
# A PostgreSQL server's refusals of the URL itself (its database, user or password): no wait ends them.
REFUSED_FOR_GOOD = re.compile(
    r'(database|role) ".*" does not exist|password authentication failed|no pg_hba\.conf entry'
)


def is_transient(exc: BaseException) -> bool:
    """Whether `exc` (a SQLAlchemy error) says the database is away for now, so the same call may succeed later: a
    connection refused, reset or lost mid-transaction, a server shutting down or starting up, a server short of disk,
    memory or connection slots (SQLSTATE class 53, `TRANSIENT_SQLSTATES`), a database closed to connections
    (`ALLOW_CONNECTIONS false`), SQLite's "database is locked" and "database or disk is full". Not: refused changes,
    bad SQL, wrong credentials or database names."""
    if isinstance(exc, IntegrityError) or not isinstance(exc, OperationalError | DBAPIError):
        return False
    if exc.connection_invalidated or sqlstate(exc) in TRANSIENT_SQLSTATES:
        return True
    text = str(getattr(exc, "orig", None) or exc).lower()
    return any(message in text for message in TRANSIENT_MESSAGES)


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE a PostgreSQL server gave with the error (psycopg's `sqlstate`, psycopg2's `pgcode`); None for
    other databases and for errors no server sent (a connection attempt's, which libpq words itself)."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


# What an outage's message tells a command's user to do besides waiting (the API's answers say their own instead:
# server.errors.unavailable_detail)
COMMAND_WAITS = "and the command that waits goes on; or set HPO_DATABASE_OUTAGE_S to the seconds to wait for it."
SET_OUTAGE_S = "set HPO_DATABASE_OUTAGE_S to the seconds to wait for it, "


def storage_error(exc: SQLAlchemyError, url: str | URL) -> StorageError:
    """The project's error for a database-library error: what failed, on which database, what to do."""
    reason = _first_line(getattr(exc, "orig", None) or exc)
    where = safe_url(url)
    if isinstance(exc, IntegrityError):
        return StorageError(f"the database {where} refused the change (a constraint was violated): {reason}")
    if "file is not a database" in reason.lower():
        return BadDatabaseError(
            f"the file of {where} is not a SQLite database ({reason}): check that {DATABASE_URL_ENV} (or --db) "
            "names the hpo database"
        )
    if make_url(url).get_backend_name() == "sqlite" and re.search(
        r"unable to open database file|readonly database", reason
    ):  # the file, not a server
        return BadDatabaseError(
            f"cannot use the SQLite file of {where}: {reason}. Check that the path names a file (not a folder) in a "
            "folder this user can write to: SQLite writes its -wal and -shm files beside the database, also to read "
            "it (copy the file to such a folder to read it)"
        )
    if is_locked_error(exc):
        return DatabaseUnavailableError(
            f"the SQLite database {where} stayed locked by another writer: {reason} (for longer than SQLite's "
            f"{SQLITE_BUSY_TIMEOUT_MS / 1000:g} s busy timeout). Another process holds a write transaction on it (a "
            "sqlite3 shell or a database browser with changes not committed, or another command's long write): end "
            f"it and try again, {SET_OUTAGE_S}or use PostgreSQL "
            f"({DATABASE_URL_ENV}=postgresql+psycopg://...) for many concurrent writers.",
            state="locked by another writer",
        )
    if sqlstate(exc) == DISK_FULL_SQLSTATE and is_transient(exc):  # a PostgreSQL server that cannot grow a file
        return DatabaseUnavailableError(
            f"the database server of {where} reported its disk full: {reason}. Free space on the disk of its data "
            "directory (`df` on the database's machine, or its volume: `docker-compose exec postgres df -h "
            f"/var/lib/postgresql/data`), or give it a larger one, {COMMAND_WAITS}",
            state="out of disk space",
        )
    if sqlstate(exc) in TRANSIENT_SQLSTATES and is_transient(exc):  # short of memory or of another resource
        return DatabaseUnavailableError(
            f"the database server of {where} is short of a resource it needs: {reason}. It comes back once other "
            f"clients' load eases (or its settings give it more), {COMMAND_WAITS}",
            state="short of a resource",
        )
    if "is not currently accepting connections" in reason.lower() and is_transient(exc):
        return DatabaseUnavailableError(
            f"the database of {where} is closed to connections: {reason}. Its owner closed it (`ALTER DATABASE ... "
            "ALLOW_CONNECTIONS false`, e.g. for maintenance); `ALTER DATABASE ... ALLOW_CONNECTIONS true` opens it "
            f"again, {COMMAND_WAITS}",
            state="closed to connections",
        )
    if "database or disk is full" in reason.lower():  # SQLite's words (its file's disk), or a server's full disk
        return DatabaseUnavailableError(
            f"the disk of the database {where} is full: {reason}. Free space on that disk (`df` shows it), "
            f"{COMMAND_WAITS}",
            state="out of disk space",
        )
    if "deadlock detected" in reason.lower():  # PostgreSQL ended one of two transactions waiting for each other
        return StorageError(
            f"the database {where} ended this command's transaction to break a deadlock with another client's: "
            f"{reason}. Its changes were not kept; run the command again"
        )
    if isinstance(exc, OperationalError) and REFUSED_FOR_GOOD.search(reason):
        return BadDatabaseError(
            f"the database server refused {where}: {reason}. Check that {DATABASE_URL_ENV} (or --db) names an "
            "existing database and user, with the right password (`createdb NAME` makes a database)"
        )
    if isinstance(exc, OperationalError) or getattr(exc, "connection_invalidated", False):
        # The database is away for now (DatabaseUnavailableError: callers may wait and retry) or misnamed.
        error = DatabaseUnavailableError if is_transient(exc) else StorageError
        if make_url(url).get_backend_name() == "sqlite":  # a file: no server, host or user to check
            return error(
                f"cannot use the SQLite file of {where}: {reason}. Check the file and the disk under it: that it is "
                "still there and this user may write it and its -wal and -shm files beside it, and that the disk "
                "answers (`dmesg` names disk errors)."
            )
        return error(
            f"cannot use the database {where}: {reason}. Check that the database server is running and "
            f"reachable, and that {DATABASE_URL_ENV} (or --db) names the right host, port, database and user."
        )
    return StorageError(f"database error on {where}: {reason}")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
