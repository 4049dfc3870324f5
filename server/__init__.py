"""The REST API over the HPO database (FastAPI, under /api/v1): experiments, trials, learning curves, best
configs and their export, and the token-protected stop action. `hpo serve` runs it; `create_app` builds it.

Importing this package never imports torch, smac, nni or ConfigSpace, so the server starts fast and small.
"""

from server.app import create_app
from server.settings import Settings

__all__ = ["Settings", "create_app"]
