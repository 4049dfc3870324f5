"""An experiment's status as users see it: `live` or `interrupted` while it should be running, else the stored one."""

from __future__ import annotations

from hpo.engine.liveness import liveness
from hpo.storage.base import ExperimentRecord


def experiment_status(record: ExperimentRecord) -> str:
    """live / interrupted (from the controller's heartbeat) or finished / stopped / failed."""
    return liveness(record)
