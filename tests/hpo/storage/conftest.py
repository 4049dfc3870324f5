"""Backends for the storage contract: a SQLite file always, PostgreSQL when HPO_TEST_POSTGRES_URL is set.

Each PostgreSQL test gets a schema of its own (created, migrated, dropped afterwards) and reaches it through
`options=-csearch_path=<schema>` in the URL, so tests never see each other's rows and need no cleanup order.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from hpo.storage import SqlStorage
from hpo.trials import TrialResult, TrialSpec, TrialState

POSTGRES_URL_ENV = "HPO_TEST_POSTGRES_URL"
POSTGRES_SKIP_REASON = "set HPO_TEST_POSTGRES_URL to run the storage contract on PostgreSQL"

BACKENDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """An empty database (no tables) on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'hpo.db'}"
        return
    base_url = os.environ.get(POSTGRES_URL_ENV)
    if not base_url:
        pytest.skip(POSTGRES_SKIP_REASON)
    yield from postgres_schema_url(base_url)


@pytest.fixture
def storage(database_url: str) -> Iterator[SqlStorage]:
    """A storage on a freshly migrated database."""
    with SqlStorage(database_url, upgrade=True) as opened:
        yield opened


def postgres_schema_url(base_url: str) -> Iterator[str]:
    """Create a throw-away schema, yield a URL whose connections use it, drop it afterwards."""
    schema = f"hpo_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.dispose()


def make_spec(number: int, **overrides) -> TrialSpec:
    """A trial spec with a plausible LAMB parameter set."""
    fields = dict(number=number, params={"optimizer.lr": 1e-3 * (number + 1), "optimizer.name": "lamb"})
    fields.update(overrides)
    return TrialSpec(**fields)


def add_finished_trial(
    storage: SqlStorage,
    experiment_id: int,
    number: int,
    objective: float | None,
    state: TrialState = TrialState.COMPLETED,
    **spec_fields,
) -> int:
    """Create, start and finish one trial; returns its id."""
    trial_id = storage.create_trial(experiment_id, make_spec(number, **spec_fields))
    storage.mark_trial_running(trial_id)
    storage.finish_trial(trial_id, TrialResult(state, objective=objective))
    return trial_id
