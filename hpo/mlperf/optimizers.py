"""Optimizers as MLPerf submitters name them (logged `opt_name`, or an option on a logged command line), mapped to
the trainer's names. The mapping is strict: a name not listed here is no optimizer the importer knows, and the
caller says so (it never falls back to a default)."""

from __future__ import annotations

import re
from typing import Any

# an optimizer's name as submitters log it or pass it on a command line, normalized by `optimizer_key` -> the trainer's
# (apex's classes are how NVIDIA-based submissions name them: FusedAdam decays weights decoupled, adam_w_mode)
OPTIMIZERS = {
    "lamb": "lamb", "fusedlamb": "lamb", "distributedfusedlamb": "lamb", "fusedmixedprecisionlamb": "lamb",
    "adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "distributedfusedadam": "adamw",
}  # fmt: skip
KNOWN_OPTIMIZERS = "FusedAdam, DistributedFusedAdam, Adam, AdamW (adamw); FusedLAMB, DistributedFusedLAMB, " \
                   "FusedMixedPrecisionLamb, LAMB (lamb)"  # fmt: skip


def optimizer_key(name: Any) -> str:
    """A logged optimizer name as OPTIMIZERS keys it: `apex.optimizers.FusedAdam` -> `fusedadam`."""
    return re.sub(r"[\s_-]", "", str(name).strip().rsplit(".", 1)[-1]).lower()


def trainer_optimizer(name: Any) -> str | None:
    """The trainer's optimizer of a logged name (see OPTIMIZERS); None for a name the importer does not know."""
    return OPTIMIZERS.get(optimizer_key(name))
