"""Building the command line and environment of one trial: a pure function, tested without starting anything.

Every runner launches the trial entry (`python -m hpo.trial.entry ...`, which wraps the trainer and records
the trial in the database) the same way:

k = 1 GPU (or a CPU slot): `python -m hpo.trial.entry ARGS`.
k > 1: `python -m hpo.trial.torchrun --nnodes=1 --nproc_per_node k --master_addr=127.0.0.1
--master_port=<port> -m hpo.trial.entry ARGS` (torchrun, ending with the code of the rank that says why it failed:
`hpo.trial.torchrun`), gloo on CPU and NCCL on GPU (the trainer picks the backend).
Each trial sees only its own GPUs through CUDA_VISIBLE_DEVICES; a CPU trial sees none.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, field

TRIAL_ENTRY = "hpo.trial.entry"
TORCHRUN = "hpo.trial.torchrun"  # torchrun, exiting with its first failed rank's code


@dataclass(frozen=True)
class LaunchSpec:
    entry_args: tuple[str, ...]  # the arguments of the entry module (trial id, attempt, database, workdir)
    gpus: tuple[int, ...] = ()  # empty: CPU
    nproc: int = 1  # processes (ranks) of this trial: gpus_per_trial on GPU, cpu ranks on CPU
    master_port: int | None = None  # rendezvous port, needed when nproc > 1
    threads_per_process: int | None = None  # OMP/MKL threads on CPU
    python: str = sys.executable
    module: str = TRIAL_ENTRY  # the entry module; benchmarks swap in a dummy workload
    extra_env: dict[str, str] = field(default_factory=dict)


def build_launch(spec: LaunchSpec, base_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The command and the full environment of a trial."""
    if spec.gpus and len(spec.gpus) != spec.nproc:
        raise ValueError(f"{len(spec.gpus)} GPUs for {spec.nproc} processes: one process per GPU")
    if spec.nproc > 1 and spec.master_port is None:
        raise ValueError("a multi-process trial needs a master_port")
    cmd = [spec.python]
    if spec.nproc > 1:
        cmd += [
            "-m", TORCHRUN, "--nnodes=1", f"--nproc_per_node={spec.nproc}",
            "--master_addr=127.0.0.1", f"--master_port={spec.master_port}",
        ]  # fmt: skip
    cmd += ["-m", spec.module, *spec.entry_args]
    env = dict(base_env)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
    env["PYTHONUNBUFFERED"] = "1"
    if spec.threads_per_process:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(spec.threads_per_process)
    env.update(spec.extra_env)
    return cmd, env


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
