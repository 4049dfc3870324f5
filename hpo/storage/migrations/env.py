"""Alembic environment for the hpo storage. Run through `hpo.storage.migrate`, which passes the connection."""

from __future__ import annotations

from alembic import context

from hpo.storage.models import Base

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise SystemExit("run migrations through hpo.storage.migrate (`hpo db upgrade`), not the alembic command")

# render_as_batch: SQLite cannot ALTER most things, so later migrations rebuild tables there.
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
