"""Controller overhead: N trials of a fixed-length dummy workload on S slots, through our local runner, our Dask
runner (a LocalCluster), our NNI engine (a real NNI manager on its local training service) and, side by side in
the same run, Optuna's `study.optimize(n_jobs=S)` on SQLite (twice: with the light process, and with the process
doing our trials' database work).

Everything but the trainer is real: the experiment spec, the tuner's ask/tell, trial rows created, processes
launched and polled (on this machine, or as Dask tasks), trials that claim and record themselves in SQLite,
results read back and told to the tuner. The workload is `bench.dummy_trial`: a process that ends `SECONDS`
after it was launched (recording its result in the database for our runners). Optuna runs the same process
per trial and records the value itself, in two ways: `optuna`, where the process only waits (about 0.05 s of CPU
to start), and `optuna-db`, where the process also does what a trial of ours does in the database (imports the
storage, about 0.2 s of CPU; creates, claims and finishes its trial in a database of its own), so that Optuna's
trials load the machine as ours do.

Under `nni`, the experiment is the same but for `engine: nni` and an NNI tuner (`--nni-tuner`, default
nni_random, no assessor): `hpo.nni.engine.run_nni` runs one NNI experiment per compare arm, one after the
other, and NNI's manager launches the dummy trial in place of the NNI trial entry. The trial takes its
parameters from NNI, creates and claims its row (worker `nni:<NNI trial id>`), records its result and reports
it to NNI as the final result; its launch time is taken by the shell NNI starts it in. The NNI managers'
start and stop count in the wall time.

Ideal time = the sum over the engine's rounds of SECONDS: ceil(N / S) x SECONDS, and under `nni` (arms one
after another) the sum of ceil(arm's trials / S) x SECONDS over the arms, the same when every arm's share is a
multiple of S. Overhead = wall / ideal - 1. Run it from the repository root (NNI runs its trials there).

    python -m bench.controller_overhead               # 200 x 1 s on 4 slots: local, dask, optuna, optuna-db
    python -m bench.controller_overhead --trials 40 --only local --only nni   # the NNI engine beside ours

With `--db URL` (a PostgreSQL database), our local and Dask runners record their trials there instead of in a
SQLite file of the run's own (each engine run adds one experiment to it); as under `hpo run`, the controller's
statements then have deadlines (`hpo.storage.deadline`; `--no-statement-deadlines` runs without them, to measure
their cost):

    python -m bench.controller_overhead --only local --db postgresql+psycopg://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpo.engine.study import Study
from hpo.experiment import experiment_from_dict, stored_form
from hpo.runners import build_runner
from hpo.storage import SqlStorage
from hpo.trial.launch import LaunchSpec, build_launch
from hpo.trials import TrialState


def dummy_launch(seconds: float):
    """A launch builder that runs bench.dummy_trial with the trial entry's arguments."""

    def build(spec: LaunchSpec, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        args = (*spec.entry_args, "--launched-at", repr(time.time()), "--seconds", str(seconds))
        return build_launch(dataclasses.replace(spec, module="bench.dummy_trial", entry_args=args), env)

    return build


REPO = Path(__file__).resolve().parent.parent
NNI_TUNERS = ("nni_random", "nni_tpe")


def experiment(trials: int, slots: int, runner: dict | None, tuner: dict | None = None, name: str = "overhead"):
    """The benchmark's experiment; `runner=None` with an NNI `tuner` makes it an `engine: nni` experiment."""
    data = {
        "name": name, "base_config": {}, "overrides": {"device": "cpu"},
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True},
                  "optimizer.name": {"choice": ["adamw", "lamb"]}},
        "compare": ["optimizer.name"], "tuner": tuner or {"name": "random", "seed": 0},
        "budget": {"trials": trials, "max_parallel": slots},
        "resources": {"gpus": "none", "cpu_slots": slots},
    }  # fmt: skip
    if runner is None:
        data["engine"] = "nni"
    else:
        data["runner"] = runner
    return experiment_from_dict(data, "overhead.yaml")


