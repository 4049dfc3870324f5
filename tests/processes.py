"""Processes a test started or looks at, by pid: whether one runs, and killing what a test left."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, an exited process not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_all(launcher: subprocess.Popen, pids: list[int]) -> None:
    """SIGKILL a launcher and the processes it started (whatever a failed test left), then reap the launcher."""
    for pid in [launcher.pid, *pids]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    launcher.wait()
