"""`hpo serve`'s settings that change what it prints (the access log), and a port it cannot have."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import api_in_process, start_server, stop_server


# "1" is slow: it says what the default (None) says
@pytest.mark.parametrize("access_log", [None, pytest.param("1", marks=pytest.mark.slow), "0"])
def test_the_access_log_has_a_line_per_request_unless_turned_off(tmp_path: Path, access_log: str | None):
    settings = {} if access_log is None else {"HPO_API_ACCESS_LOG": access_log}
    server = start_server(f"sqlite:///{tmp_path / 'absent.db'}", tmp_path, **settings)
    try:
        for _ in range(3):
            httpx.get(f"{server.url}/experiments?limit=7", timeout=10)
    finally:
        stop_server(server)
    log = next(tmp_path.glob("server-*.log")).read_text()
    assert "serving the HPO API" in log
    logged = log.count("GET /api/v1/experiments?limit=7")
    assert logged == (0 if access_log == "0" else 3), log


def test_a_port_in_use_is_named_with_the_fix_and_exit_code_2(tmp_path: Path, monkeypatch, capsys):
    from hpo.cli.main import main

    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--port", str(port)])  # in this process: an exception would fail the test
    out, err = capsys.readouterr()
    assert code == 2, err  # hpo's exit code for bad input (hpo/cli/main.py)
    assert f"error: port {port} is in use on 127.0.0.1" in err and "--port" in err
    assert "Traceback" not in err and "serving" not in out


def test_a_database_url_no_request_could_use_is_refused_before_the_server_starts(tmp_path: Path, capsys):
    """It started, and answered every request with a 503 and Retry-After, as if the database were only away."""
    from hpo.cli.main import main

    (tmp_path / "notes.db").write_text("not a database\n")
    cases = {"notaurl": "the database URL 'notaurl' is a file's path, not a URL: for a SQLite file give sqlite:///",
             "mysql://user@host/db": "cannot use the database URL mysql://user@host/db: No module named",
             f"sqlite:///{tmp_path}": f"names {tmp_path}, a folder: name the SQLite file in it",
             f"sqlite:///{tmp_path / 'notes.db'}": "which is not a SQLite database"}  # fmt: skip
    with socket.socket() as taken:  # were the URL let by, the server would stop at once on this port, in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for url, says in cases.items():
            assert main(["--db", url, "serve", "--port", str(taken.getsockname()[1])]) == 2, url
            err = capsys.readouterr().err
            assert says in err and "is in use" not in err, (url, err)  # refused before the port is tried
    assert (tmp_path / "notes.db").read_text() == "not a database\n"


def test_an_empty_host_is_refused_not_bound_to_every_interface(tmp_path: Path, monkeypatch, capsys):
    """uvicorn binds '' to every interface (0.0.0.0), where the default is this machine only."""
    from hpo.cli.main import main

    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    with socket.socket() as taken:  # were the host let by, the server would stop at once on this port, in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for flag, variable in ((["--host", ""], None), ([], " ")):
            if variable is not None:
                monkeypatch.setenv("HPO_API_HOST", variable)
            assert main(["serve", *flag, "--port", port]) == 2
            err = capsys.readouterr().err
            name, fix = (
                ("HPO_API_HOST", "the environment variable") if variable is not None else ("--host", "the option")
            )
            assert f"({name}: an empty address binds every network interface: give 127.0.0.1" in err
            assert err.rstrip().endswith(f"; fix {fix}") and "is in use" not in err


def test_a_token_that_is_not_printable_ascii_is_refused_at_startup(tmp_path: Path, monkeypatch, capsys):
    """Starlette reads header bytes as Latin-1, so a client sending a non-ASCII token as UTF-8 got a 401 from a server
    that had started as if its token could be used."""
    from hpo.cli.main import main

    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'absent.db'}")
    with socket.socket() as taken:  # were the token let by, the server would stop at once on this port, in use
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for token in ("caf\u00e9-s3cret", "tab\tinside"):
            monkeypatch.setenv("HPO_API_TOKEN", token)
            assert main(["serve", "--port", str(taken.getsockname()[1])]) == 2, token
            out, err = capsys.readouterr()
            assert "HPO_API_TOKEN: the token has a character that is not printable ASCII (its character " in err
            assert "use ASCII letters, digits and punctuation only" in err and "is in use" not in err
            assert token not in err and token not in out and "serving" not in out


def test_a_sqlite_file_deleted_or_replaced_under_the_server_is_a_503_not_the_old_files_answers(
    finished_experiment, tmp_path: Path
):
    """`rm .hpo/hpo.db*` and a new experiment of the same name: the server went on serving the deleted file (its open
    connection's), with /health ok. Now every request that reads answers 503 saying so, until `hpo serve` restarts."""
    import shutil

    source = Path(finished_experiment("sqlite").removeprefix("sqlite:///"))
    db = tmp_path / "hpo.db"
    shutil.copy(source, db)
    with api_in_process(f"sqlite:///{db}") as api:  # the API in this process
        assert api.get("/experiments").status_code == 200
        assert api.get("/health").json()["status"] == "ok"
        replacement = tmp_path / "new.db"
        shutil.copy(source, replacement)
        replacement.replace(db)  # another file at the same path
        for path in ("/experiments", "/health"):
            answer = api.get(path)
            assert answer.status_code == 503, (path, answer.text)
            assert f"the SQLite database {db} was deleted or replaced after `hpo serve` opened it" in answer.text
    with api_in_process(f"sqlite:///{db}") as api:  # restarted: the file there now
        assert api.get("/experiments").status_code == 200
