"""A trial attempt as a local process: started, polled, ended with every process it started, its stderr tail read.
The thin process-handling part of the runners; the command comes from the pure `hpo.trial.launch.build_launch`.

Ending all of a trial: torchrun starts each rank in a session of its own (`start_new_session=True`), so a signal
to torchrun's process group does not reach the ranks, and a rank whose torchrun is killed is reparented to init
and trains on. So every process of an attempt carries a tag in its environment (`HPO_TRIAL_TAG`, inherited by
torchrun, its ranks and whatever they start, from the moment each is exec'd or forked), and `end_trial` kills the
attempt's process group, every process whose environment carries its tag and their descendants (found before any
is killed, while they still have their parents), again until none is left, and waits for them to exit. The tag
is made from the trial's id, attempt and directory, so a resumed controller that lost everything (SIGKILL) can
end a leftover attempt from its database record alone. A single-process trial forked by the preloaded launcher
(`hpo.runners.preload`) has the tag in its environment, but /proc shows the launcher's: it is ended through its
process group (the runner's handle, or the group its record names once it claimed its trial); one that had not
claimed its trial when a resume re-queued it finds another attempt there and leaves (`StaleAttemptError`). Ranks
also die with their torchrun (`die_with_launcher`, PR_SET_PDEATHSIG), which covers the one case nobody is left to
kill them: a Dask worker that dies with its trials.
Without /proc (not Linux), only the process group is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Protocol

from hpo.trial.exit import EXIT_PIPE_ENV

PR_SET_PDEATHSIG = 1
TRIAL_TAG_ENV = "HPO_TRIAL_TAG"  # in the environment of every process of an attempt (see the module docstring)
END_TRIAL_S = 10.0  # how long `end_trial` keeps looking for processes of the attempt
CLOCK_SLACK_S = 2.0  # /proc's start times count from a boot time known to the second
# Its own process group, so a signal to the group reaches torchrun (or the single trial process) and the children
# that stay in its group; not torchrun's ranks, which start sessions of their own (`end_trial` finds those by their
# tag). `process_group=0` (Python 3.11+) lets subprocess use vfork; `start_new_session` forces a full fork, 2 to 5
# times slower for a controller that has imported torch. The trial stays in the controller's session, off the
# terminal's foreground group, so Ctrl-C reaches only the controller, which stops the trials itself.
OWN_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}


class ChildProcess(Protocol):
    """The part of `subprocess.Popen` a trial attempt uses (a forked trial, `preload.ForkedProcess`, has it too)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class Starter(Protocol):
    """Something that starts some commands faster than exec (the preloaded launcher, `preload.Launcher`)."""

    def accepts(self, cmd: list[str], env: dict[str, str]) -> bool: ...

    def start(self, cmd: list[str], env: dict[str, str], stdout: Path, stderr: Path, exit_pipe: int,
              memory_limit_mb: int | None, die_with_parent: bool) -> ChildProcess: ...  # fmt: skip


