"""GPU allocation and trial launch commands on fake inventories (no process is started)."""

from __future__ import annotations

import pytest

from hpo.errors import ResourceError
from hpo.runners.resources import Gpu, Slot, SlotPool, plan_slots, select_gpus
from hpo.trial.launch import LaunchSpec, build_launch, free_port

ARGS = ("--db", "sqlite:///x.db", "--trial-id", "7")


def make_inventory(n=8, free_mb=80_000, busy=()):
    return [Gpu(i, "H100", 81_559, free_mb, foreign_processes=1 if i in busy else 0) for i in range(n)]


def test_eight_gpus_two_per_trial_gives_four_disjoint_slots():
    gpus, skipped = select_gpus(make_inventory(), "all")
    slots = plan_slots(gpus, gpus_per_trial=2)
    assert [s.gpus for s in slots] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert skipped == []
    pool = SlotPool(slots)
    taken = [pool.acquire() for _ in range(4)]
    assert pool.acquire() is None
    assert "all 4 GPU allocations are busy" in pool.why_waiting()
    all_ids = [i for s in taken for i in s.gpus]
    assert sorted(all_ids) == list(range(8)) and len(set(all_ids)) == 8  # disjoint
    pool.release(taken[1])
    assert pool.acquire() == taken[1] and pool.why_waiting()


def test_gpu_held_by_a_foreign_process_is_skipped_with_a_reason():
    gpus, skipped = select_gpus(make_inventory(busy=(3,)), "all")
    assert [g.index for g in gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert skipped == ["GPU 3 is held by 1 process(es) not started by this experiment"]
    slots = plan_slots(gpus, gpus_per_trial=2)
    assert [s.gpus for s in slots] == [(0, 1), (2, 4), (5, 6)]
    pool = SlotPool(slots, skipped)
    for _ in range(3):
        pool.acquire()
    assert "GPU 3 is held" in pool.why_waiting()


def test_more_gpus_per_trial_than_the_inventory_is_a_clear_error():
    gpus, _ = select_gpus(make_inventory(4), "all")
    with pytest.raises(ResourceError, match="gpus_per_trial is 8 but only 4 usable"):
        plan_slots(gpus, gpus_per_trial=8)
    with pytest.raises(ResourceError, match=r"GPU \[9\]"):
        select_gpus(make_inventory(4), [0, 9])


@pytest.mark.parametrize("requested", ["all", [0], [0, 1, 2, 3, 4, 5, 6, 7]])
def test_gpus_asked_for_on_a_machine_without_any_are_refused_not_run_on_cpu(requested):
    with pytest.raises(ResourceError) as refused:
        select_gpus([], requested)
    message = str(refused.value)
    assert f"resources.gpus is {requested!r} but this machine has no GPU" in message
    assert "set `resources.gpus: none` with `cpu_slots`" in message


def test_every_gpu_asked_for_held_by_others_is_refused_not_run_on_cpu():
    with pytest.raises(ResourceError, match="no GPU asked for by resources.gpus is free: GPU 1 is held by 1 process"):
        select_gpus(make_inventory(4, busy=(1,)), [1])


def test_several_small_trials_per_gpu_bounded_by_free_memory():
    gpus, _ = select_gpus(make_inventory(2, free_mb=20_000), [0, 1])
    slots = plan_slots(gpus, gpus_per_trial=1, trials_per_gpu=4, memory_per_trial_mb=7_000)
    assert [s.gpus for s in slots] == [(0,), (0,), (1,), (1,)]  # 20 GB free / 7 GB = 2 per GPU, not 4


def test_cpu_slots_without_gpus():
    gpus, _ = select_gpus([], "none")
    slots = plan_slots(gpus, gpus_per_trial=2, cpu_slots=3)
    assert slots == [Slot(0), Slot(1), Slot(2)]
    assert "all 3 CPU slots are busy" in _exhausted(SlotPool(slots)).why_waiting()
    assert _exhausted(SlotPool(slots[:1])).why_waiting() == "the one CPU slot is busy"


def _exhausted(pool):
    while pool.acquire():
        pass
    return pool


def test_single_gpu_trial_command_and_environment():
    cmd, env = build_launch(LaunchSpec(ARGS, gpus=(5,), python="py"), {"PATH": "/bin"})
    assert cmd == ["py", "-m", "hpo.trial.entry", *ARGS]
    assert env["CUDA_VISIBLE_DEVICES"] == "5" and env["PATH"] == "/bin"


def test_multi_gpu_trial_uses_torchrun_on_its_own_devices_and_port():
    spec = LaunchSpec(ARGS, gpus=(2, 3), nproc=2, master_port=29611, python="py")
    cmd, env = build_launch(spec, {})
    assert cmd[:3] == ["py", "-m", "hpo.trial.torchrun"]
    assert "--nproc_per_node=2" in cmd and "--master_port=29611" in cmd
    assert cmd[-6:] == ["-m", "hpo.trial.entry", *ARGS]
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_cpu_trial_hides_gpus_and_sets_threads():
    cmd, env = build_launch(LaunchSpec(ARGS, nproc=2, master_port=1234, threads_per_process=1), {})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["OMP_NUM_THREADS"] == "1"
    assert "--nproc_per_node=2" in cmd


def test_bad_launch_specs_are_rejected():
    with pytest.raises(ValueError, match="one process per GPU"):
        build_launch(LaunchSpec(ARGS, gpus=(0, 1), nproc=1), {})
    with pytest.raises(ValueError, match="master_port"):
        build_launch(LaunchSpec(ARGS, nproc=2), {})
    assert 0 < free_port() < 65536


class NvmlError(Exception):
    pass


def stand_in_nvml(list_processes):
    """NVML as a GPU machine whose driver answers everything but, in some containers and virtual GPUs, the list of
    processes on a device (`list_processes` raises there)."""
    import types

    memory = types.SimpleNamespace(total=141 << 30, free=140 << 30)
    return types.SimpleNamespace(
        NVMLError=NvmlError, nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetMemoryInfo=lambda h: memory,
        nvmlDeviceGetComputeRunningProcesses=list_processes, nvmlDeviceGetName=lambda h: "NVIDIA H200",
    )  # fmt: skip


def test_a_gpu_whose_driver_does_not_list_processes_is_found_and_taken_as_free(monkeypatch):
    import sys

    from hpo.runners.resources import discover_gpus

    def not_supported(handle):
        raise NvmlError("Not Supported")

    monkeypatch.setitem(sys.modules, "pynvml", stand_in_nvml(not_supported))
    assert discover_gpus() == [Gpu(0, "NVIDIA H200", 141 << 10, 140 << 10, 0)]
    monkeypatch.setitem(sys.modules, "pynvml", stand_in_nvml(lambda handle: ["another process"]))
    assert discover_gpus()[0].foreign_processes == 1
