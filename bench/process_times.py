"""Commands as the user meets them, whole processes (interpreter start, imports, the work, the exit), in this
checkout beside another one (an earlier commit's `git worktree`) in the same run, alternated round by round:

- `python -m trainer --config demo_cpu --print-config`
- `python -m hpo plan BAD.yaml`: an experiment file with a bad name and three fields missing, refused
- `python -m trainer --config demo_cpu budget.max_samples=64 ...`: a short training run on the demo corpus
- `hpo serve`: from the command's start to its first 200 on /api/v1/health, over a copy of `--db`'s SQLite file

    git worktree add /tmp/before REV && ln -s "$PWD/data" /tmp/before/data
    python -m bench.process_times --other /tmp/before --db runs/demo/hpo.db --rounds 5

Each command runs with the other checkout as its working directory (`python -m` imports from there first). Prints
the median seconds of each command in each checkout and their ratio, with the CPU model."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.machine import cpu_model
from hpo.trial.launch import free_port

BAD = 'name: "../x"\n'


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def served(cwd: Path, db: Path, scratch: Path) -> float:
    """Seconds from `hpo serve`'s start to its first answer on /api/v1/health."""
    copy = scratch / "serve.db"
    shutil.copyfile(db, copy)
    port = free_port()
    env = {**os.environ, "PYTHONHASHSEED": "0", "HPO_DATABASE_URL": f"sqlite:///{copy}"}
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "hpo", "serve", "--port", str(port)], cwd=cwd, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=5) as answer:
                    if answer.status == 200:
                        return time.perf_counter() - started
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"hpo serve in {cwd} exited with {server.returncode}") from None
                time.sleep(0.05)
    finally:
        server.terminate()
        server.wait()


def round_of(cwd: Path, db: Path, scratch: Path) -> dict[str, float]:
    env = dict(os.environ)
    bad = scratch / "bad.yaml"
    bad.write_text(BAD)
    train = [sys.executable, "-m", "trainer", "--config", "demo_cpu", "budget.max_samples=64", "checkpoint.dir=null",
             f"log.jsonl={scratch / 'train.jsonl'}"]  # fmt: skip
    return {
        "trainer --print-config": timed(
            [sys.executable, "-m", "trainer", "--config", "demo_cpu", "--print-config"], cwd, env
        ),  # fmt: skip
        "hpo plan (a bad file)": timed([sys.executable, "-m", "hpo", "plan", str(bad)], cwd, env),
        "trainer, 64 samples": timed(train, cwd, env),
        "hpo serve, to its first answer": served(cwd, db, scratch),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.process_times", description=__doc__.split("\n")[0])
    parser.add_argument("--other", type=Path, required=True, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--db", type=Path, required=True, help="a SQLite file `hpo run` wrote, for `hpo serve`")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parents[1]
    if not args.db.is_file():
        parser.error(f"--db {args.db}: no such file (give a database `hpo run` wrote, e.g. runs/demo/hpo.db)")
    for checkout in (args.other, here):
        if not (checkout / "data" / "demo").is_dir():
            parser.error(f"{checkout}/data/demo is missing: `make demo-data` (or link this checkout's data/ there)")
    times: dict[str, dict[str, list[float]]] = {"other": {}, "this": {}}
    with tempfile.TemporaryDirectory(prefix="process-times-") as scratch:
        for number in range(args.rounds):
            for side, checkout in (("other", args.other), ("this", here)):
                for name, seconds in round_of(checkout, args.db, Path(scratch)).items():
                    times[side].setdefault(name, []).append(seconds)
            print(f"round {number + 1} of {args.rounds} done", file=sys.stderr)
    print(f"{cpu_model()}; median of {args.rounds} rounds, alternated; other: {args.other}")
    print("| command | other checkout (s) | this checkout (s) | this / other |")
    print("|---|---|---|---|")
    for name, other in times["other"].items():
        before, after = statistics.median(other), statistics.median(times["this"][name])
        print(f"| {name} | {before:.2f} | {after:.2f} | {after / before:.2f} |")


if __name__ == "__main__":
    main()
