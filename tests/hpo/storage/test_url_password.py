"""A database URL whose password holds an '@' not written %40, with a '/', '?' or '#' after it (docker-compose.yml
builds HPO_DATABASE_URL from POSTGRES_PASSWORD as it is): SQLAlchemy ends the password at its first '@' and reads
the rest as host and database (`hpo:p@ss/w#rd@postgres:5432/hpo`: the host `ss`). `safe_url` masks all of the
password, and the URL is refused before any connection with a message that says to percent-encode it; a password
percent-encoded, or with those characters but no '@', is read and shown as before.
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from hpo.cli.main import main
from hpo.storage.engine import parse_url, safe_url

# (URL, the parts of its password that must never be shown, what safe_url shows)
MISREAD = [
    ("postgresql+psycopg://hpo:p@ss/w#rd@postgres:5432/hpo", ["p@ss", "ss/w", "w#rd", "w%23rd", "%40postgres"],
     "postgresql+psycopg://hpo:***@postgres:5432/hpo"),
    ("postgresql+psycopg://hpo:p@ss#w@rd@postgres:5432/hpo", ["ss#w", "ss%23w", "rd@", "rd%40"],
     "postgresql+psycopg://hpo:***@postgres:5432/hpo"),
    ("postgresql+psycopg://hpo:p@ss?w@rd@postgres:5432/hpo", ["ss?w", "ss%3Fw", "w@rd", "w%40rd"],
     "postgresql+psycopg://hpo:***@postgres:5432/hpo"),
    ("postgresql+psycopg://hpo:p@ss/w@rd@postgres/hpo", ["ss/w", "w@rd", "w%40rd", "rd@"],
     "postgresql+psycopg://hpo:***@postgres/hpo"),
    ("postgresql+psycopg://hpo:p@ss?w@rd@postgres", ["ss?w", "w@rd", "w%40rd", "rd@"],
     "postgresql+psycopg://hpo:***@postgres"),
    ("postgresql+psycopg://hpo:x@y@z/q?r#s@t@postgres:5432/hpo", ["x@y", "y@z", "z/q", "q?r", "r#s", "s@t", "t@"],
     "postgresql+psycopg://hpo:***@postgres:5432/hpo"),
    ("postgresql+psycopg://hpo:s3c@12:34/pw@127.0.0.1:5432/hpo", ["s3c", "12:34", "34/pw", "pw@"],
     "postgresql+psycopg://hpo:***@127.0.0.1:5432/hpo"),
    ("postgresql+psycopg://hpo:s3c@ret/pw@[::1]:5432/hpo", ["s3c", "ret", "pw@", "pw%40"],
     "postgresql+psycopg://hpo:***@[::1]:5432/hpo"),
    # `?password=` with an '@' in it: SQLAlchemy took what followed for the host
    ("postgresql+psycopg://hpo@postgres:5432/hpo?password=s3c@ret", ["s3c", "ret"],
     "postgresql+psycopg://hpo@postgres:5432/hpo?password=***"),
]  # fmt: skip
ENCODED = [
    "postgresql+psycopg://hpo:p%40ss%2Fw%23rd@postgres:5432/hpo",
    "postgresql+psycopg://hpo:p%40ss%3Fw%40rd@postgres/hpo",
    "postgresql+psycopg://hpo:pass/word@postgres:5432/hpo",  # no '@': SQLAlchemy reads these passwords whole
    "postgresql+psycopg://hpo:pa#ss@postgres:5432/hpo",
    "postgresql+psycopg://hpo:pa?ss@postgres:5432/hpo",
    "postgresql+psycopg://hpo:secret@[::1]:5432/hpo?sslmode=require",
    "postgresql+psycopg://hpo:secret@postgres:5432/hpo?sslrootcert=/etc/certs/ca@corp.crt",
    "postgresql+psycopg://hpo@postgres:5432/hpo?password=s3c%40ret",
    "postgresql+psycopg://hpo@postgres/a@b",  # no password: a database named a@b
    "sqlite:////tmp/a@b:c/hpo.db",
]


@pytest.mark.parametrize("url, secrets, shown", MISREAD)
def test_safe_url_masks_all_of_a_password_with_an_at_sign_not_percent_encoded(url, secrets, shown):
    assert safe_url(url) == shown
    assert not any(secret in safe_url(url) for secret in secrets)


@pytest.mark.parametrize("url, secrets, shown", MISREAD)
def test_such_a_url_is_refused_saying_to_percent_encode_the_password(url, secrets, shown):
    with pytest.raises(ArgumentError, match=r"its password holds an '@' not written %40.*Percent-encode") as raised:
        parse_url(url)
    assert "?password=" in str(raised.value)
    assert not any(secret in str(raised.value) for secret in secrets)


@pytest.mark.parametrize("url", ENCODED)
def test_a_url_read_as_written_is_shown_and_parsed_as_before(url):
    assert parse_url(url) == make_url(url)
    shown = make_url(url).render_as_string(hide_password=True).replace("s3c%40ret", "***")
    assert safe_url(url) == shown


@pytest.mark.parametrize("url, secrets, shown", MISREAD)
def test_hpo_status_names_the_url_without_any_part_of_its_password(tmp_path, capsys, monkeypatch, url, secrets, shown):
    """The tester's case printed `postgresql+psycopg://hpo:***@ss/w%23rd%40postgres%3A5432/hpo: failed to resolve
    host 'ss'` and exited 1."""
    monkeypatch.chdir(tmp_path)
    assert main(["--db", url, "status"]) == 2
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert f"error: cannot use the database URL {shown}: its password holds an '@' not written %40" in err, err
    assert "Percent-encode the password" in err and "resolve" not in err and "Traceback" not in err
    assert not any(secret in err for secret in secrets), err
    assert list(tmp_path.iterdir()) == []
