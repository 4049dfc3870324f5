"""`hpo export`: the best trial as a complete trainer config, its JSON, or the `torchrun` line (in an experiment that
compares arms, the best of the verdict's winner when it names one; at a batch size, of the verdict's winner
there). It only reads."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from hpo.cli.common import check_output_file, given, open_storage, positive, write_output_file, wrong_batch_size
from hpo.errors import HpoError


def cmd_export(args: argparse.Namespace) -> int:
    from hpo.evidence.confirmations import chosen_trial
    from hpo.experiment import spec_from_stored
    from hpo.export.production import check_arm, render

    replaced = None
    if args.output:
        check_output_file(Path(args.output), printed=True)  # before the database is read: a path it cannot write
        replaced = _check_replaceable(Path(args.output))
        if args.format == "torchrun":
            _check_not_the_config(Path(args.output), args)
    storage = open_storage(args.db, read_only=True)
    record = storage.get_experiment_by_name(args.name)
    spec = spec_from_stored(record)
    check_arm(spec, args.arm)
    trial, chosen, among = chosen_trial(storage, record, spec, args.arm, args.batch_size)
    if trial is None:
        from hpo.engine.progress import why_none_completed

        raise HpoError(wrong_batch_size(storage, record, args.arm, args.batch_size, "to export") or
                       f"experiment {args.name} has no completed trial{f' of arm {args.arm}' if args.arm else ''} to "
                       f"export; {why_none_completed(storage, record.id, args.name)}")  # fmt: skip
    config_path = args.config_path if args.config_path is not None else _config_file(args)
    exported = render(record, trial, args.format, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                      config_path=config_path, spec=spec, chosen=chosen, among=among)  # fmt: skip
    if args.format == "torchrun":
        _check_config_file(args, config_path)
    # Every refusal is above, and a file that cannot be written (a full disk) is said before the warnings too: an
    # error never follows warnings about an export that did not happen.
    if args.output:
        write_output_file(Path(args.output), exported.text)
    for warning in exported.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not args.output:
        print(exported.text, end="")
        return 0
    replacing = f", replacing {replaced} there" if replaced else ""
    print(f"wrote {args.format} of trial {trial.number} ({chosen}) to {args.output}{replacing}", file=sys.stderr)
    if args.format == "yaml":
        command = exported.text.split("# run: ", 1)[1].splitlines()[0]
        print(f"run it with: {command}", file=sys.stderr)  # a line to paste: what it runs is said on the next
        if Path(config_path).resolve() != Path(args.output).resolve():
            print(f"that command names {config_path}, as --config-path asked, not {args.output}, the file written",
                  file=sys.stderr)  # fmt: skip
    return 0


def _check_replaceable(path: Path) -> str | None:
    """Refuse to replace a file that is not an earlier export (a hand-written config, anything else that is not
    empty): it would be lost. An earlier export is replaced, so that exporting again after more trials updates it;
    returns what it holds (`export_origin`), for the line that says it was replaced, else None."""
    from hpo.export.production import export_origin

    if not path.is_file() or path.stat().st_size == 0:
        return None  # nothing to lose: no file, an empty one, a device (/dev/null) or a pipe; a broken link is written
    try:
        with path.open("rb") as file:
            text = file.read(1 << 20).decode()
    except (OSError, UnicodeDecodeError):
        text = ""
    replaced = export_origin(text)
    if replaced is None:
        raise HpoError(f"-o {path}: exists and is not an earlier `hpo export`, so replacing it would lose it; give -o "
                       "a new file, or move that one away first")  # fmt: skip
    return replaced


def _check_not_the_config(output: Path, args: argparse.Namespace) -> None:
    """Refuse -o naming the config file the torchrun line runs: the line would replace that config (an earlier
    export, which -o may replace) and name itself as the config to run."""
    config_path = args.config_path if args.config_path is not None else _config_file(args)
    if not config_path or output.resolve() != Path(config_path).resolve():
        return
    given_as = f"--config-path {config_path}" if args.config_path is not None else f"{config_path} by default"
    raise HpoError(f"-o {output}: is the config file the torchrun line runs ({given_as}), so the line would "
                   "replace that config and run itself as one; give -o another file (e.g. run.sh), or name the "
                   "config with --config-path")  # fmt: skip


def _check_config_file(args: argparse.Namespace, config_path: str) -> None:
    """Refuse a torchrun line for an existing config file that was exported for other ranks (the trainer would
    refuse it on these)."""
    import yaml

    from hpo.export.production import check_config_file

    path = Path(config_path)
    if path.is_dir():  # the torchrun line could only fail ("config file ... is a directory")
        raise HpoError(f"--config-path {config_path} is a directory: name the config file the torchrun line runs "
                       f"(e.g. --config-path {path / 'best.yaml'})")  # fmt: skip
    if not path.is_file():
        return  # written later, or on the machines that run it
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return  # not a config this can read: the trainer says what is wrong with it
    again = ["hpo", "export", args.name, *(["--arm", args.arm] if args.arm else []),
             *(["--batch-size", str(args.batch_size)] if args.batch_size is not None else []),
             "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node), "-o", config_path]  # fmt: skip
    check_config_file(config_path, saved, args.nodes, args.gpus_per_node, shlex.join(again))


def _config_file(args: argparse.Namespace) -> str:
    """The config file a torchrun command names: the YAML being written, else best.yaml."""
    return args.output if args.format == "yaml" and args.output else "best.yaml"


def add_export(sub) -> None:
    """`hpo export`."""
    export = sub.add_parser("export", help="the best trial as a complete trainer config or a torchrun command")
    export.add_argument("name", help="the experiment's name")
    export.add_argument("--format", choices=["yaml", "json", "torchrun"], default="yaml",
                        help="yaml: a trainer config (python -m trainer --config FILE runs it); json: provenance + "
                             "config; torchrun: the command line (default yaml)")  # fmt: skip
    export.add_argument("--arm", help="the best of this arm, e.g. optimizer.name=lamb (default: the verdict's winner "
                        "where it names one, else every arm)")  # fmt: skip
    export.add_argument("--batch-size", type=positive, help="the best trial with this global batch size (of the "
                        "verdict's winner there where it names one)")  # fmt: skip
    export.add_argument("--nodes", type=positive, default=1, help="nodes of the production run (default 1)")
    export.add_argument("--gpus-per-node", type=positive, default=1, help="GPUs (ranks) per node (default 1)")
    export.add_argument(
        "-o", "--output", type=given("a file to write"), help="write to this file instead of standard output"
    )
    export.add_argument("--config-path", help="the config file the torchrun command names (default: -o, else "
                                              "best.yaml)")  # fmt: skip
    export.set_defaults(fn=cmd_export)
