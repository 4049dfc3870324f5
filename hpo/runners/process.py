"""A trial attempt as a local process: started in its own process group (so a timeout or a stop kills torchrun
and all its ranks together), polled, killed, its stderr tail read. The thin process-handling part of the
runners; the command comes from the pure `hpo.launch.build_launch`."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1


@dataclass
class TrialProcess:
    popen: subprocess.Popen
    stderr_path: Path
    started: float
    timeout_s: float | None
    timed_out: bool = False

    @classmethod
    def start(
        cls, cmd: list[str], env: dict[str, str], workdir: Path, timeout_s: float | None,
        memory_limit_mb: int | None = None, die_with_parent: bool = False,
    ) -> TrialProcess:  # fmt: skip
        workdir.mkdir(parents=True, exist_ok=True)
        stderr_path = workdir / "stderr.log"
        with open(workdir / "stdout.log", "ab") as out, open(stderr_path, "ab") as err:
            popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, start_new_session=True,
                                     preexec_fn=_pre_exec(memory_limit_mb, die_with_parent))  # fmt: skip
        return cls(popen, stderr_path, time.monotonic(), timeout_s)

    def poll(self) -> int | None:
        """The exit code once the process has ended; kills it when its time limit has passed."""
        code = self.popen.poll()
        if code is None and self.timeout_s is not None and self.elapsed_s > self.timeout_s:
            self.timed_out = True
            self.kill()
            code = self.popen.wait()
        return code

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def stderr_tail(self, size: int = 4000) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - size))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


def kill_process_group(pgid: int) -> None:
    """SIGKILL a process group if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _pre_exec(memory_limit_mb: int | None, die_with_parent: bool):
    """Runs in the child before exec: an address-space limit, so a CPU trial that needs too much memory fails
    with an allocation error (recorded as out of memory) instead of pushing the machine into swap; and, on a
    Dask worker, death with the worker (Linux), so a lost worker leaves no trial running."""
    if not memory_limit_mb and not die_with_parent:
        return None
    limit = (memory_limit_mb or 0) << 20

    def apply() -> None:
        if limit:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if die_with_parent:
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return apply
