"""Running one trial as a process: start it, stream its reports, enforce its time limit, say how it ended.

The command comes from `hpo.launch.build_launch` (pure); this module is the thin process-handling part. A
trial runs in its own process group so a timeout or a stop kills torchrun and all its ranks together.
How a trial ended is decided by `classify`, a pure function of the exit code, the trainer's final record,
the end of stderr and whether the time limit was hit: failures are data, never exceptions.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpo.trials import TrialState

OOM_MARKERS = ("out of memory", "OutOfMemoryError", "MemoryError", "can't allocate memory")


def classify(
    returncode: int | None, final: dict[str, Any] | None, stderr_tail: str, timed_out: bool
) -> tuple[TrialState, str | None]:
    """The state and reason of a finished trial process."""
    if timed_out:
        return TrialState.TIMEOUT, "exceeded the trial time limit (budget.trial_timeout_s)"
    if final is not None and final.get("status") in ("reached_target", "budget_exhausted"):
        return TrialState.COMPLETED, None
    if (final is not None and final.get("status") == "diverged") or returncode == 3:
        return TrialState.DIVERGED, "loss became NaN or inf"
    oom = any(m.lower() in stderr_tail.lower() for m in OOM_MARKERS)
    if oom or (final and "out of memory" in str(final.get("reason", ""))):
        return TrialState.FAILED, "out of memory"
    if returncode is not None and returncode < 0:
        return TrialState.FAILED, f"killed by {signal.Signals(-returncode).name}"
    if final is not None and final.get("reason"):
        return TrialState.FAILED, str(final["reason"])
    last = next((line for line in reversed(stderr_tail.strip().splitlines()) if line.strip()), "")
    return TrialState.FAILED, f"exit code {returncode}" + (f": {last[:300]}" if last else "")


@dataclass
class TrialProcess:
    """A started trial: its process, its report file and where reading it got to."""

    popen: subprocess.Popen
    report_path: Path
    stderr_path: Path
    started: float
    timeout_s: float | None
    offset: int = 0
    final: dict[str, Any] | None = None
    timed_out: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(
        cls, cmd: list[str], env: dict[str, str], trial_dir: Path, timeout_s: float | None,
        memory_limit_mb: int | None = None,
    ) -> TrialProcess:  # fmt: skip
        trial_dir.mkdir(parents=True, exist_ok=True)
        stderr_path = trial_dir / "stderr.log"
        limit = _address_space_limit(memory_limit_mb) if memory_limit_mb else None
        with open(trial_dir / "stdout.log", "ab") as out, open(stderr_path, "ab") as err:
            popen = subprocess.Popen(cmd, env=env, cwd=os.getcwd(), stdout=out, stderr=err, start_new_session=True,
                                     preexec_fn=limit)  # fmt: skip
        return cls(popen, trial_dir / "report.jsonl", stderr_path, time.monotonic(), timeout_s)

    def read_new_records(self) -> list[dict[str, Any]]:
        """Report lines written since the last call (only whole lines)."""
        if not self.report_path.exists():
            return []
        with open(self.report_path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self.offset += end
        new = [json.loads(line) for line in chunk[:end].splitlines() if line.strip()]
        for record in new:
            if record.get("kind") == "final":
                self.final = record
        return new

    def poll(self) -> int | None:
        """The exit code once the process has ended; kills it when its time limit has passed."""
        code = self.popen.poll()
        if code is None and self.timeout_s is not None and time.monotonic() - self.started > self.timeout_s:
            self.timed_out = True
            self.kill()
            code = self.popen.wait()
        return code

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
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


def _address_space_limit(megabytes: int):
    """A pre-exec function bounding the trial's address space, so a CPU trial that needs too much memory fails
    with an allocation error (recorded as out of memory) instead of pushing the machine into swap or the OOM
    killer."""
    import resource

    limit = megabytes << 20

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply
