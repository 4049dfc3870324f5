"""What every command shares: opening the database (read-only commands never create one), the argparse
types and options used by several commands, and the checks that name what is wrong."""

from __future__ import annotations

import argparse

from hpo.errors import HpoError

_OPENED: list = []  # the storages a command opened, closed by `close_storages` when it returns


def open_storage(url: str | None, *, read_only: bool = False):
    """The storage at `url` (default: HPO_DATABASE_URL or the embedded SQLite file). A new embedded database is
    created at the current schema, except for read-only commands, which never create a file or directory. It
    stays open until the command returns (`close_storages`)."""
    storage = _open_storage(url, read_only)
    _OPENED.append(storage)
    return storage


def close_storages() -> None:
    """Close what the command opened: SQLite's write-ahead log is folded into the file by the command that wrote
    it, when it returns, not later by whichever connection happens to close last (a reader, for one)."""
    while _OPENED:
        _OPENED.pop().close()


def _open_storage(url: str | None, read_only: bool):
    from hpo.storage import SqlStorage, default_database_url
    from hpo.storage.engine import sqlite_file

    url = url or default_database_url()
    path = sqlite_file(url)
    if path is not None and not path.exists():
        if read_only:
            raise HpoError(
                f"there is no database at {path}: no experiment has run with it; check --db / HPO_DATABASE_URL, "
                "or start one with `hpo run EXPERIMENT.yaml`"
            )
        return SqlStorage(url, upgrade=True)  # a new embedded database starts at the current schema
    return SqlStorage(url, read_only=read_only)


def safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def refuse_imported(record, action: str) -> None:
    from hpo.mlperf import imported

    if imported(record):
        raise HpoError(f"experiment {record.name} was imported (hpo import {imported(record).get('kind')}): there is "
                       f"nothing to {action}; its runs ran elsewhere")  # fmt: skip


def parse_state(name: str):
    from hpo.trials import TrialState

    try:
        return TrialState(name)
    except ValueError:
        raise HpoError(f"--state {name!r} is not a trial state; use one of {[s.value for s in TrialState]}") from None


def runner_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runner", choices=["local", "dask"], help="where trials run (default: the file's runner)")
    parser.add_argument("--scheduler", help="the Dask scheduler address for --runner dask, e.g. tcp://HOST:8786")


def whole_number(minimum: int, wanted: str):
    """An argparse type: a whole number of at least `minimum`, else a message that says `wanted`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value}")
        return value

    return parse


positive = whole_number(1, "a positive whole number")
non_negative = whole_number(0, "a whole number >= 0")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def fraction(text: str) -> float:
    """`0.05` or `5%`: a number from 0 to below 1."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.05 or 5%, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to below 1 (0.05 or 5%), got {text}")
    return value
