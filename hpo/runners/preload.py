"""A preloaded launcher: trial processes forked from a server that has already imported the trial side.

Each trial process starts a Python interpreter and imports the storage (SQLAlchemy) before it can claim its
trial: 0.2 to 0.3 s of CPU every time, taken just when the runner is ending trials and starting their
successors. The launcher is one process per runner (per Dask worker process) that imports those modules once
and forks each `python -m MODULE ARGS` command from there. The child does what starting the interpreter would
have done for that command: its own process group, the trial's environment, standard streams and limits, death
with the runner where asked, and the module run as `__main__`; then it leaves as the interpreter would (threads
joined, exit handlers run, streams flushed). Commands of another shape (torchrun for several ranks, another
interpreter, an environment that changes how Python starts) start with exec, as without the launcher: torchrun's
ranks check that their parent's environment, as the kernel shows it, carries the attempt's tag
(`hpo.runners.process.die_with_launcher`), and a forked process shows the server's.

By default the server imports no torch. For trials on the CPU the runner asks for the trainer's side too
(`TRAINER_PRELOAD`: torch, torch._dynamo, which torch.optim imports at an optimizer's first use, and the trainer):
about 4 s of CPU less per trial (`bench.trial_latency`), as much as a tiny trial trains. torch reads some variables
once, as it loads: a trial whose OMP_*, MKL_*, KMP_*, TORCH* or PYTORCH_* variables differ from the server's is
exec'd, except the thread count (OMP_NUM_THREADS, and MKL_NUM_THREADS where it is the same), which the forked trial
applies itself (`torch.set_num_threads`) as an exec'd one would have read it; a trial given GPUs
(CUDA_VISIBLE_DEVICES) is exec'd too, so that CUDA starts in a process of its own. torch's thread pools start at
their first use, not as it loads, so each forked trial starts its own (numpy's OpenBLAS pool, started as numpy
loads, is shut down by OpenBLAS at the fork and started again in the trial). The server is the trial's parent: it reaps
each child and sends its exit status to the runner (the trial announces its code earlier on its exit pipe, as an
exec'd one does). It leaves when the runner closes its end of the socket or dies; trials that asked
for death with their parent then die with it, like children of a Dask worker.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import pickle
import select
import signal
import socket
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

from hpo.interpreter import module_env
from hpo.runners.process import OWN_GROUP, pid_exists, pre_exec
from hpo.trial.exit import EXIT_PIPE_ENV
from hpo.trial.launch import TORCHRUN, TRIAL_ENTRY
from trainer.leave import leave

# Imported once by the server: what the trial entry imports before it trains (not the entry itself, which runs as
# `__main__`).
PRELOAD = ("hpo.storage", "hpo.objective", "hpo.experiment")
# For trials on the CPU: also what they import to train (see the module docstring).
TRAINER_PRELOAD = (*PRELOAD, "torch", "torch._dynamo", "trainer.train")
MAX_MESSAGE = 1 << 20
# Variables the interpreter reads when it starts: a trial whose values differ from the server's is exec'd.
_STARTUP_PREFIXES = ("PYTHON", "LD_")
_UNBUFFERED = "PYTHONUNBUFFERED"
_EXEC_MODULES = ("torch.distributed.run", TORCHRUN)  # always exec'd (see the module docstring)
# Variables torch reads as it loads: a trial whose values differ from a server that holds torch is exec'd, but for
# the thread count, which the forked trial applies itself (`_threads`).
_TORCH_PREFIXES = ("OMP_", "MKL_", "KMP_", "GOMP_", "TORCH", "PYTORCH_")
_THREADS = "OMP_NUM_THREADS"
READY_S = 30.0  # how long a runner waits for its new launcher to import (`Launcher.wait_if_heavy`)


@dataclass(frozen=True)
class _Request:
    module: str
    args: tuple[str, ...]
    env: dict[str, str]
    cwd: str  # the runner's working directory when it started the trial (an exec'd trial would inherit it)
    stdout: str
    stderr: str
    memory_limit_mb: int | None
    die_with_parent: bool


class ForkedProcess:
    """A trial forked by the launcher: the part of `subprocess.Popen` that `TrialProcess` uses."""

    def __init__(self, launcher: Launcher, pid: int):
        self.launcher, self.pid = launcher, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.launcher.exit_code(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.launcher.wait_exit(self.pid, timeout)
        return self.returncode


class Launcher:
    """The runner's side: starts the server, forks trials through it, collects their exit statuses."""

    def __init__(self, modules: tuple[str, ...] = PRELOAD, env: dict[str, str] | None = None):
        self.env = {**(module_env(os.environ) if env is None else env), _UNBUFFERED: "1"}
        self.holds_torch = "torch" in modules
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            cmd = [sys.executable, "-m", __name__, str(theirs.fileno()), *modules]
            self.server = _start_server(cmd, self.env, theirs.fileno())
        finally:
            theirs.close()
        self._lock = threading.Lock()  # one request at a time (Dask runs several tasks per worker)
        self._cond = threading.Condition()
        self._codes: dict[int, int] = {}
        self._replies: list[tuple] = []
        self.alive = True
        self.ready = False  # the server has imported the modules (0.3 s, 4 s with torch); until then, trials are exec'd
        self._reader = threading.Thread(target=self._read, name="hpo-launcher", daemon=True)
        self._reader.start()

    def wait_if_heavy(self, ready_s: float = READY_S) -> None:
        """Wait (at most `ready_s`) until a launcher that imports torch is ready, so that the first trials are forked
        too, not exec'd to import torch beside it: as long a wait as their own imports, with the CPU of one. A light
        launcher is not waited for (the first trials are exec'd meanwhile)."""
        if self.holds_torch:
            self.wait_ready(ready_s)

    def accepts(self, cmd: list[str], env: dict[str, str]) -> bool:
        """Whether forking from the server gives what exec'ing `cmd` with `env` would: `python -m MODULE` of
        this interpreter, unbuffered, started with the server's interpreter settings (and, where the server holds
        torch, on the CPU with torch's settings but the thread count)."""
        if not (self.ready and self.alive):
            return False
        if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m" or cmd[2].startswith("-"):
            return False
        if cmd[2] in _EXEC_MODULES:
            return False
        prefixes, applied = _STARTUP_PREFIXES, ()
        if self.holds_torch:
            if env.get("CUDA_VISIBLE_DEVICES"):  # CUDA starts in a process of its own
                return False
            prefixes += _TORCH_PREFIXES
            if _threads(env) is not None:
                applied = (_THREADS, "MKL_NUM_THREADS")  # by the forked trial
        keys = {k for k in {*env, *self.env} if k.startswith(prefixes) and k not in applied}
        return env.get(_UNBUFFERED) == "1" and all(env.get(k) == self.env.get(k) for k in keys)

    def start(self, cmd: list[str], env: dict[str, str], stdout: Path, stderr: Path, exit_pipe: int,
              memory_limit_mb: int | None, die_with_parent: bool) -> ForkedProcess:  # fmt: skip
        """Fork `cmd` (accepted by `accepts`) with `exit_pipe` as the write end of its exit pipe."""
        request = _Request(cmd[2], tuple(cmd[3:]), env, os.getcwd(), str(stdout), str(stderr), memory_limit_mb,
                           die_with_parent)  # fmt: skip
        with self._lock:
            socket.send_fds(self.sock, [pickle.dumps(request)], [exit_pipe])
            reply = self._reply()
        if reply[0] != "started":
            raise OSError(f"the trial launcher could not start {' '.join(cmd)}: {reply[1]}")
        return ForkedProcess(self, reply[1])

    def _reply(self) -> tuple:
        with self._cond:
            self._cond.wait_for(lambda: self._replies or not self.alive)
            return self._replies.pop(0) if self._replies else ("error", "the launcher has stopped")

    def _read(self) -> None:
        """Dispatches the server's messages: replies to requests, and exit statuses of its children."""
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self.alive = False
                    self._cond.notify_all()
                    return
                message = pickle.loads(data)
                if message[0] == "exit":
                    self._codes[message[1]] = message[2]
                elif message[0] == "ready":
                    self.ready = True
                else:
                    self._replies.append(message)
                self._cond.notify_all()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the server has imported its modules; whether it has (False: it failed, or the time ran out)."""
        with self._cond:
            self._cond.wait_for(lambda: self.ready or not self.alive, timeout)
            return self.ready and self.alive

    def exit_code(self, pid: int) -> int | None:
        with self._cond:
            code = self._codes.get(pid)
            if code is None and not self.alive and not pid_exists(pid):
                code = -signal.SIGKILL  # the server is gone (its children were reaped by init)
            return code

    def wait_exit(self, pid: int, timeout: float | None = None) -> int:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._codes or not self.alive, timeout)
        code = self.exit_code(pid)
        while code is None and timeout is None:  # the server is gone: wait for the orphan to leave
            time.sleep(0.05)
            code = self.exit_code(pid)
        if code is None:
            raise TimeoutError(f"trial process {pid} still runs")
        return code

    def close(self) -> None:
        """Stop the server (trials it started keep running, unless they die with their parent)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        with contextlib.suppress(Exception):
            self.server.wait(10)


