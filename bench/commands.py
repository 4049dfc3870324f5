"""Read commands as the user runs them: the wall time of each `hpo` read command as a whole process (interpreter
start, imports and the database included), median of several runs, on an experiment that
`hpo run` made.

The experiment is the simulated preset (`search_spaces/presets/adam_vs_lamb_simulated.yaml`: AdamW vs LAMB over the
recorded learning-curve table, confirmation rounds until the verdict decides) with `budget.trials: N`,
`budget.max_parallel: 1024` and the random tuner (seed 0, the preset's SMAC options removed). Unless the database
already holds it (`sim<N>`, e.g. `sim10000`), the bench writes that file and runs `hpo db upgrade` and `hpo run` on
it, and says how long that took. Each command then runs `--warmup` times untimed (the database file in the page
cache) and `--repeats` times timed, one after the other:

    hpo --help
    hpo status                       hpo status NAME
    hpo trials NAME --limit 50       hpo best NAME --per-arm
    hpo report NAME -o DIR           (and the size of DIR/NAME.html)

Goals at 10,000 trials: status, best --per-arm and trials --limit 50 at most 1 s, the report at most 5 s with a
page of at most 1 MB; at 100,000 trials status and best at most 2 s and the report at most 15 s. The commands run
this checkout's code (`python -m hpo` with it first on PYTHONPATH) with PYTHONHASHSEED unset, as the `hpo` command
starts, and its bytecode cached (PYTHONDONTWRITEBYTECODE unset: the warm-up run writes it, as an installed package
has it). The table printed says the CPU, the cores and the load average before and after.

    python -m bench.commands --trials 2000                                   # SQLite in a temporary directory
    python -m bench.commands --trials 10000 --db sqlite:///runs/commands/hpo-10000.db      # kept for the next run
    python -m bench.commands --trials 10000 --db postgresql+psycopg://postgres@127.0.0.1:5432/commands10k
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from bench.machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_simulated.yaml"
MAX_PARALLEL = 1024
# (goal at 10,000 trials, goal at 100,000 trials) in seconds; None: no goal
GOALS = {"status NAME": (1.0, 2.0), "best NAME --per-arm": (1.0, 2.0), "trials NAME --limit 50": (1.0, None),
         "report NAME": (5.0, 15.0)}  # fmt: skip
PAGE_GOAL_MB = 1.0


@dataclass(frozen=True)
class Timing:
    command: str
    runs: list[float]
    page_mb: float | None = None

    @property
    def median(self) -> float:
        return statistics.median(self.runs)


def experiment_file(trials: int, directory: Path) -> tuple[str, Path]:
    """The preset with `trials` trials on MAX_PARALLEL slots and the random tuner, written to `directory`."""
    data = yaml.safe_load(PRESET.read_text())
    name = f"sim{trials}"
    data.update(name=name, base_config=str((PRESET.parent / data["base_config"]).resolve()))
    data["tuner"] = {"name": "random", "seed": data["tuner"].get("seed", 0)}  # the preset's SMAC options removed
    data["budget"].update(trials=trials, max_parallel=MAX_PARALLEL)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return name, path


def hpo(url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`hpo --db URL ARGS` as a process of its own, with this checkout's code and the hash seed unset."""
    # the hash seed unset as in a shell (`hpo` fixes it by starting again for the commands that run a tuner);
    # bytecode cached as an installed package's
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    command = [sys.executable, "-m", "hpo", *(["--db", url] if url else []), *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=check)


