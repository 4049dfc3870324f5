"""The API started while its PostgreSQL server cannot answer: the routes that need no database answer at once,
requests wait together for one connection attempt, and once it has timed out every request answers 503 at once, with
the reason, until the database answers (server.storage.StorageHolder); a database that is down (its port closed)
answers 503 at once, as before, and holds nothing.

The database that cannot answer is a listener of the test's own that accepts connections and never replies (a
server whose process is stopped or hung while its machine still answers on the network); a frozen cluster
(tests/pgcluster.py) shows the API coming back without a restart. The API runs on a real uvicorn server in the
test's process (tests/server/conftest.py's api_in_process, with HPO_API_DATABASE_TIMEOUT_S's setting): what is
under test is the app's StorageHolder, which `hpo serve` runs alike. Durations are asserted in deadlines, whole
seconds each, against what a request per connection attempt would take (ten times as long): no bound near what the
machine's load could add.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from hpo.cli.main import main as hpo_main
from hpo.trial.launch import free_port
from tests.pgcluster import PostgresCluster, why_no_cluster
from tests.polling import wait_for
from tests.server.conftest import api_in_process

DEADLINE_S = 2  # HPO_API_DATABASE_TIMEOUT_S: a connection attempt's timeout (its least)
REQUESTS = 10
TRIALS = "/experiments/api-demo/trials"


class Unanswering:
    """A TCP listener on a free port that accepts every connection and never sends a byte; counts the accepted."""

    def __init__(self) -> None:
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.first = threading.Event()  # a connection attempt is under way
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            self.accepted.append(connection)
            self.first.set()

    def close(self) -> None:
        self._socket.close()
        for connection in self.accepted:
            connection.close()


@pytest.fixture
def unanswering() -> Iterator[Unanswering]:
    listener = Unanswering()
    try:
        yield listener
    finally:
        listener.close()


def timed(api, path: str) -> tuple[float, object]:
    started = time.monotonic()
    response = api.get(path)
    return time.monotonic() - started, response


def test_a_database_that_accepts_and_never_answers_holds_no_request_and_costs_one_attempt(unanswering):
    url = f"postgresql+psycopg://hpo@127.0.0.1:{unanswering.port}/hpo"
    # nothing has tried the database yet: the server answered no request
    with api_in_process(url, api_database_timeout_s=DEADLINE_S) as api, ThreadPoolExecutor(REQUESTS) as pool:
        started = time.monotonic()
        first = [pool.submit(api.get, TRIALS) for _ in range(REQUESTS - 1)] + [pool.submit(api.get, "/health")]
        assert unanswering.first.wait(30), "no request tried the database"
        during = [api.get("/openapi.json"), api.get("/docs")]  # while the connection attempt waits
        pending = sum(not request.done() for request in first)
        first = [request.result() for request in first]
        first_s = time.monotonic() - started
        attempts = len(unanswering.accepted)
        started = time.monotonic()
        held = list(pool.map(lambda path: api.get(path), [TRIALS] * (REQUESTS - 1) + ["/health"]))
        held_s = time.monotonic() - started
    assert [r.status_code for r in during] == [200, 200]
    assert pending == REQUESTS, "a route that needs no database waited for the connection attempt"
    assert [r.status_code for r in first + held] == [503] * (2 * REQUESTS)
    assert all(r.headers.get("retry-after", "").isdigit() for r in first + held)
    assert all("timeout expired" in r.json()["detail"] for r in first), [r.json() for r in first]
    # one attempt for all (and perhaps the background's next one): not one attempt per request, one after the other
    assert attempts <= 2, attempts
    assert first_s < 3 * DEADLINE_S, f"{REQUESTS} requests took {first_s:.1f} s (one attempt is {DEADLINE_S} s)"
    # held: each answers at once, with the reason, instead of trying (and waiting) again
    assert held_s < DEADLINE_S, f"{REQUESTS} requests after a timed-out attempt took {held_s:.1f} s"
    for response in held:
        detail = response.json()["detail"]
        assert "has not answered since" in detail and f"127.0.0.1:{unanswering.port}" in detail, detail
    assert held[-1].json()["status"] == "unavailable" and held[-1].json()["detail"].startswith("the database is down:")


def test_a_database_that_is_down_answers_503_at_once_and_is_tried_again_by_each_request():
    url = f"postgresql+psycopg://hpo@127.0.0.1:{free_port()}/hpo"  # nothing listens: refused
    with api_in_process(url, api_database_timeout_s=DEADLINE_S) as api:
        answers = [timed(api, TRIALS) for _ in range(3)]
    assert [r.status_code for _, r in answers] == [503] * 3
    for seconds, response in answers:
        detail = response.json()["detail"]  # each the refusal of its own attempt: nothing held
        assert "refused" in detail.lower() and "has not answered since" not in detail, detail
        assert seconds < DEADLINE_S, seconds


@pytest.mark.postgres
def test_the_api_started_while_its_database_is_frozen_answers_once_it_runs_again():
    reason = why_no_cluster()
    if reason:
        pytest.skip(reason)
    with PostgresCluster.create() as cluster:
        assert hpo_main(["--db", cluster.url, "db", "upgrade"]) == 0  # in this process
        cluster.freeze()  # its port accepts connections; nothing answers
        with api_in_process(cluster.url, api_database_timeout_s=DEADLINE_S) as api:
            frozen = [api.get("/experiments") for _ in range(3)]  # the first waits out the attempt
            cluster.thaw()
            wait_for(lambda: api.get("/health").status_code == 200, timeout_s=30)
            after = api.get("/experiments")
    assert [r.status_code for r in frozen] == [503] * 3
    assert "has not answered since" in frozen[-1].json()["detail"]
    assert after.status_code == 200 and after.json()["items"] == []
