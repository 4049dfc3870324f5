"""`hpo`: run, resume and inspect experiments. The parser and the entry point; each command lives in the module of
its group (run, plan, inspection, export, report, serve, imports) with its own parser.

    hpo db upgrade                      create or migrate the database (HPO_DATABASE_URL, else ./.hpo/hpo.db)
    hpo presets                         the experiment files that ship with hpo (a name stands for its file)
    hpo run EXPERIMENT.yaml             run an experiment (the local engine) with a live progress display
    hpo resume NAME                     finish an experiment whose controller died or was stopped
    hpo plan EXPERIMENT.yaml [--slots N] [--gpus-per-slot G] [--repetitions R] [--seed S]
             [--gpu a100|h100 | --samples-per-s X]
             [--cv C --difference D | --like PILOT] [--power P] [--draws N] [--verdict-only]
                                        forecast GPU-hours, wall-clock and the chance of an answer: R simulated runs,
                                        each in a temporary database (the database is never written); with a spread,
                                        the verdict's chances over drawn confirmation runs and, with --power, the
                                        fewest confirmation runs per arm that reach that chance
    hpo status [NAME]                   experiments, or one experiment's trial counts and why trials wait
    hpo trials NAME [--state S] [--arm A] [--after N] [--limit L]
    hpo best NAME [--per-arm] [--arm A] [--batch-size N]
    hpo export NAME --format yaml|json|torchrun [--arm A] [--batch-size N] [--nodes N --gpus-per-node G] [-o FILE]
    hpo report NAME [NAME ...] [-o DIR] [--png DIR]  HTML report(s): verdict, curves, noise scale, importance
    hpo serve [--host 127.0.0.1] [--port 8000]   the REST API (HPO_API_HOST, HPO_API_PORT, HPO_API_TOKEN);
                                        a port in use exits 2 ("port N is in use")
    hpo webui NAME [--stop]             reopen an engine: nni experiment's NNI web UI, or close it
    hpo import mlperf PATH... --name NAME [--compare optimizer,global_batch_size] [--optimizer O] [--target ACC]
                                        MLPerf result files (result_*.txt) as an imported experiment, one trial per run
    hpo import rcp FILE [--name NAME]   mlperf-logging's RCP file (rcps_bert.json) as reference arms by batch size
    hpo delete NAME [--yes]             remove an experiment with its trials and curves (asks first; files stay)

Exit codes: 0 success, 1 the experiment ended badly, 2 bad input (file, name, arguments; nothing written).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys

from hpo.cli.common import close_storages, given
from hpo.cli.delete import add_delete
from hpo.cli.export import add_export
from hpo.cli.imports import add_import
from hpo.cli.inspection import add_best, add_status, add_trials
from hpo.cli.plan import add_plan, add_table
from hpo.cli.report import add_report
from hpo.cli.run import add_db, add_presets, add_resume, add_run
from hpo.cli.serve import add_serve, add_webui
from hpo.errors import (
    BadDatabaseError,
    DiskFullError,
    HpoError,
    NotFoundError,
    ResourceError,
    SchedulerLostError,
    SchemaOutOfDateError,
    StorageError,
)
from hpo.interpreter import module_env

# The order of `hpo --help`. Each command imports what it uses when it runs, so `hpo status` or `hpo --help` does not
# load the study loop, SMAC, Dask, matplotlib, the server or the trainer's config models.
COMMANDS = (
    add_db,
    add_presets,
    add_run,
    add_resume,
    add_plan,
    add_status,
    add_trials,
    add_best,
    add_export,
    add_table,
    add_report,
    add_serve,
    add_webui,
    add_import,
    add_delete,
)


class _StoreOnce(argparse._StoreAction):
    """An option that takes one value refuses a second (argparse keeps the last without a word: `--db A ... --db
    B` would read B alone), as the trainer's `--config` does."""

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string is not None:
            given = namespace.__dict__.setdefault(GIVEN, {})
            if self.dest in given:
                parser.error(f"{option_string} given twice ({given[self.dest]} and {values}): give it once")
            given[self.dest] = values
        super().__call__(parser, namespace, values, option_string)


GIVEN = "_options_given"  # where _StoreOnce notes the options given; removed from the parsed arguments