def dummy_nni_command(seconds: float):
    """A trial-command builder for `run_nni` that runs bench.dummy_trial with the NNI trial entry's arguments;
    the shell NNI starts it in stamps its launch time."""
    from hpo.nni.config import trial_command

    def build(db_url: str, experiment_id: int, arm: int, run_dir: Path, user_home: str) -> str:
        base = trial_command(experiment_id, arm, run_dir, user_home, module="bench.dummy_trial")
        return f'{base} --db {shlex.quote(db_url)} --seconds {seconds!r} --launched-at "$(date +%s.%N)"'

    return build


def nni_ideal(spec, slots: int, seconds: float) -> float:
    """The ideal time under the NNI engine: its arms run one after another, each on all slots."""
    from hpo.experiment.arms import arm_plans

    return sum(math.ceil(plan.quota / slots) for plan in arm_plans(spec)) * seconds


def run_nni(trials: int, slots: int, seconds: float, tuner: str, tmp: Path) -> tuple[float, int, float]:
    """The NNI engine on the dummy workload; returns wall time, completed trials and the ideal time."""
    from hpo.nni.engine import run_nni as run_nni_engine

    spec = experiment(trials, slots, None, {"name": tuner, "seed": 0, "options": {"assessor": "none"}})
    url = f"sqlite:///{tmp}/hpo-nni.db"
    storage = SqlStorage(url, upgrade=True)
    run_dir = tmp / "run-nni"
    eid = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    with contextlib.chdir(REPO):  # NNI runs each trial in the directory it was started from
        start = time.perf_counter()
        ending = run_nni_engine(spec, storage, eid, run_dir, url, port=18080, quiet=True,
                                command=dummy_nni_command(seconds))  # fmt: skip
        wall = time.perf_counter() - start
    if ending != "finished":
        print(f"   nni: the NNI engine ended {ending}; NNI's files are in {run_dir / 'nni'}", file=sys.stderr)
    return wall, storage.count_trials(eid, state=TrialState.COMPLETED), nni_ideal(spec, slots, seconds)


def run_ours(trials: int, slots: int, seconds: float, runner: dict, tmp: Path, db: str | None = None,
             deadlines: bool = True) -> tuple[float, int]:  # fmt: skip
    """Our runner on the dummy workload, recording in `db` (default: a SQLite file in `tmp`); on a database server
    with `deadlines`, the controller's statements have the deadlines `hpo run` gives them."""
    from hpo.storage.retry import writer_deadlines

    name = f"{runner['name']}-{'preload' if runner.get('preload', True) else 'exec'}"
    spec = experiment(trials, slots, runner, name=f"overhead-{name}-{time.time_ns()}" if db else "overhead")
    url = db or f"sqlite:///{tmp}/hpo-{name}.db"
    storage = SqlStorage(url, upgrade=True, deadlines=writer_deadlines() if db and deadlines else None)
    run_dir = tmp / f"run-{name}"
    eid = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    study = Study(spec, storage, eid, run_dir, build_runner(spec, launch_builder=dummy_launch(seconds)), url)
    start = time.perf_counter()
    study.run()
    wall = time.perf_counter() - start
    study.runner.close()
    done = storage.count_trials(eid, state=TrialState.COMPLETED)
    storage.close()
    return wall, done


