"""An NNI trial's recorded pid is its own process group, and ending a leftover trial never ends the NNI manager.

NNI's launcher makes the manager a process-group leader, and the manager runs each trial command through
`/bin/bash -c` with NNI_TRIAL_JOB_ID in its environment, so without `lead_process_group` a trial's process group
(what it records as its pid) is the manager's. Here a stand-in manager does exactly that (no NNI needed): it
starts two trials that lead their groups as `hpo.nni.trial` does, each with a child, one child without NNI's
variables (its process group finds it, and its parent). Then the engine's stop path (`interrupt_leftovers`) ends
them: a record with the trial's own group, and an old-style record naming the manager's group; the manager stays
alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpo.nni.jobs import interrupt_leftovers
from hpo.storage import SqlStorage
from hpo.trials import TrialSpec, TrialState
from tests.processes import alive, kill_all

ROOT = Path(__file__).resolve().parents[3]

TRIAL = """
import os, subprocess, sys, time
from hpo.nni.trial import lead_process_group
group = lead_process_group()
inherits = subprocess.Popen(["sleep", "300"])  # NNI_TRIAL_JOB_ID inherited
bare = subprocess.Popen(["sleep", "301"], env={"PATH": os.environ["PATH"]})  # found by its group, or its parent
out = os.path.join(sys.argv[1], os.environ["NNI_TRIAL_JOB_ID"])
with open(out + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {group} {inherits.pid} {bare.pid}")
os.replace(out + ".tmp", out)
time.sleep(300)
"""

MANAGER = """
import os, shlex, subprocess, sys, time
trial, out = sys.argv[1:]
for job in ("aaaaa", "bbbbb"):  # as NNI's trial keeper spawns a trial command: a shell, NNI's variables
    command = shlex.join([sys.executable, "-c", trial, out])
    subprocess.Popen(["/bin/bash", "-c", command], env={**os.environ, "NNI_TRIAL_JOB_ID": job})
time.sleep(300)
"""


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


@pytest.fixture
def manager(tmp_path):
    """A stand-in NNI manager (a process-group leader, as NNI's launcher starts it) running two trials; yields
    (manager pid, {job id: (trial pid, recorded group, child pid, bare child pid)})."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "trials"
    out.mkdir()
    process = subprocess.Popen([sys.executable, "-c", MANAGER, TRIAL, str(out)], env=env, process_group=0)
    trials: dict[str, tuple[int, ...]] = {}
    try:
        deadline = time.monotonic() + 60
        while len(trials) < 2 and time.monotonic() < deadline and process.poll() is None:
            trials = {f.name: tuple(int(n) for n in f.read_text().split()) for f in out.iterdir() if "." not in f.name}
            time.sleep(0.05)
        assert sorted(trials) == ["aaaaa", "bbbbb"], "the stand-in manager's trials did not start"
        yield process.pid, trials
    finally:
        for pid in (p for trial in trials.values() for p in trial):  # whatever the test left
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def test_a_trial_leads_its_own_group_and_a_stop_ends_it_but_never_the_manager(tmp_path, manager):
    manager_pid, trials = manager
    assert os.getpgid(manager_pid) == manager_pid  # NNI's manager leads the group its trials start in
    for pid, group, inherits, bare in trials.values():
        assert group == pid == os.getpgid(pid) != manager_pid  # the group a trial records is its own
        assert os.getpgid(inherits) == os.getpgid(bare) == pid

    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment("nniexp", {}, "maximize")
    host = socket.gethostname()
    records = {}
    for job, (_, group, _, _) in trials.items():
        records[job] = storage.create_trial(eid, TrialSpec(None, {"optimizer.lr": 1e-3}))
        # "aaaaa": a record from before trials led their own group: its pid is the manager's group
        pid = manager_pid if job == "aaaaa" else group
        storage.mark_trial_running(records[job], pid=pid, host=host, worker=f"nni:{job}")

    interrupt_leftovers(storage, eid, "interrupted: the NNI experiment was stopped on request")

    assert alive(manager_pid), "the NNI manager was ended"
    trial_b = list(trials["bbbbb"])
    assert wait_gone(trial_b) == []  # the trial, its child and the child only its group holds
    pid_a, _, inherits_a, bare_a = trials["aaaaa"]
    # the trial and its child by NNI's trial id in their environment, the child without it as the trial's child (the
    # manager's group is not killed)
    assert wait_gone([pid_a, inherits_a, bare_a]) == []
    for trial_id in records.values():
        record = storage.get_trial(trial_id)
        assert record.state is TrialState.INTERRUPTED and record.reason.startswith("interrupted: ")  # as locally


# A trial's launcher (as torchrun) whose children run in sessions of their own without NNI's variables (as a rank
# that has given up its environment): only their parent, seen before it is killed, makes them the trial's.
LAUNCHER = """
import os, subprocess, sys, time
bare = {"PATH": os.environ["PATH"]}
ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=bare, start_new_session=True)
         for _ in range(2)]
print(" ".join(str(rank.pid) for rank in ranks), flush=True)
time.sleep(600)
"""


def test_ending_a_trial_returns_once_every_process_it_found_is_gone_its_untagged_children_included():
    """A rank dying with its torchrun gives up its environment (NNI's trial id) and its parent before it has exited:
    looked for after the kill, it was not found, nor waited for, and the trial was recorded ended while a rank still
    ran. The look comes first: children whose environment lacks the id are the trial's by their parent, and when
    end_trial_processes returns none of them runs (no waiting here)."""
    from hpo.nni.manager import NNI_TRIAL_ENV, end_trial_processes

    env = {**os.environ, NNI_TRIAL_ENV: "ccccc"}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], env=env, stdout=subprocess.PIPE, text=True,
                                process_group=0)  # fmt: skip
    ranks = [int(pid) for pid in launcher.stdout.readline().split()]
    try:
        found = end_trial_processes("ccccc", launcher.pid)
        assert [pid for pid in ranks if alive(pid)] == []
        assert set(found) >= {launcher.pid, *ranks}
        assert launcher.wait(timeout=30) == -signal.SIGKILL
    finally:
        kill_all(launcher, ranks)
