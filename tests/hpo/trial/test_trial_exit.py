"""A trial tells its runner its exit code on the exit pipe before the kernel has torn it down; a process that
only inherited the variable writes nothing; the runner's `TrialProcess` takes the announced code and still reaps
the process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from hpo.runners.process import TrialProcess, wait_any
from hpo.trial.exit import EXIT_PIPE_ENV

# Announces 3 and then stays alive until the file argv[1] exists (none given: ends at once), as a process the kernel
# is still tearing down would.
ANNOUNCE_AND_LINGER = """
import os, sys, time
from hpo.trial.exit import announce_exit
print(announce_exit(3), flush=True)
deadline = time.monotonic() + 60
while len(sys.argv) > 1 and not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def wait_for_text(path, timeout: float = 30.0) -> str:
    """The file's text once it holds a whole line (or whatever it holds at the deadline)."""
    deadline = time.monotonic() + timeout
    while not (text := path.read_text()).endswith("\n") and time.monotonic() < deadline:
        time.sleep(0.01)
    return text


def test_the_runner_takes_the_announced_exit_code_before_the_process_is_gone_and_reaps_it_later(tmp_path):
    go = tmp_path / "go"  # the stand-in lingers until this file exists: until the test has seen the code
    process = TrialProcess.start([sys.executable, "-c", ANNOUNCE_AND_LINGER, str(go)], dict(os.environ), tmp_path,
                                 None)  # fmt: skip
    deadline = time.monotonic() + 30
    while (code := process.poll()) is None and time.monotonic() < deadline:
        wait_any([process], 0.5)
    assert code == 3
    assert process.popen.returncode is None  # still lingering: the code came from the pipe
    # The child prints what announce returned after announcing, so the line may land just after the code did.
    assert wait_for_text(tmp_path / "stdout.log") == "True\n"
    assert process.poll() == 3  # asked again: the same answer, no second reaper
    go.touch()
    deadline = time.monotonic() + 30
    while process.popen.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the reaper thread collects the real exit status
    assert process.popen.returncode == 0  # what the lingering stand-in really returned: it was reaped


def test_a_process_that_only_inherited_the_variable_writes_nothing(tmp_path):
    read_end, write_end = os.pipe()
    try:
        inode = os.fstat(write_end).st_ino
        # The variable names descriptor 1 (here a file, not the pipe) with the pipe's inode: announce must refuse.
        env = {**os.environ, EXIT_PIPE_ENV: f"1:{inode}"}
        out = subprocess.run([sys.executable, "-c", ANNOUNCE_AND_LINGER], env=env, capture_output=True,
                             text=True, check=True)  # fmt: skip
        assert out.stdout == "False\n"
        os.set_blocking(read_end, False)
        os.close(write_end)
        write_end = None
        assert os.read(read_end, 16) == b""  # nothing was written to the pipe either
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)


def test_an_announcement_from_a_child_of_the_launched_process_is_ignored(tmp_path):
    """A wrapper script's child inherits the pipe: its code must not end the attempt while the wrapper runs on."""
    wrapper = ["/bin/sh", "-c", f'{sys.executable} -c "$0"; sleep 1; exit 7', ANNOUNCE_AND_LINGER]
    process = TrialProcess.start(wrapper, dict(os.environ), tmp_path, None)
    deadline = time.monotonic() + 30
    while (code := process.poll()) is None and time.monotonic() < deadline:
        wait_any([process], 0.5)
    assert (tmp_path / "stdout.log").read_text() == "True\n"  # the child did announce 3
    assert code == 7 and process.popen.returncode == 7  # the wrapper's own end counted


def test_a_process_that_ends_without_announcing_is_seen_by_its_end(tmp_path):
    process = TrialProcess.start([sys.executable, "-c", "raise SystemExit(5)"], dict(os.environ), tmp_path, None)
    deadline = time.monotonic() + 30
    while (code := process.poll()) is None and time.monotonic() < deadline:
        wait_any([process], 0.5)
    assert code == 5 and process.popen.returncode == 5
    assert process.exit_pipe is None and process.pidfd is None  # nothing left open
