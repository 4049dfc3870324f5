"""`hpo status`, `hpo trials` and `hpo best`: what the database says about experiments. They only read."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

from hpo.cli.common import check_stored_arm, given, non_negative, open_storage, parse_state, positive, wrong_batch_size
from hpo.errors import HpoError
from hpo.trials import objective_text


def cmd_status(args: argparse.Namespace) -> int:
    from hpo.engine.progress import experiment_progress
    from hpo.engine.settle import seen_status, unresponsive_why
    from hpo.mlperf import imported, imported_line
    from hpo.trials import TrialState

    storage = open_storage(args.db, read_only=True)
    if args.name is None:  # `hpo status ''` asks for an experiment named '', which there cannot be
        experiments = storage.list_experiments()
        if not experiments:
            print("no experiments yet; start one with `hpo run EXPERIMENT.yaml`")
        rows = [[e.name, seen_status(e), f"{experiment_progress(storage, e)}{_last_seen(e)}"] for e in experiments]
        for line in text_table(rows, widths=[32, 11]):
            print(line)
        return 0
    record = storage.get_experiment_by_name(args.name)
    state = seen_status(record)
    print(f"{record.name}: {state}{_last_seen(record)}" + (" (stop requested)" if record.stop_requested else ""))
    for line in _nni_webui_lines(record):  # engine: nni
        print(line)
    # Counts, progress, rounds, verdict and cost come from aggregates: a few queries however many trials it has.
    tallies = storage.tally_trials(record.id)
    if imported(record):
        held = sum(t.trials for t in tallies if t.state.finished)  # a run cut short mid-write is written again
        print(imported_line(imported(record), held))  # fewer where an import was cut short
    counts = {s: sum(t.trials for t in tallies if t.state is s) for s in TrialState}
    print("trials: " + (", ".join(f"{n} {s.value}" for s, n in counts.items() if n) or "none yet"))
    print(experiment_progress(storage, record, tallies))
    spec = _stored_spec(record)
    for line in _verdict_status(storage, record, spec, tallies):
        print(line)
    simulated = _simulated_line(storage, record, spec)
    if simulated:
        print(simulated)
    if state == "live" and record.controller_note:
        print(f"controller on {record.controller_host} (pid {record.controller_pid}): {record.controller_note}")
    if state == "interrupted" and imported(record):
        kind = imported(record).get("kind", "mlperf")
        print(f"the import stopped before it finished: run the same `hpo import {kind}` command again to finish it")
    elif state == "interrupted":
        print(f"the controller stopped heartbeating; `hpo resume {record.name}` takes the experiment over")
    elif state == "unresponsive":  # `hpo resume` here would refuse: its controller still runs on this machine
        why = unresponsive_why(record) or "it ended a moment ago: ask again"
        print(f"the controller stopped heartbeating but still runs on this machine (pid {record.controller_pid}): "
              f"{why}")  # fmt: skip
    elif state == "stopped":  # Ctrl-C, SIGTERM or the API's stop: its unfinished trials wait for the resume
        print(f"stopped before it finished; `hpo resume {record.name}` finishes the experiment")
    for trial in storage.list_trials(record.id, state=parse_state("running")):
        where = trial.worker or (f"gpus {','.join(map(str, trial.gpus))}" if trial.gpus else "cpu")
        print(f"  trial {trial.number} running on {where} (attempt {trial.attempt}, pid {trial.pid})")
    return 0


def _nni_webui_lines(record) -> list[str]:
    """engine: nni: where each arm's NNI web UI was last served, one line per arm: the address of its latest NNI
    experiment with that experiment's id, then the ids of the arm's earlier ones (a start a resume replaced, its
    tuning before its confirmation rounds), which `hpo webui` reopens too, with their own address where it is not
    the latest one's. The stored links are in the order the engine started them within each arm
    (`hpo.nni.jobs.record_webui`); none for engine: local."""
    arms: dict[str | None, list[dict[str, Any]]] = {}
    for link in record.nni_webui:
        if str(link.get("url", "")).startswith(("http://", "https://")):
            arms.setdefault(link.get("arm"), []).append(link)
    if not arms:
        return []
    lines = [f"NNI web UI, where last served (each answers while the experiment runs it; "
             f"`hpo webui {shlex.quote(record.name)}` reopens them all):"]  # fmt: skip
    for arm, links in arms.items():
        *earlier, latest = links
        said = f"NNI experiment {latest.get('nni_experiment', '?')}"
        if earlier:
            said += "; earlier: " + ", ".join(_earlier(link, latest["url"]) for link in earlier)
        lines.append(f"  {arm + ': ' if arm else ''}{latest['url']} ({said})")
    return lines


def _earlier(link: dict[str, Any], latest: str) -> str:
    """An arm's earlier NNI experiment as shown beside its latest one: its id, and where it was last served unless
    that is the latest one's address (the arms' NNI experiments run one after another, each on the first free port,
    so they share one until `hpo webui` serves each on its own): `:PORT` on the same host, else the address."""
    nni_id, url = link.get("nni_experiment", "?"), link["url"]
    if url == latest:
        return nni_id
    host, _, port = url.rpartition(":")
    return f"{nni_id} at {':' + port if host == latest.rpartition(':')[0] else url}"


def _stored_spec(record):
    """The experiment's stored spec; None where it no longer validates (status still shows the rest)."""
    from hpo.experiment import spec_from_stored

    try:
        return spec_from_stored(record)
    except HpoError:
        return None


