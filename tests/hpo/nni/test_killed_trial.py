"""An NNI trial whose process a signal ended (SIGKILL from the out-of-memory killer or `kill -9`) after it recorded
itself: NNI 3.0 keeps no signal, only an exit code of null, which it reports as USER_CANCELED (what a cancel in its
web UI also gives). The recorded reason says so rather than blaming a user who cancelled nothing."""

from __future__ import annotations

from hpo.nni.jobs import _ending
from hpo.trials import TrialState
from tests.hpo.nni.conftest import make_nni_spec


def test_a_trial_nni_reports_user_canceled_is_recorded_as_killed_by_a_signal(tmp_path):
    spec = make_nni_spec(tmp_path, "nni_random", trials=2, parallel=1)
    killed = {"status": "USER_CANCELED", "trialJobId": "ZEoBw", "startTime": 1_000, "endTime": 13_000}
    assert _ending(spec, killed, True) == (
        TrialState.FAILED,
        "NNI trial ZEoBw ended (USER_CANCELED) without a final result: its process was killed by a signal (the "
        "out-of-memory killer, `kill`) or the trial was cancelled in NNI's web UI",
    )
    assert "before it asked for its parameters" in _ending(spec, killed, False)[1]
