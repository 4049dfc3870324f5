"""Where experiments, trials and learning curves are stored: the `Storage` interface and its SQL backend.

from hpo.storage import SqlStorage, default_database_url, upgrade_database

upgrade_database(default_database_url())   # what `hpo db upgrade` does
storage = SqlStorage()                      # HPO_DATABASE_URL, else sqlite:///$HPO_HOME/hpo.db (./.hpo)

`base` is the contract (the interface and its records), `models` the tables, `migrate` and `migrations/` the schema's
revisions, `engine` the connections and how database errors read, `retry` waiting out an outage, `sql` the
implementation (its reads in `sql_reads`, the statements and row conversions it composes in `statements`), and
`noise` the late-training noise scale kept on each finished trial. It imports only the vocabulary (`hpo.errors`,
`hpo.trials`); everything above it reads and writes through `Storage`.
"""

from hpo.storage.base import (
    Direction,
    ExperimentRecord,
    ExperimentStatus,
    MetricPoint,
    MetricRecord,
    Storage,
    TrialRecord,
)
from hpo.storage.engine import default_database_url
from hpo.storage.migrate import current_revision, downgrade_database, head_revision, upgrade_database
from hpo.storage.sql import SqlStorage

__all__ = [
    "Direction",
    "ExperimentRecord",
    "ExperimentStatus",
    "MetricPoint",
    "MetricRecord",
    "SqlStorage",
    "Storage",
    "TrialRecord",
    "current_revision",
    "default_database_url",
    "downgrade_database",
    "head_revision",
    "upgrade_database",
]