def _verdict_status(storage, record, spec, tallies) -> list[str]:
    """Where a compare experiment's confirmations stand and what the verdict would be now."""
    from hpo.evidence.confirmations import batch_verdict_lines, round_line, shown_batch_verdicts, stored_evidence
    from hpo.evidence.verdict import Outcome
    from hpo.mlperf import IMPORT_VERDICT_NOTE, imported

    if spec is None or not spec.compare:
        return []
    evidence = stored_evidence(storage, record.id, tallies)
    verdict = evidence.verdict(spec)
    look = f" (look {verdict.look} of {verdict.looks})" if verdict.looks > 1 else ""
    note = [IMPORT_VERDICT_NOTE] if imported(record) and verdict.outcome is Outcome.NOT_YET else []
    return [round_line(spec, evidence.confirmations, evidence.best), f"verdict now{look}: {verdict.line}", *note,
            *batch_verdict_lines(spec, shown_batch_verdicts(spec, evidence))]  # fmt: skip


def _simulated_line(storage, record, spec) -> str | None:
    """What a simulated experiment cost (simulated GPU-hours and wall-clock); None for a real one."""
    from hpo.simulation.cost import simulated_line

    if spec is None or spec.runner.name != "simulated":
        return None
    return simulated_line(spec, storage.trial_span(record.id))


def _last_seen(record) -> str:
    from hpo.engine.liveness import liveness

    if liveness(record) != "interrupted" or record.heartbeat_at is None:  # unresponsive too: its claim is stale
        return ""
    seen = f"{record.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC"
    if record.controller_host is None:  # it ended (an error, a lost scheduler) without finishing the experiment
        return f" (its controller ended without finishing it; last seen {seen})"
    return f" (controller {record.controller_host} pid {record.controller_pid} last seen {seen})"


def cmd_trials(args: argparse.Namespace) -> int:
    from hpo.trials import TrialKind, TrialState

    if args.after is not None and args.offset:
        raise HpoError("--after and --offset do not combine: --after N starts after trial number N")
    storage = open_storage(args.db, read_only=True)
    record = storage.get_experiment_by_name(args.name)
    check_stored_arm(record, args.arm)  # an arm it does not have would list nothing
    more = None if args.limit is None else args.limit + 1  # one trial more: whether another page follows
    trials = storage.list_trials(record.id, state=parse_state(args.state) if args.state else None, arm=args.arm,
                                 offset=args.offset, limit=more, after=args.after)  # fmt: skip
    next_page = trials[args.limit - 1].number if args.limit is not None and len(trials) > args.limit else None
    trials = trials[: args.limit]
    spec = _stored_spec(record)
    to_target = spec is not None and spec.objective.metric in ("samples_to_target", "time_to_target_s")
    penalty = "; its objective is the penalty" if to_target else ""
    rows = [["#", "state", "arm", "budget", "objective", "acc", " reason / params"]]
    for t in trials:
        objective = objective_text(t.objective) if t.objective is not None else "-"
        acc = f"{t.best_mlm_accuracy:.4f}" if t.best_mlm_accuracy is not None else "-"
        detail = t.reason or json.dumps(t.params, default=str)
        if t.state is TrialState.COMPLETED and t.samples_to_target is None and not t.reason:
            detail = f"missed the target{penalty}: {detail}"  # it ended at its budget below the target accuracy
        if t.kind is not TrialKind.TUNING:  # a re-run of its arm's best configuration with another seed
            detail = f"{t.kind.value} (seed {t.seed}): {detail}"
        rows.append([str(t.number), t.state.value, t.arm or "-", f"{t.budget:.2f}", objective, acc, f" {detail}"])
    for line in text_table(rows, widths=[4, 10, 24, 6, 12, 7], right={0, 3, 4, 5}):
        print(line)
    if not trials:  # on standard error: the table stays a table for a script
        chosen = [f"in state {args.state}" if args.state else "", f"of arm {args.arm}" if args.arm else "",
                  "on this page" if args.offset or args.after is not None else ""]  # fmt: skip
        print(f"no trial {' '.join(c for c in chosen if c) or 'yet'}", file=sys.stderr)
    if next_page is not None:
        print(f"more trials follow: --after {next_page} --limit {args.limit} shows the next page", file=sys.stderr)
    return 0


def text_table(rows: list[list[str]], widths: list[int], right: set[int] = frozenset()) -> list[str]:
    """`rows` as lines of aligned columns, each at least its `widths` entry and as wide as its widest value (the
    columns in `right` right-aligned); the last column, free text, is not padded."""
    fitted = [max([width, *(len(row[i]) for row in rows)]) for i, width in enumerate(widths)]
    return [" ".join([*(row[i].rjust(w) if i in right else row[i].ljust(w) for i, w in enumerate(fitted)), row[-1]])
            for row in rows]  # fmt: skip


