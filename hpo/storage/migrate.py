"""Schema migrations, run explicitly: `upgrade_database(url)` is what `hpo db upgrade` calls.

The Alembic scripts ship inside the package (`hpo/storage/migrations/`); the Alembic configuration is built
here in code, so no alembic.ini is needed. Storages refuse to open a database whose schema is not at the head
revision (`check_schema`), so code never runs against tables it does not know.

A new migration, after changing `models.py`: upgrade a scratch database to head, then let Alembic compare

    engine = create_storage_engine("sqlite:////tmp/scratch.db")
    with engine.connect() as connection:
        alembic.command.revision(alembic_config(connection), "what changed", autogenerate=True, rev_id="0002")

and clean the generated file in `migrations/versions/` by hand (tests check migrations == models).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from hpo.errors import BadDatabaseError, SchemaOutOfDateError, StorageError
from hpo.storage.engine import WRITE_OPTION, create_storage_engine, safe_url, sqlite_file, storage_error

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# The newest revision in migrations/versions (tests check it against Alembic's own head). Opening a storage
# compares the database's revision with it in one query, without importing Alembic: every trial process and
# read-only command opens one.
HEAD_REVISION = "0008_ids_never_reused"


def upgrade_database(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (default: the newest), creating the tables if needed. A new SQLite
    file appears with its tables in it (`_create_sqlite_file`): no other process sees it half made."""
    from alembic import command

    path = sqlite_file(url)
    if path is not None and not path.exists() and _create_sqlite_file(url, path, revision):
        return
    _refuse_tables_not_ours(url)

    def upgrade(config: Config) -> None:
        connection = config.attributes["connection"]
        taken = _unversioned_tables(connection)
        connection.rollback()  # the check's read transaction: Alembic begins (and commits) its own
        _refuse_taken(url, taken)
        command.upgrade(config, revision)

    _run_alembic(url, upgrade)


def _create_sqlite_file(url: str, path: Path, revision: str) -> bool:
    """Make a new SQLite database at `path` whole: its schema is built in a hidden file beside it, which is then
    linked to `path` in one step (a link, unlike a rename, never replaces a file another process made meanwhile).
    Built in place, the file would be seen before its schema was committed, and `hpo status` or a second `hpo run`
    on it would say it had no hpo tables. False when `path` should be upgraded as it is instead: another process
    made it first, or this file system makes no hard links."""
    from alembic import command

    hidden = path.with_name(f".{path.name}.new-{os.getpid()}-{threading.get_ident()}")
    _remove_abandoned(path)
    try:
        _run_alembic(make_url(url).set(database=str(hidden)).render_as_string(hide_password=False),
                     lambda config: command.upgrade(config, revision), shown=url)  # fmt: skip
        if _sqlite_leftovers(hidden):  # a log not folded into the file when it closed: link nothing
            return False
        os.link(hidden, path)
        return True
    except OSError:  # made by another process meanwhile (EEXIST), or no hard links here: upgrade what is there
        return False
    finally:
        for leftover in (hidden, *_sqlite_leftovers(hidden)):
            with contextlib.suppress(OSError):  # none where the folder could not be made
                leftover.unlink(missing_ok=True)


ABANDONED_AFTER_S = 3600.0  # a hidden new database this old was left by a creator that was killed: none takes as long


def _remove_abandoned(path: Path) -> None:
    """Remove the hidden files of creations of `path` that a killed process left (SIGKILL, or SIGTERM, which runs no
    cleanup) an hour or more ago; younger ones may be another process's, still building."""
    now = time.time()
    for hidden in path.parent.glob(f".{glob.escape(path.name)}.new-*"):
        with contextlib.suppress(OSError):
            if now - hidden.stat().st_mtime >= ABANDONED_AFTER_S:
                hidden.unlink()


def _sqlite_leftovers(path: Path) -> list[Path]:
    """The files SQLite keeps beside a database while it is open (its write-ahead log and shared memory)."""
    return [Path(f"{path}{suffix}") for suffix in ("-wal", "-shm", "-journal") if Path(f"{path}{suffix}").exists()]


def downgrade_database(url: str, revision: str) -> None:
    """Take the database at `url` back to `revision` ("base" drops every table); for tests and rollbacks."""
    from alembic import command

    _run_alembic(url, lambda config: command.downgrade(config, revision))


def current_revision(url: str) -> str | None:
    """The database's schema revision, or None when it has no hpo schema."""
    engine = create_storage_engine(url)
    try:
        with engine.connect() as connection:
            return stored_revision(connection)
    except SQLAlchemyError as exc:
        raise storage_error(exc, url) from exc
    finally:
        engine.dispose()