@dataclass
class TrialProcess:
    popen: ChildProcess
    stderr_path: Path
    started: float
    timeout_s: float | None
    timed_out: bool = False
    pidfd: int | None = None  # readable once the process has ended (Linux); lets `wait_any` sleep until then
    exit_pipe: int | None = None  # where the trial writes its exit code just before it exits (read end)
    announced: int | None = None  # the exit code the trial wrote there
    tag: str | None = None  # carried by every process of the attempt (TRIAL_TAG_ENV)
    stderr_from: int = 0  # where this attempt's lines start in stderr.log (an earlier attempt's come before)

    @classmethod
    def start(
        cls, cmd: list[str], env: dict[str, str], workdir: Path, timeout_s: float | None,
        memory_limit_mb: int | None = None, die_with_parent: bool = False, launcher: Starter | None = None,
        tag: str | None = None,
    ) -> TrialProcess:  # fmt: skip
        """Start `cmd`: forked from `launcher` where it accepts the command (a preloaded `python -m`), else
        exec'd; with `tag` in the environment of every process it starts (`end_trial` finds them by it)."""
        workdir.mkdir(parents=True, exist_ok=True)
        if tag is not None:
            env = {**env, TRIAL_TAG_ENV: tag}
        stdout_path, stderr_path = workdir / "stdout.log", workdir / "stderr.log"
        stderr_from = stderr_path.stat().st_size if stderr_path.exists() else 0  # appended: earlier attempts' first
        # The pipe on which the trial announces its exit code before the kernel tears it down (hpo.trial.exit).
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        try:
            if launcher is not None and launcher.accepts(cmd, env):
                process = launcher.start(cmd, env, stdout_path, stderr_path, write_end, memory_limit_mb,
                                         die_with_parent)  # fmt: skip
            else:
                process = _exec(cmd, env, stdout_path, stderr_path, write_end, memory_limit_mb, die_with_parent)
        except BaseException:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        return cls(process, stderr_path, time.monotonic(), timeout_s, pidfd=_open_pidfd(process.pid),
                   exit_pipe=read_end, tag=tag, stderr_from=stderr_from)  # fmt: skip

    def poll(self) -> int | None:
        """The exit code once the process has announced it (and is leaving) or has ended; kills it when its time
        limit has passed."""
        code = self.popen.poll()
        if self.announced is None and self._read_announced() is not None and code is None:
            # The kernel is still freeing its memory: reap it when done, without making anyone wait for that.
            threading.Thread(target=self.popen.wait, name=f"reap-{self.popen.pid}", daemon=True).start()
        if self.announced is not None:  # what the trial said as it left: also where a launcher that forked it and
            code = self.announced  # died meanwhile can only say SIGKILL for a process it no longer sees
        if code is None and self.timeout_s is not None and self.elapsed_s > self.timeout_s:
            self.timed_out = True
            self.kill()
            code = self.popen.wait()
        if code is not None:
            self._close_fds()
        return code

    def _read_announced(self) -> int | None:
        """The exit code on the exit pipe, once the launched process itself has written it."""
        if self.exit_pipe is None:
            return None
        try:
            data = os.read(self.exit_pipe, 16)
        except BlockingIOError:
            return None
        code, _, pid = data.decode(errors="replace").partition(" ")
        if pid == str(self.popen.pid) and code.lstrip("-").isdigit():
            self.announced = int(code)
        else:  # closed without a code, or a code from another process (a wrapper's child): only the end counts
            os.close(self.exit_pipe)
            self.exit_pipe = None
        return self.announced

    def _close_fds(self) -> None:
        for name in ("pidfd", "exit_pipe"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)

    def kill(self) -> None:
        """End the attempt: its process group and every process carrying its tag (torchrun's ranks)."""
        end_trial(self.tag, self.popen.pid)

    def stderr_tail(self, size: int = 4000) -> str:
        """The last `size` bytes this attempt wrote to stderr (never an earlier attempt's)."""
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(max(self.stderr_from, f.seek(0, os.SEEK_END) - size))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


def _exec(cmd: list[str], env: dict[str, str], stdout_path: Path, stderr_path: Path, exit_pipe: int,
          memory_limit_mb: int | None, die_with_parent: bool) -> subprocess.Popen:  # fmt: skip
    # Death with the parent through setpriv keeps vfork; in a function run before exec it would cost a full fork
    # (3.7 ms for an 80 MB Dask worker, against 0.1 ms).
    wrapper = death_signal_wrapper() if die_with_parent else None
    if wrapper:
        cmd, die_with_parent = [*wrapper, *cmd], False
    env = {**env, EXIT_PIPE_ENV: f"{exit_pipe}:{os.fstat(exit_pipe).st_ino}"}
    with open(stdout_path, "ab") as out, open(stderr_path, "ab") as err:
        return subprocess.Popen(
            cmd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=(exit_pipe,),
            preexec_fn=pre_exec(memory_limit_mb, die_with_parent), **OWN_GROUP,
        )  # fmt: skip


