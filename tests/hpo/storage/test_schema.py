"""Migrations: they build exactly the models' schema, and storages refuse databases that are not at the head."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text

from hpo.errors import SchemaOutOfDateError, StorageError
from hpo.storage import SqlStorage, current_revision, downgrade_database, head_revision, upgrade_database
from hpo.storage.engine import create_storage_engine
from hpo.storage.models import Base


def test_an_empty_database_is_out_of_date_until_upgraded(database_url: str):
    assert current_revision(database_url) is None
    with pytest.raises(SchemaOutOfDateError, match="no hpo tables yet: run `hpo db upgrade`"):
        SqlStorage(database_url)
    upgrade_database(database_url)
    assert current_revision(database_url) == head_revision()
    with SqlStorage(database_url) as storage:
        assert storage.list_experiments() == []


def test_upgrade_is_idempotent_and_keeps_data(database_url: str):
    with SqlStorage(database_url, upgrade=True) as storage:
        storage.create_experiment("kept", {}, "minimize")
    upgrade_database(database_url)
    with SqlStorage(database_url) as storage:
        assert [e.name for e in storage.list_experiments()] == ["kept"]


def test_an_older_schema_is_out_of_date(database_url: str):
    upgrade_database(database_url)
    downgrade_database(database_url, "base")
    assert current_revision(database_url) is None
    with pytest.raises(SchemaOutOfDateError, match="hpo db upgrade"):
        SqlStorage(database_url)


def test_a_schema_newer_than_the_code_is_refused(database_url: str):
    upgrade_database(database_url)
    engine = create_storage_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'f00d'"))
    engine.dispose()
    with pytest.raises(SchemaOutOfDateError, match="newer than this code"):
        SqlStorage(database_url)
    with pytest.raises(StorageError, match="cannot migrate"):
        upgrade_database(database_url)


def test_migrations_build_exactly_the_models(database_url: str):
    upgrade_database(database_url)
    engine = create_storage_engine(database_url)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert differences == []


def test_downgrade_then_upgrade_round_trips(database_url: str):
    upgrade_database(database_url)
    downgrade_database(database_url, "base")
    upgrade_database(database_url)
    with SqlStorage(database_url) as storage:
        assert storage.create_experiment("again", {}, "minimize") == 1


def test_the_head_revision_constant_is_alembics_head_and_storages_open_without_importing_alembic(database_url: str):
    import subprocess
    import sys

    from hpo.storage.migrate import HEAD_REVISION

    assert head_revision() == HEAD_REVISION  # Alembic's own reading of migrations/versions
    upgrade_database(database_url)
    probe = (f"import sys; from hpo.storage import SqlStorage; SqlStorage({database_url!r}).list_experiments(); "
             "print('alembic' in sys.modules)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
