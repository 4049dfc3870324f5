"""`hpo`: run, resume and inspect experiments.

    hpo db upgrade                      create or migrate the database (HPO_DATABASE_URL, else ./.hpo/hpo.db)
    hpo run EXPERIMENT.yaml             run an experiment (the local engine) with a live progress display
    hpo resume NAME                     finish an experiment whose controller died or was stopped
    hpo status [NAME]                   experiments, or one experiment's trial counts and why trials wait
    hpo trials NAME [--state S] [--arm A]
    hpo best NAME [--per-arm] [--arm A] [--batch-size N]

Exit codes: 0 success, 1 the experiment ended badly, 2 bad input (file, name, arguments; nothing written).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from hpo.errors import HpoError, NotFoundError, SchemaOutOfDateError, StorageError

# --------------------------------------------------------------------------- storage


def open_storage(url: str | None):
    """The storage at `url` (default: HPO_DATABASE_URL or the embedded SQLite file, created on first use)."""
    from hpo.storage import SqlStorage, default_database_url

    url = url or default_database_url()
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return SqlStorage(url, upgrade=True)  # a new embedded database starts at the current schema
    return SqlStorage(url)


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from hpo.storage import current_revision, default_database_url, upgrade_database

    url = args.db or default_database_url()
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    upgrade_database(url)
    print(f"database {_safe_url(url)} is at revision {current_revision(url)}")
    return 0


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


# --------------------------------------------------------------------------- run / resume


def cmd_run(args: argparse.Namespace) -> int:
    from hpo.experiment import load_experiment

    spec = load_experiment(args.experiment)  # pure: a bad file writes nothing
    if spec.engine != "local":
        raise HpoError(f"{args.experiment}: engine: {spec.engine} is not available yet; use engine: local")
    storage = open_storage(args.db)
    run_dir = Path(args.run_dir or Path("runs") / spec.name).resolve()
    try:
        existing = storage.get_experiment_by_name(spec.name)
    except NotFoundError:
        existing = None
    if existing is not None:
        raise HpoError(
            f"experiment {spec.name!r} already exists (status {existing.status.value}); "
            f"use `hpo resume {spec.name}` to finish it, or change `name:` in {args.experiment}"
        )
    stored = {"experiment": spec.self_contained(), "run_dir": str(run_dir)}
    experiment_id = storage.create_experiment(spec.name, stored, spec.direction)
    return drive(spec, storage, experiment_id, run_dir, args.quiet, resume=False)


def cmd_resume(args: argparse.Namespace) -> int:
    from hpo.experiment import experiment_from_dict
    from hpo.storage import ExperimentStatus

    storage = open_storage(args.db)
    record = storage.get_experiment_by_name(args.name)
    spec = experiment_from_dict(record.spec["experiment"], f"experiment {args.name} (stored)")
    storage.set_experiment_status(record.id, ExperimentStatus.RUNNING)
    return drive(spec, storage, record.id, Path(record.spec["run_dir"]), args.quiet, resume=True)


def drive(spec, storage, experiment_id: int, run_dir: Path, quiet: bool, resume: bool) -> int:
    """Run the study loop and leave the experiment with its final status."""
    from hpo.progress import Progress
    from hpo.storage import ExperimentStatus
    from hpo.study import Study

    run_dir.mkdir(parents=True, exist_ok=True)
    study = Study(spec, storage, experiment_id, run_dir, Progress(quiet=quiet))
    if resume:
        study.restore()
    try:
        status = study.run()
    except KeyboardInterrupt:
        study._stop_all("interrupted by the user (Ctrl-C)")
        storage.set_experiment_status(experiment_id, ExperimentStatus.STOPPED)
        print(f"stopped; `hpo resume {spec.name}` finishes the experiment", file=sys.stderr)
        return 1
    storage.set_experiment_status(experiment_id, status)
    if not quiet:
        print_summary(storage, experiment_id, spec)
    return 0 if status == ExperimentStatus.FINISHED else 1


def print_summary(storage, experiment_id: int, spec) -> None:
    counts = storage.count_trials_by_state(experiment_id)
    print(f"\nexperiment {spec.name}: " + ", ".join(f"{n} {s.value}" for s, n in counts.items() if n))
    best = storage.best_per_arm(experiment_id) if spec.compare else {}
    overall = storage.best_trial(experiment_id)
    for arm, trial in sorted(best.items()):
        print(f"\nbest for {arm}: trial {trial.number}, {_describe(trial, spec)}")
        print(_indent(yaml.safe_dump(trial.params, sort_keys=False)))
    if not best and overall is not None:
        print(f"\nbest: trial {overall.number}, {_describe(overall, spec)}")
        print(_indent(yaml.safe_dump(overall.params, sort_keys=False)))
    if overall is None:
        print("no trial completed; `hpo trials " + spec.name + "` shows why")
        return
    run_dir = Path(storage.get_experiment(experiment_id).spec["run_dir"])
    config = run_dir / "trials" / f"{overall.number:05d}" / "trial.yaml"
    print("next:")
    print(f"  hpo trials {spec.name}                 # every trial, with its state, reason and objective")
    print(f"  hpo best {spec.name} --per-arm         # the winners again, as YAML")
    print(f"  python -m trainer --config {config} budget.max_time_s=null budget.max_samples=...   # train the best")


def _describe(trial, spec) -> str:
    parts = [f"{spec.objective.metric} {trial.objective:,.6g}"]
    if trial.samples_to_target is None and spec.objective.metric in ("samples_to_target", "time_to_target_s"):
        parts.append("(target not reached: penalized)")
    if trial.best_mlm_accuracy is not None:
        parts.append(f"best mlm_accuracy {trial.best_mlm_accuracy:.4f}")
    return ", ".join(parts)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines())


# --------------------------------------------------------------------------- inspection


def cmd_status(args: argparse.Namespace) -> int:
    storage = open_storage(args.db)
    if not args.name:
        experiments = storage.list_experiments()
        if not experiments:
            print("no experiments yet; start one with `hpo run EXPERIMENT.yaml`")
        for e in experiments:
            counts = storage.count_trials_by_state(e.id)
            done = sum(n for s, n in counts.items() if s.finished)
            print(f"{e.name:<32} {e.status.value:<9} {done}/{e.spec['experiment']['budget']['trials']} trials done")
        return 0
    record = storage.get_experiment_by_name(args.name)
    print(f"{record.name}: {record.status.value}" + (" (stop requested)" if record.stop_requested else ""))
    counts = storage.count_trials_by_state(record.id)
    print("trials: " + ", ".join(f"{n} {s.value}" for s, n in counts.items() if n))
    status_file = Path(record.spec["run_dir"]) / "status.json"
    if status_file.exists():
        live = json.loads(status_file.read_text())
        age = time.time() - live["time"]
        print(f"controller (as of {age:.0f} s ago): {live['line']}")
        if live.get("waiting"):
            print(f"waiting trials: {live['waiting']}")
    for trial in storage.list_trials(record.id, state=_state("running")):
        where = f"gpus {','.join(map(str, trial.gpus))}" if trial.gpus else "cpu"
        print(f"  trial {trial.number} running on {where} (pid {trial.pid})")
    return 0


def cmd_trials(args: argparse.Namespace) -> int:
    storage = open_storage(args.db)
    record = storage.get_experiment_by_name(args.name)
    trials = storage.list_trials(record.id, state=_state(args.state) if args.state else None, arm=args.arm,
                                 offset=args.offset, limit=args.limit)  # fmt: skip
    print(f"{'#':>4} {'state':<10} {'arm':<24} {'budget':>6} {'objective':>12} {'acc':>7}  reason / params")
    for t in trials:
        objective = f"{t.objective:,.4g}" if t.objective is not None else "-"
        acc = f"{t.best_mlm_accuracy:.4f}" if t.best_mlm_accuracy is not None else "-"
        detail = t.reason or json.dumps(t.params, default=str)
        print(
            f"{t.number:>4} {t.state.value:<10} {t.arm or '-':<24} {t.budget:>6.2f} {objective:>12} {acc:>7}  {detail}"
        )
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    storage = open_storage(args.db)
    record = storage.get_experiment_by_name(args.name)
    if args.per_arm:
        best = {arm: t for arm, t in storage.best_per_arm(record.id).items()}
    else:
        trial = storage.best_trial(record.id, arm=args.arm, global_batch_size=args.batch_size)
        best = {args.arm or "overall": trial} if trial else {}
    if not best:
        print("no completed trial matches", file=sys.stderr)
        return 1
    out: dict[str, Any] = {
        arm: {"trial": t.number, "objective": t.objective, "samples_to_target": t.samples_to_target,
              "best_mlm_accuracy": t.best_mlm_accuracy, "params": t.params}
        for arm, t in best.items()
    }  # fmt: skip
    print(yaml.safe_dump(out, sort_keys=False), end="")
    return 0


def _state(name: str):
    from hpo.trials import TrialState

    try:
        return TrialState(name)
    except ValueError:
        raise HpoError(f"--state {name!r} is not a trial state; use one of {[s.value for s in TrialState]}") from None


# --------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpo", description="HPO for large-batch BERT optimizers.")
    parser.add_argument("--db", help="database URL (default: HPO_DATABASE_URL, else sqlite:///.hpo/hpo.db)")
    sub = parser.add_subparsers(dest="command", required=True)
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="db_command", required=True)
    db.add_parser("upgrade", help="create or migrate the schema to the current version").set_defaults(fn=cmd_db_upgrade)
    run = sub.add_parser("run", help="run an experiment file")
    run.add_argument("experiment")
    run.add_argument("--run-dir", help="where trial configs, logs and checkpoints go (default runs/NAME)")
    run.add_argument("--quiet", action="store_true")
    run.set_defaults(fn=cmd_run)
    resume = sub.add_parser("resume", help="finish an interrupted experiment")
    resume.add_argument("name")
    resume.add_argument("--quiet", action="store_true")
    resume.set_defaults(fn=cmd_resume)
    status = sub.add_parser("status", help="experiments, or one experiment's progress")
    status.add_argument("name", nargs="?")
    status.set_defaults(fn=cmd_status)
    trials = sub.add_parser("trials", help="list an experiment's trials")
    trials.add_argument("name")
    trials.add_argument("--state")
    trials.add_argument("--arm")
    trials.add_argument("--offset", type=int, default=0)
    trials.add_argument("--limit", type=int)
    trials.set_defaults(fn=cmd_trials)
    best = sub.add_parser("best", help="the best trial (overall, per arm, per batch size)")
    best.add_argument("name")
    best.add_argument("--per-arm", action="store_true")
    best.add_argument("--arm")
    best.add_argument("--batch-size", type=int)
    best.set_defaults(fn=cmd_best)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except SchemaOutOfDateError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except NotFoundError as e:
        print(f"error: {e}; `hpo status` lists the experiments", file=sys.stderr)
        return 2
    except StorageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except HpoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
