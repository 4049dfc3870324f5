"""`hpo report`: the HTML comparison report(s) of experiments, and their figures as PNG files."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import sys
from pathlib import Path

from hpo.cli.common import directory_blocker, given, open_storage, safe_url
from hpo.errors import HpoError
from hpo.files import write_whole


def cmd_report(args: argparse.Namespace) -> int:
    import shlex

    from hpo.report.data import load_experiment
    from hpo.report.html import comparison_report, experiment_page
    from hpo.report.text import study_lines

    storage = open_storage(args.db, read_only=True)
    names = list(dict.fromkeys(args.names))
    for name in names:
        storage.get_experiment_by_name(name)  # every name exists before anything is written
    if len(names) > 1 and "compare" in names:  # its page and figures would be the comparison's own file names
        raise HpoError("hpo report: an experiment named compare shares its page's name, compare.html, with the "
                       "comparison of several experiments (and its --png figures with the comparison's); report it "
                       "on its own (hpo report compare), or compare the others without it")  # fmt: skip
    pages = [Path(args.output) / f"{name}.html" for name in names] + (
        [Path(args.output) / "compare.html"] if len(names) > 1 else []
    )
    _check_directory("-o", Path(args.output))  # both outputs usable before anything is written
    if args.png:
        _check_directory("--png", Path(args.png), pages)
    for page in pages:
        if page.is_dir() or (page.exists() and not os.access(page, os.W_OK)):
            what = "a directory is there" if page.is_dir() else "a file this user may not write is there"
            raise HpoError(f"hpo report: cannot write {page} ({what}); move it, or give another directory with -o")
        _check_replaceable(page, "-o")
    # Every read before anything is made: a database that goes away meanwhile leaves no directory or page behind
    experiments = [load_experiment(storage, name) for name in names]
    comparison = comparison_report(storage, names) if len(names) > 1 else None
    figures = _figures(experiments, Path(args.png)) if args.png else []
    for path, _ in figures:
        _check_replaceable(path, "--png")
    out = _directories(Path(args.output), Path(args.png) if args.png else None)
    hpo_command = "hpo" + (f" --db {shlex.quote(safe_url(args.db))}" if args.db else "")
    index = "compare.html" if len(names) > 1 else None
    studies = []
    for data in experiments:
        path = out / f"{data.name}.html"
        _write(path, experiment_page(data, hpo_command=hpo_command, index=index))
        print(f"wrote {path}")
        studies += study_lines(data)  # an experiment whose arms span batch sizes: its batch-size view as text
    if comparison is not None:
        path = out / "compare.html"
        _write(path, comparison)
        print(f"wrote {path} (links to the reports above)")
    if figures:
        _directory("--png", Path(args.png))
    for path, contents in figures:
        _write(path, contents)
        print(f"wrote {path}")
    print("\n".join(studies), end="\n" if studies else "")
    return 0


def _figures(experiments: list, directory: Path) -> list[tuple[Path, bytes]]:
    """Each report's figures as NAME-FIGURE.png in `directory` (or why an experiment has none, said here), and with
    several experiments compare.html's as compare-FIGURE.png: each file and its bytes, drawn before any is written."""
    from hpo.report.html import comparison_pngs, experiment_pngs

    figures = []
    for data in experiments:
        pngs, why = experiment_pngs(data)
        if not pngs:
            print(f"no figure for {data.name}: {why}", file=sys.stderr)
        figures += [(directory / f"{data.name}-{slug}.png", contents) for slug, contents in pngs.items()]
    if len(experiments) > 1:
        pngs = comparison_pngs(experiments)
        if not pngs:
            print("no figure for compare.html: no arm has a best trial yet", file=sys.stderr)
        figures += [(directory / f"compare-{slug}.png", contents) for slug, contents in pngs.items()]
    return figures


# What an earlier `hpo report` wrote begins so (a page: every page's title ends "comparison report"; a figure: a PNG
# that matplotlib drew, which says so in a text chunk before its image data).
_EARLIER_PAGE = re.compile(
    rb"<!doctype html><html lang=en><head><meta charset=utf-8><title>[^<]*comparison report</title>"
)
_PNG = b"\x89PNG\r\n\x1a\n"