class HpoParser(argparse.ArgumentParser):
    """The parser of `hpo` and of each of its commands (argparse makes a command's parser of its parent's class):
    options that take one value take it once, and `--db` after the command says where it goes."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register("action", None, _StoreOnce)
        self.register("action", "store", _StoreOnce)

    def error(self, message):
        if message.startswith("unrecognized arguments") and "--db" in message.split():
            message += " (--db is hpo's own option: it comes before the command, `hpo --db URL COMMAND ...`)"
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    parser = HpoParser(prog="hpo", description="HPO for large-batch BERT optimizers.")
    parser.add_argument("--version", action=VersionAction, help="print hpo's version and exit")
    parser.add_argument(
        "--db",
        type=given("a database URL"),
        help="database URL (default: HPO_DATABASE_URL, else $HPO_HOME/hpo.db; HPO_HOME: ./.hpo)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


class VersionAction(argparse.Action):
    """`--version`: the distribution's metadata is read only when asked for, not at every command's start."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"hpo {installed_version()}")
        parser.exit()


def installed_version() -> str:
    """The installed distribution's version (bert-hpo), or a note where the source runs without being installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("bert-hpo")
    except PackageNotFoundError:
        return "(not installed: running from the source)"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    vars(args).pop(GIVEN, None)
    try:
        return args.fn(args)
    except SchemaOutOfDateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NotFoundError as e:
        print(f"error: {e}; `hpo status` lists the experiments", file=sys.stderr)
        return 2
    except StorageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if bad_database_url(e) else 1  # a URL that names no usable database is bad input
    except SchedulerLostError as e:  # mid-run: stopped, for `hpo resume`, as on a full disk
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ResourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except DiskFullError as e:  # the machine's state, not bad input
        print(f"error: {e}", file=sys.stderr)
        return 1
    except HpoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        close_storages()


def bad_database_url(error: StorageError) -> bool:
    """Whether `error` is the refusal of a database URL that cannot be used as written (it does not parse, or it
    names a database kind or driver there is none of, or the server refuses its database, user or password, or
    the file is not SQLite): bad input, unlike a database that cannot be reached."""
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    return isinstance(error, BadDatabaseError) or isinstance(error.__cause__, (ArgumentError, NoSuchModuleError,
                                                                                  ImportError))  # fmt: skip


# SMAC3 and ConfigSpace iterate over sets of strings, whose order follows Python's per-process hash seed: the
# same experiment and tuner seed would propose different trials in another process. A command that runs a tuner
# (a controller, `hpo plan`'s repetitions, the server's plans) therefore runs with a fixed seed, which only an
# interpreter's start can set; the commands that only read, export or import never propose a trial and are spared
# the second start (about 0.1 s of each).
FIXED_HASH_SEED = "0"
NO_TUNER = frozenset({"db", "presets", "status", "trials", "best", "export", "table", "report", "import", "delete"})


def entry() -> None:
    """The `hpo` command: `main`, in an interpreter whose hash seed is fixed (re-started once if it is not) unless
    the command runs no tuner."""
    if os.environ.get("PYTHONHASHSEED") != FIXED_HASH_SEED and command_of(sys.argv[1:]) not in NO_TUNER:
        env = module_env({**os.environ, "PYTHONHASHSEED": FIXED_HASH_SEED})  # not the current folder's trainer.py
        os.execve(sys.executable, [sys.executable, "-m", "hpo", *sys.argv[1:]], env)
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:  # the reader of the output left (`hpo trials NAME | head`): as any Unix filter, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush cannot fail again
        code = 128 + signal.SIGPIPE
    except KeyboardInterrupt:  # Ctrl-C where no command handles it (while modules load): no traceback
        print("interrupted (Ctrl-C)", file=sys.stderr)
        code = 128 + signal.SIGINT
    except OSError as e:
        if e.errno not in OUTPUT_ERRNOS or e.filename is not None:  # not the output's: a defect, with its traceback
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is left in its buffer goes nowhere
        print(f"error: cannot write the output: {e.strerror} (a full disk, or a file that cannot grow, behind "
              "the standard output)", file=sys.stderr)  # fmt: skip
        code = 1
    sys.exit(code)


# What writing the standard output can fail with when it is a file (`hpo trials NAME > out.txt`) that cannot grow.
OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})


def command_of(argv: list[str]) -> str | None:
    """The command `argv` names (its first word after the global options), None without one."""
    words = iter(argv)
    for word in words:
        if word == "--db":
            next(words, None)
        elif not word.startswith("-"):
            return word
    return None


if __name__ == "__main__":
    entry()
