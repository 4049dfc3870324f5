"""The preloaded launcher forks a trial that behaves as the same command exec'd: arguments, environment,
process group, standard streams, limits, exit code (announced or not), exit handlers and threads; it is killed
as a process group, and dies with the launcher where asked. Commands of another shape are exec'd."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpo.runners.preload import PRELOAD, TRAINER_PRELOAD, ForkedProcess, Launcher, launcher_modules
from hpo.runners.process import TrialProcess, wait_any
from hpo.trial.launch import LaunchSpec, build_launch
from tests.processes import alive

# Prints what a trial could tell apart between being exec'd and forked, then ends as argv[1] says.
PROBE = """
import atexit, json, os, resource, sys, threading, time
mode = sys.argv[1]
print(json.dumps({
    "argv": sys.argv[1:], "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
    "var": os.environ.get("PROBE_VAR"), "own_group": os.getpgrp() == os.getpid(), "stdin": sys.stdin.read(),
    "limit": resource.getrlimit(resource.RLIMIT_AS)[0], "dirty": "_probe_dirty" in globals(),
}), flush=True)
print("to stderr", file=sys.stderr)
atexit.register(lambda: print("exit handler ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread finished"))).start()
_probe_dirty = True
if mode == "raise":
    raise RuntimeError("probe failed")
if mode == "announce":
    from hpo.trial.exit import exit_recorded
    exit_recorded(3)
if mode == "sleep":
    time.sleep(60)
if mode == "late":  # announce 3 once the file argv[2] exists
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
    from hpo.trial.exit import exit_recorded
    exit_recorded(3)
