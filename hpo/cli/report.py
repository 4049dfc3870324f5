"""`hpo report`: the HTML comparison report(s) of experiments, and their figures as PNG files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hpo.cli.common import open_storage, safe_url


def cmd_report(args: argparse.Namespace) -> int:
    import shlex

    from hpo.report.data import load_experiment
    from hpo.report.html import comparison_report, experiment_page
    from hpo.report.text import study_lines

    storage = open_storage(args.db, read_only=True)
    names = list(dict.fromkeys(args.names))
    for name in names:
        storage.get_experiment_by_name(name)  # every name exists before anything is written
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    hpo_command = "hpo" + (f" --db {shlex.quote(safe_url(args.db))}" if args.db else "")
    index = "compare.html" if len(names) > 1 else None
    studies = []
    for name in names:
        data = load_experiment(storage, name)
        path = out / f"{name}.html"
        path.write_text(experiment_page(data, hpo_command=hpo_command, index=index))
        print(f"wrote {path}")
        studies += study_lines(data)  # an experiment whose arms span batch sizes: its batch-size view as text
    if len(names) > 1:
        path = out / "compare.html"
        path.write_text(comparison_report(storage, names))
        print(f"wrote {path} (links to the reports above)")
    if args.png:
        _write_pngs(storage, names, Path(args.png))
    print("\n".join(studies), end="\n" if studies else "")
    return 0


def _write_pngs(storage, names: list[str], directory: Path) -> None:
    """Each report's figures as NAME-FIGURE.png in `directory`, or why an experiment has none."""
    from hpo.report.html import experiment_pngs

    for name in names:
        pngs, why = experiment_pngs(storage, name)
        if not pngs:
            print(f"no figure for {name}: {why}", file=sys.stderr)
            continue
        directory.mkdir(parents=True, exist_ok=True)
        for slug, contents in pngs.items():
            path = directory / f"{name}-{slug}.png"
            path.write_bytes(contents)
            print(f"wrote {path}")


# --------------------------------------------------------------------------- import


def add_report(sub) -> None:
    """`hpo report`."""
    report = sub.add_parser("report", help="self-contained HTML comparison report(s); several names: compare.html too")
    report.add_argument("names", nargs="+", metavar="NAME",
                        help="the experiment(s); with several, compare.html plots samples to target and the noise "
                             "scale against global batch size per optimizer (e.g. the batch_scaling runs)")  # fmt: skip
    report.add_argument("-o", "--output", default="reports",
                        help="the directory for NAME.html (and compare.html); default ./reports")  # fmt: skip
    report.add_argument("--png", metavar="DIR", help="also write each figure of the report(s) as DIR/NAME-FIGURE.png "
                                                     "(for slides and papers)")  # fmt: skip
    report.set_defaults(fn=cmd_report)
