"""On resume the controller ends the processes a dead controller's attempts left running: the process group each
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
