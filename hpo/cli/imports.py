"""`hpo import mlperf` and `hpo import rcp`: runs made elsewhere, written as imported experiments."""

from __future__ import annotations

import argparse
import signal
import sys

from hpo.cli.common import open_storage, safe_url
from hpo.errors import DatabaseUnavailableError


def cmd_import_mlperf(args: argparse.Namespace) -> int:
    from hpo.mlperf.importer import describe, plan_mlperf, write_plan
    from hpo.mlperf.logs import read_result_files, result_files

    # every file is read and checked first; a directory's files of other benchmarks are skipped, each with a note
    runs = read_result_files(result_files(args.paths, note=print), args.optimizer)
    plan = plan_mlperf(runs, args.name, args.compare.split(","), args.target)
    storage = open_storage(args.db)
    try:
        written = write_plan(storage, plan)
    except KeyboardInterrupt:
        return _interrupted()
    except DatabaseUnavailableError as e:
        raise _cut_short(e) from None
    print("\n".join(describe(plan, written)))
    print(_after_import(args, plan.name))
    return 0


def _interrupted() -> int:
    """Ctrl-C while an import writes its runs: what it wrote stays; the same command again adds the rest."""
    print("import interrupted (Ctrl-C) before it finished: the runs it stored are kept; run the same command again to "
          "finish it (it adds only the runs not stored yet)", file=sys.stderr)  # fmt: skip
    return 128 + signal.SIGINT


def _cut_short(error: DatabaseUnavailableError) -> DatabaseUnavailableError:
    """The database went away while an import wrote its runs: what it stored stays, the same command adds the rest."""
    return DatabaseUnavailableError(
        f"{error}; the import stopped there: any runs it stored are kept, and the same "
        "command run again once the database answers adds only the runs not stored yet"
    )


def cmd_import_rcp(args: argparse.Namespace) -> int:
    from hpo.mlperf.importer import describe, plan_rcp, write_plan
    from hpo.mlperf.rcp import read_rcp_file, ruleset
    from hpo.report.scaling import experiment_fits
    from hpo.report.text import fit_line

    records = read_rcp_file(args.file)
    name = args.name or "rcp-bert" + (f"-{ruleset(args.file).replace('.', '-')}" if ruleset(args.file) else "")
    plan = plan_rcp(records, args.file, name)
    storage = open_storage(args.db)
    try:
        written = write_plan(storage, plan)
    except KeyboardInterrupt:
        return _interrupted()
    except DatabaseUnavailableError as e:
        raise _cut_short(e) from None
    print("\n".join(describe(plan, written)))
    for series, fit in experiment_fits(storage, name).items() if written.added else ():  # the batch-size view's fit
        print(fit_line(series, fit))
    print(_after_import(args, name) + f"  # beside your experiments: hpo report YOURS... {name}")
    return 0


def _after_import(args: argparse.Namespace, name: str) -> str:
    import shlex

    hpo_command = "hpo" + (f" --db {shlex.quote(safe_url(args.db))}" if args.db else "")
    return f"next: {hpo_command} status {name}; {hpo_command} best {name} --per-arm; {hpo_command} report {name}"


def add_import(sub) -> None:
    """`hpo import mlperf|rcp`."""
    imports = sub.add_parser("import", help="read runs made elsewhere into an experiment (MLPerf results, RCPs)")
    kinds = imports.add_subparsers(dest="import_kind", required=True, metavar="mlperf|rcp")
    mlperf = kinds.add_parser("mlperf", help="MLPerf training result files as an experiment of finished trials")
    mlperf.add_argument("paths", nargs="+", metavar="PATH",
                        help="result files, or directories searched for result_N.txt (MLCommons' layout, or "
                             "what `log.mlperf` of our trainer wrote)")  # fmt: skip
    mlperf.add_argument("--name", required=True, help="the experiment's name (a second import of the same files "
                                                      "adds nothing)")  # fmt: skip
    mlperf.add_argument("--compare", default="optimizer,global_batch_size",
                        help="arms: comma-separated optimizer, global_batch_size, system, submitter, clipping "
                             "(named by our trainer's logs only) (default optimizer,global_batch_size)")  # fmt: skip
    mlperf.add_argument("--optimizer", choices=["adamw", "lamb"],
                        help="the optimizer of runs whose log names none (no opt_name, no optimizer option on a "
                             "logged command line); without it such a run is an error")  # fmt: skip
    mlperf.add_argument("--target", type=float, help="the target masked-LM accuracy the runs trained to (default: "
                                                     "the logged one, else MLPerf BERT's 0.720)")  # fmt: skip
    mlperf.set_defaults(fn=cmd_import_mlperf)
    rcp = kinds.add_parser("rcp", help="mlperf-logging's reference convergence points: arms by batch size")
    rcp.add_argument("file", help="an RCP file, e.g. mlperf_logging/rcp_checker/training_5.0.0/rcps_bert.json")
    rcp.add_argument("--name", help="the experiment's name (default rcp-bert-<ruleset>, from the file's folder)")
    rcp.set_defaults(fn=cmd_import_rcp)
