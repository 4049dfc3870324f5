"""Files and their disk: output files written whole or not at all (reports, exports, curve tables), so that what a
reader later finds under the name is a complete file, whatever stopped the writer (a full disk, a signal); and
whether a write failed because its disk is full (`full_disk`), which is the machine's fault, not a trial's."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from trainer.disk import free_bytes

FULL_BELOW_BYTES = 16 << 20  # a disk with less free than this cannot take a trial's logs: it is full


def full_disk(path: Path) -> str | None:
    """'the disk under PATH is full (N MiB free)' where it has less than `FULL_BELOW_BYTES` free, else None; None
    also where this machine does not have PATH: the directory of a trial that ran on another machine (a Dask
    worker's) is on that machine's disk, not on the one that holds the nearest folder above it here."""
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return None
    if free >= FULL_BELOW_BYTES:
        return None
    return f"the disk under {path} is full ({free / 2**20:,.1f} MiB free)"


def no_space(error: BaseException) -> str | None:
    """For an error of a write to a full disk (ENOSPC): 'FILE: No space left on device (N MiB free there)'; else
    None."""
    if not isinstance(error, OSError) or error.errno != errno.ENOSPC:
        return None
    where = Path(error.filename) if isinstance(error.filename, str) else None
    free = free_bytes(where) if where is not None else None
    said = f"{where}: {error.strerror}" if where is not None else str(error.strerror or error)
    return said + (f" ({free / 2**20:,.1f} MiB free there)" if free is not None else "")


def write_whole(path: Path, contents: str | bytes, replace: bool = True) -> None:
    """Write a file whole or not at all: into a hidden file beside it, then renamed over it (`replace`) or linked to
    its name (not `replace`: FileExistsError where it is there), so a full disk or a signal leaves no half-written file
    under its name, and an earlier file stays as it was until the new one is complete. A link (a broken one too) is
    written through to the file it names; a path that is there and is not a file (/dev/null, /dev/stdout, a pipe) is
    written in place. Raises OSError."""
    data = contents.encode() if isinstance(contents, str) else contents
    if path.exists() and not path.is_file():  # through a link too: /dev/stdout names a pipe by a name not on disk
        with open(path, "wb") as out:
            out.write(data)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    hidden = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(hidden, "wb") as out:
            out.write(data)
        if replace:
            os.replace(hidden, path)
        else:
            os.link(hidden, path)
    finally:
        hidden.unlink(missing_ok=True)
