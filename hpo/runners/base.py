"""The runner interface: where and how trial attempts run. The study loop hands a runner `TrialLaunch`es and
gets `TrialExit`s back; the trial itself records its metrics and result in the database.

Implementations: `local` (GPU/CPU slots on this machine) and `dask` (a Dask distributed cluster). Both launch
the same command, built by the pure `hpo.trial.launch.build_launch`. How an attempt ended when it left no final
record is decided by `classify_exit`, a pure function: failures are data, never exceptions.
"""

from __future__ import annotations

import abc
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpo.trials import TrialState

OOM_MARKERS = ("out of memory", "OutOfMemoryError", "MemoryError", "can't allocate memory")


@dataclass(frozen=True)
class TrialLaunch:
    """One attempt of one trial, as a runner needs it."""

    trial_id: int
    number: int
    attempt: int
    database_url: str  # where the trial records itself
    workdir: Path  # the trial's directory on the machine that runs it (never read by the controller)
    gpus: int = 0  # GPUs per trial; 0: a CPU trial
    cpu_ranks: int = 1  # gloo ranks of a CPU trial
    timeout_s: float | None = None  # killed after this many seconds (recorded as timeout)
    memory_limit_mb: int | None = None  # address-space limit of each process (CPU trials)

    def entry_args(self) -> tuple[str, ...]:
        return ("--db", self.database_url, "--trial-id", str(self.trial_id), "--attempt", str(self.attempt),
                "--workdir", str(self.workdir))  # fmt: skip

    @property
    def ranks(self) -> int:
        return self.gpus or self.cpu_ranks

    @property
    def tag(self) -> str:
        """What every process of this attempt carries in its environment (hpo.runners.process.end_trial)."""
        from hpo.runners.process import trial_tag

        return trial_tag(self.trial_id, self.attempt, self.workdir)


@dataclass(frozen=True)
class TrialExit:
    """How an attempt's process ended, as the runner saw it."""

    trial_id: int
    attempt: int
    returncode: int | None = None
    stderr_tail: str = ""
    timed_out: bool = False
    lost: str | None = None  # the worker running it was lost (why); the trial may be re-queued
    worker: str | None = None
    duration_s: float | None = None


class Runner(abc.ABC):
    """Runs trial attempts somewhere. Not thread-safe: one study loop drives it."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line: where trials run (for the start of `hpo run`)."""

    def attach(self, storage, experiment_id: int) -> None:  # noqa: B027 - optional
        """Called once before the study loop starts (or resumes) an experiment: a runner that records trials
        itself (the simulated one) takes the storage here."""

    @abc.abstractmethod
    def free_slots(self) -> int:
        """How many more attempts can start now."""

    @abc.abstractmethod
    def why_waiting(self) -> str:
        """Why the next attempt cannot start now ("" when it can)."""

    @abc.abstractmethod
    def submit(self, launch: TrialLaunch) -> None:
        """Start an attempt (only when free_slots() > 0)."""

    @abc.abstractmethod
    def poll(self) -> list[TrialExit]:
        """Attempts that ended since the last call."""

    def wait(self, timeout_s: float) -> None:
        """Block until an attempt may have ended, at most `timeout_s` (the study loop calls it when idle)."""
        time.sleep(timeout_s)

    @abc.abstractmethod
    def cancel_all(self) -> list[TrialExit]:
        """Kill every running attempt and return how they ended."""

    def kill_leftover(self, host: str | None, pid: int | None, tag: str,  # noqa: B027 - optional
                      claimed_at: datetime | None = None) -> None:  # fmt: skip
        """End every process of an attempt a dead controller left running (resume), where the runner can: its
        process group `pid` on `host` (unless a process that started after the attempt claimed its trial at
        `claimed_at` holds that pid now: `leftover_group`) and the processes carrying its `tag` (`TrialLaunch.tag`)."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release the runner's resources."""


def classify_exit(exit: TrialExit) -> tuple[TrialState, str]:
    """The state and reason of an attempt that ended without recording a result."""
    if exit.timed_out:
        return TrialState.TIMEOUT, "exceeded the trial time limit (budget.trial_timeout_s)"
    if exit.lost:
        return TrialState.FAILED, exit.lost
    tail = exit.stderr_tail
    if any(m.lower() in tail.lower() for m in OOM_MARKERS):
        return TrialState.FAILED, "out of memory"
    code = exit.returncode
    if code == 3:
        return TrialState.DIVERGED, "loss became NaN or inf"
    if code is not None and code < 0:
        return TrialState.FAILED, f"killed by {signal.Signals(-code).name}"
    last = next((line for line in reversed(tail.strip().splitlines()) if line.strip()), "")
    return TrialState.FAILED, f"exit code {code} without a result" + (f": {last[:300]}" if last else "")
