"""What every command shares: opening the database (read-only commands never create one), the argparse
types and options used by several commands, and the checks that name what is wrong."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from hpo.errors import HpoError
from hpo.files import write_whole
from hpo.limits import MAX_COUNT

_OPENED: list = []  # the storages a command opened, closed by `close_storages` when it returns


def open_storage(url: str | None, *, read_only: bool = False, existing: bool = False):
    """The storage at `url` (default: HPO_DATABASE_URL or the embedded SQLite file). A new embedded database is
    created at the current schema, except for read-only commands, which never create a file or directory (and open
    a SQLite file read-only where a log is beside it: `hpo.storage.engine`), and for commands that write only to an
    `existing` database (`hpo resume`, `hpo webui`). It stays open until the command returns (`close_storages`)."""
    storage = _open_storage(url, read_only or existing, writes=not read_only)
    _OPENED.append(storage)
    return storage


def close_storages() -> None:
    """Close what the command opened: SQLite's write-ahead log is folded into the file by the command that wrote
    it, when it returns, not later by whichever connection happens to close last (a reader, for one)."""
    while _OPENED:
        _OPENED.pop().close()


def _open_storage(url: str | None, read_only: bool, writes: bool):
    from hpo.storage import SqlStorage, default_database_url
    from hpo.storage.engine import sqlite_file
    from hpo.storage.retry import outage_bound, writer_deadlines

    url = url or default_database_url()
    refuse_in_memory(url)
    # A command that writes waits for a database that is away from its first call on when HPO_DATABASE_OUTAGE_S
    # says so, and says that it waits (`hpo run` and `hpo resume` then take the experiment file's bound unless it is
    # set, and their progress line says it); one that only reads never waits. Its statements on a database server
    # have a deadline: a server that stops answering is an outage, not a wait without end.
    wait = outage_bound(0.0) if writes else 0.0
    told = {"on_wait": waiting_note()} if wait > 0 else {}
    path = sqlite_file(url)
    if path is not None and path.is_file() and path.stat().st_size == 0 and not read_only:
        return SqlStorage(url, upgrade=True, outage_s=wait)  # an empty file (`touch hpo.db`) is a new SQLite database
    if path is not None and not path.exists():
        if read_only:
            if blocker := next((p for p in path.parents if p.exists() and not p.is_dir()), None):
                raise HpoError(
                    f"there is no database at {path}, nor can there be: {blocker} is a file, not a folder; check "
                    "--db / HPO_DATABASE_URL (or HPO_HOME, the folder of the default database)"
                )
            raise HpoError(
                f"there is no database at {path}: no experiment has run with it; check --db / HPO_DATABASE_URL, "
                "or start one with `hpo run EXPERIMENT.yaml`"
            )
        return SqlStorage(url, upgrade=True, outage_s=wait)  # a new embedded database starts at the current schema
    # a command's reads, or its writes to an existing database
    deadlines = writer_deadlines() if writes and path is None else None
    return SqlStorage(url, read_only=read_only, one_shot=read_only, writes=writes, outage_s=wait, deadlines=deadlines,
                      **told)  # fmt: skip


def waiting_note():
    """What a command that waits for the database tells, once, on standard error: `waiting up to 600 s
    (HPO_DATABASE_OUTAGE_S) for the database: cannot use the database URL: ...` (the error's first sentence; the
    rest says what to do, for when it gives up). A call for `hpo.storage.retry.call_with_retry`'s `waiting`."""
    from hpo.storage.retry import OUTAGE_ENV

    told: list[bool] = []

    def tell(error: Exception, bound_s: float) -> None:
        if not told:
            what = str(error).split(". ")[0]
            print(f"waiting up to {bound_s:g} s ({OUTAGE_ENV}) for the database: {what}", file=sys.stderr, flush=True)
            told.append(True)

    return tell


def note_unread_namesake(experiment: str) -> None:
    """A bare NAME reads the shipped preset even where `NAME.yaml` is in the working folder: say which file is read
    and how to read the other."""
    from search_spaces import shipped_preset, unread_namesake

    namesake = unread_namesake(experiment)
    if namesake is not None:
        print(f"note: {experiment} is the shipped preset {shipped_preset(experiment)}; {namesake} in this folder is "
              f"not read (give ./{namesake} to read it)", file=sys.stderr)  # fmt: skip


def refuse_in_memory(url: str) -> None:
    """HpoError for an in-memory SQLite URL: a database gone when its process ends, which trials, the API and the
    next command would each see a new empty one of."""
    from hpo.storage.engine import in_memory_sqlite

    if in_memory_sqlite(url):
        raise HpoError(f"the database URL {url} is an in-memory SQLite database, which keeps nothing and which no "
                       "other process sees: give a file (sqlite:///path/to/hpo.db) or a PostgreSQL URL")  # fmt: skip


def safe_url(url: str) -> str:
    from hpo.storage.engine import safe_url as masked

    return masked(url)


