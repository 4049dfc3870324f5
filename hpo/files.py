"""Output files written whole or not at all (reports, exports, curve tables): what a reader later finds under the
name is a complete file, whatever stopped the writer (a full disk, a signal)."""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: Path, contents: str | bytes, replace: bool = True) -> None:
    """Write a file whole or not at all: into a hidden file beside it, then renamed over it (`replace`) or linked to
    its name (not `replace`: FileExistsError where it is there), so a full disk or a signal leaves no half-written file
    under its name, and an earlier file stays as it was until the new one is complete. A link is written through to
    the file it names; a path that is there and is not a file (/dev/null, /dev/stdout, a pipe) is written in place.
    Raises OSError."""
    data = contents.encode() if isinstance(contents, str) else contents
    if path.is_symlink() and path.exists():
        path = Path(os.path.realpath(path))
    if path.exists() and not path.is_file():
        with open(path, "wb") as out:
            out.write(data)
        return
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
