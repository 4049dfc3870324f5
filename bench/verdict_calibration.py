"""Verdict calibration: how often does an ADAM-vs-LAMB experiment name the wrong winner?

On the simulated cluster (`runner: simulated` over the learning-curve table, bench/curves/curves.jsonl), the
whole `adam_vs_lamb_demo_cpu`-style experiment (5 tuning trials per arm + 2 confirmation seeds of each arm's
best, the preset's tuner) runs `--reps` times through the real control plane (`hpo run`: Study, tuners, storage,
verdict), each repetition with its own tuner seed and training seeds. Scenarios:

- `real`: the table's AdamW against its LAMB. The truth of an arm is its best configuration's truth (the mean of
  its samples to target over the table's seeds, misses scored by the experiment's penalty), found by a dense
  grid over the arm's space; the truly better arm is the one with the lower truth.
- `delay=D`: AdamW against "AdamW D samples later" (the second arm reads AdamW's curves, delayed by D samples:
  `runner.simulation.handicaps`), so AdamW is truly better by D samples; D = 0 is a true tie.

Counted per scenario: right (the verdict names the truly better arm), wrong (it names the worse one; at a tie,
any winner is wrong), no winner. A 95 % interval suggests a wrong-winner rate of at most 5 %.

    python -m bench.verdict_calibration                               # 200 repetitions of each scenario
    python -m bench.verdict_calibration --reps 20 --delays 0 2048     # a quick look
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from hpo.cli import main as hpo_main
from hpo.experiment import spec_from_stored
from hpo.local_engine import experiment_verdict
from hpo.objective import objective_value
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import load_table
from hpo.storage import SqlStorage
from trainer.config import config_from_dict
from trainer.result import TrainResult, TrainStatus

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "bench/curves/curves.jsonl"
WARMUPS = [0, 40]


def experiment(name: str, table: Path, tuner: str, seed: int, batch: int, lr: tuple[float, float], trials: int,
               confirm: int, handicap: dict | None) -> dict[str, Any]:  # fmt: skip
    """The experiment file of one repetition: the demo preset's budget on the table's dimensions."""
    meta = load_table(table).meta["fixed"]
    return {
        "name": name,
        "base_config": str(ROOT / "trainer/configs/demo_cpu.yaml"),
        "overrides": {
            "seed": 1000 + seed,  # the training seeds of this repetition (tuning trials; confirmations go on)
            "budget.max_samples": meta["budget.max_samples"], "budget.max_time_s": None,
            "eval.every_samples": meta["eval.every_samples"], "eval.max_samples": meta.get("eval.max_samples", 512),
            "eval.target_mlm_accuracy": meta["eval.target_mlm_accuracy"],
            "batch.global_batch_size": batch, "batch.micro_batch_size": batch,
        },
        "space": {
            "optimizer.name": {"choice": ["adamw", "lamb"]},
            "optimizer.lr": {"float": list(lr), "log": True},
            "schedule.warmup_steps": {"choice": WARMUPS},
        },
        "compare": ["optimizer.name"],
        "tuner": {"name": tuner, "seed": seed},
        "budget": {"trials": trials, "confirm_seeds": confirm, "max_parallel": 1},
        "resources": {"gpus_per_trial": 1},
        "runner": {"name": "simulated", "simulation": {"table": str(table), "handicaps": handicap or {}}},
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
        for warmup in WARMUPS:
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


def run_scenario(label: str, handicap: dict | None, args, directory: Path) -> dict[str, Any]:
    url = f"sqlite:///{directory / f'{label}.db'}"
    counts = {"right": 0, "wrong": 0, "none": 0}
    started = time.perf_counter()
    better: Any = ...  # not known yet
    for rep in range(args.reps):
        name = f"{label}-{rep}".replace("=", "-")
        data = experiment(name, args.table, args.tuner, rep, args.batch, args.lr, args.trials, args.confirm, handicap)
        run_quietly(name, data, directory, url)
        with SqlStorage(url) as storage:
            record = storage.get_experiment_by_name(name)
            spec = spec_from_stored(record)
            winner = experiment_verdict(storage, record.id, spec).winner
        if better is ...:
            better = truly_better(spec, handicap, args)
        if winner is None:
            counts["none"] += 1
        elif better is not None and winner == f"optimizer.name={better}":
            counts["right"] += 1
        else:
            counts["wrong"] += 1
        if (rep + 1) % 20 == 0:
            print(f"  {label}: {rep + 1}/{args.reps} ({counts})", file=sys.stderr)
    return {"scenario": label, "reps": args.reps, **counts, "truly_better": better,
            "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


def truly_better(spec, handicap: dict | None, args) -> str | None:
    """The arm that is truly better (None: a true tie)."""
    if handicap:
        return "adamw" if handicap["lamb"]["delay_samples"] > 0 else None
    surrogate = Surrogate(load_table(args.table))
    adamw = truth(surrogate, spec, "adamw", args.batch, args.lr)
    lamb = truth(surrogate, spec, "lamb", args.batch, args.lr)
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
    parser.add_argument("--lr", type=float, nargs=2, default=(3.1623e-4, 0.1))
    parser.add_argument("--trials", type=int, default=10, help="tuning trials (both arms)")
    parser.add_argument("--confirm", type=int, default=2, help="confirmation seeds per arm")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    scenarios: list[tuple[str, dict | None]] = [] if args.no_real else [("real", None)]
    scenarios += [(f"delay={d}", {"lamb": {"curves_of": "adamw", "delay_samples": d}}) for d in args.delays]
    rows = []
    scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None  # SQLite's syncs cost nothing in memory
    with tempfile.TemporaryDirectory(prefix="calibration-", dir=scratch) as tmp:
        for label, handicap in scenarios:
            rows.append(run_scenario(label, handicap, args, Path(tmp)))
    print(f"\n{args.tuner}, {args.trials} tuning trials + {args.confirm} confirmation seeds per arm, "
          f"batch {args.batch}, {args.reps} repetitions per scenario\n")  # fmt: skip
    print("| scenario | truly better | right | wrong winner | no winner | seconds |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        n = r["reps"]
        print(f"| {r['scenario']} | {r['truly_better'] or 'tie'} | {r['right'] / n:.1%} | {r['wrong'] / n:.1%} | "
              f"{r['none'] / n:.1%} | {r['seconds']:.0f} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
