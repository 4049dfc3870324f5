"""Alembic environment for the hpo storage. Run through `hpo.storage.migrate`, which passes the connection."""

from __future__ import annotations

from alembic import context

from hpo.errors import StorageError
from hpo.storage.models import Base

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise SystemExit("run migrations through hpo.storage.migrate (`hpo db upgrade`), not the alembic command")

# render_as_batch: SQLite cannot ALTER most things, so later migrations rebuild tables there.
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    if connection.dialect.name == "postgresql":
        # Two `hpo db upgrade` at once (hosts that start together) would both read the old revision and run the same
        # migrations, and one fail on the tables or the revision row the other made. Held until this transaction
        # ends, the lock makes the second wait, then read the new revision and find nothing left to do. SQLite needs
        # none: hpo.storage.migrate begins this transaction with BEGIN IMMEDIATE, one writer at a time.
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('hpo migrations ' || current_schema()))")
    context.run_migrations()
    # hpo.storage.migrate turns SQLite's foreign keys off while tables are rebuilt: a row they no longer match
    # rolls the whole migration back.
    if connection.dialect.name == "sqlite" and connection.exec_driver_sql("PRAGMA foreign_key_check").first():
        raise StorageError("the migration would leave rows whose foreign keys match nothing: nothing was changed")
