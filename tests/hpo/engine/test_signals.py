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


# `hpo` with a Ctrl-C delivered as scipy's Sobol engine loads its direction numbers (SMAC3 building its initial design
# while the tuners load), as a terminal-started process has it (SIGINT not ignored); numpy's loader is where the
# signal is sent from, nothing of hpo's is replaced. In a process of its own: scipy loads the numbers once a process.
CTRL_C_IN_SOBOL = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
import numpy.lib._npyio_impl as npio
load = npio.zipfile_factory
def sent_at_sobol(file, *args, **kwargs):
    if "sobol" in str(getattr(file, "name", file)) and not os.environ.get("SENT"):
        os.environ["SENT"] = "1"
        print("ctrl-c sent", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGINT)
    return load(file, *args, **kwargs)
npio.zipfile_factory = sent_at_sobol
from hpo.cli import entry
sys.argv[0] = "hpo"
entry()
"""


def test_ctrl_c_that_compiled_code_swallows_while_the_tuners_load_still_stops_the_run(tmp_path):
    """scipy's Sobol set-up prints the KeyboardInterrupt as "Exception ignored" and goes on, half made: the run went
    on as if no Ctrl-C had come, finished with exit code 0, and proposed other trials than the same seed does."""
    import subprocess
    import sys

    from hpo.storage import SqlStorage

    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    env = {**os.environ, "PYTHONHASHSEED": "0", "HPO_HOME": str(tmp_path / ".hpo")}  # no restart: the hook stays
    done = subprocess.run([sys.executable, "-c", CTRL_C_IN_SOBOL, "--db", db, "run", "adam_vs_lamb_simulated",
                           "--run-dir", str(tmp_path / "run")], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert "ctrl-c sent" in done.stderr, done.stderr[-3000:]  # SMAC3 built a Sobol design as the tuners loaded
    assert done.returncode == 1, done.stderr[-3000:]
    assert "stopped (Ctrl-C) while it loaded its tuners; `hpo resume adam_vs_lamb_simulated` runs" in done.stderr
    storage = SqlStorage(db)
    (experiment,) = storage.list_experiments()
    assert experiment.status.value == "stopped" and storage.count_trials(experiment.id) == 0
    storage.close()
