"""`hpo`: run, resume and inspect experiments.

    hpo db upgrade                      create or migrate the database (HPO_DATABASE_URL, else ./.hpo/hpo.db)
    hpo run EXPERIMENT.yaml             run an experiment (the local engine) with a live progress display
    hpo resume NAME                     finish an experiment whose controller died or was stopped
    hpo plan EXPERIMENT.yaml [--slots N] [--gpus-per-slot G] [--repetitions R] [--seed S]
             [--gpu a100|h100 | --samples-per-s X]
             [--cv C --difference D | --like PILOT] [--power P] [--draws N] [--verdict-only]
                                        forecast GPU-hours, wall-clock and the chance of an answer: R simulated runs,
                                        each in a temporary database (the database is never written); with a spread,
                                        the verdict's chances over drawn confirmation runs and, with --power, the
                                        fewest confirmation runs per arm that reach that chance
    hpo status [NAME]                   experiments, or one experiment's trial counts and why trials wait
    hpo trials NAME [--state S] [--arm A] [--after N] [--limit L]
    hpo best NAME [--per-arm] [--arm A] [--batch-size N]
    hpo export NAME --format yaml|json|torchrun [--arm A] [--batch-size N] [--nodes N --gpus-per-node G] [-o FILE]
    hpo report NAME [NAME ...] [-o DIR] [--png DIR]  HTML report(s): verdict, curves, noise scale, importance
    hpo serve [--host 127.0.0.1] [--port 8000]   the REST API (HPO_API_HOST, HPO_API_PORT, HPO_API_TOKEN);
                                        a port in use exits 2 ("port N is in use")
    hpo webui NAME [--stop]             reopen an engine: nni experiment's NNI web UI, or close it
    hpo import mlperf PATH... --name NAME [--compare optimizer,global_batch_size] [--optimizer O] [--target ACC]
                                        MLPerf result files (result_*.txt) as an imported experiment, one trial per run
    hpo import rcp FILE [--name NAME]   mlperf-logging's RCP file (rcps_bert.json) as reference arms by batch size

Exit codes: 0 success, 1 the experiment ended badly, 2 bad input (file, name, arguments; nothing written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from hpo.errors import HpoError, NotFoundError, ResourceError, SchemaOutOfDateError, StorageError

# Each command imports what it uses when it runs, so `hpo status` or `hpo --help` does not load the study loop,
# SMAC, Dask, matplotlib, the server or the trainer's config models.
# --------------------------------------------------------------------------- storage


def open_storage(url: str | None, *, read_only: bool = False):
    """The storage at `url` (default: HPO_DATABASE_URL or the embedded SQLite file). A new embedded database is
    created at the current schema, except for read-only commands, which never create a file or directory."""
    from hpo.storage import SqlStorage, default_database_url

    url = url or default_database_url()
    path = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
    if path is not None and not path.exists():
        if read_only:
            raise HpoError(
                f"there is no database at {path}: no experiment has run with it; check --db / HPO_DATABASE_URL, "
                "or start one with `hpo run EXPERIMENT.yaml`"
            )
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
    from hpo.experiment import stored_form
    from hpo.local_engine import check_trial_data, describe_plan, drive
    from hpo.runners import build_runner
    from hpo.storage import default_database_url

    spec = _load_spec(args.experiment, args.engine)  # pure: a bad file writes nothing
    # resources are checked before anything is written (NNI's own training service places the nni engine's trials)
    if spec.engine == "nni" and (args.runner or args.scheduler):
        raise HpoError("--runner and --scheduler apply to engine: local; NNI's training service runs nni trials")
    if spec.engine == "nni":
        from hpo.nni.engine import preflight

        preflight()  # NNI installed and patched, before anything is written
    if _trials_run_here(spec, args.runner):
        check_trial_data(spec)  # data the trials could only fail on is refused before anything is written
    runner = build_runner(spec, args.runner, args.scheduler) if spec.engine == "local" else None
    try:
        url = args.db or default_database_url()
        if spec.engine == "nni":
            from hpo.nni.config import check_remote

            check_remote(spec, url)  # remote trials need a server database and an SSH key, before any write
        storage = open_storage(url)
        if _experiment_exists(storage, spec.name):
            existing = storage.get_experiment_by_name(spec.name)
            raise HpoError(
                f"experiment {spec.name!r} already exists (status {existing.status.value}); "
                f"use `hpo resume {spec.name}` to finish it, or change `name:` in {args.experiment}"
            )
    except BaseException:
        if runner is not None:
            runner.close()
        raise
    run_dir = Path(args.run_dir or Path("runs") / spec.name).resolve()
    if not args.quiet and runner is not None:
        print(describe_plan(spec, runner), file=sys.stderr)
    experiment_id = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    if spec.engine == "nni":
        from hpo.nni.engine import drive_nni

        return drive_nni(spec, storage, experiment_id, run_dir, url, args.quiet, port=args.port)
    return drive(spec, storage, experiment_id, run_dir, runner, url, args.quiet, resume=False)


def _trials_run_here(spec, runner: str | None) -> bool:
    """Whether the trials read this machine's files (the local runner, or NNI's local training service)."""
    if spec.engine == "nni":
        return not spec.resources.machines
    return (runner or spec.runner.name) == "local"


def _load_spec(path: str, engine: str | None):
    """The experiment file, validated as if it said `engine: ENGINE` when --engine is given."""
    from hpo.experiment import experiment_from_dict, load_experiment

    try:
        data = yaml.safe_load(Path(path).read_text()) if engine else None
    except (OSError, yaml.YAMLError):
        data = None
    if not isinstance(data, dict):
        return load_experiment(path)  # its errors name the file and what is wrong
    return experiment_from_dict({**data, "engine": engine}, path, base_dir=Path(path).parent)


def _experiment_exists(storage, name: str) -> bool:
    try:
        storage.get_experiment_by_name(name)
    except NotFoundError:
        return False
    return True


def cmd_resume(args: argparse.Namespace) -> int:
    from hpo.experiment import spec_from_stored
    from hpo.liveness import controller_identity, stale_after_s
    from hpo.local_engine import drive
    from hpo.runners import build_runner
    from hpo.storage import default_database_url

    url = args.db or default_database_url()
    storage = open_storage(url, read_only=True)
    record = storage.get_experiment_by_name(args.name)
    _refuse_imported(record, "resume")
    spec = spec_from_stored(record)
    host, pid = controller_identity()
    storage.claim_controller(record.id, host, pid, stale_after_s())  # refuses while another controller lives
    if spec.engine == "nni":
        from hpo.nni.engine import drive_nni

        return drive_nni(spec, storage, record.id, Path(record.spec["run_dir"]), url, args.quiet, resume=True,
                         port=args.port)  # fmt: skip
    runner = build_runner(spec, args.runner, args.scheduler)
    return drive(spec, storage, record.id, Path(record.spec["run_dir"]), runner, url, args.quiet, resume=True)


# --------------------------------------------------------------------------- plan


def cmd_plan(args: argparse.Namespace) -> int:
    from hpo.plan import PlanOptions

    _check_plan_options(args)
    if args.verdict_only:
        from hpo.experiment import load_experiment

        print("\n".join(_plan_chances(args, load_experiment(args.experiment))))  # a bad file: `hpo run`'s errors
        return 0
    options = PlanOptions(args.repetitions or 20, args.seed, args.slots, args.gpus_per_slot, args.gpu,
                          args.samples_per_s, args.difference)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="hpo-plan-") as scratch:
        return _plan(args, options, Path(scratch))


def _plan(args: argparse.Namespace, options, scratch: Path) -> int:
    import time
    from dataclasses import asdict, replace

    from hpo.plan import forecast_data, forecast_lines, prepare_plan, run_plan, trials_advice, trials_advice_lines

    curves = None
    if args.like:  # the pilot's curves, where they make a table that serves the file
        options, curves = _pilot_curves(args, options, scratch)
    try:
        plan = prepare_plan(args.experiment, options)  # a bad file: the errors `hpo run` gives; nothing is written
    except HpoError as e:
        if options.table is None:
            raise
        reason = str(e).removeprefix(f"{args.experiment}: ").replace(options.table, f"the pilot {args.like}'s table")
        curves = f"not used: they cannot serve {args.experiment}: {reason}"
        plan = prepare_plan(args.experiment, replace(options, table=None))
    chances = _plan_chances(args, plan.spec) if args.cv is not None or args.like else []  # a bad pilot: before the runs
    started = time.perf_counter()
    try:
        repetitions = run_plan(plan, progress=_plan_progress(options.repetitions), jobs=args.jobs or 1)
    except KeyboardInterrupt:
        print("\nplan interrupted; its temporary databases are deleted", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - started
    advice = []
    if args.power is not None and not chances and plan.spec.compare:  # --power alone: advice on tuning trials
        advice = trials_advice(plan, repetitions, jobs=args.jobs or 1, progress=_advice_progress())
    if args.json:
        data = forecast_data(plan, repetitions, seconds, args.like, curves) | ({"chances": chances} if chances else {})
        if args.like:
            data["pilot_curves"] = {"used": plan.options.table is not None, "note": curves}
        if advice:
            data["advice"] = [asdict(c) | {"reaches": c.right / c.repetitions >= args.power} for c in advice]
        print(json.dumps(data, indent=1))
        return 0
    lines = forecast_lines(plan, repetitions, seconds, pilot=args.like, curves=curves)
    extra = chances or (trials_advice_lines(advice, args.power, plan.spec.budget.confirm_seeds) if advice else [])
    print("\n".join(lines + ([""] + extra if extra else [])))
    return 0


def _pilot_curves(args: argparse.Namespace, options, scratch: Path):
    """(options planning over the pilot's curves as a table, what they are), or the options unchanged and why not."""
    from dataclasses import replace

    from hpo.pilot_table import PilotTableError, pilot_table, write_table

    storage = open_storage(args.db, read_only=True)  # read only: the pilot's trials and curves
    try:
        meta, runs = pilot_table(storage, args.like)
    except PilotTableError as e:
        return options, f"not used: {e}"
    finally:
        storage.close()
    if meta["fixed"]["eval.stop_at_target"]:
        return options, (f"not used: experiment {args.like} ran with eval.stop_at_target: true, so its curves end at "
                         "the target and blends between its learning rates would fall short of it; run the pilot with "
                         "eval.stop_at_target: false for curves to the full budget")  # fmt: skip
    path = scratch / f"{args.like}.jsonl"
    write_table(path, meta, runs)
    seeds = ", ".join(map(str, meta["grid"]["seed"]))
    return replace(options, table=str(path)), (f"the pilot {args.like}'s {len(runs)} runs (seeds {seeds}), as "
                                               f"`hpo table {args.like}` writes them")  # fmt: skip


def _advice_progress():
    def show(done: int, total: int) -> None:
        print(f"plan: advice {done}/{total} (tuning trials x confirmation cap) done", file=sys.stderr, flush=True)

    return show


def _check_plan_options(args: argparse.Namespace) -> None:
    """Refuse what `hpo plan` would ignore: the verdict's options without a spread, the cluster's without a run."""
    if args.cv is not None and args.difference is None:
        raise HpoError("--cv needs --difference: a stated spread is a coefficient of variation and the true "
                       "difference to find (e.g. --cv 5% --difference 10%; --difference 0 for a tie)")  # fmt: skip
    if args.like is not None and args.difference is not None:
        raise HpoError("--like takes the pilot's own difference; drop --difference (or state a spread with --cv)")
    if args.cv == 0 or args.power == 0:
        raise HpoError(f"--{'cv' if args.cv == 0 else 'power'} 0 means nothing here: give a fraction above 0 "
                       "(e.g. --cv 5% --power 80%)")  # fmt: skip
    spread = args.cv is not None or args.like is not None
    needing = [name for name, value in (("--draws", args.draws), ("--verdict-only", args.verdict_only or None))
               if value is not None]  # fmt: skip
    if needing and not spread:
        raise HpoError(f"{', '.join(needing)}: the verdict's chances need a spread: --cv and --difference, or --like "
                       "EXPERIMENT (a pilot in the database); --power alone advises on tuning trials")  # fmt: skip
    cluster = [name for name, value in (("--repetitions", args.repetitions), ("--jobs", args.jobs),
                                        ("--slots", args.slots),
                                        ("--gpus-per-slot", args.gpus_per_slot), ("--gpu", args.gpu),
                                        ("--samples-per-s", args.samples_per_s)) if value is not None]  # fmt: skip
    if args.verdict_only and args.json:
        raise HpoError("--json: the JSON is the simulated forecast's; --verdict-only prints only the verdict's chances")
    if args.verdict_only and cluster:
        raise HpoError(f"{', '.join(cluster)}: --verdict-only runs nothing on the simulated cluster; drop "
                       "--verdict-only to forecast the cost too")  # fmt: skip


def _plan_chances(args: argparse.Namespace, spec) -> list[str]:
    """The verdict's chances (and with --power the advice) at the stated spread or the pilot's."""
    from hpo.arms import arm_labels
    from hpo.plan_chances import DRAWS, chances_forecast, pilot_evidence, stated_evidence

    labels = arm_labels(spec)
    if args.like:
        storage = open_storage(args.db, read_only=True)  # read only: the pilot's trials and curves
        try:
            evidence = pilot_evidence(storage, args.like, labels)
        finally:
            storage.close()
    else:
        evidence = stated_evidence(labels, args.cv, args.difference)
    return chances_forecast(spec, evidence, args.draws or DRAWS, args.power, args.seed)


def _plan_progress(total: int):
    """A progress line on standard error: rewritten in place on a terminal, one line a repetition otherwise."""
    live = sys.stderr.isatty()

    def show(done: int, elapsed_s: float) -> None:
        left = elapsed_s / done * (total - done)
        line = f"plan: {done}/{total} repetitions, {elapsed_s:,.0f} s" + (f", about {left:,.0f} s left" if left else "")
        print(f"\r{line}\x1b[K" if live else line, end="\n" if done == total or not live else "", file=sys.stderr,
              flush=True)  # fmt: skip

    return show


# --------------------------------------------------------------------------- inspection


def cmd_webui(args: argparse.Namespace) -> int:
    from hpo.nni.engine import webui

    storage = open_storage(args.db, read_only=True)  # no new database; the web UI's address is stored
    return webui(storage.get_experiment_by_name(args.name), stop=args.stop, port=args.port, storage=storage)


def cmd_status(args: argparse.Namespace) -> int:
    from hpo.liveness import liveness
    from hpo.mlperf import imported, imported_line
    from hpo.progress import experiment_progress

    storage = open_storage(args.db, read_only=True)
    if not args.name:
        experiments = storage.list_experiments()
        if not experiments:
            print("no experiments yet; start one with `hpo run EXPERIMENT.yaml`")
        for e in experiments:
            print(f"{e.name:<32} {liveness(e):<11} {experiment_progress(storage, e)}{_last_seen(e)}")
        return 0
    record = storage.get_experiment_by_name(args.name)
    state = liveness(record)
    print(f"{record.name}: {state}{_last_seen(record)}" + (" (stop requested)" if record.stop_requested else ""))
    if imported(record):
        print(imported_line(imported(record)))
    counts = storage.count_trials_by_state(record.id)
    print("trials: " + (", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "none yet"))
    print(experiment_progress(storage, record))
    for line in _verdict_status(storage, record):
        print(line)
    simulated = _simulated_line(record, storage)
    if simulated:
        print(simulated)
    if state == "live" and record.controller_note:
        print(f"controller on {record.controller_host} (pid {record.controller_pid}): {record.controller_note}")
    if state == "interrupted":
        print(f"the controller stopped heartbeating; `hpo resume {record.name}` takes the experiment over")
    for trial in storage.list_trials(record.id, state=_state("running")):
        where = trial.worker or (f"gpus {','.join(map(str, trial.gpus))}" if trial.gpus else "cpu")
        print(f"  trial {trial.number} running on {where} (attempt {trial.attempt}, pid {trial.pid})")
    return 0


def _verdict_status(storage, record) -> list[str]:
    """Where a compare experiment's confirmations stand and what the verdict would be now."""
    from hpo.confirmations import round_line
    from hpo.experiment import spec_from_stored
    from hpo.local_engine import experiment_verdict

    try:
        spec = spec_from_stored(record)
    except HpoError:
        return []
    if not spec.compare:
        return []
    verdict = experiment_verdict(storage, record.id, spec)
    look = f" (look {verdict.look} of {verdict.looks})" if verdict.looks > 1 else ""
    return [round_line(spec, storage.list_trials(record.id)), f"verdict now{look}: {verdict.line}"]


def _simulated_line(record, storage) -> str | None:
    """What a simulated experiment cost (simulated GPU-hours and wall-clock); None for a real one."""
    from hpo.experiment import spec_from_stored
    from hpo.simulation.cost import simulated_line

    try:
        spec = spec_from_stored(record)
    except HpoError:
        return None
    return simulated_line(spec, storage.list_trials(record.id))


def _last_seen(record) -> str:
    from hpo.liveness import liveness

    if liveness(record) != "interrupted" or record.heartbeat_at is None:
        return ""
    return f" (controller {record.controller_host} pid {record.controller_pid} last seen " \
           f"{record.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC)"  # fmt: skip


def cmd_trials(args: argparse.Namespace) -> int:
    from hpo.trials import TrialKind

    if args.after is not None and args.offset:
        raise HpoError("--after and --offset do not combine: --after N starts after trial number N")
    storage = open_storage(args.db, read_only=True)
    record = storage.get_experiment_by_name(args.name)
    more = None if args.limit is None else args.limit + 1  # one trial more: whether another page follows
    trials = storage.list_trials(record.id, state=_state(args.state) if args.state else None, arm=args.arm,
                                 offset=args.offset, limit=more, after=args.after)  # fmt: skip
    next_page = trials[args.limit - 1].number if args.limit is not None and len(trials) > args.limit else None
    trials = trials[: args.limit]
    print(f"{'#':>4} {'state':<10} {'arm':<24} {'budget':>6} {'objective':>12} {'acc':>7}  reason / params")
    for t in trials:
        objective = f"{t.objective:,.4g}" if t.objective is not None else "-"
        acc = f"{t.best_mlm_accuracy:.4f}" if t.best_mlm_accuracy is not None else "-"
        detail = t.reason or json.dumps(t.params, default=str)
        if t.kind is not TrialKind.TUNING:  # a re-run of its arm's best configuration with another seed
            detail = f"{t.kind.value} (seed {t.seed}): {detail}"
        print(
            f"{t.number:>4} {t.state.value:<10} {t.arm or '-':<24} {t.budget:>6.2f} {objective:>12} {acc:>7}  {detail}"
        )
    if next_page is not None:
        print(f"more trials follow: --after {next_page} --limit {args.limit} shows the next page", file=sys.stderr)
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    storage = open_storage(args.db, read_only=True)
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
    verdict = _per_arm_verdict(storage, record) if args.per_arm else None
    for arm in verdict.arms if verdict else ():
        if arm.label in out:
            interval = [arm.low, arm.high] if arm.low is not None else None
            out[arm.label]["evidence"] = {"runs": arm.runs, "reached_target": arm.hits,
                                          "samples_to_target_mean": arm.mean, "interval_95": interval}  # fmt: skip
    if verdict:
        out["verdict"] = verdict.as_dict()
    print(yaml.safe_dump(out, sort_keys=False, allow_unicode=True), end="")
    if verdict:
        print(f"# verdict: {verdict.line}")
    return 0


def _per_arm_verdict(storage, record):
    """The verdict of a compare experiment (None without compare arms)."""
    from hpo.experiment import spec_from_stored
    from hpo.local_engine import experiment_verdict

    spec = spec_from_stored(record)
    return experiment_verdict(storage, record.id, spec) if spec.compare else None


def cmd_export(args: argparse.Namespace) -> int:
    from hpo.export import check_arm, render, stored_spec

    storage = open_storage(args.db, read_only=True)
    record = storage.get_experiment_by_name(args.name)
    spec = stored_spec(record)
    check_arm(spec, args.arm)
    trial = storage.best_trial(record.id, arm=args.arm, global_batch_size=args.batch_size)
    if trial is None:
        raise HpoError(f"experiment {args.name} has no completed trial to export; `hpo trials {args.name}` says why")
    exported = render(record, trial, args.format, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                      config_path=args.config_path or _config_file(args), spec=spec)  # fmt: skip
    for warning in exported.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not args.output:
        print(exported.text, end="")
        return 0
    Path(args.output).write_text(exported.text)
    print(f"wrote {args.format} of trial {trial.number} to {args.output}", file=sys.stderr)
    if args.format == "yaml":
        command = exported.text.split("# run: ", 1)[1].splitlines()[0]
        print(f"run it with: {command}", file=sys.stderr)
    return 0


def cmd_table(args: argparse.Namespace) -> int:
    from hpo.pilot_table import pilot_table, write_table

    out = Path(args.output)
    if out.exists():
        raise HpoError(f"{out}: exists; give -o a new file (hpo table never replaces one)")
    storage = open_storage(args.db, read_only=True)
    meta, runs = pilot_table(storage, args.name)
    write_table(out, meta, runs)
    points = {(r["optimizer"], r["warmup_steps"], r["global_batch_size"]) for r in runs}
    lrs = {(r["optimizer"], r["lr"]) for r in runs}
    print(f"wrote {len(runs)} runs of experiment {args.name} to {out}: {len(points)} point(s) of optimizer, warmup and "
          f"batch size, {len(lrs)} learning rate(s), seeds {', '.join(map(str, meta['grid']['seed']))}; plan over it "
          f"with `runner: {{name: simulated, simulation: {{table: {out}}}}}` or `hpo plan FILE --like {args.name}`",
          file=sys.stderr)  # fmt: skip
    return 0


def _config_file(args: argparse.Namespace) -> str:
    """The config file a torchrun command names: the YAML being written, else best.yaml."""
    return args.output if args.format == "yaml" and args.output else "best.yaml"


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
    hpo_command = "hpo" + (f" --db {shlex.quote(_safe_url(args.db))}" if args.db else "")
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


def cmd_import_mlperf(args: argparse.Namespace) -> int:
    from hpo.mlperf.importer import describe, plan_mlperf, write_plan
    from hpo.mlperf.logs import read_result_files, result_files

    runs = read_result_files(result_files(args.paths), args.optimizer)  # every file is read and checked first
    plan = plan_mlperf(runs, args.name, args.compare.split(","), args.target)
    written = write_plan(open_storage(args.db), plan)
    print("\n".join(describe(plan, written)))
    print(_after_import(args, plan.name))
    return 0


def cmd_import_rcp(args: argparse.Namespace) -> int:
    from hpo.mlperf.importer import describe, plan_rcp, write_plan
    from hpo.mlperf.rcp import read_rcp_file, ruleset
    from hpo.report.scaling import experiment_fits
    from hpo.report.text import fit_line

    records = read_rcp_file(args.file)
    name = args.name or "rcp-bert" + (f"-{ruleset(args.file).replace('.', '-')}" if ruleset(args.file) else "")
    plan = plan_rcp(records, args.file, name)
    storage = open_storage(args.db)
    written = write_plan(storage, plan)
    print("\n".join(describe(plan, written)))
    for series, fit in experiment_fits(storage, name).items() if written.added else ():  # the batch-size view's fit
        print(fit_line(series, fit))
    print(_after_import(args, name) + f"  # beside your experiments: hpo report YOURS... {name}")
    return 0


def _after_import(args: argparse.Namespace, name: str) -> str:
    import shlex

    hpo_command = "hpo" + (f" --db {shlex.quote(_safe_url(args.db))}" if args.db else "")
    return f"next: {hpo_command} status {name}; {hpo_command} best {name} --per-arm; {hpo_command} report {name}"


def _refuse_imported(record, action: str) -> None:
    from hpo.mlperf import imported

    if imported(record):
        raise HpoError(f"experiment {record.name} was imported (hpo import {imported(record).get('kind')}): there is "
                       f"nothing to {action}; its runs ran elsewhere")  # fmt: skip


def cmd_serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from server.app import serve
    from server.settings import Settings

    overrides = {"database_url": args.db, "api_host": args.host, "api_port": args.port}
    try:
        settings = Settings(**{key: value for key, value in overrides.items() if value is not None})
    except ValidationError as e:
        where = "; ".join(f"HPO_{str(err['loc'][0]).upper()}: {err['msg']}" for err in e.errors())
        raise HpoError(f"bad server settings ({where}); fix the environment variable or the flag") from None
    serve(settings)
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
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="db_command", required=True,
                                                                      metavar="upgrade")  # fmt: skip
    db.add_parser("upgrade", help="create or migrate the schema to the current version").set_defaults(fn=cmd_db_upgrade)
    run = sub.add_parser("run", help="run an experiment file (live progress; Ctrl-C stops, resume finishes)")
    run.add_argument("experiment", help="the experiment YAML file (see search_spaces/presets/)")
    run.add_argument("--run-dir", help="where trial configs, logs and checkpoints go (default runs/NAME)")
    run.add_argument("--engine", choices=["local", "nni"], help="override the file's engine (default: the file's)")
    run.add_argument("--port", type=_positive, default=8080, help="engine nni: first port tried for its web UI")
    _runner_options(run)
    run.add_argument("--quiet", action="store_true", help="no progress display and no summary")
    run.set_defaults(fn=cmd_run)
    resume = sub.add_parser("resume", help="finish an experiment whose controller died or was stopped")
    resume.add_argument("name", help="the experiment's name")
    resume.add_argument("--port", type=_positive, default=8080, help="engine nni: first port tried for its web UI")
    _runner_options(resume)
    resume.add_argument("--quiet", action="store_true", help="no progress display and no summary")
    resume.set_defaults(fn=cmd_resume)
    plan = sub.add_parser(
        "plan",
        help="forecast an experiment's GPU-hours, wall-clock and chance of an answer by "
        "running it R times on the simulated runner (never touches the database)",
    )
    plan.add_argument(
        "experiment",
        help="the experiment YAML file: runner: simulated, or a real one whose space the "
        "default learning-curve table (bench/curves/curves.jsonl) covers",
    )
    plan.add_argument(
        "--slots", type=_positive, help="slots of the simulated cluster (default: the file's budget.max_parallel)"
    )
    plan.add_argument(
        "--gpus-per-slot", type=_positive, help="GPUs per slot (default: the file's resources.gpus_per_trial)"
    )
    plan.add_argument("--repetitions", type=_positive, help="simulated runs of the file (default 20)")
    plan.add_argument(
        "--jobs",
        type=_positive,
        help="repetitions run at a time, in worker processes (default 1; the figures do not depend on it)",
    )
    plan.add_argument(
        "--json",
        action="store_true",
        help="print the forecast as JSON (figures with their ranges, outcomes with their intervals, the text lines; "
        "the verdict's chances as `chances` lines); not with --verdict-only",
    )
    plan.add_argument(
        "--seed",
        type=_non_negative,
        default=0,
        help="repetition r uses tuner seed file + SEED + r and training seed file + 1000 (SEED + r); the verdict's "
        "draws are seeded by it too (default 0)",
    )
    speed = plan.add_mutually_exclusive_group()
    speed.add_argument(
        "--gpu",
        choices=["a100", "h100"],
        help="the GPU whose samples/s set simulated durations (default: the file's runner.simulation, else a100)",
    )
    speed.add_argument(
        "--samples-per-s",
        type=_positive_float,
        metavar="X",
        help="one GPU's BERT-large samples per second instead of a --gpu's",
    )
    chances = plan.add_argument_group(
        "the verdict's chances from a spread",
        "draw the confirmation runs from a stated spread or a pilot experiment's and ask the verdict "
        "(hpo.verdict.decide) with the file's margin and confirmation budget: how often it names the right arm, "
        "says equivalent, not yet, or names a wrong one",
    )
    source = chances.add_mutually_exclusive_group()
    source.add_argument(
        "--cv",
        type=_fraction,
        metavar="C",
        help="a stated spread: every arm's samples to target log-normal with this coefficient of variation "
        "(0.05 or 5%%); with --difference",
    )
    source.add_argument(
        "--like",
        metavar="EXPERIMENT",
        help="the spread, hit rates and difference of this experiment in the database (a pilot; read only): its "
        "arms' confirmation runs (plus the best tuning run and its other seeds where fewer than 2), taken as the "
        "truth; and its curves, as `hpo table` writes them, where they serve the file (a grid pilot run with "
        "eval.stop_at_target: false), else the plan says why not",
    )
    chances.add_argument(
        "--difference",
        type=_fraction,
        metavar="D",
        help="the true difference, the file's first arm needing D fewer samples than the others (10%% or 0.1; 0: a "
        "tie): the simulated repetitions run at it (two arms comparing optimizers: the second reads the first's "
        "curves, delayed) and are judged against it; with --cv the verdict's chances too (default: the table's own "
        "truth)",
    )
    chances.add_argument(
        "--power",
        type=_fraction,
        metavar="P",
        help="advice for a right answer in at least P of experiments (0.8 or 80%%): with --cv/--like the fewest "
        "confirmation runs per arm (confirm_seeds 2 to 12; auto with max_confirm_seeds 6, 9, 12) and their runs per "
        "arm; alone, the file planned again at 0.5x and 2x its tuning trials (the same repetitions each): the "
        "fewest budget.trials whose right answers reach P, with its GPU-hours",
    )
    chances.add_argument(
        "--draws",
        type=_positive,
        metavar="N",
        help="drawn experiments per confirmation budget (default 2,000; about 1 ms a verdict)",
    )
    chances.add_argument(
        "--verdict-only",
        action="store_true",
        help="only the verdict's chances (and --power's advice): no simulated repetitions, no cost figures",
    )
    plan.set_defaults(fn=cmd_plan)
    status = sub.add_parser("status", help="experiments (live/interrupted/finished), or one experiment's progress")
    status.add_argument("name", nargs="?", help="the experiment's name (default: list all)")
    status.set_defaults(fn=cmd_status)
    trials = sub.add_parser("trials", help="list an experiment's trials")
    trials.add_argument("name", help="the experiment's name")
    trials.add_argument("--state", help="only trials in this state (queued, running, completed, failed, ...)")
    trials.add_argument("--arm", help="only trials of this arm, e.g. optimizer.name=lamb")
    trials.add_argument("--offset", type=_non_negative, default=0, help="skip this many trials (paging)")
    trials.add_argument("--after", type=_non_negative, metavar="N",
                        help="only trials numbered above N (paging by key: fast however deep)")  # fmt: skip
    trials.add_argument("--limit", type=_positive, help="show at most this many trials")
    trials.set_defaults(fn=cmd_trials)
    best = sub.add_parser("best", help="the best trial (overall, per arm, per batch size)")
    best.add_argument("name", help="the experiment's name")
    best.add_argument("--per-arm", action="store_true", help="the best trial of every arm, with the verdict")
    best.add_argument("--arm", help="only this arm, e.g. optimizer.name=lamb")
    best.add_argument("--batch-size", type=int, help="only trials with this global batch size")
    best.set_defaults(fn=cmd_best)
    export = sub.add_parser("export", help="the best trial as a complete trainer config or a torchrun command")
    export.add_argument("name", help="the experiment's name")
    export.add_argument("--format", choices=["yaml", "json", "torchrun"], default="yaml",
                        help="yaml: a trainer config (python -m trainer --config FILE runs it); json: provenance + "
                             "config; torchrun: the command line (default yaml)")  # fmt: skip
    export.add_argument("--arm", help="the best of this arm, e.g. optimizer.name=lamb (default: overall)")
    export.add_argument("--batch-size", type=int, help="the best trial with this global batch size")
    export.add_argument("--nodes", type=_positive, default=1, help="nodes of the production run (default 1)")
    export.add_argument("--gpus-per-node", type=_positive, default=1, help="GPUs (ranks) per node (default 1)")
    export.add_argument("-o", "--output", help="write to this file instead of standard output")
    export.add_argument("--config-path", help="the config file the torchrun command names (default: -o, else "
                                              "best.yaml)")  # fmt: skip
    export.set_defaults(fn=cmd_export)
    table = sub.add_parser("table", help="a pilot experiment's learning curves as a curve table (for hpo plan and "
                                         "runner: simulated)")  # fmt: skip
    table.add_argument("name", help="the experiment's name (read only)")
    table.add_argument("-o", "--output", required=True, help="the table file to write (JSON lines; must not exist)")
    table.set_defaults(fn=cmd_table)
    report = sub.add_parser("report", help="self-contained HTML comparison report(s); several names: compare.html too")
    report.add_argument("names", nargs="+", metavar="NAME",
                        help="the experiment(s); with several, compare.html plots samples to target and the noise "
                             "scale against global batch size per optimizer (e.g. the batch_scaling runs)")  # fmt: skip
    report.add_argument("-o", "--output", default="reports",
                        help="the directory for NAME.html (and compare.html); default ./reports")  # fmt: skip
    report.add_argument("--png", metavar="DIR", help="also write each figure of the report(s) as DIR/NAME-FIGURE.png "
                                                     "(for slides and papers)")  # fmt: skip
    report.set_defaults(fn=cmd_report)
    serve = sub.add_parser("serve", help="the REST API (FastAPI under uvicorn) over the database")
    serve.add_argument("--host", help="address to bind (default HPO_API_HOST, else 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=_positive,
                       help="port to listen on (default HPO_API_PORT, else 8000; busy: exit 2)")  # fmt: skip
    serve.set_defaults(fn=cmd_serve)
    webui = sub.add_parser("webui", help="reopen an engine: nni experiment's NNI web UI (view mode), or close it")
    webui.add_argument("name", help="the experiment's name")
    webui.add_argument("--stop", action="store_true", help="close the NNI web UI (stop its NNI managers)")
    webui.add_argument("--port", type=_positive, default=8080, help="first port tried for the web UI (default 8080)")
    webui.set_defaults(fn=cmd_webui)
    imports = sub.add_parser("import", help="read runs made elsewhere into an experiment (MLPerf results, RCPs)")
    kinds = imports.add_subparsers(dest="import_kind", required=True, metavar="mlperf|rcp")
    mlperf = kinds.add_parser("mlperf", help="MLPerf training result files as an experiment of finished trials")
    mlperf.add_argument("paths", nargs="+", metavar="PATH",
                        help="result files, or directories searched for result_*.txt (MLCommons' layout, or "
                             "what `log.mlperf` of our trainer wrote)")  # fmt: skip
    mlperf.add_argument("--name", required=True, help="the experiment's name (a second import of the same files "
                                                      "adds nothing)")  # fmt: skip
    mlperf.add_argument("--compare", default="optimizer,global_batch_size",
                        help="arms: comma-separated optimizer, global_batch_size, system, submitter "
                             "(default optimizer,global_batch_size)")  # fmt: skip
    mlperf.add_argument("--optimizer", choices=["adamw", "lamb"],
                        help="the optimizer of runs whose log names none (no opt_name, no optimizer option on a "
                             "logged command line); without it such a run is an error")  # fmt: skip
    mlperf.add_argument("--target", type=float, help="the target masked-LM accuracy the runs trained to (default: "
                                                     "the logged one, else MLPerf BERT's 0.720)")  # fmt: skip
    mlperf.set_defaults(fn=cmd_import_mlperf)
    rcp = kinds.add_parser("rcp", help="mlperf-logging's reference convergence points: arms by batch size")
    rcp.add_argument("file", help="an RCP file, e.g. mlperf_logging/rcp_checker/training_5.0.0/rcps_bert.json")
    rcp.add_argument("--name", help="the experiment's name (default rcp-bert-<ruleset>, from the file's folder)")
    rcp.set_defaults(fn=cmd_import_rcp)
    return parser


def _runner_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runner", choices=["local", "dask"], help="where trials run (default: the file's runner)")
    parser.add_argument("--scheduler", help="the Dask scheduler address for --runner dask, e.g. tcp://HOST:8786")


def _whole_number(minimum: int, wanted: str):
    """An argparse type: a whole number of at least `minimum`, else a message that says `wanted`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value}")
        return value

    return parse


_positive = _whole_number(1, "a positive whole number")
_non_negative = _whole_number(0, "a whole number >= 0")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _fraction(text: str) -> float:
    """`0.05` or `5%`: a number from 0 to below 1."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.05 or 5%, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction from 0 to below 1 (0.05 or 5%), got {text}")
    return value


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
    except ResourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except HpoError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# SMAC3 and ConfigSpace iterate over sets of strings, whose order follows Python's per-process hash seed: the
# same experiment and tuner seed would propose different trials in another process. A controller therefore
# runs with a fixed seed, which only an interpreter's start can set.
FIXED_HASH_SEED = "0"


def entry() -> None:
    """The `hpo` command: `main` in an interpreter whose hash seed is fixed (re-started once if it is not)."""
    if os.environ.get("PYTHONHASHSEED") != FIXED_HASH_SEED:
        env = {**os.environ, "PYTHONHASHSEED": FIXED_HASH_SEED}
        os.execve(sys.executable, [sys.executable, "-m", "hpo", *sys.argv[1:]], env)
    sys.exit(main())


if __name__ == "__main__":
    entry()