def absolute(url: str) -> str:
    """A SQLite URL with an absolute path (the commands run in the repository's root)."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return f"sqlite:///{Path(url.removeprefix('sqlite:///')).resolve()}"
    return url


def has_experiment(url: str, name: str) -> bool:
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return False
    return hpo(url, "status", name, check=False).returncode == 0


def create(url: str, trials: int, directory: Path) -> float:
    """Store the experiment with `hpo db upgrade` and `hpo run`; the seconds `hpo run` took."""
    _, path = experiment_file(trials, directory)
    hpo(url, "db", "upgrade")
    started = time.monotonic()
    result = hpo(url, "run", str(path), "--run-dir", str(directory / "run"), check=False)
    if result.returncode != 0:
        sys.exit(f"hpo run failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return time.monotonic() - started


def time_command(url: str, args: list[str], warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        hpo(url, *args)
    runs = []
    for _ in range(repeats):
        started = time.monotonic()
        hpo(url, *args)
        runs.append(time.monotonic() - started)
    return runs


def measure(url: str, name: str, reports: Path, warmup: int, repeats: int) -> list[Timing]:
    commands = [["--help"], ["status"], ["status", name], ["trials", name, "--limit", "50"],
                ["best", name, "--per-arm"], ["report", name, "-o", str(reports)]]  # fmt: skip
    timings = []
    for args in commands:
        runs = time_command("" if args == ["--help"] else url, args, warmup, repeats)
        label = " ".join(args).replace(name, "NAME").replace(f" -o {reports}", "")
        page = reports / f"{name}.html" if args[0] == "report" else None
        timings.append(Timing(label, runs, page.stat().st_size / 1e6 if page else None))
    return timings


def goal(command: str, trials: int) -> float | None:
    goals = GOALS.get(command)
    if goals is None or trials not in (10_000, 100_000):
        return None
    return goals[0] if trials == 10_000 else goals[1]


def table(timings: list[Timing], trials: int) -> str:
    lines = ["| command | median | min | max | runs | page | goal | met |", "|---|---|---|---|---|---|---|---|"]
    for t in timings:
        wanted = goal(t.command, trials)
        met = "" if wanted is None else "yes" if t.median <= wanted else "**no**"
        if t.page_mb is not None and wanted is not None and t.page_mb > PAGE_GOAL_MB:
            met = "**no** (page)"
        page = f"{t.page_mb:.2f} MB" if t.page_mb is not None else ""
        lines.append(f"| `hpo {t.command}` | {t.median:.2f} s | {min(t.runs):.2f} s | {max(t.runs):.2f} s | "
                     f"{len(t.runs)} | {page} | {'' if wanted is None else f'<= {wanted:g} s'} | {met} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10_000, help="tuning trials of the experiment (default 10,000)")
    parser.add_argument("--db", help="database URL; default: SQLite in a temporary directory, removed afterwards")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per command (default 3; the median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per command first (default 1)")
    parser.add_argument("--json", type=Path, help="also write the timings here as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-commands-") as tmp:
        directory = Path(tmp)
        url = absolute(args.db) if args.db else f"sqlite:///{directory / 'hpo.db'}"
        name, _ = experiment_file(args.trials, directory)
        made_s = None
        if not has_experiment(url, name):
            print(f"storing {name} with `hpo run` ({args.trials:,} trials) ...", file=sys.stderr, flush=True)
            made_s = create(url, args.trials, directory)
        load_before = os.getloadavg()
        timings = measure(url, name, directory / "reports", args.warmup, args.repeats)
        load_after = os.getloadavg()
    made = f"`hpo run` took {made_s:.0f} s" if made_s is not None else "the database already held it"
    print(f"{name}: {args.trials:,} tuning trials, {url.split(':', 1)[0]} ({made}); {cpu_model()}, {os.cpu_count()} "
          f"cores, load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; median of {args.repeats} "
          f"runs after {args.warmup} warm-up")  # fmt: skip
    print(table(timings, args.trials))
    if args.json:
        rows = [asdict(t) | {"median": t.median} for t in timings]
        args.json.write_text(json.dumps({"trials": args.trials, "database": url.split(":", 1)[0], "made_s": made_s,
                                         "cpu": cpu_model(), "load": [load_before, load_after], "timings": rows},
                                        indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