def refuse_imported(record, action: str) -> None:
    from hpo.mlperf import imported

    if imported(record):
        kind = imported(record).get("kind")
        if record.status.value == "running" and action == "resume":  # an import cut short
            raise HpoError(f"experiment {record.name} is an import (hpo import {kind}) that stopped before it "
                           f"finished: run the same `hpo import {kind}` command again to finish it")  # fmt: skip
        raise HpoError(f"experiment {record.name} was imported (hpo import {kind}): there is "
                       f"nothing to {action}; its runs ran elsewhere")  # fmt: skip


def directory_blocker(path: Path) -> tuple[str, Path] | None:
    """Why `path` could not be made or written as a directory, checked without making anything: ("file", P) where
    P, the path or the nearest part of it that is there, is not a directory ("link" for a broken symbolic link),
    ("unwritable", P) where it cannot be written; None where it can be used."""
    probe = path
    while not (probe.exists() or probe.is_symlink()) and probe != probe.parent:
        probe = probe.parent  # the nearest part of the path that is there
    if probe.is_symlink() and not probe.exists():
        return "link", probe
    if not probe.is_dir():
        return "file", probe
    if not os.access(probe, os.W_OK | os.X_OK):
        return "unwritable", probe
    return None


def check_output_file(path: Path, option: str = "-o", printed: bool = False) -> None:
    """Refuse an output file that could not be written, before any work: a directory, or a file whose directory
    does not exist (or is a file) or is not writable, naming the path and the option. A link is judged by the file
    it names, where it is written (`write_whole`); a device or a pipe (/dev/null, /dev/stdout) is written in place.
    `-` is refused (it would be a file named `-`, not standard output; `printed`: the command prints its output
    when the option is left out, which the message says)."""
    if str(path) == "-":
        instead = f"leave {option} out to print to standard output" if printed else f"give {option} a file name"
        raise HpoError(f"{option} -: '-' would be a file named '-', not standard output; {instead}")
    if path.is_dir():
        raise HpoError(f"{option} {path}: is a directory; give {option} a file name (e.g. {path / 'out'})")
    if path.exists() and not path.is_file():
        return
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    named = f"{option} {path}" + (f" (a link to {target})" if target != path else "")
    parent = target.parent
    if not parent.exists():
        raise HpoError(f"{named}: the directory {parent} does not exist; make it first, or write elsewhere")
    if not parent.is_dir():
        raise HpoError(f"{named}: {parent} is not a directory; give {option} a path in a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise HpoError(f"{named}: the directory {parent} is not writable; write elsewhere")


def write_output_file(path: Path, text: str, option: str = "-o") -> None:
    """Write `text` to the output file, whole or not at all (`write_whole`); an error naming it if that fails (a full
    disk, a file it may not replace)."""
    try:
        write_whole(path, text)
    except OSError as exc:
        raise HpoError(f"{option} {path}: cannot write it: {exc.strerror or exc}") from None


def wrong_batch_size(storage, record, arm: str | None, batch_size: int | None, action: str) -> str | None:
    """Why --batch-size finds no best trial when completed trials (of `arm`) exist at other global batch sizes
    (`hpo.export.production.other_batch_sizes`, asked as the command line asks)."""
    from hpo.export.production import other_batch_sizes

    return other_batch_sizes(storage, record, arm, batch_size, action, "use --batch-size ")


def check_stored_arm(record, arm: str | None) -> None:
    """Refuse an --arm the experiment does not have, naming the arms it has (as `hpo export` does); an experiment
    whose stored definition no longer validates is not checked."""
    if arm is None:
        return
    from hpo.experiment import spec_from_stored
    from hpo.export.production import check_arm

    try:
        spec = spec_from_stored(record)
    except HpoError:
        return
    check_arm(spec, arm)


def parse_state(name: str):
    from hpo.trials import TrialState

    try:
        return TrialState(name)
    except ValueError:
        raise HpoError(f"--state {name!r} is not a trial state; use one of {[s.value for s in TrialState]}") from None


def runner_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runner", choices=["local", "dask"], help="where trials run (default: the file's runner)")
    parser.add_argument("--scheduler", help="the Dask scheduler address for --runner dask, e.g. tcp://HOST:8786")


def whole_number(minimum: int, wanted: str, maximum: int | None = None):
    """An argparse type: a whole number of at least `minimum` (and at most `maximum`), else a message that says
    `wanted`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value}")
        return value

    return parse


def given(what: str, default: bool = True):
    """An argparse type: a non-empty string (`what` names it in the message). An empty one (`--db ""`, a variable
    that expanded to nothing) is refused, not taken for the option left out (`default`: the option has a default,
    which the message points to)."""

    def parse(text: str) -> str:
        if not text.strip():
            hint = " (leave the option out for its default)" if default else ""
            raise argparse.ArgumentTypeError(f"expected {what}, got an empty string{hint}")
        return text

    return parse


positive = whole_number(1, f"a whole number from 1 to {MAX_COUNT:,}", maximum=MAX_COUNT)
non_negative = whole_number(0, f"a whole number from 0 to {MAX_COUNT:,}", maximum=MAX_COUNT)
tcp_port = whole_number(1, "a TCP port (1 to 65535)", maximum=65535)


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