def run_optuna(trials: int, slots: int, seconds: float, tmp: Path, record: bool = False) -> tuple[float, int]:
    """Optuna on the dummy workload; with `record`, each trial process also records itself in a database of ours
    (an experiment created here, outside the timed part)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name = "optuna-db" if record else "optuna"
    study = optuna.create_study(storage=f"sqlite:///{tmp}/{name}.db", sampler=optuna.samplers.RandomSampler(0))
    own = []
    if record:
        spec = experiment(trials, slots, {"name": "local"})
        url = f"sqlite:///{tmp}/hpo-{name}.db"
        storage = SqlStorage(url, upgrade=True)
        eid = storage.create_experiment(name, stored_form(spec, tmp / "run"), spec.direction)
        own = ["--db", url, "--experiment-id", str(eid)]

    def objective(trial) -> float:
        params = {"optimizer.lr": trial.suggest_float("optimizer.lr", 1e-4, 1e-2, log=True),
                  "optimizer.name": trial.suggest_categorical("optimizer.name", ["adamw", "lamb"])}  # fmt: skip
        cmd = [sys.executable, "-m", "bench.dummy_trial", "--launched-at", repr(time.time()), "--seconds", str(seconds)]
        if record:
            cmd += [*own, "--params", json.dumps(params)]
        subprocess.run(cmd, check=True)
        return 64.0

    start = time.perf_counter()
    study.optimize(objective, n_trials=trials, n_jobs=slots)
    wall = time.perf_counter() - start
    done = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    if record:  # and recorded by the trial processes themselves
        done = min(done, storage.count_trials(eid, state=TrialState.COMPLETED))
    return wall, done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=200, help="trials per engine")
    ap.add_argument("--slots", type=int, default=4, help="trials at once")
    ap.add_argument("--seconds", type=float, default=1.0, help="length of one dummy trial")
    ap.add_argument("--only", choices=["local", "dask", "local-exec", "dask-exec", "nni", "optuna", "optuna-db"],
                    action="append", help="run only these engines, in this order (default: local, dask, optuna, "
                    "optuna-db); -exec: that runner with runner.preload off (a new interpreter per trial)")  # fmt: skip
    ap.add_argument("--nni-tuner", choices=NNI_TUNERS, default="nni_random", help="the NNI engine's tuner")
    ap.add_argument("--db", help="a PostgreSQL database URL our local and Dask runners record in (default: a SQLite "
                    "file of each run's own)")  # fmt: skip
    ap.add_argument("--no-statement-deadlines", action="store_true",
                    help="with --db: the controller's statements without `hpo run`'s deadlines")  # fmt: skip
    args = ap.parse_args()
    engines = args.only or ["local", "dask", "optuna", "optuna-db"]
    ours_only = {"local", "dask", "local-exec", "dask-exec"}
    if args.db and (not args.db.startswith("postgresql") or set(engines) - ours_only):
        ap.error("--db takes a PostgreSQL URL (postgresql+psycopg://...) and runs our local and Dask runners only "
                 "(--only local, dask, local-exec, dask-exec)")  # fmt: skip
    ours = {"db": args.db, "deadlines": not args.no_statement_deadlines}
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            preload = not engine.endswith("-exec")
            ideal = math.ceil(args.trials / args.slots) * args.seconds
            if engine == "nni":
                wall, done, ideal = run_nni(args.trials, args.slots, args.seconds, args.nni_tuner, Path(tmp))
            elif engine in ("optuna", "optuna-db"):
                record = engine == "optuna-db"
                wall, done = run_optuna(args.trials, args.slots, args.seconds, Path(tmp), record)
            elif engine.startswith("dask"):
                from distributed import LocalCluster

                with LocalCluster(n_workers=2, threads_per_worker=args.slots // 2, processes=True,
                                  dashboard_address=None) as cluster:  # fmt: skip
                    runner = {"name": "dask", "scheduler": cluster.scheduler_address, "preload": preload}
                    wall, done = run_ours(args.trials, args.slots, args.seconds, runner, Path(tmp), **ours)
            else:
                runner = {"name": "local", "preload": preload}
                wall, done = run_ours(args.trials, args.slots, args.seconds, runner, Path(tmp), **ours)
            overhead = 100 * (wall / ideal - 1)
            print(f"{engine:>10}: {args.trials} trials x {args.seconds:g} s on {args.slots} slots: {done} completed, "
                  f"wall {wall:.2f} s, ideal {ideal:.2f} s, overhead {overhead:.1f} %", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
