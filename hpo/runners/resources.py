"""GPU discovery and allocation: which trial runs on which devices, and why a trial waits.

An `Inventory` is what the machine has (from NVML, or given for tests). `plan_slots` carves it into slots of
`gpus_per_trial` disjoint GPUs (several trials per GPU when `trials_per_gpu` > 1 and memory allows); with
`gpus: none` the slots are CPU slots. GPUs asked for on a machine without any are refused before anything is
written (a fall-back to CPU slots ran a BERT-large experiment's every trial into a failure in seconds).
`SlotPool` hands slots out and takes them back. Everything here is pure except `discover_gpus` and
`usable_cores`, so the scheduling rules are tested on fake inventories.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hpo.errors import ResourceError


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str = "gpu"
    memory_total_mb: int = 0
    memory_free_mb: int = 0
    foreign_processes: int = 0  # compute processes not started by us


@dataclass(frozen=True)
class Slot:
    """Where one trial runs: GPU ids (empty for a CPU slot) and a stable slot number."""

    number: int
    gpus: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return f"gpus {','.join(map(str, self.gpus))}" if self.gpus else f"cpu slot {self.number}"


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity (a Slurm job's, a container's cpuset, `taskset`), not
    the machine's count, which CPU trials given a share of it would oversubscribe."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def cpu_trial_threads(sharing: int, ranks: int) -> int:
    """The threads of each rank of a CPU trial: the usable cores divided among the `sharing` trials that run at once
    on them (a local runner's slots, the Dask threads of a host's workers) times the trial's `ranks`, at least 1."""
    return max(1, usable_cores() // max(1, sharing * ranks))


def discover_gpus() -> list[Gpu]:
    """GPUs seen through NVML (nvidia-ml-py); an empty list where there is no NVIDIA driver or library."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                foreign = len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
            except pynvml.NVMLError:  # some virtualized GPUs and containers do not list processes: taken as free
                foreign = 0
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(Gpu(i, str(name), mem.total >> 20, mem.free >> 20, foreign))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def select_gpus(inventory: list[Gpu], requested: list[int] | str) -> tuple[list[Gpu], list[str]]:
    """The usable GPUs among `requested` ("all", "none" or ids) and a reason for each one left out. Asking for
    GPUs on a machine without any is refused: the trials would otherwise run on CPU, or fail one after another."""
    if requested == "none":
        return [], []
    if not inventory:
        asked = "all" if requested == "all" else requested
        raise ResourceError(
            f"resources.gpus is {asked!r} but this machine has no GPU (NVML sees none: no NVIDIA driver, no "
            "nvidia-ml-py, or no device); to train on CPU set `resources.gpus: none` with `cpu_slots` (trials side "
            "by side) and `cpu_ranks_per_trial`, and a base config sized for a CPU (e.g. `base_config: demo_cpu`, "
            "as the *_demo_cpu presets have; `hpo presets` lists them); or run on a machine with GPUs"
        )
    by_index = {g.index: g for g in inventory}
    wanted = sorted(by_index) if requested == "all" else list(requested)
    unknown = [i for i in wanted if i not in by_index]
    if unknown:
        raise ResourceError(
            f"resources.gpus asks for GPU {unknown} but this machine has {sorted(by_index) or 'no GPUs'}; "
            "use ids from nvidia-smi, 'all' or 'none'"
        )
    usable, skipped = [], []
    for i in wanted:
        gpu = by_index[i]
        if gpu.foreign_processes:
            skipped.append(f"GPU {i} is held by {gpu.foreign_processes} process(es) not started by this experiment")
        else:
            usable.append(gpu)
    if not usable:  # CPU slots here would train a GPU experiment on the CPU
        raise ResourceError(f"no GPU asked for by resources.gpus is free: {'; '.join(skipped)}; free one, or list "
                            "free ids in resources.gpus")  # fmt: skip
    return usable, skipped


def plan_slots(
    gpus: list[Gpu],
    gpus_per_trial: int,
    trials_per_gpu: int = 1,
    memory_per_trial_mb: int | None = None,
    cpu_slots: int = 1,
) -> list[Slot]:
    """Carve GPUs into disjoint slots of `gpus_per_trial`; CPU slots when there are no GPUs."""
    if not gpus:
        return [Slot(i) for i in range(cpu_slots)]
    if gpus_per_trial > len(gpus):
        raise ResourceError(
            f"resources.gpus_per_trial is {gpus_per_trial} but only {len(gpus)} usable GPU(s) "
            f"({[g.index for g in gpus]}); lower gpus_per_trial or free GPUs"
        )
    if trials_per_gpu > 1 and gpus_per_trial != 1:
        raise ResourceError("resources.trials_per_gpu > 1 needs gpus_per_trial = 1")
    slots: list[Slot] = []
    if trials_per_gpu > 1:
        for gpu in gpus:
            fit = trials_per_gpu
            if memory_per_trial_mb:
                fit = min(fit, gpu.memory_free_mb // memory_per_trial_mb)
            slots.extend(Slot(len(slots) + k, (gpu.index,)) for k in range(fit))
        return slots
    for start in range(0, len(gpus) - gpus_per_trial + 1, gpus_per_trial):
        slots.append(Slot(len(slots), tuple(g.index for g in gpus[start : start + gpus_per_trial])))
    return slots


class SlotPool:
    """Free and busy slots; says why the next trial has to wait."""

    def __init__(self, slots: list[Slot], skipped: list[str] | None = None):
        if not slots:
            raise ResourceError("no slot can run a trial: " + ("; ".join(skipped or []) or "no resources"))
        self.slots = slots
        self.skipped = skipped or []
        self._free = list(slots)

    def acquire(self) -> Slot | None:
        return self._free.pop(0) if self._free else None

    def release(self, slot: Slot) -> None:
        if slot in self._free:
            raise ValueError(f"{slot.label} released twice")
        self._free.append(slot)
        self._free.sort(key=lambda s: s.number)

    @property
    def free(self) -> int:
        return len(self._free)

    def why_waiting(self) -> str:
        if self._free:
            return ""
        kind = "GPU allocation" if self.slots[0].gpus else "CPU slot"
        reason = f"all {len(self.slots)} {kind}s are busy" if len(self.slots) > 1 else f"the one {kind} is busy"
        return reason + (f" ({'; '.join(self.skipped)})" if self.skipped else "")
