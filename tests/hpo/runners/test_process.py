"""hpo/runners/process.py: what a resume ends and what a failed attempt is said to have printed.

On resume the controller ends the processes a dead controller's attempts left running: the process group each
recorded when it claimed its trial. A pid is reused once its process has gone (after a reboot, within minutes): a
process that started after the claim holds it then, and is another program's, never killed for the trial's."""

from __future__ import annotations

import subprocess
import time
from datetime import datetime, timedelta, timezone

from hpo.runners.process import end_trial, leftover_group


def sleeper() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "60"], start_new_session=True)  # a group of its own, as a trial's


def test_a_process_that_started_after_the_claim_is_not_the_attempts_and_lives():
    claimed = datetime.now(timezone.utc) - timedelta(minutes=5)  # the attempt claimed its trial 5 minutes ago
    stranger = sleeper()
    try:
        assert leftover_group(stranger.pid, claimed) is None
        end_trial("no-process-has-this-tag", leftover_group(stranger.pid, claimed))  # as kill_leftover does
        time.sleep(0.2)
        assert stranger.poll() is None  # still running
    finally:
        stranger.kill()
        stranger.wait()


def test_the_attempts_own_group_is_ended():
    leftover = sleeper()
    time.sleep(0.05)
    claimed = datetime.now(timezone.utc)  # it claimed its trial after it started
    try:
        assert leftover_group(leftover.pid, claimed) == leftover.pid
        end_trial("no-process-has-this-tag", leftover_group(leftover.pid, claimed))
        assert leftover.wait(timeout=10) == -9
    finally:
        leftover.kill()


def test_a_gone_leader_or_an_unknown_claim_still_ends_the_group():
    assert leftover_group(None, datetime.now(timezone.utc)) is None
    done = sleeper()
    done.kill()
    done.wait()
    assert leftover_group(done.pid, datetime.now(timezone.utc) - timedelta(days=1)) == done.pid  # its survivors
    assert leftover_group(12345, None) == 12345


def test_an_attempts_stderr_tail_holds_its_own_lines_only(tmp_path):
    """stderr.log is appended to by every attempt of a trial: the reason given for an attempt that failed quotes its
    own lines, never an earlier attempt's (an out-of-memory message there would misname the cause)."""
    from hpo.runners.process import TrialProcess

    first = TrialProcess.start(["sh", "-c", "echo 'CUDA out of memory' >&2; exit 1"], {}, tmp_path, None)
    assert first.popen.wait() == 1 and "out of memory" in first.stderr_tail()
    second = TrialProcess.start(["sh", "-c", "echo 'a rank failed' >&2; exit 1"], {}, tmp_path, None)
    assert second.popen.wait() == 1
    assert second.stderr_tail().strip() == "a rank failed"
    assert "out of memory" in (tmp_path / "stderr.log").read_text()  # the file keeps both
