"""Tuners as thin ask/tell adapters: a controller proposes parameters (and a budget) and is told the cost."""

from hpo.controllers.base import Controller, Suggestion
from hpo.controllers.factory import build_controller

__all__ = ["Controller", "Suggestion", "build_controller"]