def wait_any(processes: list[TrialProcess], timeout_s: float) -> None:
    """Sleep until one of `processes` may have ended, or `timeout_s` has passed."""
    fds = [p.pidfd for p in processes if p.pidfd is not None]
    if fds and len(fds) == len(processes):
        select.select(fds + [p.exit_pipe for p in processes if p.exit_pipe is not None], [], [], timeout_s)
    else:  # no pidfds (not Linux, or an old kernel): poll at this interval
        time.sleep(timeout_s)


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # AttributeError: not Linux
        return None


def pid_exists(pid: int) -> bool:
    """Whether a process `pid` exists (a zombie included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def kill_process_group(pgid: int) -> None:
    """SIGKILL a process group if it still exists."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def trial_tag(trial_id: int, attempt: int, workdir: Path | str) -> str:
    """The tag of one attempt's processes: from what the trial's database record says, so a resumed controller
    finds the processes of an attempt its dead predecessor started."""
    return f"{trial_id}.{attempt}:{workdir}"


def attempt_processes(tag: str | None, group: int | None = None, variable: str = TRIAL_TAG_ENV) -> dict[int, str]:
    """The live processes (zombies excluded) of an attempt, this one excepted: those whose environment carries `tag`
    (as `variable`: TRIAL_TAG_ENV, or NNI's trial id), those of process `group`, and the descendants of any of them
    (a child started with an environment of its own, or in a session of its own); pid -> start time (/proc's, as
    `exiting` compares it). Empty without /proc."""
    needle = f"{variable}={tag}\0".encode() if tag else None
    try:
        entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return {}
    started: dict[int, str] = {}
    children: dict[int, list[int]] = {}
    seeds = []
    for pid in entries:
        if pid == os.getpid():
            continue
        try:  # state, parent, process group, ... start time (fields 3, 4, 5 and 22)
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        if fields[0] in ("Z", "X"):
            continue
        started[pid] = fields[19]
        children.setdefault(int(fields[1]), []).append(pid)
        if group and int(fields[2]) == group:
            seeds.append(pid)
        elif needle is not None:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:  # unreadable for others' processes
                    if needle in f.read():
                        seeds.append(pid)
            except OSError:
                continue
    found: dict[int, str] = {}
    while seeds:
        pid = seeds.pop()
        if pid not in found:
            found[pid] = started[pid]
            seeds.extend(children.get(pid, []))
    return found


