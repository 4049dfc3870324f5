"""Verdict calibration: how often does an ADAM-vs-LAMB experiment give a wrong answer, and how often an answer?

On the simulated cluster (`runner: simulated` over the learning-curve table, hpo/simulation/tables/curves.jsonl), the
whole `adam_vs_lamb_demo_cpu`-style experiment (5 tuning trials per arm, then confirmation runs of each arm's
best: a fixed number, or `auto` in rounds up to a cap) runs `--reps` times through the real control plane
(`hpo run`: Study, tuners, storage, verdict), each repetition with its own tuner seed and training seeds. Scenarios:

- `real`: the table's AdamW against its LAMB. The truth of an arm is its best configuration's truth (the mean of
  its samples to target over the table's seeds, misses scored by the experiment's penalty), found by a dense
  grid over the arm's space; the truly better arm is the one with the lower truth.
- `delay=D`: AdamW against "AdamW D samples later" (the second arm reads AdamW's curves, delayed by D samples:
  `runner.simulation.handicaps`), so AdamW is truly better by D samples; D = 0 is a true tie.

Counted per scenario: right (the verdict names the truly better arm; at a tie, "equivalent"), wrong winner (it
names the worse arm; at a tie, any winner), equivalent (when the arms truly differ), not yet; and the
confirmation runs per arm the experiment used. The rule allows at most 5 % of wrong winners.

The selected best tuning run: the verdict counts only confirmation runs. Each repetition is also judged with the
arm's best tuning run added to its evidence (`with selected`: the same `decide`, the same look), so the two
choices are compared on the same experiments.

    python -m bench.verdict_calibration --tuner random                      # 200 repetitions of each scenario
    python -m bench.verdict_calibration --tuner random --confirm auto --cap 12
    python -m bench.verdict_calibration --reps 20 --delays 0 2048           # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from bench.machine import cpu_model
from hpo.cli.main import main as hpo_main
from hpo.engine.local import experiment_verdict
from hpo.evidence.confirmations import look, stored_curves
from hpo.evidence.verdict import Outcome, arm_runs, decide, samples_between_evaluations
from hpo.experiment import spec_from_stored
from hpo.objective import objective_value
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import load_table
from hpo.storage import SqlStorage
from trainer.config import config_from_dict
from trainer.result import TrainResult, TrainStatus

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "hpo/simulation/tables/curves.jsonl"
WARMUPS = [0, 40]  # the warmups of the batch-32 table (TABLE); a large-batch table has one per batch size


def arm_ranges(table: Path, batch: int, lr: tuple[float, float] | None, handicap: dict | None = None) -> dict:
    """Each optimizer's learning-rate range: `lr` for both, else the table's grid range of that optimizer at `batch`
    (a large-batch table has one per optimizer and batch size). Under a handicap LAMB's trials read AdamW's curves,
    so both arms search AdamW's range."""
    if lr is not None:
        return {"adamw": tuple(lr), "lamb": tuple(lr)}
    loaded = _table(table)
    ranges = {}
    for optimizer in ("adamw", "lamb"):
        rates = [r for w in warmups(table, batch) for r in loaded.learning_rates(optimizer, w, batch)]
        ranges[optimizer] = (min(rates), max(rates))
    return {"adamw": ranges["adamw"], "lamb": ranges["adamw"]} if handicap else ranges


def warmups(table: Path, batch: int) -> list[int]:
    """The table's warmups at `batch` (0 and 40 at batch 32; a large-batch table has one per batch size)."""
    return [int(w) for w in _table(table).grid_values("schedule.warmup_steps", batch)]


@functools.cache
def _table(path: Path):
    return load_table(path)


