"""The local runner: GPU allocations (or CPU slots) of this machine, one process (group) per attempt.

GPUs are discovered through NVML and carved into slots of `gpus_per_trial` (hpo/runners/resources.py); each attempt
gets a slot's GPUs through CUDA_VISIBLE_DEVICES and, with several ranks, its own rendezvous port. Without
GPUs, CPU slots run side by side with the machine's cores shared between their ranks.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from hpo.interpreter import module_env
from hpo.runners.base import Runner, TrialExit, TrialLaunch
from hpo.runners.preload import Launcher, start_launcher
from hpo.runners.process import TrialProcess, end_trial, leftover_group, wait_any
from hpo.runners.resources import Slot, SlotPool, cpu_trial_threads, discover_gpus, plan_slots, select_gpus
from hpo.trial.entry import WORKER_ENV
from hpo.trial.launch import LaunchSpec, build_launch, free_port

LaunchBuilder = Callable[[LaunchSpec, dict[str, str]], tuple[list[str], dict[str, str]]]


@dataclass
class _Running:
    launch: TrialLaunch
    slot: Slot
    process: TrialProcess


class LocalRunner(Runner):
    def __init__(self, resources, max_parallel: int, launch_builder: LaunchBuilder = build_launch,
                 preload: bool = False):  # fmt: skip
        """Plans the slots now: an impossible request (8 GPUs per trial on a 4-GPU machine) raises
        ResourceError before anything is written. With `preload`, single-process trials are forked from a
        launcher that has imported the trial side (hpo.runners.preload; on the CPU the trainer and torch too),
        started with the first one."""
        inventory = [] if resources.gpus == "none" else discover_gpus()
        gpus, skipped = select_gpus(inventory, resources.gpus)  # GPUs asked for on a machine without any: refused
        slots = plan_slots(gpus, resources.gpus_per_trial, resources.trials_per_gpu, cpu_slots=resources.cpu_slots)
        self.pool = SlotPool(slots[:max_parallel], skipped)
        self.resources = resources
        self.launch_builder = launch_builder
        self.running: dict[int, _Running] = {}
        self.preload = preload
        self.launcher: Launcher | None = None

    def describe(self) -> str:
        slots = self.pool.slots
        return f"local runner, {len(slots)} slot(s): {', '.join(s.label for s in slots)}"

    def free_slots(self) -> int:
        return self.pool.free

    def why_waiting(self) -> str:
        return self.pool.why_waiting()

    def submit(self, launch: TrialLaunch) -> None:
        slot = self.pool.acquire()
        if slot is None:
            raise RuntimeError("submit() without a free slot")
        ranks = self.resources.ranks_per_trial(on_gpu=bool(slot.gpus))
        threads = None if slot.gpus else cpu_trial_threads(len(self.pool.slots), ranks)
        spec = LaunchSpec(
            launch.entry_args(), slot.gpus, ranks, free_port() if ranks > 1 else None, threads,
            extra_env={WORKER_ENV: f"{socket.gethostname()}/{slot.label}"},
        )  # fmt: skip
        cmd, env = self.launch_builder(spec, module_env(os.environ))
        if self.preload and self.launcher is None and ranks == 1:  # torchrun's ranks are exec'd
            self.launcher = start_launcher(cmd, on_gpu=bool(slot.gpus))
        process = TrialProcess.start(cmd, env, launch.workdir, launch.timeout_s, launch.memory_limit_mb,
                                     launcher=self.launcher, tag=launch.tag)  # fmt: skip
        self.running[launch.trial_id] = _Running(launch, slot, process)

    def poll(self) -> list[TrialExit]:
        ended = []
        for trial_id, run in list(self.running.items()):
            code = run.process.poll()
            if code is not None:
                ended.append(self._ended(trial_id, code))
        return ended

    def wait(self, timeout_s: float) -> None:
        wait_any([run.process for run in self.running.values()], timeout_s)

    def cancel_all(self) -> list[TrialExit]:
        ended = []
        for trial_id, run in list(self.running.items()):
            run.process.kill()
            ended.append(self._ended(trial_id, run.process.popen.wait()))
        return ended

    def kill_leftover(self, host: str | None, pid: int | None, tag: str, claimed_at: datetime | None = None) -> None:
        if host is None or host == socket.gethostname():  # no host: killed before it recorded one
            end_trial(tag, leftover_group(pid, claimed_at) if host else None)

    def close(self) -> None:
        if self.launcher is not None:
            self.launcher.close()
            self.launcher = None

    def _ended(self, trial_id: int, code: int) -> TrialExit:
        run = self.running.pop(trial_id)
        self.pool.release(run.slot)
        return TrialExit(trial_id, run.launch.attempt, code, run.process.stderr_tail(), run.process.timed_out,
                         worker=run.slot.label, duration_s=run.process.elapsed_s)  # fmt: skip
