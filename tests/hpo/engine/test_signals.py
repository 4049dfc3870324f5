"""hpo.engine.local.stop_on_signals: the signals that stop a controller at its loop's next turn, sent for real to
this process: Ctrl-C, SIGTERM and a closed terminal (SIGHUP); one ignored when it started (nohup) stays ignored.

A signal ignored when the tests started stays ignored by design, so each test first gives the process what a command
started from a terminal has (`from_a_terminal`): the suite run under `nohup` (SIGHUP ignored) or as a background job
of a script (SIGINT ignored) would otherwise test that case instead. The tests wait for a handler's effect rather
than take it for granted at the next bytecode."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest

from hpo.engine.local import STOP_REASONS, stop_on_signals
from tests.polling import wait_for

TERMINAL = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL}


@pytest.fixture(autouse=True)
def from_a_terminal():
    """The dispositions of a process started from a terminal, put back as they were after the test."""
    before = {sig: signal.signal(sig, handler) for sig, handler in TERMINAL.items()}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_each_stop_signal_asks_the_study_to_stop_with_its_reason(sig):
    study = SimpleNamespace(stop_reason=None)
    before = signal.getsignal(sig)
    with stop_on_signals(study):
        os.kill(os.getpid(), sig)
        wait_for(lambda: study.stop_reason, timeout_s=30)
        assert study.stop_reason == STOP_REASONS[sig]
    assert signal.getsignal(sig) is before  # put back
    assert "SIGHUP" in STOP_REASONS[signal.SIGHUP] and "hpo resume" in STOP_REASONS[signal.SIGHUP]


def test_a_hangup_ignored_when_the_controller_started_stays_ignored():
    """`nohup hpo run ... &`: the terminal may close; the experiment goes on."""
    study = SimpleNamespace(stop_reason=None)
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stop_on_signals(study):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.5)  # time for a handler, were there one, to run
        assert study.stop_reason is None
    finally:
        signal.signal(signal.SIGHUP, before)


def test_the_nni_engine_stops_on_a_hangup_as_on_sigterm_naming_it():
    from hpo.nni.engine import Terminated, sigterm_stops

    with pytest.raises(Terminated) as stopped, sigterm_stops():
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(30)  # the handler raises within it
    assert stopped.value.args == ("SIGHUP",)
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # under nohup: it goes on
    try:
        with sigterm_stops():
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.5)  # time for a handler, were there one, to run
    finally:
        signal.signal(signal.SIGHUP, before)