def launcher_modules(cmd: list[str], on_gpu: bool) -> tuple[str, ...]:
    """What a launcher for trials such as `cmd` imports: the trainer's side too where they train on the CPU
    (`TRAINER_PRELOAD`; not for another module, such as a benchmark's dummy trial, nor on GPUs)."""
    trains = cmd[1:3] == ["-m", TRIAL_ENTRY]  # a single-process trial of the trial entry
    return TRAINER_PRELOAD if trains and not on_gpu else PRELOAD


def start_launcher(cmd: list[str], on_gpu: bool) -> Launcher:
    """A runner's launcher for trials such as `cmd` (`launcher_modules`), waited for where it imports torch
    (`Launcher.wait_if_heavy`)."""
    launcher = Launcher(launcher_modules(cmd, on_gpu))
    launcher.wait_if_heavy()
    return launcher


def _start_server(cmd: list[str], env: dict[str, str], fd: int):
    """The server in a process group of its own (Ctrl-C is the controller's to handle). It needs no death signal:
    when the runner's process ends, the kernel closes the runner's end of the socket and the server leaves (a
    death signal would follow the thread that started it, and a Dask worker starts it from a task thread)."""
    import subprocess

    return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, pass_fds=(fd,), **OWN_GROUP)


# -- the server ----------------------------------------------------------------------------------------------


