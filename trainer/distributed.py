"""The data-parallel environment: who am I, how many are we, which ranks share my node.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE; a plain `python -m trainer` is rank 0 of 1.
Collectives get a timeout so that a rank that dies ends the run instead of hanging it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from trainer.errors import ConfigError

COLLECTIVE_TIMEOUT = timedelta(seconds=float(os.environ.get("TRAINER_COLLECTIVE_TIMEOUT_S", "300")))


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_env_from_environ() -> DistEnv:
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    return DistEnv(
        rank=int(env.get("RANK", "0")),
        world_size=world,
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_world_size=int(env.get("LOCAL_WORLD_SIZE", str(world))),
    )


def check_device(requested: str, env: DistEnv) -> None:
    """Raise `ConfigError` when the config's `device` cannot be had on this machine: cuda without a CUDA device,
    or (cuda, or auto with CUDA) a local rank without a GPU of its own. Touches no device."""
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device: cuda, but this machine has no CUDA device (torch.cuda.is_available() is False): "
            "use device: cpu or auto"
        )
    if requested in ("cuda", "auto") and torch.cuda.is_available() and env.local_rank >= torch.cuda.device_count():
        count = torch.cuda.device_count()
        raise ConfigError(
            f"device: {requested}, LOCAL_RANK {env.local_rank}, but this machine has {count} CUDA devices "
            f"(0 to {count - 1}) visible to this process: start at most {count} processes per node "
            f"(torchrun --nproc-per-node {count}), or use device: cpu"
        )


def pick_device(requested: str, env: DistEnv) -> torch.device:
    """The device of this rank (`check_device` first): cuda:LOCAL_RANK for cuda, or auto where CUDA is available;
    else the CPU."""
    check_device(requested, env)
    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def init_process_group(env: DistEnv, device: torch.device) -> None:
    """NCCL on GPU, gloo on CPU; rendezvous from torchrun's MASTER_ADDR/MASTER_PORT."""
    if env.enabled and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        if backend == "gloo":
            # gloo connects every pair of ranks in init_process_group, and a rank that has connected may return
            # while its peer still reads the handshake: if it then leaves at once (a data error every rank meets
            # before any collective), the peer fails with "connectFullMesh failed ... Connection closed by peer"
            # instead of meeting the same error: 9 of 50 starts on 2 loaded cores, none of 50 with this barrier.
            dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device, env: DistEnv) -> list[float]:
    """Sum a few numbers over ranks (identity on one process)."""
    if not env.enabled:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_gather_scalars(values: list[float], device: torch.device, env: DistEnv) -> list[list[float]]:
    """A few numbers from every rank, in rank order, in one collective: [rank][value] (one process: [values]).
    `dist.all_gather` into a tensor a rank: torch 2.13 deprecated `all_gather_into_tensor` (a FutureWarning every
    rank printed) for `all_gather_single`, which earlier versions lack; this one every version has, undeprecated."""
    if not env.enabled:
        return [list(values)]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(env.world_size)]
    dist.all_gather(out, t)
    return torch.stack(out).tolist()


def any_rank(flags: list[bool], device: torch.device, env: DistEnv) -> list[bool]:
    """Whether any rank raised each flag, the same answer on every rank (one collective): for decisions that must
    not split the ranks, such as stopping."""
    rows = all_gather_scalars([float(flag) for flag in flags], device, env)
    return [any(row[i] for row in rows) for i in range(len(flags))]


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def log(env: DistEnv, message: str) -> None:
    """A line of the run's progress or warnings on stderr, from rank 0 only (the others keep quiet)."""
    if env.is_main:
        print(message, file=sys.stderr, flush=True)