def process_state(pid: int) -> tuple[str, str] | None:
    """The state letter and start time of process `pid` (fields 3 and 22 of /proc/PID/stat), None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return fields[0], fields[19]


def exiting(pid: int, started: str) -> bool:
    """Whether the process `pid` (started at `started`, its /proc start time) still runs: a SIGKILLed process gives
    up its memory, and with it the environment `attempt_processes` reads, before it turns zombie, so until then it is
    found only by its pid. A pid reused by another process (another start time) does not count."""
    state = process_state(pid)
    return state is not None and state[0] not in ("Z", "X") and state[1] == started


def leftover_group(pid: int | None, claimed_at: datetime | None) -> int | None:
    """The process group `pid` an attempt recorded when it claimed its trial at `claimed_at`, to end on resume; None
    where a process that started after that claim holds the pid now (a pid reused after the attempt ended, after a
    reboot say): it is not the trial's, and killing its group would kill another program. Without a leader the
    group's survivors are the attempt's (a new group needs a leader with that pid)."""
    if pid is None:
        return None
    started = process_started_at(pid)
    if started is None or claimed_at is None:
        return pid
    claimed = claimed_at if claimed_at.tzinfo else claimed_at.replace(tzinfo=timezone.utc)
    return pid if started.timestamp() <= claimed.timestamp() + CLOCK_SLACK_S else None


def process_started_at(pid: int) -> datetime | None:
    """When process `pid` started (its /proc start time after the boot time), None when it is gone."""
    state = process_state(pid)
    if state is None:
        return None
    try:
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))  # fmt: skip
    except (OSError, StopIteration):
        return None
    return datetime.fromtimestamp(boot + int(state[1]) / os.sysconf("SC_CLK_TCK"), timezone.utc)


def controller_here(host: str | None, pid: int | None, last_beat: datetime | None) -> str | None:
    """The state letter (/proc's: R, S, T for stopped...) of the controller recorded as (host, pid) where it still
    runs on this machine though its heartbeat `last_beat` went stale (it could not write: another process kept an
    SQLite file locked): a live process of that pid, not a zombie, started before that heartbeat (not a later
    process that took the pid over), whose arguments run or resume an experiment with hpo. None otherwise, on
    another host, or where /proc cannot tell."""
    if not pid or last_beat is None or host != socket.gethostname():
        return None
    state = process_state(pid)
    started = process_started_at(pid)
    if state is None or state[0] in "ZX" or started is None or started > last_beat + timedelta(seconds=CLOCK_SLACK_S):
        return None
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    runs = any(os.path.basename(arg) == b"hpo" for arg in argv) and bool({b"run", b"resume"} & set(argv))
    return state[0] if runs else None


def controller_gone_here(host: str | None, pid: int | None) -> bool:
    """Whether the controller recorded as (host, pid) ran on this machine and no longer does: no process of that
    pid, or a zombie. False on another host or where /proc cannot tell (a live process of that pid may be another
    program, but is not taken for gone)."""
    if not pid or host != socket.gethostname() or not Path("/proc/self/stat").exists():
        return False
    state = process_state(pid)
    return state is None or state[0] in "ZX"


def end_trial(
    tag: str | None, group: int | None = None, timeout_s: float = END_TRIAL_S, variable: str = TRIAL_TAG_ENV
) -> list[int]:
    """SIGKILL every process of an attempt (`attempt_processes`: its process `group`, those carrying its `tag` as
    `variable`, and their descendants), and look again until none is left (one started by torchrun between a look
    and the kill is found by the next look) and every process killed has finished exiting; returns the pids found.
    Each look comes before its kills: a rank dies with its torchrun (PR_SET_PDEATHSIG) the moment the group's
    SIGKILL ends torchrun, and gives up the environment a look reads (and its parent) before it has finished
    exiting: a look after the kill would not find it, nor wait for it, and the trial would be said to be ended
    while a rank still ran."""
    deadline = time.monotonic() + timeout_s
    killed: dict[int, str] = {}  # pid: start time
    while True:
        found = attempt_processes(tag, group, variable)
        for pid, started in found.items():
            killed.setdefault(pid, started)
        if group:
            kill_process_group(group)
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        still = [pid for pid, started in killed.items() if exiting(pid, started)]
        if (not found and not still) or time.monotonic() > deadline:
            return sorted(killed)
        time.sleep(0.01)


def die_with_launcher() -> None:
    """In a rank started by torchrun for an attempt: get SIGKILL when torchrun dies (Linux), and leave now if it
    already has (then this process's parent no longer carries the attempt's tag)."""
    tag = os.environ.get(TRIAL_TAG_ENV)
    if tag is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/environ", "rb") as f:
            launched_by_trial = f"{TRIAL_TAG_ENV}={tag}\0".encode() in f.read()
    except OSError:
        return  # no /proc: nothing to check against
    if not launched_by_trial:
        os._exit(1)


@functools.cache
def death_signal_wrapper() -> tuple[str, ...] | None:
    """A command prefix that makes what it runs get SIGKILL when its parent dies: util-linux's `setpriv
    --pdeathsig` (which sets PR_SET_PDEATHSIG and execs the command, so torchrun itself carries it), when it is
    installed and supports the option (util-linux 2.33+); None otherwise (then a pre-exec function sets it)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    prefix = (setpriv, "--pdeathsig", "KILL", "--")
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else None


def pre_exec(memory_limit_mb: int | None, die_with_parent: bool):
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
