"""`hpo serve` (the REST API) and `hpo webui` (an NNI experiment's web UI). The only module of `hpo` that imports
the server: the command line is the top of everything."""

from __future__ import annotations

import argparse

from hpo.cli.common import open_storage, refuse_in_memory, safe_url, tcp_port
from hpo.errors import HpoError


def cmd_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from server.app import serve
    from server.settings import Settings

    overrides = {"database_url": args.db, "api_host": args.host, "api_port": args.port}
    flags = {"database_url": "--db", "api_host": "--host", "api_port": "--port"}
    given = {key: value for key, value in overrides.items() if value is not None}
    try:
        settings = Settings(**given)
    except ValidationError as e:
        # each bad setting named where it came from: the command line's option, else its environment variable
        said, fixes = [], set()
        for err in e.errors():
            key = str(err["loc"][0])
            name = flags[key] if key in given else f"HPO_{key.upper()}"
            said.append(f"{name}: {err['msg'].removeprefix('Value error, ')}")
            fixes.add("the option" if key in given else "the environment variable")
        where, fix = "; ".join(said), " and ".join(sorted(fixes))
        raise HpoError(f"bad server settings ({where}); fix {fix}") from None
    refuse_in_memory(settings.database_url)
    check_database_url(settings.database_url)
    serve(settings)
    return 0


def check_database_url(url: str) -> None:
    """Refuse, before the server starts, a database URL no request could use: one that does not parse or names no
    driver there is, a folder, a file that is not SQLite. A database that is away, or a SQLite file not made yet (an
    API started before the first experiment), is not refused: requests answer 503 until it is there."""
    import sys

    from hpo.errors import BadDatabaseError
    from hpo.storage.engine import SQLITE_MAGIC, create_storage_engine, sqlite_file

    create_storage_engine(url, read_only=True).dispose()  # parses the URL and loads its driver; connects to nothing
    path, shown = sqlite_file(url), safe_url(url)
    if path is None:
        return
    if path.is_dir():
        raise BadDatabaseError(f"the database URL {shown} names {path}, a folder: name the SQLite file in it (hpo.db)")
    if not path.exists():
        print(f"note: there is no database at {path} yet; requests answer 503 until an experiment (or `hpo db "
              "upgrade`) makes it", file=sys.stderr)  # fmt: skip
        return
    try:
        with path.open("rb") as file:
            header = file.read(16)
    except OSError as e:
        raise BadDatabaseError(f"the database URL {shown} names {path}, which cannot be read ({e.strerror})") from None
    if header and header != SQLITE_MAGIC:
        raise BadDatabaseError(f"the database URL {shown} names {path}, which is not a SQLite database: check --db "
                               "(or HPO_DATABASE_URL)")  # fmt: skip


def cmd_webui(args: argparse.Namespace) -> int:
    from hpo.nni.engine import webui

    storage = open_storage(args.db, existing=True)  # no new database; the web UI's address is stored
    return webui(storage.get_experiment_by_name(args.name), stop=args.stop, port=args.port, storage=storage)


def add_serve(sub) -> None:
    """`hpo serve`."""
    serve = sub.add_parser("serve", help="the REST API (FastAPI under uvicorn) over the database")
    serve.add_argument("--host", help="address to bind (default HPO_API_HOST, else 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=tcp_port,
                       help="port to listen on (default HPO_API_PORT, else 8000; busy: exit 2)")  # fmt: skip
    serve.set_defaults(fn=cmd_serve)


def add_webui(sub) -> None:
    """`hpo webui`."""
    webui = sub.add_parser("webui", help="reopen an engine: nni experiment's NNI web UI (view mode), or close it")
    webui.add_argument("name", help="the experiment's name")
    webui.add_argument("--stop", action="store_true", help="close the NNI web UI (stop its NNI managers)")
    webui.add_argument("--port", type=tcp_port, default=8080, help="first port tried for the web UI (default 8080)")
    webui.set_defaults(fn=cmd_webui)
