"""Repeated database outages during a simulated experiment: how many are survived, what is lost or recorded twice,
and how much time they cost beyond their own length.

A throw-away PostgreSQL cluster (tests/pgcluster.py: initdb, pg_ctl on a free port; as the `postgres` user when
run as root) holds two databases. In each, `hpo run` runs the same experiment: the adam_vs_lamb_simulated preset's
table, space and arms with random search (seed 0), `--trials` trials (default 200) at most `--slots` at a time on
the simulated runner, no confirmation runs. The first runs undisturbed (`--clean-runs` times; the median wall time
counts). During the second, the cluster is stopped with `pg_ctl stop -m immediate` (every connection cut, as a
crash) `--outages` times, each for a duration drawn uniformly from [`--min-s`, `--max-s`] seconds, each once a
drawn number of trials has finished (drawn uniformly from 5 % to 90 % of the trials); every draw comes from
`--seed`. The controller waits with the default bound (database.outage_s, 600 s).

Reported:
- outages survived: outages after which `hpo run` was still running when the database came back, and the run
  then completed (exit 0);
- trials lost: trials of the undisturbed run missing from the disturbed one, unfinished, or with another state,
  objective or samples to target (the simulated runner is deterministic: the same trials give the same results);
- duplicates: trial numbers stored twice, metric values stored twice (same trial, name, step and samples), and
  trials whose number of metric values differs from the undisturbed run's;
- time lost: the disturbed run's wall time, less the undisturbed median, less the time the database was down (from
  the end of each stop to the end of its start), in total and per outage: the time to notice the database is back
  (the retry's pauses, at most 5 s) and to go on.

    python -m bench.outage                                   # 200 trials, 10 outages of 5-30 s, seed 0
    python -m bench.outage --trials 200 --outages 5 --min-s 5 --max-s 15 --out outage.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from sqlalchemy import create_engine, text

from bench.machine import cpu_model
from tests.pgcluster import PostgresCluster, why_no_cluster

REPO = Path(__file__).resolve().parent.parent
PRESET = REPO / "search_spaces" / "presets" / "adam_vs_lamb_simulated.yaml"
NAME = "outage_bench"


@dataclass
class Outage:
    after_trials: int  # it began once this many trials had finished
    planned_s: float
    down_s: float = 0.0  # measured: from the end of the stop to the end of the start
    finished_at_start: int = 0  # trials finished when it began
    controller_alive: bool = False  # `hpo run` still running when the database was back


@dataclass
class Result:
    trials: int
    slots: int
    seed: int
    clean_wall_s: list[float]
    outage_wall_s: float = 0.0
    exit_code: int | None = None
    outages: list[Outage] = field(default_factory=list)
    trials_lost: int = 0
    duplicate_trials: int = 0
    duplicate_metric_values: int = 0
    trials_with_other_metric_counts: int = 0
    unreachable_lines: int = 0
    load_before: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)
    cpu: str = ""

    @property
    def down_s(self) -> float:
        return sum(o.down_s for o in self.outages)

    @property
    def time_lost_s(self) -> float:
        return self.outage_wall_s - statistics.median(self.clean_wall_s) - self.down_s


def experiment_file(directory: Path, trials: int, slots: int) -> Path:
    """The preset with random search, `trials` trials, `slots` at a time, no confirmations."""
    spec = yaml.safe_load(PRESET.read_text())
    spec.update(name=NAME, base_config=str((PRESET.parent / spec["base_config"]).resolve()),
                tuner={"name": "random", "seed": 0})  # fmt: skip
    spec["budget"] = {"trials": trials, "max_parallel": slots}
    path = directory / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def create_database(cluster: PostgresCluster, name: str) -> str:
    admin = create_engine(cluster.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return cluster.url.rsplit("/", 1)[0] + f"/{name}"


def hpo(url: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "hpo", "--db", url, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def run_clean(url: str, path: Path, run_dir: Path) -> float:
    subprocess.run([sys.executable, "-m", "hpo", "--db", url, "db", "upgrade"], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    started = time.monotonic()
    process = hpo(url, "run", str(path), "--run-dir", str(run_dir))
    output, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"the undisturbed run failed:\n{output[-3000:]}")
    return time.monotonic() - started


def finished_trials(engine) -> int:
    unfinished = "('queued', 'running', 'interrupted')"
    with engine.connect() as connection:
        return connection.execute(text(f"SELECT COUNT(*) FROM trials WHERE state NOT IN {unfinished}")).scalar_one()


def disturb(cluster: PostgresCluster, url: str, outages: list[Outage], process: subprocess.Popen) -> None:
    """Stop the cluster for each outage once its number of trials has finished (the monitor's thread)."""
    engine = create_engine(url, pool_pre_ping=True)
    try:
        for outage in outages:
            while process.poll() is None:
                try:
                    done = finished_trials(engine)
                except Exception:  # noqa: BLE001 - the tables are not there yet
                    done = -1
                if done >= outage.after_trials:
                    break
                time.sleep(0.05)
            if process.poll() is not None:
                return
            engine.dispose()
            outage.finished_at_start = done
            cluster.stop()
            stopped = time.monotonic()
            time.sleep(outage.planned_s)
            cluster.start()
            outage.down_s = time.monotonic() - stopped
            outage.controller_alive = process.poll() is None
    finally:
        engine.dispose()


def compare(clean_url: str, outage_url: str, result: Result) -> None:
    """Trials lost and values stored twice, the disturbed run against the undisturbed one."""
    query = text("SELECT t.number, t.state, t.objective, t.samples_to_target, COUNT(m.id) FROM trials t "
                 "LEFT JOIN trial_metrics m ON m.trial_id = t.id GROUP BY t.id ORDER BY t.number")  # fmt: skip
    repeats = text("SELECT COUNT(*) FROM (SELECT trial_id FROM trial_metrics GROUP BY trial_id, name, step, samples "
                   "HAVING COUNT(*) > 1) r")  # fmt: skip
    rows = {}
    for name, url in (("clean", clean_url), ("outage", outage_url)):
        engine = create_engine(url)
        with engine.connect() as connection:
            rows[name] = connection.execute(query).all()
            if name == "outage":
                result.duplicate_metric_values = connection.execute(repeats).scalar_one()
        engine.dispose()
    numbers = [row[0] for row in rows["outage"]]
    result.duplicate_trials = len(numbers) - len(set(numbers))
    outage = {row[0]: row for row in rows["outage"]}
    for row in rows["clean"]:
        other = outage.get(row[0])
        if other is None or tuple(other[1:4]) != tuple(row[1:4]) or other[1] in ("queued", "running"):
            result.trials_lost += 1
        elif other[4] != row[4]:
            result.trials_with_other_metric_counts += 1


def run(args: argparse.Namespace) -> Result:
    rng = random.Random(args.seed)
    low, high = max(1, round(0.05 * args.trials)), max(1, round(0.9 * args.trials))
    afters = sorted(rng.randint(low, high) for _ in range(args.outages))
    planned = [Outage(after, round(rng.uniform(args.min_s, args.max_s), 1)) for after in afters]
    result = Result(args.trials, args.slots, args.seed, [], outages=planned, cpu=cpu_model(),
                    load_before=os.getloadavg())  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hpo-outage-") as scratch, PostgresCluster.create() as cluster:
        directory = Path(scratch)
        path = experiment_file(directory, args.trials, args.slots)
        for i in range(args.clean_runs):
            url = create_database(cluster, f"clean{i}")
            result.clean_wall_s.append(run_clean(url, path, directory / f"clean{i}"))
        clean_url = url
        outage_url = create_database(cluster, "outage")
        subprocess.run([sys.executable, "-m", "hpo", "--db", outage_url, "db", "upgrade"], cwd=REPO, check=True,
                       capture_output=True)  # fmt: skip
        started = time.monotonic()
        process = hpo(outage_url, "run", str(path), "--run-dir", str(directory / "outage"))
        monitor = threading.Thread(target=disturb, args=(cluster, outage_url, planned, process), daemon=True)
        monitor.start()
        output, _ = process.communicate()
        result.outage_wall_s = time.monotonic() - started
        monitor.join()
        if not cluster.running():
            cluster.start()
        result.exit_code = process.returncode
        result.unreachable_lines = output.count("database unreachable for")
        result.outages = [o for o in planned if o.down_s > 0]
        compare(clean_url, outage_url, result)
        if process.returncode != 0:
            print(output[-3000:], file=sys.stderr)
    result.load_after = os.getloadavg()
    return result


def report(result: Result) -> str:
    survived = sum(o.controller_alive for o in result.outages) if result.exit_code == 0 else 0
    per = result.time_lost_s / len(result.outages) if result.outages else 0.0
    each = ", ".join(f"{o.down_s:.1f} s after {o.finished_at_start}" for o in result.outages)
    lines = [
        f"{result.trials} simulated trials, {result.slots} at a time, seed {result.seed}; {result.cpu}; "
        f"load average {result.load_before[0]:.2f} before, {result.load_after[0]:.2f} after",
        f"outages: {len(result.outages)} (down for, after so many finished trials: {each})",
        f"outages survived: {survived} of {len(result.outages)} (exit code {result.exit_code})",
        f"trials lost: {result.trials_lost}; duplicate trials: {result.duplicate_trials}; duplicate metric values: "
        f"{result.duplicate_metric_values}; trials with another number of metric values: "
        f"{result.trials_with_other_metric_counts}",
        f"wall: undisturbed {statistics.median(result.clean_wall_s):.1f} s (median of {len(result.clean_wall_s)}), "
        f"with outages {result.outage_wall_s:.1f} s, database down {result.down_s:.1f} s",
        f"time lost beyond the outages: {result.time_lost_s:.1f} s in total, {per:.1f} s per outage",
        f"progress lines saying the database is unreachable: {result.unreachable_lines}",
    ]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--outages", type=int, default=10)
    parser.add_argument("--min-s", type=float, default=5.0)
    parser.add_argument("--max-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clean-runs", type=int, default=3, help="undisturbed runs (their median wall time counts)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    reason = why_no_cluster()
    if reason:
        raise SystemExit(f"cannot start a throw-away PostgreSQL cluster: {reason}")
    result = run(args)
    print(report(result))
    if args.out:
        data = {**asdict(result), "time_lost_s": result.time_lost_s, "down_s": result.down_s}
        args.out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