def _check_replaceable(path: Path, option: str) -> None:
    """HpoError where `path` holds a file that is not empty and not one an earlier `hpo report` wrote: a report
    replaces its own pages and figures (running it again updates them), never a file of the user's that happens to
    have a page's or a figure's name."""
    try:
        with path.open("rb") as file:
            head = file.read(512)
    except (FileNotFoundError, IsADirectoryError):
        return
    except OSError:
        return  # unreadable: the write says why it cannot be written
    ours = _EARLIER_PAGE.match(head) if path.suffix == ".html" else head.startswith(_PNG) and b"Matplotlib" in head
    if head and not ours:
        raise HpoError(f"hpo report: {path} exists and is not a page or figure an earlier `hpo report` wrote: it is "
                       f"kept; move it away, or give another directory with {option}")  # fmt: skip


_HINT = "give a directory that is not a file (it is created where missing), in a place you can write to"


def _check_directory(option: str, path: Path, pages: list[Path] | None = None) -> None:
    """HpoError naming `path` where it could not be the output directory (a file, or under one; a place that
    cannot be written; one of the pages this command writes); makes nothing."""
    if any(path.resolve() == page.resolve() for page in pages or []):
        raise HpoError(f"hpo report {option} {path}: is where the page {path.name} is written; {_HINT}")
    if not path.exists() and path.suffix.lower() in (".html", ".htm", ".png"):  # a page's name, taken for the folder
        raise HpoError(f"hpo report {option} {path}: names a file, but {option} is the directory the pages are "
                       f"written in (NAME.html), made where missing; give a directory (e.g. {option} "
                       f"{path.parent / 'reports'}) or make one of that name first")  # fmt: skip
    blocked = directory_blocker(path)
    if blocked is None:
        return
    why, probe = blocked
    if why != "unwritable" and probe == path:
        raise HpoError(f"hpo report {option} {path}: is a file, not a directory; {_HINT}")
    cause = "Permission denied" if why == "unwritable" else "Not a directory"
    raise HpoError(f"hpo report {option} {path}: cannot be created ({cause}); {_HINT}")


def _directories(output: Path, png: Path | None) -> Path:
    """The output directory made (where missing) and the --png one shown to be makeable before any page is written
    (made and removed again: it is made for good only where there is a figure); the first is removed again, if this
    made it, where the second cannot be made (a place only trying shows: /proc, a full or read-only disk)."""
    made = _missing(output)
    out = _directory("-o", output)
    if png is not None and not png.exists():
        missing = _missing(png)
        try:
            _directory("--png", png)
        except HpoError:
            _remove(made)
            raise
        _remove(missing)
    return out


def _missing(path: Path) -> list[Path]:
    """`path` and those of its parents that are not there, the deepest first (what making it makes)."""
    return [p for p in (path, *path.parents) if not p.exists()]


def _remove(made: list[Path]) -> None:
    for directory in made:
        with contextlib.suppress(OSError):
            directory.rmdir()


def _directory(option: str, path: Path) -> Path:
    """The output directory `path`, created where it does not exist; HpoError naming it where that cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise HpoError(f"hpo report {option} {path}: is a file, not a directory; {_HINT}") from None
    except OSError as e:
        raise HpoError(f"hpo report {option} {path}: cannot be created ({e.strerror}); {_HINT}") from None
    return path


def _write(path: Path, contents: str | bytes) -> None:
    """Write one output file; HpoError naming it where that cannot be (e.g. a directory of that name)."""
    try:
        write_whole(path, contents)  # an earlier report stays whole until the new one is
    except OSError as e:
        fix = "free space on its disk" if e.errno == errno.ENOSPC else "move what is there"
        raise HpoError(f"hpo report: cannot write {path} ({e.strerror}); {fix}, or give another directory with -o "
                       "(or --png)") from None  # fmt: skip


# --------------------------------------------------------------------------- import


def add_report(sub) -> None:
    """`hpo report`."""
    report = sub.add_parser("report", help="self-contained HTML comparison report(s); several names: compare.html too")
    report.add_argument("names", nargs="+", metavar="NAME",
                        help="the experiment(s); with several, compare.html plots samples to target and the noise "
                             "scale against global batch size per optimizer (e.g. the batch_scaling runs)")  # fmt: skip
    report.add_argument("-o", "--output", default="reports", type=given("a directory"),
                        help="the directory for NAME.html (and compare.html); default ./reports")  # fmt: skip
    report.add_argument("--png", metavar="DIR", help="also write each figure of the report(s) as DIR/NAME-FIGURE.png, "
                                                     "and compare.html's as DIR/compare-FIGURE.png (for slides and "
                                                     "papers)")  # fmt: skip
    report.set_defaults(fn=cmd_report)
