"""`hpo plan` and `hpo table`: forecasts on the simulated runner, and a pilot's curves as a curve table. Both only
read the database."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from hpo.cli.common import (
    check_output_file,
    fraction,
    given,
    note_unread_namesake,
    open_storage,
    positive,
    positive_float,
    whole_number,
)
from hpo.errors import HpoError
from hpo.limits import MAX_DRAWS, MAX_PROCESSES, MAX_REPETITIONS, MAX_SLOTS

MAX_PLAN_SEED = 2**31 - 1  # with a file's tuner.seed and the repetition added, a seed must stay below 2**32


def cmd_plan(args: argparse.Namespace) -> int:
    from hpo.experiment import load_experiment

    _check_plan_options(args)
    note_unread_namesake(args.experiment)
    spec = load_experiment(args.experiment)  # a bad file: `hpo run`'s errors, before the forecast's modules load
    from hpo.plan.forecast import PlanOptions

    if args.verdict_only:
        from hpo.plan.chances import chances_lines

        chances = _plan_chances(args, spec)
        print("\n".join(chances_lines(chances)))
        return 0
    options = PlanOptions(args.repetitions or 20, args.seed, args.slots, args.gpus_per_slot, args.gpu,
                          args.samples_per_s, args.difference)  # fmt: skip
    try:
        with _stop_once(), tempfile.TemporaryDirectory(prefix=f"hpo-plan-{os.getpid()}-") as scratch:
            return _plan(args, options, Path(scratch))
    except Terminated:  # after the with: the workers have ended and the temporary files are deleted
        print("\nplan terminated (SIGTERM); its temporary databases are deleted", file=sys.stderr)
        return 128 + signal.SIGTERM


class Terminated(BaseException):
    """SIGTERM during a plan (`kill`, `timeout`, the REST API's deadline): raised as Ctrl-C raises KeyboardInterrupt,
    so that the plan unwinds (its workers end, its temporary files are deleted) where the signal's default action
    would end the process at once and leave them."""


@contextlib.contextmanager
def _stop_once():
    """Ctrl-C (SIGINT) or SIGTERM stops the plan once: the first raises (KeyboardInterrupt, Terminated) and any
    later one (a key pressed twice; `timeout`, which signals the command and then its process group) is ignored
    while the worker processes end and the temporary files are deleted, which it would otherwise cut short. A signal
    the plan started with ignored or handled (Ctrl-C in a script's background job) is left as it was.

    A worker process forked from the plan (`hpo.plan.forecast`) inherits this handler until it sets its own; there
    a SIGTERM (`timeout`'s to the process group) ends it as SIGTERM's default action does, and Ctrl-C is left to the
    plan, which ends its workers. The handler once set SIG_IGN after the first signal, and a worker forked after that
    ignored SIGTERM; one forked before raised Terminated and printed a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    caught = [sig for sig, default in defaults.items() if signal.getsignal(sig) is default]
    plan_pid, stopped = os.getpid(), False

    def stop(signum, frame) -> None:
        nonlocal stopped
        if os.getpid() != plan_pid:  # a worker before its own handlers
            if signum == signal.SIGTERM:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
            return
        if not stopped:  # later signals are ignored while the plan ends its workers and deletes its files
            stopped = True
            raise KeyboardInterrupt if signum == signal.SIGINT else Terminated

    previous = {sig: signal.signal(sig, stop) for sig in caught}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _plan(args: argparse.Namespace, options, scratch: Path) -> int:
    import time
    from dataclasses import replace

    from hpo.plan.advice import advice_data, check_advice_seeds, trials_advice, trials_advice_lines
    from hpo.plan.chances import chances_data, chances_lines
    from hpo.plan.forecast import forecast_data, forecast_lines, prepare_plan, run_plan

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
    if args.cv is not None or args.like:  # of the file's arms (a file moved onto a table may read other batch sizes)
        from hpo.experiment import load_experiment

        chances = _plan_chances(args, load_experiment(args.experiment))  # a bad pilot: before the runs
    else:
        chances = None
    advising = args.power is not None and chances is None and plan.spec.compare  # --power alone: trials advice
    if advising:
        check_advice_seeds(plan)  # its cells' confirmation caps, before any repetition runs
    jobs = _capped_jobs(args.jobs)
    started = time.perf_counter()
    try:
        repetitions = run_plan(plan, progress=_plan_progress(options.repetitions), jobs=jobs)
    except KeyboardInterrupt:
        print("\nplan interrupted; its temporary databases are deleted", file=sys.stderr)
        return 130
    seconds = time.perf_counter() - started
    advice = []
    if advising:
        advice = trials_advice(plan, repetitions, jobs=jobs, progress=_advice_progress())
    if args.json:
        data = forecast_data(plan, repetitions, seconds, args.like, curves)
        if chances is not None:
            data["chances"] = chances_data(chances)
        if args.like:
            data["pilot_curves"] = {"used": plan.options.table is not None, "note": curves}
        if advice:
            data["advice"] = advice_data(advice, args.power)
        print(json.dumps(data, indent=1))
        return 0
    lines = forecast_lines(plan, repetitions, seconds, pilot=args.like, curves=curves)
    if chances is not None:
        extra = chances_lines(chances)
    else:
        extra = trials_advice_lines(advice, args.power, plan.spec.budget.confirm_seeds,
                                    bool(plan.batch_truths)) if advice else []  # fmt: skip
    print("\n".join(lines + ([""] + extra if extra else [])))
    return 0


def _pilot_curves(args: argparse.Namespace, options, scratch: Path):
    """(options planning over the pilot's curves as a table, what they are), or the options unchanged and why not."""
    from dataclasses import replace

    from hpo.plan.pilot_table import PilotTableError, pilot_table, unfinished, write_table

    storage = _pilot_storage(args)
    try:
        why = unfinished(storage.get_experiment_by_name(args.like))
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
    so_far = f" that ended so far (it has not finished; {why})" if why else ""
    return replace(options, table=str(path)), (f"the pilot {args.like}'s {len(runs)} runs{so_far} (seeds {seeds}), as "
                                               f"`hpo table {args.like}` writes them")  # fmt: skip


def _pilot_storage(args: argparse.Namespace):
    """The database, read only, holding the pilot `--like` names: the error names the option where it has none."""
    from hpo.errors import NotFoundError

    storage = open_storage(args.db, read_only=True)  # read only: the pilot's trials and curves
    try:
        storage.get_experiment_by_name(args.like)
    except NotFoundError as e:
        storage.close()
        raise NotFoundError(f"--like {args.like}: {e}") from None
    return storage


def _capped_jobs(jobs: int | None) -> int:
    """--jobs (default 1), at most the CPUs this process may run on: more workers than CPUs only take turns on
    them, each holding a repetition's memory. A line on standard error says where it is capped."""
    from hpo.runners.resources import usable_cores

    cpus = usable_cores()
    if jobs is None or jobs <= cpus:
        return jobs or 1
    print(f"plan: --jobs {jobs} is more than the {cpus} CPU(s) this process may use; running {cpus} repetitions at "
          "a time", file=sys.stderr)  # fmt: skip
    return cpus


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


def _plan_chances(args: argparse.Namespace, spec):
    """The verdict's chances (and with --power the advice) at the stated spread or the pilot's; a batch-size study's
    at each batch size (a `hpo.plan.chances.ChancesForecast`)."""
    from hpo.experiment.arms import arm_labels
    from hpo.plan.chances import (
        DRAWS,
        batch_places,
        chances_forecast,
        pilot_evidence,
        stated_batch_evidence,
        stated_evidence,
    )

    labels, places = arm_labels(spec), batch_places(spec)
    if args.like:
        storage = _pilot_storage(args)
        try:
            evidence = pilot_evidence(storage, args.like, labels, places)
        finally:
            storage.close()
    elif places is not None:
        evidence = stated_batch_evidence(places, args.cv, args.difference)
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


def cmd_table(args: argparse.Namespace) -> int:
    from hpo.plan.pilot_table import pilot_table, unfinished, write_table

    out = Path(args.output)
    check_output_file(out)  # a directory, or a file in a directory that is not there: before the database is read
    if out.exists() or out.is_symlink():
        raise HpoError(f"-o {out}: exists; give -o a new file (hpo table never replaces one)")
    storage = open_storage(args.db, read_only=True)
    meta, runs = pilot_table(storage, args.name)
    write_table(out, meta, runs)
    points = {(r["optimizer"], r["warmup_steps"], r["global_batch_size"]) for r in runs}
    lrs = {(r["optimizer"], r["lr"]) for r in runs}
    print(f"wrote {len(runs)} runs of experiment {args.name} to {out}: {len(points)} point(s) of optimizer, warmup and "
          f"batch size, {len(lrs)} learning rate(s), seeds {', '.join(map(str, meta['grid']['seed']))}; plan over it "
          f"with `runner: {{name: simulated, simulation: {{table: {out}}}}}` or `hpo plan FILE --like {args.name}`",
          file=sys.stderr)  # fmt: skip
    if meta["fixed"].get("eval.stop_at_target"):  # its curves end at the target, where blends fall short
        print(f"note: experiment {args.name} stopped its runs at the target (eval.stop_at_target: true), so their "
              "curves end there: `hpo plan --like` does not plan over them, and a simulated run between two of its "
              "learning rates falls short of the target; for a table, run the pilot with eval.stop_at_target: false "
              "(the documentation's Planning page, A pilot's curves)", file=sys.stderr)  # fmt: skip
    why = unfinished(storage.get_experiment_by_name(args.name))
    if why:  # a table of the runs that ended so far: another later holds more
        print(f"note: experiment {args.name} has not finished, so the table holds only the runs that ended so far; "
              f"{why}, then write the table again", file=sys.stderr)  # fmt: skip
    return 0


def add_plan(sub) -> None:
    """`hpo plan`."""
    plan = sub.add_parser(
        "plan",
        help="forecast an experiment's GPU-hours, wall-clock and chance of an answer by "
        "running it R times on the simulated runner (never touches the database)",
    )
    plan.add_argument(
        "experiment",
        help="the experiment YAML file or a shipped preset's name (`hpo presets`): runner: simulated, or a real "
        "one whose space and budgets the shipped learning-curve tables (hpo/simulation/tables/) cover, batch size "
        "by batch size (else --like a pilot)",
    )
    plan.add_argument(
        "--slots",
        type=whole_number(1, f"a whole number of slots from 1 to {MAX_SLOTS:,}", maximum=MAX_SLOTS),
        help="slots of the simulated cluster (default: the file's budget.max_parallel)",
    )
    plan.add_argument(
        "--gpus-per-slot",
        type=whole_number(1, f"a whole number of GPUs from 1 to {MAX_PROCESSES:,}", maximum=MAX_PROCESSES),
        help="GPUs per slot (default: the file's resources.gpus_per_trial)",
    )
    plan.add_argument(
        "--repetitions",
        type=whole_number(1, f"a whole number of repetitions from 1 to {MAX_REPETITIONS:,}", maximum=MAX_REPETITIONS),
        help=f"simulated runs of the file (default 20, at most {MAX_REPETITIONS:,})",
    )
    plan.add_argument(
        "--jobs",
        type=positive,
        help="repetitions run at a time, in worker processes (default 1, at most the CPUs this process may use; the "
        "figures do not depend on it)",
    )
    plan.add_argument(
        "--json",
        action="store_true",
        help="print the forecast as JSON (figures with their ranges, outcomes with their intervals, the text lines; "
        "with --cv/--like the verdict's chances as `chances`: counts, shares and intervals); not with --verdict-only",
    )
    plan.add_argument(
        "--seed",
        type=whole_number(
            0,
            f"a whole number from 0 to {MAX_PLAN_SEED} (the tuner seeds file + SEED + r stay seeds)",
            maximum=MAX_PLAN_SEED,
        ),  # fmt: skip
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
        type=positive_float,
        metavar="X",
        help="one GPU's BERT-large samples per second instead of a --gpu's",
    )
    chances = plan.add_argument_group(
        "the verdict's chances from a spread",
        "draw the confirmation runs from a stated spread or a pilot experiment's and ask the verdict "
        "(hpo.evidence.verdict.decide) with the file's margin and confirmation budget: how often it names the right "
        "arm, "
        "says equivalent, not yet, or names a wrong one",
    )
    source = chances.add_mutually_exclusive_group()
    source.add_argument(
        "--cv",
        type=fraction,
        metavar="C",
        help="a stated spread: every arm's samples to target log-normal with this coefficient of variation "
        "(0.05 or 5%%); with --difference",
    )
    source.add_argument(
        "--like",
        metavar="EXPERIMENT",
        type=given("an experiment's name", default=False),
        help="the spread, hit rates and difference of this experiment in the database (a pilot; read only): its "
        "arms' confirmation runs (plus the best tuning run and its other seeds where fewer than 2), taken as the "
        "truth; and its curves, as `hpo table` writes them, where they serve the file (a grid pilot run with "
        "eval.stop_at_target: false), else the plan says why not",
    )
    chances.add_argument(
        "--difference",
        type=fraction,
        metavar="D",
        help="the true difference, the file's first arm needing D fewer samples than the others (10%% or 0.1; 0: a "
        "tie): the simulated repetitions run at it (two arms comparing optimizers: the second reads the first's "
        "curves, delayed) and are judged against it; with --cv the verdict's chances too (default: the table's own "
        "truth)",
    )
    chances.add_argument(
        "--power",
        type=fraction,
        metavar="P",
        help="advice for a right answer in at least P of experiments (0.8 or 80%%): with --cv/--like the fewest "
        "confirmation runs per arm (confirm_seeds 2 to 12; auto with max_confirm_seeds 6, 9, 12) and their runs per "
        "arm; alone, the file planned at 0.5x, 1x and 2x its tuning trials (with confirm_seeds: auto, each at "
        "max_confirm_seeds 6, 9 and 12; the same repetitions each): the fewest budget.trials whose right answers "
        "reach P, with its GPU-hours",
    )
    chances.add_argument(
        "--draws",
        type=whole_number(1, f"a whole number of draws from 1 to {MAX_DRAWS:,}", maximum=MAX_DRAWS),
        metavar="N",
        help="drawn experiments per confirmation budget (default 2,000; about 1 ms a verdict)",
    )
    chances.add_argument(
        "--verdict-only",
        action="store_true",
        help="only the verdict's chances (and --power's advice): no simulated repetitions, no cost figures",
    )
    plan.set_defaults(fn=cmd_plan)


def add_table(sub) -> None:
    """`hpo table`."""
    table = sub.add_parser("table", help="a pilot experiment's learning curves as a curve table (for hpo plan and "
                                         "runner: simulated)")  # fmt: skip
    table.add_argument(
        "name", type=given("an experiment's name", default=False), help="the experiment's name (read only)"
    )
    table.add_argument("-o", "--output", required=True, type=given("a file to write", default=False),
                       help="the table file to write (JSON lines; must not exist)")  # fmt: skip
    table.set_defaults(fn=cmd_table)
