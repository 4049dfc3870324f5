"""How the API opens its storage (server.storage.StorageHolder), with the opening itself replaced: requests wait
together for one attempt, made in a thread (the event loop goes on meanwhile); an attempt that got no answer holds
every request until one made in the background answers; one refused holds nothing. A real server against a
database that never answers: tests/server/test_outage_unanswered.py."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable

import pytest

from hpo.errors import DatabaseUnavailableError
from server.storage import StorageHolder
from tests.polling import wait_for

URL = "postgresql+psycopg://hpo@127.0.0.1:5/hpo"
WAIT_S = 30  # a safety net: nothing here waits for long
TIMED_OUT = "cannot use the database: connection timeout expired."
REFUSED = "cannot use the database: connection refused."


class Attempts:
    """Stands in for `StorageHolder._open`: each attempt takes the next outcome the test puts (a storage, or the
    message of a DatabaseUnavailableError), waiting for it; `started` counts the attempts."""

    def __init__(self) -> None:
        self.outcomes: queue.Queue[object] = queue.Queue()
        self.started = 0

    def __call__(self) -> object:
        self.started += 1
        outcome = self.outcomes.get(timeout=WAIT_S)
        if isinstance(outcome, str):
            raise DatabaseUnavailableError(outcome)
        return outcome


@pytest.fixture
def holder(monkeypatch) -> tuple[StorageHolder, Attempts]:
    monkeypatch.setattr("server.storage.PROBE_INTERVAL_S", 0.01)
    made, attempts = StorageHolder(URL, timeout_s=2), Attempts()
    monkeypatch.setattr(made, "_open", attempts)
    yield made, attempts
    made.close()
    attempts.outcomes.put(TIMED_OUT)  # an attempt still waiting ends
    wait_for(lambda: not any(t.name == "hpo-storage-open" for t in threading.enumerate()), timeout_s=WAIT_S)


class Opened:
    """A storage as far as the holder sees it (a database server's: no file to be replaced)."""

    def replaced_file(self) -> None:
        return None

    def close(self) -> None:
        pass


def outcome(call: Callable[[], object]) -> object:
    try:
        return call()
    except DatabaseUnavailableError as exc:
        return str(exc)


def test_requests_on_the_event_loop_wait_together_for_one_attempt_and_one_that_gives_up_leaves_the_others(holder):
    holder, attempts = holder
    storage = Opened()

    async def requests() -> list[object]:
        waiting = [asyncio.create_task(holder.opened()) for _ in range(5)]
        while attempts.started == 0:  # the loop runs while the attempt waits
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        waiting[0].cancel()  # a client gone: its request is cancelled
        await asyncio.sleep(0.01)
        attempts.outcomes.put(storage)
        return await asyncio.gather(*waiting[1:])

    assert asyncio.run(requests()) == [storage] * 4
    assert attempts.started == 1
    assert holder.get() is storage


def test_an_attempt_without_answer_holds_requests_until_one_in_the_background_answers(holder):
    holder, attempts = holder
    storage = Opened()
    attempts.outcomes.put(TIMED_OUT)
    assert outcome(holder.get) == TIMED_OUT
    wait_for(lambda: attempts.started == 2, timeout_s=WAIT_S)  # the background's next attempt, waiting
    held = [outcome(holder.get) for _ in range(3)]
    assert all("has not answered since" in reason and "127.0.0.1:5" in reason for reason in held), held
    assert attempts.started == 2  # no request tried the database itself
    attempts.outcomes.put(TIMED_OUT)
    wait_for(lambda: attempts.started == 3, timeout_s=WAIT_S)
    assert "has not answered since" in outcome(holder.get)
    attempts.outcomes.put(storage)
    wait_for(lambda: outcome(holder.get) is storage, timeout_s=WAIT_S)
    assert attempts.started == 3


def test_a_refused_attempt_holds_nothing_and_the_next_request_tries_again(holder):
    holder, attempts = holder
    storage = Opened()
    attempts.outcomes.put(REFUSED)
    assert outcome(holder.get) == REFUSED
    attempts.outcomes.put(REFUSED)
    assert outcome(holder.get) == REFUSED
    attempts.outcomes.put(storage)
    assert holder.get() is storage
    assert attempts.started == 3


def test_closing_the_holder_ends_its_attempts_in_the_background(holder):
    holder, attempts = holder
    attempts.outcomes.put(TIMED_OUT)
    assert outcome(holder.get) == TIMED_OUT
    wait_for(lambda: attempts.started == 2, timeout_s=WAIT_S)
    holder.close()
    attempts.outcomes.put(TIMED_OUT)  # the attempt under way ends: no other starts
    wait_for(lambda: not any(t.name == "hpo-storage-open" for t in threading.enumerate()), timeout_s=WAIT_S)
    assert attempts.started == 2
    assert "stopping" in outcome(holder.get)
