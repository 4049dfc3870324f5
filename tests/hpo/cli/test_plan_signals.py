"""How `hpo plan` stops once on Ctrl-C or SIGTERM (`hpo.cli.plan._stop_once`), seen from a worker process forked
from the plan that has not set its own signal handlers yet, before or after the plan's handler ran (a SIGTERM to
the plan's process group, `timeout`'s, reaches it there): the SIGTERM must end it as SIGTERM's default action ends a
process, without a traceback, and not be ignored. (multiprocessing's pool, which the plan once used, forked such
workers in place of those the signal ended, while the plan unwound; the plan's own workers, forked once and ended
with SIGKILL, are tested in tests/hpo/plan/test_plan.py.)"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import pytest

from hpo.cli.plan import Terminated, _stop_once


def _ready_then_sleep(ready) -> None:
    ready.send(True)
    time.sleep(60)


def started_and_terminated() -> int:
    """A worker forked now and running (it said so: a signal that comes before a fork has returned is lost to
    Python, so the test waits for that), with no handlers of its own, ended with SIGTERM: its exit code (0 when it
    ignored the signal, after 20 s)."""
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    worker = context.Process(target=_ready_then_sleep, args=(writer,))
    worker.start()
    assert reader.poll(30) and reader.recv()
    worker.terminate()
    worker.join(timeout=20)
    if worker.is_alive():
        worker.kill()
        worker.join()
        return 0
    return worker.exitcode


@pytest.fixture(autouse=True)
def as_from_a_terminal():
    """Ctrl-C raising KeyboardInterrupt, as in a terminal (a test worker may have started with it ignored, which
    the plan leaves as it was), and SIGTERM's default action: what the plan's handlers take over."""
    handlers = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    yield
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def test_a_worker_forked_before_the_plans_stop_dies_of_sigterm_without_a_traceback(capfd):
    with _stop_once():
        code = started_and_terminated()
    assert code == -signal.SIGTERM, f"exit code {code}"
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["after-ctrl-c", "after-sigterm"])
def test_a_worker_forked_after_the_plans_stop_dies_of_sigterm_and_the_plan_still_ignores_a_second_signal(sig, capfd):
    stopped = KeyboardInterrupt if sig == signal.SIGINT else Terminated
    with pytest.raises(stopped), _stop_once():
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises within it
        except stopped:
            code = started_and_terminated()
            os.kill(os.getpid(), signal.SIGTERM)  # `timeout`'s second signal, to the process group: ignored here
            os.kill(os.getpid(), signal.SIGINT)  # a key pressed twice
            time.sleep(0.2)
            raise
    assert code == -signal.SIGTERM, f"exit code {code} (0: it ignored SIGTERM)"
    assert "Traceback" not in capfd.readouterr().err
