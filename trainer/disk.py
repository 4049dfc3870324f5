"""The free space of a disk, as a message about a write that failed says it (the trainer's, and the control plane's
through `hpo.files`). No torch here: the control plane and the server import it."""

from __future__ import annotations

import shutil
from pathlib import Path


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the disk that holds `path` (or the nearest folder above it that is there); None if unknown."""
    for folder in (Path(path), *Path(path).parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def free_text(path: str | Path) -> str:
    """'N MiB free' on the disk of `path` (`free_bytes`), or 'free space unknown'."""
    free = free_bytes(path)
    return "free space unknown" if free is None else f"{free / 2**20:,.1f} MiB free"
