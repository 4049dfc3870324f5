"""Import every BERT result directory of MLCommons' training results, round by round, beside mlperf-logging's
compliance checker under each round's rules.

    python bench/mlperf_corpus.py FOLDER [--rounds 2.0,2.1] [--optimizer lamb] [--jobs 2] [--cache FILE]

FOLDER holds one folder per round, named as MLCommons' repositories are (`training_results_v2.0/`, a checkout of
https://github.com/mlcommons/training_results_v2.0 or just its `*/results/*/bert/` and `*/systems/*.json`). A
BERT result directory is `<submitter>/results/<system>/bert/` (at any depth under `results/`) with `result_*.txt`
files. Each directory is imported as `hpo import mlperf DIR --optimizer lamb` would (`hpo.mlperf`: read and checked,
planned, written into a temporary SQLite database per round; `--optimizer` names the optimizer of runs whose log
names none, BERT's reference LAMB by default) and counts as imported or refused with the importer's reason. Beside
it, every file goes through `mlperf_logging.compliance_checker` under the round's ruleset (`X.Y.0`; the same
checker MLCommons' submission checks run, in the version installed), and the directory shows how many of its files
pass and the checker's first message for one that does not. The checker's answers are cached per file content,
ruleset and mlperf-logging version (`--cache`, default `FOLDER/compliance-cache.json`), so a second run only imports.

Per round it prints a line (directories, imported with their runs, refused, files the checker passes) and a line
per directory; `--markdown` adds the summary table BENCHMARKS.md shows. Exit status 0 unless a directory that the
importer should take (every run ends with run_stop and a train_samples after its evaluations) is refused.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import sys
import tempfile
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hpo.errors import HpoError
from hpo.mlperf.importer import plan_mlperf, write_plan
from hpo.mlperf.logs import TOKEN, read_result_files, result_files
from hpo.storage import SqlStorage

ROUND = re.compile(r"training_results_v(\d+\.\d+)$")


@dataclass
class Directory:
    """One BERT result directory: what the import and the checker made of it."""

    path: Path
    files: list[Path]
    runs: int = 0  # imported runs
    hits: int = 0
    summary: str = ""  # optimizer, batch, curve sources, accelerators
    refused: str | None = None  # the importer's reason
    takeable: bool = True  # every file ends with run_stop and a train_samples after its evaluations
    checks: list[tuple[bool, str]] = field(default_factory=list)  # per file: (passes, first message)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    folder = args.folder.resolve()
    rounds = _rounds(folder, args.rounds)
    cache_path = args.cache or folder / "compliance-cache.json"
    cache = _load_cache(cache_path)
    summary, wrongly_refused = [], 0
    for version, root in rounds:
        directories = [_import(d, args.optimizer, root) for d in bert_directories(root)]
        _check(directories, f"{version}.0", cache, args.jobs)
        _save_cache(cache_path, cache)
        _print_round(version, root, directories)
        summary.append((version, directories))
        wrongly_refused += sum(1 for d in directories if d.refused and d.takeable)
    if args.markdown:
        print("\n".join(markdown(summary)))
    return 1 if wrongly_refused else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="See the module docstring.")
    parser.add_argument("folder", type=Path, help="a folder of training_results_vX.Y folders (MLCommons' layout)")
    parser.add_argument("--rounds", help="only these rounds, comma-separated (e.g. 1.1,2.0); default every one found")
    parser.add_argument("--optimizer", default="lamb", choices=["lamb", "adamw"],
                        help="the optimizer of runs whose log names none (default lamb, BERT's reference)")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="checker processes (default 2)")
    parser.add_argument("--cache", type=Path, help="the checker's cache (default FOLDER/compliance-cache.json)")
    parser.add_argument("--markdown", action="store_true", help="also print the per-round summary as a table")
    return parser


def _rounds(folder: Path, wanted: str | None) -> list[tuple[str, Path]]:
    if not folder.is_dir():
        raise SystemExit(f"{folder}: not a folder; give the folder that holds training_results_vX.Y folders")
    found = sorted(((m.group(1), p) for p in folder.iterdir() if (m := ROUND.match(p.name)) and p.is_dir()),
                   key=lambda r: tuple(map(int, r[0].split("."))))  # fmt: skip
    if wanted:
        names = [w.strip() for w in wanted.split(",") if w.strip()]
        missing = [n for n in names if n not in {v for v, _ in found}]
        if missing:
            raise SystemExit(f"--rounds {', '.join(missing)}: no training_results_v{missing[0]} folder in {folder}")
        found = [r for r in found if r[0] in names]
    if not found:
        raise SystemExit(f"{folder}: no training_results_vX.Y folder (fetch MLCommons' results repositories there)")
    return found


def bert_directories(root: Path) -> list[Path]:
    """`<submitter>/results/.../bert/` folders that hold result files, in name order."""
    found = {p.parent for p in root.glob("*/results/**/bert/result_*.txt")}
    return sorted(found, key=lambda p: str(p).lower())


# ------------------------------------------------------------------------------------------------ import


def _import(directory: Path, optimizer: str, root: Path) -> Directory:
    files = sorted(directory.glob("result_*.txt"))
    out = Directory(directory.relative_to(root), files, takeable=all(map(_ends_with_train_samples, files)))
    try:
        runs = read_result_files(result_files([directory]), optimizer)
        plan = plan_mlperf(runs, "corpus")
        with tempfile.TemporaryDirectory() as tmp:
            write_plan(SqlStorage(f"sqlite:///{tmp}/corpus.db", upgrade=True), plan)
    except HpoError as e:
        out.refused = str(e).replace(f"{root}{os.sep}", "")
        return out
    out.runs, out.hits = len(runs), sum(1 for r in runs if r.reached)
    out.summary = _describe(runs)
    return out


def _describe(runs) -> str:
    optimizers = "/".join(sorted({f"{r.optimizer} ({r.optimizer_source.split(' (')[0]})" for r in runs}))
    batches = "/".join(f"{b:,}" for b in sorted({r.global_batch_size for r in runs}))
    curves = "/".join(sorted({r.curve for r in runs}))
    accelerators = "/".join(
        f"{a:,}" for a in sorted({r.hardware.accelerators for r in runs if r.hardware.accelerators})
    )
    return f"{optimizers}, batch {batches}, positions {curves}, accelerators {accelerators or 'unknown'}"


def _ends_with_train_samples(path: Path) -> bool:
    """Whether the run logged run_stop and a train_samples after its last eval_accuracy (read without hpo.mlperf)."""
    last_eval = last_train = stop = -1
    for number, line in enumerate(path.read_bytes().decode("latin-1").splitlines()):
        key = re.search(r'"key":\s*"(\w+)"', line) if TOKEN in line else None
        if key is None:
            continue
        if key.group(1) == "eval_accuracy":
            last_eval = number
        elif key.group(1) == "train_samples":
            last_train = number
        elif key.group(1) == "run_stop":
            stop = number
    return stop >= 0 and last_train > last_eval


# ------------------------------------------------------------------------------------------------ the checker


def _check(directories: list[Directory], ruleset: str, cache: dict, jobs: int) -> None:
    """Every file's compliance verdict under `ruleset`, from the cache or the checker (in `jobs` processes)."""
    version = importlib.metadata.version("mlperf-logging")
    keys = {f: f"{_digest(f)}:{ruleset}:{version}" for d in directories for f in d.files}
    todo = [f for f, key in keys.items() if key not in cache]
    if todo:
        with ProcessPoolExecutor(max(1, jobs)) as pool:
            for path, answer in zip(todo, pool.map(check_file, todo, [ruleset] * len(todo), chunksize=4), strict=True):
                cache[keys[path]] = answer
    for directory in directories:
        directory.checks = [tuple(cache[keys[f]]) for f in directory.files]


