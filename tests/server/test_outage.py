"""The API while its PostgreSQL server is away: only 503s with a JSON reason and Retry-After, never a 500 or a hang;
the same answers as before once the database is back, without restarting the API.

A cluster of the test's own (tests/pgcluster.py) holds the tiny experiment of the API tests, written by `hpo run`;
`hpo serve` runs in a subprocess; the cluster is stopped with `pg_ctl stop -m immediate` and started again, or its
processes are stopped (SIGSTOP) and let run again, a server that stops answering without closing a connection. The
client gives up on a request after 30 s, so a request that hangs fails the test with httpx's timeout.
"""

from __future__ import annotations

import os

import pytest

from tests.pgcluster import PostgresCluster, why_no_cluster
from tests.polling import wait_for
from tests.server.conftest import EXPERIMENT, TOKEN, hpo, make_experiment_file, start_server, stop_server

READS = (
    "/health",
    "/experiments",
    f"/experiments/{EXPERIMENT}",
    f"/experiments/{EXPERIMENT}/trials",
    f"/experiments/{EXPERIMENT}/trials?after=0&limit=1",
    f"/experiments/{EXPERIMENT}/trials/0",
    f"/experiments/{EXPERIMENT}/trials/0/metrics",
    f"/experiments/{EXPERIMENT}/best",
    f"/experiments/{EXPERIMENT}/best/arms",
    "/best?global_batch_size=8&optimizer=lamb",
    f"/experiments/{EXPERIMENT}/export",
)
ROUNDS = 3  # every endpoint asked this many times while the database is away


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("away_as", ["stopped", "frozen"])
def test_the_api_answers_503_with_retry_after_while_postgres_is_away_and_200_after(tmp_path, away_as):
    """`stopped`: the server shut down (pg_ctl stop -m immediate, then start). `frozen`: its processes stopped
    (SIGSTOP, then SIGCONT), its port still open: nothing answers and no connection closes."""
    reason = why_no_cluster()
    if reason:
        pytest.skip(reason)
    with PostgresCluster.create() as cluster:
        url = cluster.url
        env = {**os.environ, "HPO_DATABASE_URL": url}
        for args in (["db", "upgrade"], ["run", str(make_experiment_file(tmp_path)), "--run-dir",
                                         str(tmp_path / "run"), "--quiet"]):  # fmt: skip
            result = hpo(*args, env=env)
            assert result.returncode == 0, result.stderr
        server = start_server(url, tmp_path, HPO_API_DATABASE_TIMEOUT_S="2")
        try:
            with server.client() as api:
                before = {path: api.get(path) for path in READS}
                assert {path: r.status_code for path, r in before.items()} == dict.fromkeys(READS, 200)
                cluster.stop() if away_as == "stopped" else cluster.freeze()
                away = [(path, api.get(path)) for _ in range(ROUNDS) for path in READS]
                away.append(("stop", api.post(f"/experiments/{EXPERIMENT}/stop",
                                              headers={"Authorization": f"Bearer {TOKEN}"})))  # fmt: skip
                cluster.start() if away_as == "stopped" else cluster.thaw()
                wait_for(lambda: api.get("/health").status_code == 200, timeout_s=60)
                after = {path: api.get(path) for path in READS}
        finally:
            stop_server(server)
    assert [(path, r.status_code) for path, r in away if r.status_code != 503] == []
    assert all(r.headers.get("retry-after", "").isdigit() for _, r in away)
    for path, response in away:
        detail = response.json()["detail"]
        assert "cannot use the database" in detail and "127.0.0.1" in detail, (path, detail)
    health = next(r for path, r in away if path == "/health")
    assert health.json()["status"] == "unavailable" and health.json()["detail"].startswith("the database is down:")
    assert {path: r.status_code for path, r in after.items()} == dict.fromkeys(READS, 200)
    assert {path: r.content for path, r in after.items()} == {path: r.content for path, r in before.items()}


def test_an_outage_is_told_to_an_api_client_without_the_command_lines_advice():
    """The storage's words for a PostgreSQL database closed to connections end with what a waiting command does and
    HPO_DATABASE_OUTAGE_S, which an API client cannot act on: the API says it answers again by itself (a 503 carries
    Retry-After meanwhile)."""
    from sqlalchemy.exc import OperationalError

    from hpo.storage.engine import storage_error
    from server.errors import unavailable_detail

    closed = OperationalError(
        "SELECT 1", {}, Exception('FATAL:  database "team" is not currently accepting connections')
    )
    error = storage_error(closed, "postgresql+psycopg://hpo@db/team")
    assert "HPO_DATABASE_OUTAGE_S" in str(error) and "the command that waits goes on" in str(error)
    detail = unavailable_detail(error)
    assert "HPO_DATABASE_OUTAGE_S" not in detail and "command" not in detail, detail
    assert detail.endswith("`ALTER DATABASE ... ALLOW_CONNECTIONS true` opens it again, and the API answers again by "
                           "itself.")  # fmt: skip