def _best_key(arm: str | None, batch_size: int | None) -> str:
    """What `hpo best` names its answer by: `overall`, the arm, the batch size (not "overall" for one batch size), or
    both."""
    at = f"batch.global_batch_size={batch_size}" if batch_size is not None else None
    return ", ".join(part for part in (arm, at) if part) or "overall"


def cmd_best(args: argparse.Namespace) -> int:
    import yaml

    if args.per_arm and (args.arm or args.batch_size):  # per arm is every arm's best at any batch size
        given = " and ".join(flag for flag, value in (("--arm", args.arm), ("--batch-size", args.batch_size)) if value)
        raise HpoError(f"--per-arm shows every arm's best trial and cannot be combined with {given}: drop --per-arm "
                       f"for the best trial {'of one arm' if args.arm else 'at one batch size'}")  # fmt: skip
    storage = open_storage(args.db, read_only=True)
    record = storage.get_experiment_by_name(args.name)
    check_stored_arm(record, args.arm)  # an arm it does not have would match nothing
    if args.per_arm:
        from hpo.experiment import spec_from_stored
        from hpo.experiment.arms import in_arm_order

        spec = spec_from_stored(record)
        if not spec.compare:
            raise HpoError(f"experiment {record.name} compares no arms (its file has no `compare:`): "
                           f"`hpo best {record.name}` shows its best trial")  # fmt: skip
        best = in_arm_order(spec, storage.best_per_arm(record.id))  # the file's order, as the verdict lists them
    else:
        trial = storage.best_trial(record.id, arm=args.arm, global_batch_size=args.batch_size)
        best = {_best_key(args.arm, args.batch_size): trial} if trial else {}
    if not best:
        wrong = None if args.per_arm else wrong_batch_size(storage, record, args.arm, args.batch_size, "to show")
        if wrong:  # completed trials at other batch sizes: --batch-size asked for one the experiment did not run
            raise HpoError(wrong)
        of_arm = f" of arm {args.arm}" if args.arm else ""  # nothing else is left to match: name what to read next
        from hpo.engine.progress import why_none_completed

        print(f"experiment {record.name} has no completed trial{of_arm}; "
              f"{why_none_completed(storage, record.id, record.name)}", file=sys.stderr)  # fmt: skip
        return 1
    out: dict[str, Any] = {
        arm: {"trial": t.number, "objective": t.objective, "samples_to_target": t.samples_to_target,
              "best_mlm_accuracy": t.best_mlm_accuracy, "params": t.params}
        for arm, t in best.items()
    }  # fmt: skip
    evidence = _evidence(storage, record, spec) if args.per_arm else None
    verdict = evidence.verdict(spec) if evidence is not None else None
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
        from hpo.evidence.confirmations import batch_verdict_lines, shown_batch_verdicts

        for line in batch_verdict_lines(spec, shown_batch_verdicts(spec, evidence)):
            print(f"# {line}")
    return 0


def _evidence(storage, record, spec):
    """The stored evidence of a compare experiment (None without compare arms)."""
    from hpo.evidence.confirmations import stored_evidence

    return stored_evidence(storage, record.id) if spec.compare else None


def add_status(sub) -> None:
    """`hpo status`."""
    status = sub.add_parser("status", help="experiments (live/interrupted/finished), or one experiment's progress")
    status.add_argument("name", nargs="?", help="the experiment's name (default: list all)")
    status.set_defaults(fn=cmd_status)


def add_trials(sub) -> None:
    """`hpo trials`."""
    trials = sub.add_parser("trials", help="list an experiment's trials")
    trials.add_argument("name", help="the experiment's name")
    trials.add_argument(
        "--state",
        type=given("a trial state"),
        help="only trials in this state (queued, running, completed, failed, ...)",
    )
    trials.add_argument("--arm", help="only trials of this arm, e.g. optimizer.name=lamb")
    trials.add_argument("--offset", type=non_negative, default=0, help="skip this many trials (paging)")
    trials.add_argument("--after", type=non_negative, metavar="N",
                        help="only trials numbered above N (paging by key: fast however deep)")  # fmt: skip
    trials.add_argument("--limit", type=positive, help="show at most this many trials")
    trials.set_defaults(fn=cmd_trials)


def add_best(sub) -> None:
    """`hpo best`."""
    best = sub.add_parser("best", help="the best trial (overall, per arm, per batch size)")
    best.add_argument("name", help="the experiment's name")
    best.add_argument(
        "--per-arm",
        action="store_true",
        help="the best trial of every arm, with the verdict (not with --arm or --batch-size)",
    )
    best.add_argument("--arm", help="only this arm, e.g. optimizer.name=lamb")
    best.add_argument("--batch-size", type=positive, help="only trials with this global batch size")
    best.set_defaults(fn=cmd_best)
