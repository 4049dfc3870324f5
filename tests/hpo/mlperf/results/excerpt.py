"""Cut a published MLPerf result file down to the lines `hpo import mlperf` reads, each kept unchanged.

    python tests/hpo/mlperf/results/excerpt.py SOURCE_ROOT RELATIVE_PATH... --out tests/hpo/mlperf/results/ROUND

Kept, in the file's order: the first line that is not MLLOG and carries an option (`--`) the importer reads (an
optimizer, the evaluation schedule, the target, the sample limit); of the MLLOG lines of the lowest rank that logged a
key, the first line of every setting the importer reads and of run_start and run_stop, and every eval_accuracy and
train_samples line. Everything else (other ranks, per-process start-up lines, weights_initialization, block and
epoch events) is dropped. A system description (`systems/*.json`) is copied whole.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from hpo.mlperf.logs import SETTINGS, TOKEN

EVERY_LINE = {"eval_accuracy", "train_samples"}
FIRST_LINE = {*SETTINGS, "run_start", "run_stop"}
OPTIONS = re.compile(r"--(optimizer|optim|opt|distributed_lamb|eval_iter_start_samples|eval_iter_samples|"
                     r"target_mlm_accuracy|max_samples_termination)\b")  # fmt: skip


def excerpt(text: str) -> list[str]:
    """The kept lines of one result file (see the module docstring)."""
    parsed = []
    for line in text.splitlines():
        at = line.find(TOKEN)
        event = json.loads(line[at + len(TOKEN) :]) if at >= 0 else None
        parsed.append((line, event))
    lowest = {}
    for _, event in parsed:
        if event is not None and isinstance((event.get("metadata") or {}).get("rank"), int):
            key = event["key"]
            lowest[key] = min(lowest.get(key, event["metadata"]["rank"]), event["metadata"]["rank"])
    kept, seen, command = [], set(), False
    for line, event in parsed:
        if event is None:
            if not command and OPTIONS.search(line):
                kept.append(line)
                command = True
            continue
        key, rank = event["key"], (event.get("metadata") or {}).get("rank")
        if rank is not None and rank != lowest.get(key, rank):
            continue
        if key in EVERY_LINE or (key in FIRST_LINE and key not in seen):
            kept.append(line)
            seen.add(key)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a checkout of an MLCommons training_results repository")
    parser.add_argument("paths", nargs="+", help="result files or system descriptions, relative to ROOT")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    for relative in args.paths:
        source, target = args.root / relative, args.out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.suffix == ".json":
            shutil.copyfile(source, target)
            continue
        text = source.read_bytes().decode("utf-8", errors="replace")
        target.write_text("\n".join(excerpt(text)) + "\n")
        print(f"{relative}: {len(text.splitlines())} lines -> {len(excerpt(text))}")


if __name__ == "__main__":
    main()