@functools.cache
def head_revision() -> str:
    """The newest revision the code knows."""
    head = _script_directory().get_current_head()
    assert head is not None, f"no migrations found in {MIGRATIONS_DIR}"
    return head


def stored_revision(connection: Connection) -> str | None:
    """The revision recorded in the database's alembic_version table; None without one."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise SchemaOutOfDateError(f"the database has several schema revisions ({', '.join(rows)}): one expected")
    return rows[0] if rows else None


def check_schema(connection: Connection, url: str) -> None:
    """Raise SchemaOutOfDateError unless the database's schema is exactly at the head revision."""
    current = stored_revision(connection)
    if current == HEAD_REVISION:
        return
    head = head_revision()
    where = safe_url(url)
    if current is None:
        if taken := _unversioned_tables(connection):
            raise SchemaOutOfDateError(f"the database {where} {_not_ours(taken)}")
        if others := sorted(inspect(connection).get_table_names()):
            shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
            raise SchemaOutOfDateError(
                f"the database {where} holds other tables ({shown}) and none of hpo's: another program's database, "
                "or the wrong --db (or HPO_DATABASE_URL); give hpo a database of its own (a new SQLite file name "
                f"makes one), or add hpo's tables beside those with `hpo db upgrade` (it migrates {where})"
            )
        problem = f"the database {where} has no hpo tables yet"
    elif current not in _known_revisions():
        raise SchemaOutOfDateError(
            f"the database {where} has schema revision {current}, which is newer than this code knows "
            f"(its newest is {head}): install the bert-hpo version that upgraded it"
        )
    else:
        problem = f"the database {where} has schema revision {current}, this code needs {head}"
    raise SchemaOutOfDateError(f"{problem}: run `hpo db upgrade` (it migrates {where})")


def _unversioned_tables(connection: Connection) -> list[str]:
    """The tables of hpo's names in a database that has no hpo schema revision (none when it has one)."""
    if stored_revision(connection) is not None:
        return []
    from hpo.storage.models import Base

    return sorted(set(inspect(connection).get_table_names()) & set(Base.metadata.tables))


def _refuse_tables_not_ours(url: str) -> None:
    """Refuse a database whose tables of hpo's names hpo did not make, before anything writes to it (on SQLite,
    opening the file for writing would set its journal mode); the migration checks again in its transaction."""
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        return  # a new file: nothing there yet (and opening it would create it)
    engine = create_storage_engine(url, read_only=True)
    try:
        with engine.connect() as connection:
            taken = _unversioned_tables(connection)
    except SQLAlchemyError as exc:
        raise storage_error(exc, url) from exc
    finally:
        engine.dispose()
    _refuse_taken(url, taken)


def _refuse_taken(url: str, taken: list[str]) -> None:
    if taken:
        raise BadDatabaseError(f"the database {safe_url(url)} {_not_ours(taken)}: nothing was changed")


def _not_ours(tables: list[str]) -> str:
    return (f"has tables named {', '.join(tables)} but no hpo schema revision: they were not made by "
            "`hpo db upgrade`; use another database (or another PostgreSQL schema) for hpo")  # fmt: skip


def alembic_config(connection: Connection) -> Config:
    """Alembic's configuration for the shipped migrations, running on `connection`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # env.py runs the migrations on this connection: it carries the project's SQLite settings.
    config.attributes["connection"] = connection
    return config


def _run_alembic(url: str, alembic_command, shown: str | None = None) -> None:
    """Run `alembic_command` on the database at `url`; errors name `shown` (default: `url`)."""
    from alembic.util import CommandError

    shown = shown or url

    engine = create_storage_engine(url)
    try:
        with engine.connect() as connection:
            if connection.dialect.name == "sqlite":
                # SQLite alters a table by copying it and dropping the old one: with foreign keys on, dropping
                # `experiments` or `trials` would cascade and delete every trial and metric row. The pragma only
                # takes effect outside a transaction; env.py checks the keys before the migration commits.
                connection.connection.driver_connection.execute("PRAGMA foreign_keys = OFF")
            connection.execution_options(**{WRITE_OPTION: True})
            alembic_command(alembic_config(connection))
    except SQLAlchemyError as exc:
        raise storage_error(exc, shown) from exc
    except CommandError as exc:
        raise StorageError(f"cannot migrate the database {safe_url(shown)}: {exc}") from exc
    finally:
        engine.dispose()


@functools.cache
def _script_directory() -> ScriptDirectory:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ScriptDirectory.from_config(config)


@functools.cache
def _known_revisions() -> frozenset[str]:
    return frozenset(script.revision for script in _script_directory().walk_revisions())
