"""An experiment's status as users see it: `live`, `interrupted` or `unresponsive` while it should be running, else
the stored one."""

from __future__ import annotations

from hpo.engine.settle import seen_status
from hpo.storage.base import ExperimentRecord


def experiment_status(record: ExperimentRecord) -> str:
    """live / interrupted / unresponsive (from the controller's heartbeat, and its process where it runs on the
    server's machine) or finished / stopped / failed."""
    return seen_status(record)
