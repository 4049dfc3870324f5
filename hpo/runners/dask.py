"""The Dask runner: trial attempts as tasks on a Dask distributed cluster.

Workers declare their GPUs as resources (`dask worker tcp://HOST:8786 --resources GPU=8`); an attempt with
`gpus_per_trial: k` is a task that needs `{"GPU": k}`, so the scheduler never puts more trials on a worker
than it has GPUs. On the worker, the task takes k of that worker's GPU ids that no other task holds, sets
CUDA_VISIBLE_DEVICES, and runs the same launch as the local runner (torchrun for k > 1 with its own port).
The trial process dies with its worker (PR_SET_PDEATHSIG; a trial forked by the worker's preloaded launcher dies
with the launcher, which leaves with the worker), torchrun's ranks die with torchrun (`die_with_launcher`), and a
cancelled or leftover attempt is ended with all its processes (`end_trial`). The trial records itself in the
database, so only the database URL needs to reach the workers, no shared disk. How the process ended (exit code,
stderr tail) is announced on the scheduler's event log under the runner's own topic as soon as the process is
gone: the runner hears of it in one message instead of fetching the task's value from the worker. Task keys and
the topic carry a token of the runner, since keys are global to a scheduler and several experiments may share one
cluster.

A worker that dies mid-trial: the runner sees the task's worker leave the cluster and reports the attempt as
lost; the study loop re-queues the trial once (a new attempt), then fails it. When Dask re-runs the task on
another worker before the runner notices, that re-run cannot claim the trial (the storage fences attempts and
only claims queued trials); its refusal (exit code 4) is reported as the same loss. A scheduler that goes away
ends the run instead (`lost_scheduler`, a SchedulerLostError naming it): the study records its running trials as
interrupted, for `hpo resume` once a scheduler is back.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hpo.errors import HpoError, ResourceError, SchedulerLostError
from hpo.interpreter import module_env
from hpo.runners.base import Runner, TrialExit, TrialLaunch
from hpo.runners.preload import Launcher, launcher_modules
from hpo.runners.process import TrialProcess, end_trial, leftover_group, wait_any
from hpo.runners.resources import cpu_trial_threads
from hpo.trial.entry import EXIT_NOT_CLAIMED, WORKER_ENV
from hpo.trial.launch import LaunchSpec, build_launch, free_port

CONNECT_TIMEOUT_S = 10
WORKER_CHECK_S = 0.25
SEND_INTERVAL_S = 0.001  # the client's batching of messages to the scheduler (Dask's default: 10 ms)
SETTLE_S = 5.0  # how long a submission waits for the scheduler to see its announced predecessors' tasks end
GPU_WAIT_S = 120.0  # how long a task waits for the GPU ids of a cancelled task to be released


ADDRESS_HINT = "give it as tcp://HOST:PORT, e.g. tcp://HOST:8786 (`dask scheduler` prints its address)"


def check_address(address: str, where: str) -> None:
    """Refuse a scheduler address that names no port (`tcp://HOST`) or an unusable one, before connecting:
    Dask's own parser raises a ValueError from inside the client, whose clean-up then waits out its timeout
    twice. `where` says where the address came from (--scheduler, or the file's runner.scheduler)."""
    from distributed.comm.addressing import get_address_host_port, parse_address

    scheme, _ = parse_address(address, strict=False)
    if scheme not in ("tcp", "tls"):
        return  # inproc://, ucx://: Dask's own checks, when the client connects
    try:
        _, port = get_address_host_port(address)
    except ValueError as e:
        raise HpoError(f"{where}: {address!r} is not a Dask scheduler address ({e}); {ADDRESS_HINT}") from None
    if not 0 < port < 65536:
        raise HpoError(f"{where}: {address!r} has port {port}, not a TCP port (1 to 65535); {ADDRESS_HINT}")


@dataclass
class _Submitted:
    launch: TrialLaunch
    future: Any
    worker: str | None = None  # the last worker the scheduler had it processing on
    task_ended: threading.Event = field(default_factory=threading.Event)  # the scheduler knows its task ended

    @property
    def key(self) -> tuple[int, int]:
        return self.launch.trial_id, self.launch.attempt


class DaskRunner(Runner):
    def __init__(self, scheduler: str, resources, max_parallel: int, launch_builder=build_launch,
                 preload: bool = False):  # fmt: skip
        """Connects now: an unreachable scheduler, or a cluster whose workers cannot hold one trial, raises
        ResourceError naming the address before anything is written. With `preload`, each worker process forks
        single-process trials from a launcher of its own (hpo.runners.preload)."""
        from distributed import Client

        try:
            self.client = Client(scheduler, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except ValueError as e:  # an address Dask cannot parse (`check_address` refuses the usual ones first)
            raise HpoError(
                f"runner.scheduler: {scheduler!r} is not a Dask scheduler address ({e}); {ADDRESS_HINT}"
            ) from None
        except (OSError, TimeoutError) as e:
            workers = "`dask worker ADDRESS --resources GPU=N`" if resources.gpus != "none" else "`dask worker ADDRESS`"
            raise ResourceError(
                f"runner.scheduler: cannot reach the Dask scheduler at {scheduler} ({e}); start one with "
                f"`dask scheduler` and workers with {workers}, or use runner: local"
            ) from None
        self.scheduler = scheduler
        _send_promptly(self.client)
        self.gpus = 0 if resources.gpus == "none" else resources.gpus_per_trial
        self.max_parallel = max_parallel
        self.launch_builder = launch_builder
        self.preload = preload
        self.running: dict[int, _Submitted] = {}
        # This runner's own names on the cluster: task keys are global to the scheduler, and another experiment's
        # trial 1 must not be taken for ours.
        self.token = uuid.uuid4().hex[:12]
        self._done = threading.Event()  # set when a submitted task ends
        self._exits: dict[tuple[int, int], dict[str, Any]] = {}  # (trial id, attempt) -> how it ended, announced
        self._lock = threading.Lock()
        # Attempts whose end was announced but whose task the scheduler may not yet know to have ended.
        self._ending: list[_Submitted] = []
        # Futures of ended attempts, let go at the next poll, after the study loop submitted their successors: the
        # release then reaches the worker after the next task, not ahead of it in the scheduler's 5 ms batching.
        self._released: list[Any] = []
        self.client.subscribe_topic(self.topic, self._on_exit)
        self._checked = 0.0
        self._capacity: tuple[float, int] | None = None  # (when, value): asked of the scheduler at most 1/s
        self._host_threads: dict[str, int] = {}  # the Dask threads of each host's workers, read with the capacity
        if self.capacity() == 0 and not self.gpus:
            self.client.close()
            raise ResourceError(f"runner.scheduler: the Dask cluster at {scheduler} has no worker; start one with "
                                f"`dask worker {scheduler}`")  # fmt: skip
        if self.capacity() == 0:
            self.client.close()
            raise ResourceError(
                f"runner.scheduler: no worker of the Dask cluster at {scheduler} declares GPU >= {self.gpus}; "
                f"start workers with `--resources GPU={self.gpus}` (or more), or lower resources.gpus_per_trial"
            )

    def capacity(self) -> int:
        """Attempts the cluster can run at once (GPU resources per worker // GPUs per trial)."""
        now = time.monotonic()
        if self._capacity is None or now - self._capacity[0] > 1.0:
            self._capacity = (now, self._ask_capacity())
        return self._capacity[1]

    def _ask_capacity(self) -> int:
        workers = self.client.scheduler_info(n_workers=-1)["workers"].values()
        threads: Counter[str] = Counter()
        for w in workers:
            threads[w.get("host", "")] += int(w.get("nthreads", 1))
        self._host_threads = dict(threads)
        if self.gpus:
            fit = sum(int(w.get("resources", {}).get("GPU", 0)) // self.gpus for w in workers)
        else:
            fit = sum(int(w.get("nthreads", 1)) for w in workers)
        return min(self.max_parallel, fit)

    def _threads_by_host(self) -> dict[str, int]:
        """The Dask threads of each host's workers: the CPU trials that host runs at once, which share its cores
        (read with the capacity, at most once a second)."""
        self.capacity()
        return self._host_threads

    def describe(self) -> str:
        per = f"{self.gpus} GPU(s)" if self.gpus else "a CPU thread"
        return f"dask runner at {self.scheduler}: {self.capacity()} trial(s) at once, {per} each"

    def free_slots(self) -> int:
        return max(0, self.capacity() - len(self.running))

    def why_waiting(self) -> str:
        if self.free_slots():
            return ""
        if self.capacity() == 0:  # every worker gone (or none with the GPUs a trial needs): not busy, empty
            need = f"with {self.gpus} GPU(s) " if self.gpus else ""
            return f"the Dask cluster at {self.scheduler} has no worker {need}left: waiting for one to join"
        slots = f"all {self.capacity()} allocations" if self.capacity() > 1 else "the one allocation"
        return f"{slots} of the Dask cluster at {self.scheduler} {'are' if self.capacity() > 1 else 'is'} busy"

    @property
    def topic(self) -> str:
        """The scheduler event topic on which this runner's attempts announce how they ended."""
        return f"hpo-exits-{self.token}"

    def _on_exit(self, event: tuple[float, dict[str, Any]]) -> None:
        """Runs in the client's event loop when an attempt announces its end (just before its task ends)."""
        msg = event[1]
        with self._lock:
            self._exits[(msg["trial_id"], msg["attempt"])] = msg["ended"]
        self._done.set()

    def submit(self, launch: TrialLaunch) -> None:
        # The study loop learns of an end from the announcement, a few ms before the scheduler has the task's end
        # (both wait in Dask's batching). A task submitted in between could be placed on a worker that the scheduler
        # still thinks busy, or on one that is in fact full, and wait there for a thread: so wait for those ends
        # here, after the study loop did its own work for the successor in the meantime.
        for sub in self._ending:
            sub.task_ended.wait(SETTLE_S)
            self._released.append(sub.future)
        self._ending.clear()
        future = self.client.submit(
            run_attempt, launch, self.gpus, self.launch_builder, self.topic, self.preload,
            None if self.gpus else self._threads_by_host(),
            key=f"hpo-trial-{self.token}-{launch.trial_id}-attempt-{launch.attempt}", pure=False, retries=0,
            resources={"GPU": self.gpus} if self.gpus else None,
        )  # fmt: skip
        sub = self.running[launch.trial_id] = _Submitted(launch, future)

        def task_ended(_) -> None:  # in a Dask callback thread: wakes `wait` without a call into the client's loop
            sub.task_ended.set()
            self._done.set()

        future.add_done_callback(task_ended)

    def poll(self) -> list[TrialExit]:
        with self._scheduler_calls():
            return self._poll()

    def _poll(self) -> list[TrialExit]:
        self._require_scheduler()
        self._done.clear()  # before looking, so an end that comes while we look wakes the next `wait`
        self._released.clear()
        with self._lock:
            announced = {tid: self._exits.pop(s.key) for tid, s in self.running.items() if s.key in self._exits}
            running = {s.key for s in self.running.values()}
            for key in [k for k in self._exits if k not in running]:
                del self._exits[key]  # announcements of attempts given up as lost
        ended = [self._announced(tid, ended) for tid, ended in announced.items()]
        # Tasks that ended without announcing it (the task raised, its worker died, or the announcement is late):
        # their return values, where they have one, in one round trip to the workers, not one each.
        done = [tid for tid, s in self.running.items() if tid not in announced and s.future.done()]
        finished = [f for f in (self.running[tid].future for tid in done) if f.status == "finished"]
        values = dict(zip((f.key for f in finished), self.client.gather(finished), strict=True)) if finished else {}
        ended += [self._finished(tid, values) for tid in done]
        # Which workers live is asked of the scheduler (a round trip) in a poll that found no end, so that it does not
        # hold up the successors of ended attempts (the study loop polls again right after starting them); it is
        # not put off past 4 intervals.
        since = time.monotonic() - self._checked
        if self.running and (since > WORKER_CHECK_S and not ended or since > 4 * WORKER_CHECK_S):
            self._checked = time.monotonic()
            ended += self._lost()
        return ended

    def wait(self, timeout_s: float) -> None:
        self._done.wait(min(timeout_s, WORKER_CHECK_S) if self.running else timeout_s)

    def _announced(self, trial_id: int, ended: dict[str, Any]) -> TrialExit:
        sub = self.running.pop(trial_id)
        self._ending.append(sub)
        if ended["returncode"] == EXIT_NOT_CLAIMED:  # Dask re-ran the attempt after its worker died
            why = f"its Dask worker {sub.worker or ''} was lost while it ran; Dask re-ran the attempt on "
            return TrialExit(trial_id, sub.launch.attempt, lost=why + f"{ended['worker']}, which the database refused")
        return TrialExit(trial_id, sub.launch.attempt, **ended)

    def _finished(self, trial_id: int, values: dict[str, Any]) -> TrialExit:
        sub = self.running[trial_id]
        if sub.future.key in values:
            return self._announced(trial_id, values[sub.future.key])
        self._require_scheduler()  # the client cancels every future when it loses the scheduler: not a worker's loss
        self.running.pop(trial_id)
        attempt = sub.launch.attempt
        error = sub.future.exception() if sub.future.status == "error" else None
        if error is None or type(error).__name__ == "KilledWorker":
            return TrialExit(trial_id, attempt, lost=f"lost its Dask worker {sub.worker or ''}".strip())
        return TrialExit(trial_id, attempt, stderr_tail=f"{type(error).__name__}: {error}", worker=sub.worker)

    def _lost(self) -> list[TrialExit]:
        """Attempts whose worker left the cluster while running them."""
        # One snapshot of the scheduler: every live worker (busy or idle) and the tasks it runs.
        processing = self.client.processing()
        live = set(processing)
        where = {key: worker for worker, keys in processing.items() for key in keys}
        lost = []
        for trial_id, sub in list(self.running.items()):
            if sub.worker is not None and sub.worker not in live:
                self.client.cancel(sub.future, force=True)
                # Dask may already have re-run the task elsewhere: that stale attempt cannot claim the trial
                # (the storage fences attempts), and is stopped here so it holds no GPU.
                self.client.run(_kill_trials, [(trial_id, sub.launch.attempt)])
                del self.running[trial_id]
                why = f"its Dask worker {sub.worker} was lost while it ran"
                lost.append(TrialExit(trial_id, sub.launch.attempt, lost=why, worker=sub.worker))
            else:
                sub.worker = where.get(sub.future.key, sub.worker)
        return lost

    def cancel_all(self) -> list[TrialExit]:
        if not self.running:
            return []
        ids = list(self.running)
        reachable = self.client.status == "running"  # else the workers end their trials when they lose the scheduler
        if reachable:
            try:
                self.client.run(_kill_trials, [(tid, self.running[tid].launch.attempt) for tid in ids])
            except (OSError, TimeoutError):  # it went away before the client noticed: the same as gone
                reachable = False
        exits = []
        for trial_id in ids:
            sub = self.running.pop(trial_id)
            if reachable:
                with contextlib.suppress(OSError, TimeoutError):
                    self.client.cancel(sub.future, force=True)
            exits.append(TrialExit(trial_id, sub.launch.attempt, returncode=-9, worker=sub.worker))
        return exits

    def on_workers(self, fn, *args) -> dict[str, Any]:
        """`fn(*args)` called in every worker's process (where its trials start): its answer by worker address."""
        with self._scheduler_calls():
            return self.client.run(fn, *args)

    def kill_leftover(self, host: str | None, pid: int | None, tag: str, claimed_at: datetime | None = None) -> None:
        self.client.run(_kill_on_host, host, pid, tag, claimed_at)  # every worker: a trial not started has no host

    def close(self) -> None:
        if self.client.status == "running":
            self.client.close()
            return
        # The scheduler is gone: closing cancels the client's attempts to reconnect, which Dask logs with a traceback.
        log = logging.getLogger("distributed.client")
        disabled, log.disabled = log.disabled, True
        try:
            self.client.close()
        finally:
            log.disabled = disabled

    def _require_scheduler(self) -> None:
        """Raise `lost_scheduler` once the client lost its connection to the scheduler (it then cancels every
        task it submitted, and a scheduler that comes back knows none of them)."""
        if self.client.status != "running":
            raise self.lost_scheduler("the connection to it broke")

    @contextlib.contextmanager
    def _scheduler_calls(self):
        """Calls to the scheduler that fail because it went away raise `lost_scheduler` instead of Dask's error."""
        try:
            yield
        except (OSError, TimeoutError) as e:  # Dask's CommClosedError is an OSError
            raise self.lost_scheduler(str(e) or type(e).__name__) from None

    def lost_scheduler(self, cause: str) -> SchedulerLostError:
        return SchedulerLostError(
            f"runner.scheduler: lost the Dask scheduler at {self.scheduler} ({cause}); its workers end their trials "
            "when they lose it, and a resume ends any left; start the scheduler and its workers again, then "
            "`hpo resume` runs the interrupted trials again"
        )


def _send_promptly(client) -> None:
    """Dask's client batches its messages to the scheduler, sending at most one batch every 10 ms; the trials of
    a wave, submitted one after another, then wait up to that long to leave. Submissions here are few and their
    latency is the runner's overhead, so the batching interval is lowered to 1 ms (where the client has it)."""
    comm = getattr(client, "scheduler_comm", None)
    if comm is not None and isinstance(getattr(comm, "interval", None), float):
        comm.interval = min(comm.interval, SEND_INTERVAL_S)


# -- on the worker ---------------------------------------------------------------------------------------------

_lock = threading.Lock()
_gpus_in_use: set[int] = set()
_processes: dict[tuple[int, int], TrialProcess] = {}  # (trial id, attempt) -> its process
_launchers: dict[tuple[str, ...], Launcher] = {}  # this worker process's, by modules (`_worker_launcher`)


def run_attempt(launch: TrialLaunch, gpus: int, launch_builder, topic: str, preload: bool = False,
                threads_by_host: dict[str, int] | None = None) -> dict[str, Any]:  # fmt: skip
    """The task: run one attempt on this worker with `gpus` of its GPUs; how its process ended. That is also
    announced on the scheduler's event log under `topic` as soon as the process has ended: the runner learns it
    without fetching the task's result from the worker. With `preload`, the process is forked from this worker's
    launcher (which dies with the worker, and so do the trials it forked). A CPU trial gets its share of the
    machine's cores: divided among the Dask threads of the workers on this host (`threads_by_host`, the runner's
    view), as the local runner divides them among its slots (without it, Dask's nanny gives every trial 1 thread)."""
    from distributed import get_worker
    from distributed.comm.addressing import get_address_host

    worker = get_worker()
    ids = _take_gpus(int(worker.state.total_resources.get("GPU", 0)), gpus)
    try:
        ranks = launch.ranks
        threads = None
        if not ids:
            sharing = (threads_by_host or {}).get(get_address_host(worker.address), worker.state.nthreads)
            threads = cpu_trial_threads(sharing, ranks)
        spec = LaunchSpec(launch.entry_args(), ids, ranks, free_port() if ranks > 1 else None, threads,
                          extra_env={WORKER_ENV: worker.address})  # fmt: skip
        cmd, env = launch_builder(spec, module_env(os.environ))
        launcher = _worker_launcher(cmd, on_gpu=bool(ids)) if preload and ranks == 1 else None
        process = TrialProcess.start(cmd, env, launch.workdir, launch.timeout_s, launch.memory_limit_mb,
                                     die_with_parent=True, launcher=launcher, tag=launch.tag)  # fmt: skip
        _processes[(launch.trial_id, launch.attempt)] = process
        while (code := process.poll()) is None:
            wait_any([process], 0.1)
        ended = {"returncode": code, "stderr_tail": process.stderr_tail(), "timed_out": process.timed_out,
                 "worker": worker.address, "duration_s": process.elapsed_s}  # fmt: skip
    finally:
        _processes.pop((launch.trial_id, launch.attempt), None)
        with _lock:
            _gpus_in_use.difference_update(ids)
    worker.log_event(topic, {"trial_id": launch.trial_id, "attempt": launch.attempt, "ended": ended})
    return ended


def _worker_launcher(cmd: list[str], on_gpu: bool) -> Launcher:
    """This worker's launcher for trials such as `cmd`, one per kind (`preload.launcher_modules`: with the trainer's
    side for CPU trials, without it for GPU trials), started by the first trial of its kind. One that imports torch
    is waited for (`Launcher.wait_if_heavy`) outside the lock: the worker's other tasks go on meanwhile."""
    modules = launcher_modules(cmd, on_gpu)
    with _lock:
        launcher = _launchers.get(modules)
        if launcher is None or not launcher.alive:
            launcher = _launchers[modules] = Launcher(modules)
    launcher.wait_if_heavy()
    return launcher


def _take_gpus(total: int, needed: int, wait_s: float = GPU_WAIT_S) -> tuple[int, ...]:
    """`needed` of this worker's GPU ids 0..total-1 that no other task holds. Dask's resource accounting
    guarantees there are enough, except for a moment after a cancelled task whose process is still exiting:
    wait for it rather than fail the trial."""
    deadline = time.monotonic() + wait_s
    while True:
        with _lock:
            free = [i for i in range(total) if i not in _gpus_in_use]
            if len(free) >= needed:
                ids = tuple(free[:needed])
                _gpus_in_use.update(ids)
                return ids
        if time.monotonic() > deadline:
            raise ResourceError(f"worker has {len(free)} free GPU(s) of {total} after {wait_s:.0f} s, "
                                f"a trial needs {needed}")  # fmt: skip
        time.sleep(0.1)


def _kill_trials(attempts: list[tuple[int, int]]) -> None:
    for key in attempts:
        process = _processes.get(tuple(key))
        if process is not None:
            process.kill()


def _kill_on_host(host: str | None, pid: int | None, tag: str, claimed_at: datetime | None = None) -> None:
    if host is None or socket.gethostname() == host:
        end_trial(tag, leftover_group(pid, claimed_at) if host else None)
