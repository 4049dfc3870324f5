"""Where a short trial's time goes outside the controller: how long a trial process takes from its start to
having the storage imported (exec'd, or forked by the preloaded launcher of `hpo.runners.preload`), how long
the kernel takes to tear down a trial process after its last write (what `hpo.trial.exit`'s exit pipe saves the
runner from waiting for), and the latency of one task through an idle Dask `LocalCluster` (2 worker processes,
as in `bench.controller_overhead`).

    python -m bench.trial_latency            # 30 processes per way or import set, 100 Dask tasks

Start: `TrialProcess.start` of `python -m bench.started_trial` (imports the storage, prints the time and its own
CPU time), with and without a launcher; from the call to the printed stamp, and the CPU time the process used.
Then the same for what a CPU trial imports before it trains (the trainer, torch and torch._dynamo), exec'd and
forked from a launcher that holds them (`hpo.runners.preload.TRAINER_PRELOAD`, a CPU trial's).

Teardown: a child imports a set of modules, waits for a line on stdin, writes `time.time()` and calls
`os._exit(0)`; the parent measures from that stamp to its pidfd becoming readable. Dask: `submit` to the task
running on a worker, and the task returning to the client's done-callback; each task starts on an idle cluster
(50 ms apart), so no batching interval delays it. Medians.
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

IMPORT_SETS = {
    "bare interpreter": "",
    "the trial's storage (SQLAlchemy)": "from hpo.storage import SqlStorage",
    "torch": "import torch",
}

CHILD = """
import os, sys, time
{imports}
sys.stdin.readline()
sys.stdout.write(repr(time.time()))
sys.stdout.flush()
os._exit(0)
"""


def teardown_ms(imports: str, runs: int) -> float:
    samples = []
    for _ in range(runs):
        child = subprocess.Popen([sys.executable, "-c", CHILD.format(imports=imports)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE)  # fmt: skip
        pidfd = os.pidfd_open(child.pid)
        child.stdin.write(b"\n")
        child.stdin.flush()
        stamp = float(child.stdout.read())
        select.select([pidfd], [], [], 30)
        samples.append(time.time() - stamp)
        child.wait()
        os.close(pidfd)
    return 1000 * statistics.median(samples)


def start_ms(preload: bool, runs: int, tmp: Path, trainer: bool = False) -> tuple[float, float]:
    """Median ms from `TrialProcess.start` to the storage imported (with `trainer`: the trainer and torch too, from
    a launcher that holds them, as a CPU trial's is), and the process's CPU ms until then."""
    from hpo.runners.preload import PRELOAD, TRAINER_PRELOAD, Launcher
    from hpo.runners.process import TrialProcess

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    launcher = Launcher(TRAINER_PRELOAD if trainer else PRELOAD, env=env) if preload else None
    if launcher is not None and not launcher.wait_ready(60):
        raise SystemExit("the preloaded launcher did not start")
    wall, cpu = [], []
    try:
        for i in range(runs):
            workdir = tmp / f"{'forked' if preload else 'execd'}-{'trainer' if trainer else 'storage'}-{i}"
            started = time.time()
            cmd = [sys.executable, "-m", "bench.started_trial", *(["trainer"] if trainer else [])]
            process = TrialProcess.start(cmd, env, workdir, None, launcher=launcher)
            process.popen.wait()
            stamp_s, cpu_s = map(float, (workdir / "stdout.log").read_text().split())
            wall.append(stamp_s - started)
            cpu.append(cpu_s)
    finally:
        if launcher is not None:
            launcher.close()
    return 1000 * statistics.median(wall), 1000 * statistics.median(cpu)


def stamp() -> float:
    return time.time()


def dask_ms(tasks: int) -> tuple[float, float]:
    from distributed import Client, LocalCluster

    from hpo.runners.dask import _send_promptly

    to_run, back = [], []
    with (
        LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        _send_promptly(client)  # as the runner does
        client.submit(stamp, pure=False).result()  # warm up: the function reaches the workers once
        for _ in range(tasks):
            done = threading.Event()
            submitted = time.time()
            future = client.submit(stamp, pure=False)
            future.add_done_callback(lambda _, done=done: done.set())
            done.wait(30)
            called_back = time.time()
            ran = future.result()
            to_run.append(ran - submitted)
            back.append(called_back - ran)
            del future
            time.sleep(0.05)
    return 1000 * statistics.median(to_run), 1000 * statistics.median(back)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30, help="processes per way of starting, and per import set")
    ap.add_argument("--tasks", type=int, default=100, help="Dask tasks")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for trainer in (False, True):
            what = "trainer and torch" if trainer else "storage"
            for preload in (False, True):
                wall, cpu = start_ms(preload, args.runs, Path(tmp), trainer)
                how = "forked by the preloaded launcher" if preload else "exec'd"
                print(f"start -> {what} imported, {how}: {wall:.1f} ms, {cpu:.1f} ms of CPU", flush=True)
    for name, imports in IMPORT_SETS.items():
        print(f"teardown after the last write, {name}: {teardown_ms(imports, args.runs):.2f} ms", flush=True)
    to_run, back = dask_ms(args.tasks)
    print(f"dask LocalCluster, idle: submit -> task runs {to_run:.2f} ms, task returns -> done-callback {back:.2f} ms")


if __name__ == "__main__":
    main()