def experiment(name: str, table: Path, tuner: str, seed: int, batch: int, lr: tuple[float, float] | None,
               trials: int, confirm: int | str, handicap: dict | None, cap: int | None = None,
               margin: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The experiment file of one repetition: the demo preset's budget on the table's dimensions at `batch` (its
    sample budget and evaluation interval there; each optimizer's learning rates over `arm_ranges`, one shared
    `optimizer.lr` where they are equal)."""
    loaded = _table(table)
    meta = loaded.meta["fixed"]
    ranges = arm_ranges(table, batch, lr, handicap)
    if ranges["adamw"] == ranges["lamb"]:
        rates = {"optimizer.lr": {"float": list(ranges["adamw"]), "log": True}}
    else:
        rates = {f"optimizer.lr@{o}": {"float": list(r), "log": True, "when": {"optimizer.name": o}}
                 for o, r in ranges.items()}  # fmt: skip
    return {
        "name": name,
        "base_config": str(ROOT / "trainer/configs/demo_cpu.yaml"),
        "overrides": {
            "seed": 1000 + seed,  # the training seeds of this repetition (tuning trials; confirmations go on)
            "budget.max_samples": loaded.max_samples_for(batch), "budget.max_time_s": None,
            "eval.every_samples": loaded.eval_every_for(batch), "eval.max_samples": meta.get("eval.max_samples", 512),
            "eval.target_mlm_accuracy": meta["eval.target_mlm_accuracy"],
            "batch.global_batch_size": batch, "batch.micro_batch_size": batch,
        },
        "space": {
            "optimizer.name": {"choice": ["adamw", "lamb"]},
            **rates,
            "schedule.warmup_steps": {"choice": warmups(table, batch)},
        },
        "compare": ["optimizer.name"],
        "tuner": {"name": tuner, "seed": seed},
        "budget": {"trials": trials, "confirm_seeds": confirm, "max_parallel": 1,
                   **({"max_confirm_seeds": cap} if cap and confirm == "auto" else {})},
        "resources": {"gpus_per_trial": 1},
        "runner": {"name": "simulated", "simulation": {"table": str(table), "handicaps": handicap or {}}},
        **({"verdict": {"margin": margin}} if margin else {}),
    }  # fmt: skip


def run_quietly(name: str, data: dict[str, Any], directory: Path, url: str) -> None:
    """`hpo run` of one experiment file (written into `directory`) in this process, its output swallowed."""
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(directory / "runs" / name)])
    if code != 0:
        raise SystemExit(f"{name}: hpo run failed (exit {code})")


def truth(surrogate: Surrogate, spec, optimizer: str, batch: int, lr: tuple[float, float], points: int = 241):
    """(the arm's best configuration's truth, that configuration): the mean objective over the table's seeds,
    over a dense grid of the arm's space."""
    cfg = config_from_dict(spec.resolved_base())
    best = (math.inf, None)
    for k in range(points):
        value = math.exp(math.log(lr[0]) + (math.log(lr[1]) - math.log(lr[0])) * k / (points - 1))
        for warmup in warmups(surrogate.table.path, batch):
            scores = [run_objective(spec, cfg, c)[0] for c in surrogate.curves(Config(optimizer, value, warmup, batch))]
            mean = sum(scores) / len(scores)
            if mean < best[0]:
                best = (mean, (value, warmup))
    return best


def run_objective(spec, cfg, curve) -> tuple[float, int | None]:
    """(the experiment's objective, samples to target or None) of a full-budget run that follows `curve`."""
    evals = curve.evaluations(cfg.eval.every_samples, cfg.budget.max_samples)
    hit = next((s for s, a in evals if a >= cfg.eval.target_mlm_accuracy), None)
    status = TrainStatus.DIVERGED if curve.diverged and hit is None else (
        TrainStatus.REACHED_TARGET if hit is not None else TrainStatus.BUDGET_EXHAUSTED)  # fmt: skip
    best_acc = max((a for _, a in evals), default=None)
    result = TrainResult(status, samples_to_target=hit, best_mlm_accuracy=best_acc)
    return objective_value(spec, result, cfg), hit


OUTCOMES = ("right", "wrong", "equivalent", "not_yet")


def judged(winner: str | None, outcome: Outcome, better: str | None) -> str:
    """right / wrong (a wrong winner) / equivalent (when the arms truly differ) / not_yet."""
    if outcome is Outcome.WINNER:
        return "right" if better is not None and winner == f"optimizer.name={better}" else "wrong"
    if outcome is Outcome.EQUIVALENT:
        return "right" if better is None else "equivalent"
    return "not_yet"


def with_selected(storage, record, spec) -> Outcome | tuple:
    """The verdict at the same look with each arm's best tuning run added to its evidence (as (outcome, winner))."""
    trials = storage.list_trials(record.id)
    best = storage.best_per_arm(record.id)
    curves = stored_curves(storage, trials) | {
        t.id: [(m.samples, m.value) for m in storage.get_metrics(t.id, "mlm_accuracy")] for t in best.values()
    }
    evidence = arm_runs(spec, best, trials, curves)
    cfg = {label: t for label, t in best.items()}
    added = []
    for arm in evidence:
        top = cfg.get(arm.label)
        if top is None or top.budget < 1.0 - 1e-9:
            added.append(arm)
            continue
        target = config_from_dict(spec.resolved_base()).eval.target_mlm_accuracy
        value = None if top.samples_to_target is None else samples_between_evaluations(
            curves[top.id], target, top.samples_to_target)  # fmt: skip
        added.append(replace(arm, samples_to_target=(value, *arm.samples_to_target)))
    at, looks = look(spec, trials)
    verdict = decide(added, spec.verdict.margin, at, looks)
    return verdict.outcome, verdict.winner


def compared_truth(spec, best: dict, args) -> str | None:
    """The truly better of the two configurations the verdict compared (each arm's best tuning trial): the lower
    geometric mean, over the table's recorded seeds, of samples to target between evaluations (a miss at the
    budget), the quantity the verdict estimates; None when they are equal (a true tie)."""
    handicaps = {k: (h.curves_of, h.delay_samples) for k, h in spec.runner.simulation.handicaps.items()}
    surrogate = Surrogate(load_table(args.table), handicaps)
    cfg = config_from_dict(spec.resolved_base())
    means = {}
    for label, top in best.items():
        values = spec.space.trainer_values(top.params)  # optimizer.lr@adamw -> optimizer.lr
        config = Config(values["optimizer.name"], values["optimizer.lr"], values["schedule.warmup_steps"], args.batch)
        logs = []
        for curve in surrogate.curves(config):
            evals = curve.evaluations(cfg.eval.every_samples, cfg.budget.max_samples)
            hit = next((s for s, a in evals if a >= cfg.eval.target_mlm_accuracy), None)
            value = cfg.budget.max_samples if hit is None else samples_between_evaluations(
                evals, cfg.eval.target_mlm_accuracy, hit)  # fmt: skip
            logs.append(math.log(value))
        means[label] = statistics.fmean(logs)
    (a, ma), (b, mb) = sorted(means.items())
    return None if math.isclose(ma, mb, rel_tol=1e-12) else (a if ma < mb else b).split("=")[1]


def run_scenario(label: str, handicap: dict | None, args, directory: Path) -> dict[str, Any]:
    url = f"sqlite:///{directory / f'{label}.db'}"
    counts = dict.fromkeys(OUTCOMES, 0)
    selected = dict.fromkeys(OUTCOMES, 0)
    configs = dict.fromkeys(OUTCOMES, 0)  # judged against the truth of the two configurations compared
    runs_per_arm = []
    started = time.perf_counter()
    better: Any = ...  # not known yet
    for rep in range(args.reps):
        name = f"{label}-{rep}".replace("=", "-")
        data = experiment(name, args.table, args.tuner, rep, args.batch, args.lr, args.trials, args.confirm, handicap,
                          args.cap, args.margin)  # fmt: skip
        run_quietly(name, data, directory, url)
        with SqlStorage(url) as storage:
            record = storage.get_experiment_by_name(name)
            spec = spec_from_stored(record)
            verdict = experiment_verdict(storage, record.id, spec)
            if better is ...:
                better = truly_better(spec, handicap, args)
            counts[judged(verdict.winner, verdict.outcome, better)] += 1
            best = storage.best_per_arm(record.id)
            if len(best) == 2:
                configs[judged(verdict.winner, verdict.outcome, compared_truth(spec, best, args))] += 1
            outcome, winner = with_selected(storage, record, spec)
            selected[judged(winner, outcome, better)] += 1
            runs_per_arm.append(statistics.fmean(a.runs for a in verdict.arms))
        if (rep + 1) % 20 == 0:
            print(f"  {label}: {rep + 1}/{args.reps} ({counts})", file=sys.stderr)
    return {"scenario": label, "reps": args.reps, **counts, "truly_better": better,
            "with_selected": selected, "against_the_configurations": configs,
            "confirmation_runs_per_arm": round(statistics.fmean(runs_per_arm), 2),
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def truly_better(spec, handicap: dict | None, args) -> str | None:
    """The arm that is truly better (None: a true tie)."""
    if handicap:
        return "adamw" if handicap["lamb"]["delay_samples"] > 0 else None
    surrogate = Surrogate(load_table(args.table))
    ranges = arm_ranges(args.table, args.batch, args.lr)
    adamw = truth(surrogate, spec, "adamw", args.batch, ranges["adamw"])
    lamb = truth(surrogate, spec, "lamb", args.batch, ranges["lamb"])
    print(f"  truth: adamw {adamw[0]:,.0f} at lr {adamw[1][0]:.3g} warmup {adamw[1][1]}; "
          f"lamb {lamb[0]:,.0f} at lr {lamb[1][0]:.3g} warmup {lamb[1][1]}", file=sys.stderr)  # fmt: skip
    return None if adamw[0] == lamb[0] else ("adamw" if adamw[0] < lamb[0] else "lamb")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict_calibration", description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--delays", type=int, nargs="*", default=[0, 1024, 2048, 4096])
    parser.add_argument("--no-real", action="store_true", help="skip the table's real AdamW-vs-LAMB pair")
    parser.add_argument("--tuner", default="smac_bo")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, nargs=2, default=None,
                        help="one learning-rate range for both optimizers (default: each optimizer's grid range at "
                        "--batch in the table; 3.16e-4 to 0.1 for both at batch 32)")  # fmt: skip
    parser.add_argument("--trials", type=int, default=10, help="tuning trials (both arms)")
    parser.add_argument("--confirm", type=_confirm, default=2, help="confirmation seeds per arm, or auto")
    parser.add_argument("--cap", type=int, default=None, help="max_confirm_seeds with --confirm auto (default 12)")
    parser.add_argument("--margin", type=float, default=None, help="verdict.margin (default 0.05)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    args.table = args.table.resolve()  # the experiment files live in a temporary directory
    scenarios: list[tuple[str, dict | None]] = [] if args.no_real else [("real", None)]
    scenarios += [(f"delay={d}", {"lamb": {"curves_of": "adamw", "delay_samples": d}}) for d in args.delays]
    rows = []
    scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None  # SQLite's syncs cost nothing in memory
    with tempfile.TemporaryDirectory(prefix="calibration-", dir=scratch) as tmp:
        for label, handicap in scenarios:
            rows.append(run_scenario(label, handicap, args, Path(tmp)))
    confirm = f"auto (cap {args.cap or 12})" if args.confirm == "auto" else args.confirm
    print(f"\n{args.tuner}, {args.trials} tuning trials, confirmation runs per arm: {confirm}, batch {args.batch}, "
          f"{args.reps} repetitions per scenario, CPU: {cpu_model()}\n")  # fmt: skip
    print("| scenario | truly better | right | wrong winner | equivalent (arms differ) | not yet | confirmation runs "
          "per arm (mean) | against the configurations compared: right / wrong winner | with the selected run: "
          "right / wrong winner | seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        n, sel, conf = r["reps"], r["with_selected"], r["against_the_configurations"]
        print(f"| {r['scenario']} | {r['truly_better'] or 'tie'} | {r['right'] / n:.1%} | {r['wrong'] / n:.1%} | "
              f"{r['equivalent'] / n:.1%} | {r['not_yet'] / n:.1%} | {r['confirmation_runs_per_arm']:.1f} | "
              f"{conf['right'] / n:.1%} / {conf['wrong'] / n:.1%} | {sel['right'] / n:.1%} / {sel['wrong'] / n:.1%} | "
              f"{r['seconds']:.0f} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


def _confirm(value: str) -> int | str:
    return value if value == "auto" else int(value)


if __name__ == "__main__":
    sys.exit(main())