def check_file(path: Path, ruleset: str) -> tuple[bool, str]:
    """(passes, the checker's first message) for one result file under `ruleset`."""
    from mlperf_logging.compliance_checker import mlp_compliance  # in the worker: the checker logs as it goes

    logging.disable(logging.CRITICAL)
    try:
        checker = mlp_compliance.make_checker("training", ruleset, True, False)
        valid = checker.check_file(str(path), f"training_{ruleset}/common.yaml")
    except Exception as e:  # noqa: BLE001 - a checker that stops on a file is that file's verdict
        return False, f"the checker stopped: {type(e).__name__}: {e}"
    messages = [*checker.overwritable.values(), *checker.not_overwritable]
    first = " ".join(str(messages[0]).split())[:160] if messages else ""
    return bool(valid), first


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _load_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _save_cache(path: Path, cache: dict) -> None:
    try:
        path.write_text(json.dumps(cache, sort_keys=True))
    except OSError as e:
        print(f"note: the checker's cache {path} was not written ({e.strerror})", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ output


def _print_round(version: str, root: Path, directories: list[Directory]) -> None:
    imported = [d for d in directories if d.refused is None]
    files = sum(len(d.files) for d in directories)
    passing = sum(ok for d in directories for ok, _ in d.checks)
    print(f"training {version} (ruleset {version}.0, {root.name}): {len(directories)} BERT result directories, "
          f"{len(imported)} imported ({sum(d.runs for d in imported)} runs), {len(directories) - len(imported)} "
          f"refused; the checker passes {passing} of {files} files")  # fmt: skip
    for d in directories:
        outcome = (
            f"refused: {d.refused}"
            if d.refused
            else f"imported {d.runs} runs, {d.hits} reached the target; {d.summary}"
        )
        print(f"  {d.path.parent}: {len(d.files)} files: {outcome}; checker {_verdict(d)}")
    print()


def _verdict(d: Directory) -> str:
    passing = sum(ok for ok, _ in d.checks)
    if passing == len(d.checks):
        return f"{passing}/{len(d.checks)} pass"
    first = Counter(message for ok, message in d.checks if not ok).most_common(1)[0][0]
    return f"{passing}/{len(d.checks)} pass ({first})"


def markdown(summary: list[tuple[str, list[Directory]]]) -> list[str]:
    """The per-round table: directories, imported (runs), refused, files the checker passes, and the imported
    directories with a file the checker fails."""
    head = ("round", "BERT result directories", "imported (runs)", "refused",
            "of them ending with run_stop and train_samples", "files the checker passes",
            "imported directories with a file the checker fails")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for version, dirs in summary:
        imported = [d for d in dirs if d.refused is None]
        files, passing = sum(len(d.files) for d in dirs), sum(ok for d in dirs for ok, _ in d.checks)
        failing = sum(1 for d in imported if not all(ok for ok, _ in d.checks))
        takeable = sum(1 for d in dirs if d.refused and d.takeable)
        lines.append(f"| {version} | {len(dirs)} | {len(imported)} ({sum(d.runs for d in imported):,}) | "
                     f"{len(dirs) - len(imported)} | {takeable} | {passing:,} of {files:,} | {failing} |")  # fmt: skip
    every = [d for _, dirs in summary for d in dirs]
    kept = [d for d in every if d.refused is None]
    checked = [ok for d in every for ok, _ in d.checks]
    lines.append(f"| all | {len(every)} | {len(kept)} ({sum(d.runs for d in kept):,}) | {len(every) - len(kept)} | "
                 f"{sum(1 for d in every if d.refused and d.takeable)} | {sum(checked):,} of {len(checked):,} | "
                 f"{sum(1 for d in kept if not all(ok for ok, _ in d.checks))} |")  # fmt: skip
    return lines


if __name__ == "__main__":
    sys.exit(main())