sys.exit(int(mode))
"""


@pytest.fixture(scope="module")
def probe_pkg(tmp_path_factory) -> Path:
    """The folder of the modules the tests run as trials (`python -m MODULE`), on the PYTHONPATH of `probe_env`."""
    pkg = tmp_path_factory.mktemp("pkg")
    (pkg / "preload_probe.py").write_text(PROBE)
    (pkg / "preloaded.py").write_text("import sys\nprint('sqlalchemy' in sys.modules)\n")
    (pkg / "threads_probe.py").write_text(THREADS_PROBE)
    return pkg


def environment(pkg: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(pkg), "PYTHONUNBUFFERED": "1", "PROBE_VAR": "x"}


@pytest.fixture
def probe_env(probe_pkg) -> dict[str, str]:
    return environment(probe_pkg)


@pytest.fixture(scope="module")
def launcher(probe_pkg):
    """One launcher for the tests that leave it running, whose trials are its children in turn, as an experiment's
    are; a test that kills it starts its own (`own_launcher`)."""
    launcher = Launcher(env=environment(probe_pkg))
    assert launcher.wait_ready(60)
    yield launcher
    launcher.close()


@pytest.fixture
def own_launcher(probe_env):
    launcher = Launcher(env=probe_env)
    assert launcher.wait_ready(60)
    yield launcher
    launcher.close()


def run(cmd, env, workdir: Path, launcher=None, memory_limit_mb=None) -> tuple[TrialProcess, int]:
    process = TrialProcess.start(cmd, env, workdir, None, memory_limit_mb, launcher=launcher)
    deadline = time.monotonic() + 60
    while (code := process.poll()) is None and time.monotonic() < deadline:
        wait_any([process], 0.5)
    return process, code


def outputs(workdir: Path) -> tuple[str, str]:
    return (workdir / "stdout.log").read_text(), (workdir / "stderr.log").read_text()


@pytest.mark.parametrize("mode", ["0", "5", "raise", "announce"])
def test_a_forked_trial_behaves_as_the_exec_d_one(tmp_path, probe_env, launcher, mode, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the runner's directory now, not the launcher's when it started
    cmd = [sys.executable, "-m", "preload_probe", mode]
    limit = 4096
    forked, forked_code = run(cmd, probe_env, tmp_path / "forked", launcher, limit)
    execd, execd_code = run(cmd, probe_env, tmp_path / "execd", None, limit)
    assert isinstance(forked.popen, ForkedProcess) and isinstance(execd.popen, subprocess.Popen)
    expected = {"0": 0, "5": 5, "raise": 1, "announce": 3}[mode]
    assert forked_code == execd_code == expected
    # The status the launcher reaped; the process is gone, so its output is complete.
    assert forked.popen.wait(30) == execd.popen.wait(30) == expected
    (forked_out, forked_err), (execd_out, execd_err) = outputs(tmp_path / "forked"), outputs(tmp_path / "execd")
    assert forked_out == execd_out
    first = json.loads(forked_out.splitlines()[0])
    assert first["argv"] == [mode] and first["name"] == "__main__" and first["var"] == "x"
    assert first["cwd"] == first["path0"] == str(tmp_path)
    assert first["own_group"] and first["stdin"] == "" and first["limit"] == limit << 20 and not first["dirty"]
    if mode == "announce":  # exit_recorded leaves at once, without exit handlers, forked or not
        assert "exit handler ran" not in forked_out
    else:
        assert forked_out.splitlines()[1:] == ["thread finished", "exit handler ran"]
    assert forked_err.splitlines()[0] == execd_err.splitlines()[0] == "to stderr"
    if mode == "raise":
        assert forked_err.splitlines()[-1] == execd_err.splitlines()[-1] == "RuntimeError: probe failed"


def test_the_launcher_preloads_the_trial_side(tmp_path, probe_env, launcher):
    """The fork starts with the storage imported: the trial's own imports of it cost nothing (`preloaded`, in
    `probe_pkg`, prints whether it finds SQLAlchemy imported)."""
    run([sys.executable, "-m", "preloaded"], probe_env, tmp_path / "forked", launcher)
    run([sys.executable, "-m", "preloaded"], probe_env, tmp_path / "execd", None)
    assert (tmp_path / "forked" / "stdout.log").read_text() == "True\n"
    assert (tmp_path / "execd" / "stdout.log").read_text() == "False\n"


def test_a_forked_trial_is_killed_as_a_process_group(tmp_path, probe_env, launcher):
    process = TrialProcess.start([sys.executable, "-m", "preload_probe", "sleep"], probe_env, tmp_path, None,
                                 launcher=launcher)  # fmt: skip
    assert isinstance(process.popen, ForkedProcess)
    assert os.getpgid(process.popen.pid) == process.popen.pid
    process.kill()
    assert process.popen.wait(30) == -signal.SIGKILL
    assert process.poll() == -signal.SIGKILL


@pytest.mark.parametrize("die_with_parent", [True, False])
def test_forked_trials_die_with_the_launcher_only_where_asked(tmp_path, probe_env, own_launcher, die_with_parent):
    process = TrialProcess.start([sys.executable, "-m", "preload_probe", "sleep"], probe_env, tmp_path, None,
                                 die_with_parent=die_with_parent, launcher=own_launcher)  # fmt: skip
    pid = process.popen.pid
    own_launcher.server.kill()  # SIGKILL: the launcher's process is lost, as with its Dask worker
    own_launcher.server.wait(30)
    deadline = time.monotonic() + 30
    while process.poll() is None and time.monotonic() < deadline:
        wait_any([process], 0.5)
        if not die_with_parent:
            break
    try:
        if die_with_parent:
            assert process.poll() == -signal.SIGKILL  # gone; its status went with the launcher
        else:
            assert process.poll() is None and os.getpgid(pid) == pid  # still running, in its own group
    finally:
        process.kill()


def test_a_trial_that_outlives_its_launcher_is_known_by_the_exit_code_it_announced(tmp_path, probe_env, own_launcher):
    """The launcher dies (SIGKILL); the trial it forked goes on, records its outcome and announces exit code 3: that
    is its code, not the SIGKILL the dead launcher can only assume for a process it no longer sees."""
    flag = tmp_path / "go"
    process = TrialProcess.start([sys.executable, "-m", "preload_probe", "late", str(flag)], probe_env, tmp_path,
                                 None, launcher=own_launcher)  # fmt: skip
    own_launcher.server.kill()
    own_launcher.server.wait(30)
    flag.touch()
    deadline = time.monotonic() + 30
    while (code := process.poll()) is None and time.monotonic() < deadline:
        wait_any([process], 0.2)
    deadline = time.monotonic() + 30
    while process_alive(process.popen.pid) and time.monotonic() < deadline:  # gone: the launcher would guess now
        time.sleep(0.05)
    assert code == 3 and process.poll() == 3


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_commands_of_another_shape_are_exec_d(tmp_path, probe_env, launcher):
    other_path = {**probe_env, "PYTHONPATH": str(tmp_path)}  # the interpreter would start differently
    buffered = {k: v for k, v in probe_env.items() if k != "PYTHONUNBUFFERED"}
    assert launcher.accepts([sys.executable, "-m", "preload_probe", "0"], probe_env)
    assert not launcher.accepts([sys.executable, "-m", "preload_probe", "0"], other_path)
    assert not launcher.accepts([sys.executable, "-m", "preload_probe", "0"], buffered)
    assert not launcher.accepts([sys.executable, "-c", "pass"], probe_env)
    assert not launcher.accepts(["/bin/sh", "-m", "x"], probe_env)
    for module in ("torch.distributed.run", "hpo.trial.torchrun"):  # the ranks check their parent's environment
        torchrun = [sys.executable, "-m", module, "--nproc_per_node=2", "-m", "hpo.trial.entry"]
        assert not launcher.accepts(torchrun, probe_env)  # as exec'd
    process, code = run([sys.executable, "-c", "print('hi')"], probe_env, tmp_path, launcher)
    assert isinstance(process.popen, subprocess.Popen) and code == 0


THREADS_PROBE = """
import sys
held = "torch" in sys.modules
import torch
print(held, torch.get_num_threads())
"""


def test_a_launcher_holding_torch_forks_cpu_trials_with_their_own_thread_count(tmp_path, probe_env, capfd):
    """TRAINER_PRELOAD (a CPU trial's launcher): the server loaded torch with 2 threads in its environment; a trial
    whose environment says 1 runs torch with 1 thread, forked as exec'd (torch read it as it loaded: the forked
    trial sets it). A trial given GPUs, one whose other torch variables differ, and one whose MKL thread count
    differs from its OMP one are exec'd. Closed, the launcher leaves quietly, as at an experiment's end (see
    test_a_launcher_holding_torch_leaves_quietly_at_an_experiments_end)."""
    server_env = {**probe_env, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    launcher = Launcher(TRAINER_PRELOAD, env=server_env)
    try:
        assert launcher.wait_ready(120)
        trial_env = {**server_env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        cmd = [sys.executable, "-m", "threads_probe"]
        forked, forked_code = run(cmd, trial_env, tmp_path / "forked", launcher)
        execd, execd_code = run(cmd, trial_env, tmp_path / "execd", None)
        assert isinstance(forked.popen, ForkedProcess) and forked_code == execd_code == 0
        assert outputs(tmp_path / "forked")[0] == "True 1\n"
        assert outputs(tmp_path / "execd")[0] == "False 1\n"
        assert launcher.accepts(cmd, {**trial_env, "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"})
        for refused in ({"CUDA_VISIBLE_DEVICES": "0"}, {"TORCH_LOGS": "recompiles"}, {"MKL_NUM_THREADS": "2"},
                        {"OMP_NUM_THREADS": "many"}):  # fmt: skip
            assert not launcher.accepts(cmd, {**trial_env, **refused}), refused
    finally:
        launcher.close()
    assert launcher.server.wait(120) == 0
    err = capfd.readouterr().err
    assert "leaked" not in err and "Traceback" not in err, err[-2000:]


def test_a_runner_preloads_the_trainer_only_for_the_trial_entry_on_the_cpu():
    """The runners' launchers (`start_launcher`): torch and the trainer for the trial entry's single-process CPU
    trials; without them for GPU trials (CUDA in the trial's own process) and for another module (a benchmark's
    dummy trial, which would wait for torch for nothing)."""
    cpu, _ = build_launch(LaunchSpec(("1", "0"), threads_per_process=1), {})
    gpu, _ = build_launch(LaunchSpec(("1", "0"), gpus=(0,)), {})
    dummy, _ = build_launch(LaunchSpec(("1", "0"), module="bench.dummy_trial"), {})
    assert launcher_modules(cpu, on_gpu=False) == TRAINER_PRELOAD
    assert launcher_modules(gpu, on_gpu=True) == launcher_modules(dummy, on_gpu=False) == PRELOAD
    assert "torch" not in PRELOAD


def test_a_launcher_closed_while_it_imports_torch_leaves_quietly(capfd, probe_env):
    """Ctrl-C as a CPU experiment starts: the runner leaves while its launcher still imports torch; the launcher
    then leaves without a word (it printed a BrokenPipeError traceback on the terminal and exited 1), at the next
    module it would import (the runner's close waits for it)."""
    launcher = Launcher(TRAINER_PRELOAD, env=probe_env)
    launcher.close()  # at once: its imports take seconds
    assert launcher.server.wait(120) == 0
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.slow  # by default the launcher holding torch of the thread-count test above leaves as quietly
def test_a_launcher_holding_torch_leaves_quietly_at_an_experiments_end(capfd, probe_env):
    """A CPU experiment's end: its launcher, which imported torch and with it Triton's bindings, left through the
    interpreter's finalization, where nanobind printed pages of "leaked instance/type/function" on the terminal."""
    launcher = Launcher(TRAINER_PRELOAD, env=probe_env)
    assert launcher.wait_ready(120)
    launcher.close()
    assert launcher.server.wait(120) == 0
    err = capfd.readouterr().err
    assert "leaked" not in err and "Traceback" not in err, err[-2000:]


# A runner's process (as a Dask worker is): starts a launcher and a sleeping trial that dies with its parent.
RUNNER = """
import os, sys
from pathlib import Path
from hpo.runners.preload import Launcher
from hpo.runners.process import TrialProcess
env = dict(os.environ)
launcher = Launcher(env=env)
assert launcher.wait_ready(60)
process = TrialProcess.start([sys.executable, "-m", "preload_probe", "sleep"], env, Path(sys.argv[1]), None,
                             die_with_parent=True, launcher=launcher)
print(type(process.popen).__name__, process.popen.pid, launcher.server.pid, flush=True)
sys.stdin.read()
"""


def test_a_runner_killed_takes_its_launcher_and_the_trials_that_die_with_it(tmp_path, probe_env):
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path)], env=probe_env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    trial = None
    try:
        kind, trial, server = runner.stdout.readline().split()
        assert kind == "ForkedProcess"
        runner.kill()  # SIGKILL: no clean-up runs in the runner
        runner.wait(30)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in (int(trial), int(server))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(int(server)) and not alive(int(trial))
    finally:
        runner.kill()
        if trial is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(trial), signal.SIGKILL)
