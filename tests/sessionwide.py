"""Files a test session makes once for all its pytest-xdist workers: the first worker to ask builds it in the
session's shared temporary directory, the others wait on a lock and find it done (one process: its own directory)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path


def built_once(tmp_path_factory, name: str, build: Callable[[Path], Path]) -> Path:
    """The path `build(directory)` returned, built once a session: `directory` is empty and the session's, and what
    `build` makes there stays for the whole session. A worker that reads a built file must not write it: copy it."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # a single process
        return build(tmp_path_factory.mktemp(name))
    directory = tmp_path_factory.getbasetemp().parent / name  # every worker's
    with open(directory.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = directory.with_suffix(".done")
            if not done.exists():
                directory.mkdir(exist_ok=True)  # an earlier worker's build may have failed there
                done.write_text(str(build(directory)))
            return Path(done.read_text())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
