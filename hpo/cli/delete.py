"""`hpo delete NAME`: remove an experiment, its trials and their learning curves from the database.

It asks first (on a terminal; elsewhere `--yes` says so), refuses while a controller drives the experiment, and
removes everything in one transaction: an interrupted delete leaves the experiment whole. Files stay: the run
directory (trial logs, checkpoints, MLPerf logs) is named, for the user to remove.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hpo.cli.common import open_storage
from hpo.errors import HpoError

SAY_WORKING_FROM = 5_000  # trials from which the delete says that it works (it takes a second or more)


def add_delete(sub) -> None:
    """`hpo delete`."""
    delete = sub.add_parser("delete", help="remove an experiment with its trials and curves from the database "
                                           "(asks first; its files stay)")  # fmt: skip
    delete.add_argument("name", help="the experiment's name")
    delete.add_argument("--yes", action="store_true", help="do not ask (needed where the input is not a terminal)")
    delete.set_defaults(fn=cmd_delete)


def cmd_delete(args: argparse.Namespace) -> int:
    from hpo.engine.liveness import controller_identity, liveness, stale_after_s
    from hpo.engine.settle import settle_controller

    storage = open_storage(args.db, existing=True)
    record = storage.get_experiment_by_name(args.name)  # NotFoundError: exit 2, naming `hpo status`
    trials = sum(tally.trials for tally in storage.tally_trials(record.id))
    what = f"experiment {record.name!r} ({liveness(record)}, {trials:,} trial{'' if trials == 1 else 's'})"
    if not args.yes and not _confirmed(f"delete {what} and every curve recorded of it? [y/N] "):
        print(f"kept {what}", file=sys.stderr)
        return 1
    record = settle_controller(storage, record, quiet=False)  # a controller still running here keeps it
    if trials >= SAY_WORKING_FROM:  # about 2 s a 10,000 trials on SQLite (BENCHMARKS.md)
        print(f"deleting {trials:,} trials and their curves in one transaction ...", file=sys.stderr, flush=True)
    removed = storage.purge_experiment(record.id, *controller_identity(), stale_after_s())  # one beating elsewhere
    trials, metrics = removed if removed is not None else (trials, None)
    counted = f"{trials:,} trial{'' if trials == 1 else 's'}" + (f", {metrics:,} metric values" if metrics else "")
    print(f"deleted experiment {record.name!r}: {counted}")
    run_dir = record.spec.get("run_dir")
    if run_dir and record.spec.get("experiment", {}).get("engine") == "nni":  # its web UI, if open, shows it no more
        from hpo.nni.manager import stop_all

        if closed := stop_all(Path(run_dir)):
            print(f"closed its NNI web UI ({len(closed)} NNI experiment(s))")
    if run_dir and Path(run_dir).exists():
        print(f"its run directory stays, with the trials' logs and checkpoints (`hpo run` of the file again needs it "
              f"gone, or another --run-dir): `rm -r {shlex.quote(_shown(Path(run_dir)))}` removes it")  # fmt: skip
    return 0


def _confirmed(question: str) -> bool:
    """The user's yes to `question` on the terminal; HpoError where there is none to ask (nothing is deleted)."""
    if not sys.stdin.isatty():
        raise HpoError("hpo delete asks before it deletes, and the input is not a terminal: add --yes to delete "
                       "without asking")  # fmt: skip
    try:
        answer = input(question)
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _shown(path: Path) -> str:
    """`path` as the user would type it here: relative to the working directory when it lies under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