def serve(fd: int, modules: list[str]) -> None:
    sock = socket.socket(fileno=fd)
    for name in modules:
        if _runner_left(sock):  # Ctrl-C as an experiment starts: the runner's close waits for this process
            return
        importlib.import_module(name)
    gc.freeze()  # what was imported stays out of the children's collections (and their pages shared)
    try:
        sock.send(pickle.dumps(("ready",)))
    except OSError:  # the runner left while the modules were imported (Ctrl-C as an experiment starts)
        return
    # os.fork with threads running warns from Python 3.12: the one thread the imports start (numpy's OpenBLAS pool,
    # with torch) is shut down by OpenBLAS's own fork handler, and the child starts its own.
    warnings.filterwarnings("ignore", message=".*multi-threaded.*fork", category=DeprecationWarning)
    wake_r, wake_w = os.pipe()
    for end in (wake_r, wake_w):
        os.set_blocking(end, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the controller's to handle
    server_pid = os.getpid()
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            _reap(sock)
        if sock in ready:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 1)
            except ConnectionResetError:
                data, fds = b"", []
            if not data:
                return  # the runner is gone
            try:
                request = pickle.loads(data)
                pid = os.fork()
            except Exception as e:  # noqa: BLE001 - told to the runner, which fails the attempt
                reply = ("error", f"{type(e).__name__}: {e}")
            else:
                if pid == 0:
                    _child(request, fds[0], server_pid, [sock.fileno(), wake_r, wake_w])
                with contextlib.suppress(OSError):  # the child does it too: the group exists before the reply
                    os.setpgid(pid, pid)
                reply = ("started", pid)
            for end in fds:
                os.close(end)
            sock.send(pickle.dumps(reply))
            _reap(sock)  # a child that ended before the reply was sent


def _runner_left(sock: socket.socket) -> bool:
    """Whether the runner has closed its end of the socket (no request comes before "ready": only its end shows)."""
    try:
        return sock.recv(MAX_MESSAGE, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(pickle.dumps(("exit", pid, os.waitstatus_to_exitcode(status))))


def _child(request: _Request, exit_pipe: int, server_pid: int, server_fds: list[int]) -> None:
    """In the forked child: become the trial process, run its module, leave with its exit code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setpgid(0, 0)
        limits_and_death = pre_exec(request.memory_limit_mb, request.die_with_parent)  # as an exec'd trial gets
        if limits_and_death is not None:
            limits_and_death()
        if request.die_with_parent and os.getppid() != server_pid:  # the server died before the signal was set
            os.kill(os.getpid(), signal.SIGKILL)
        for end in server_fds:
            os.close(end)
        _redirect(0, os.devnull, os.O_RDONLY)
        _redirect(1, request.stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        _redirect(2, request.stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        env = {**request.env, EXIT_PIPE_ENV: f"{exit_pipe}:{os.fstat(exit_pipe).st_ino}"}
        os.environ.clear()
        os.environ.update(env)
        if "torch" in sys.modules and (threads := _threads(env)) is not None:  # as torch would have read it
            sys.modules["torch"].set_num_threads(threads)
        os.chdir(request.cwd)
        import runpy

        if not sys.flags.safe_path:
            sys.path[0] = request.cwd  # where `python -m` looks first
        sys.argv = [request.module, *request.args]
        runpy.run_module(request.module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:  # noqa: BLE001 - printed and ended with 1, as the interpreter does
        traceback.print_exc()
        code = 1
    finally:
        leave(code)


def _threads(env: dict[str, str]) -> int | None:
    """The thread count a trial's environment gives torch, where the forked trial can apply it: OMP_NUM_THREADS a
    positive number, and MKL_NUM_THREADS unset or the same (torch.set_num_threads sets both)."""
    value = env.get(_THREADS, "")
    if not value.isdigit() or int(value) < 1 or env.get("MKL_NUM_THREADS", value) != value:
        return None
    return int(value)


def _redirect(fd: int, path: str, flags: int) -> None:
    opened = os.open(path, flags, 0o644)
    os.dup2(opened, fd)
    os.close(opened)


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
    leave(0)  # not the interpreter's finalization (trainer.leave)
