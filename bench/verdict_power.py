"""Verdict power: how many confirmation runs an ADAM-vs-LAMB answer needs, and how often it is wrong.

The verdict (`hpo.evidence.verdict.decide`, whose module docstring is the rule: Welch on ln samples to target of each
arm's
*confirmation* runs, a winner when the interval of the ratio excludes 1, "equivalent within ±margin" by two
one-sided tests, else "not yet"; alpha spent over the looks of `confirm_seeds: auto`) is a pure function of each
arm's runs, so its power is measured here by drawing runs and asking `decide` itself (never a copy of the rule).
Each draw is judged:

- right: the truly better arm named; at a true tie, "equivalent"; at a true difference d below the margin,
  naming the better arm or "equivalent" (both statements are true);
- wrong winner: the worse arm named (at a tie: any arm named);
- equivalent (at a true difference d >= margin): a false equivalence, counted on its own;
- not yet.

A cell is either a fixed number k of confirmation runs per arm (one look, `confirm_seeds: k`) or `auto`
(`confirm_seeds: auto`, cap 12: looks after 3, 6, 9, 12 runs per arm, `Budget.confirmation_rounds`, look j of J
asked as `decide(..., look=j, looks=J)`, stopping at the first look that is not "not yet"; the mean runs per arm
used is reported).

1. **The seeds table, the real pair** (hpo/simulation/tables/seeds.jsonl: 20 training seeds at each optimizer's best
point
   of batch 32, AdamW lr 1e-3 and LAMB lr 1e-2, warmup 0; every run reached the target). Each run's samples to
   target are interpolated between evaluation points on its recorded curve (`samples_between_evaluations`), as
   the service reads a confirmation run. Each arm's k runs are k of its 20 seeds drawn without replacement: the
   same seeds for both arms ("same", as `hpo run` gives both arms the same training seeds) or each arm its own
   draw ("independent"). The resolution floor is the service's (`hpo.evidence.verdict.arm_runs`: the evaluation interval
   where a value lies on an evaluation point or two coincide, else 0; every value here is interpolated and distinct,
   so 0) unless
   `--seeds-resolution` sets one. LAMB is the truly better arm: over the 20 seeds its geometric mean samples to
   target is 24 % below AdamW's.
2. **GPU-scale spreads**: samples to target drawn from a normal or a log-normal law with a coefficient of
   variation of 3, 5 or 10 % (arm B: mean `--base` samples; arm A: the same law scaled by 1 - d, so the ratio of
   the arms' geometric means is exactly 1 - d under both laws), independent draws (numpy Generator, fixed seed),
   resolution 0 (continuous draws: no evaluation interval), every run a hit. True differences d = 0, 2, 5, 10,
   25 %; margin 0.05, and 0.075 for the tie cells as well.
3. **Random search's chance of a good pick**: how often an arm's best of n tuning trials lies at a configuration
   that reaches the target on every recorded seed of the learning-curve table (hpo/simulation/tables/curves.jsonl)
   with a
   truth (mean samples to target over its seeds) within `--near` samples of the arm's best truth: the
   configurations where parts 1-2 apply. Each trial draws its learning rate log-uniformly and its warmup from
   {0, 40}, trains with the repetition's training seed (as `hpo run` gives every tuning trial the same seed) and
   scores the experiment's objective; the best is the lowest objective, ties to the earliest.
4. **Through the control plane** (`--end-to-end K`, K a number or `auto`; off by default): delay scenarios
   (`--e2e-delays`: AdamW against AdamW's own curves D samples later, the surrogate's handicap; D = 0 is a true
   tie) through `hpo run` on the seeds table, `--e2e-reps` times (the space is the optimizer with lr fixed at
   AdamW's best and warmup 0: 1 tuning trial per arm, then the confirmation runs with training seeds
   1001 + r, 1002 + r, ...). Each repetition's stored verdict (`hpo.engine.local.experiment_verdict`) must equal
   `decide` over the same confirmation seeds' interpolated values (seed s reads recorded seed s mod 20), at the
   same look: a check that parts 1-2 compute what the service does.

Every cell has its own generator seeded by (`--seed`, part, cell index), so the tables do not depend on `--jobs`.

    python -m bench.verdict_power --json bench/results/verdict_power.rows.json   # parts 1-3, 4,000 draws a cell
    python -m bench.verdict_power --draws 400 --reps 100                # a quick look
    python -m bench.verdict_power --parts --end-to-end 6 auto           # part 4 only, 100 experiments a scenario
    python -m bench.verdict_power --tables-from bench/results/verdict_power.rows.json   # the tables again, no computing

The cost is `decide` itself (about 1 ms a call, most of it in scipy's quantile functions): parts 1-2 ask it about
1.7 million times with the defaults, about 33 CPU-minutes; `--jobs` (default: every CPU) shares the cells out.
Part 4 costs about 0.65 CPU-seconds an experiment.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import cpu_model
from bench.verdict_calibration import TABLE, WARMUPS, experiment, run_objective, run_quietly, truth
from hpo.engine.local import experiment_verdict
from hpo.evidence.verdict import ArmRuns, Outcome, Verdict, decide, samples_between_evaluations, t_quantile
from hpo.experiment import experiment_from_dict, spec_from_stored
from hpo.experiment.schema import Budget
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import load_table
from hpo.storage import SqlStorage
from trainer.config import config_from_dict

ROOT = Path(__file__).resolve().parents[1]
SEEDS_TABLE = ROOT / "hpo/simulation/tables/seeds.jsonl"
BEST = {"adamw": 0.001, "lamb": 0.01}  # each optimizer's best point of batch 32 (bench/curves/README.md)
LR_RANGE = (3.1623e-4, 0.1)
BATCH = 32
OUTCOMES = ("right", "wrong", "equivalent", "not_yet")
CAP = 12  # confirm_seeds: auto, the default max_confirm_seeds
ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"

Runs = Sequence[float | None]
Sampler = Callable[[np.random.Generator, int], tuple[Runs, Runs]]


# --- the verdict over drawn runs ---------------------------------------------------------------------------------


def auto_rounds(cap: int = CAP) -> tuple[int, ...]:
    """Cumulative confirmation runs per arm after each round of `confirm_seeds: auto` (the service's rounds)."""
    return Budget(trials=2, confirm_seeds="auto", max_confirm_seeds=cap).confirmation_rounds


def sequential(a: ArmRuns, b: ArmRuns, rounds: Sequence[int], margin: float,
               ask: Callable[..., Verdict] = decide) -> tuple[Verdict, int]:  # fmt: skip
    """The verdict `confirm_seeds: auto` reaches over these runs: look j of J over the first rounds[j - 1] runs of
    each arm, stopping at the first look that is not "not yet"; (that verdict, the runs per arm it used)."""
    for j, n in enumerate(rounds, 1):
        arms = [ArmRuns(a.label, a.samples_to_target[:n], a.max_samples, a.resolution),
                ArmRuns(b.label, b.samples_to_target[:n], b.max_samples, b.resolution)]  # fmt: skip
        verdict = ask(arms, margin, look=j, looks=len(rounds))
        if verdict.outcome is not Outcome.NOT_YET:
            return verdict, n
    return verdict, rounds[-1]


def judge(verdict: Verdict, better: str | None, within_margin: bool) -> str:
    """right / wrong (the worse arm named; at a tie any arm) / equivalent (a false one: d >= margin) / not_yet."""
    if verdict.outcome is Outcome.WINNER:
        return "right" if better is not None and verdict.winner == better else "wrong"
    if verdict.outcome is Outcome.EQUIVALENT:
        return "right" if within_margin else "equivalent"
    return "not_yet"


def _order(value: float | None) -> float:
    return math.inf if value is None else value


class Memo:
    """`decide` over runs in ascending order (the rule does not depend on their order), remembered: draws of a few
    of 20 recorded seeds repeat the same sets. Only for the seeds table: continuous draws never repeat."""

    def __init__(self) -> None:
        self.seen: dict[tuple, Verdict] = {}

    def __call__(self, arms: Sequence[ArmRuns], margin: float, look: int = 1, looks: int = 1) -> Verdict:
        arms = [ArmRuns(a.label, tuple(sorted(a.samples_to_target, key=_order)), a.max_samples, a.resolution)
                for a in arms]  # fmt: skip
        key = (tuple(arms), margin, look, looks)
        if key not in self.seen:
            self.seen[key] = decide(arms, margin, look, looks)
        return self.seen[key]


def rates(sampler: Sampler, k: int | str, draws: int, rng: np.random.Generator, *, better: str | None,
          within_margin: bool, margin: float, labels: tuple[str, str], budget: int | None, resolution: float,
          cap: int = CAP, ask: Callable[..., Verdict] = decide) -> dict[str, float]:  # fmt: skip
    """Outcome rates of the verdict over `draws` draws of `sampler` (runs of arms labels[0] and labels[1]): with k
    runs per arm at one look, or with k = "auto" in the rounds of `confirm_seeds: auto` up to `cap`."""
    counts = dict.fromkeys(OUTCOMES, 0)
    runs_used = 0
    rounds = auto_rounds(cap) if k == "auto" else None
    for _ in range(draws):
        first, second = sampler(rng, rounds[-1] if rounds else k)
        a = ArmRuns(labels[0], tuple(first), budget, resolution)
        b = ArmRuns(labels[1], tuple(second), budget, resolution)
        if rounds:
            verdict, n = sequential(a, b, rounds, margin, ask)
        else:
            verdict, n = ask([a, b], margin), k
        counts[judge(verdict, better, within_margin)] += 1
        runs_used += n
    return {key: value / draws for key, value in counts.items()} | {"runs_per_arm": runs_used / draws}


# --- part 1: the seeds table ---------------------------------------------------------------------------------------


def demo_spec(table: Path):
    """The calibration experiment's spec (its objective, budget and evaluation set-up) on `table`."""
    data = experiment("power", table, "random", 0, BATCH, LR_RANGE, 10, 2, None)
    return experiment_from_dict(data, current_rules=False)


def seed_samples(surrogate: Surrogate, spec, optimizer: str, lr: float) -> list[int | None]:
    """Stored samples to target (MLPerf's: the first evaluation at or above the target) of `optimizer` at `lr`
    (warmup 0) under every recorded seed (None: missed)."""
    cfg = config_from_dict(spec.resolved_base())
    return [run_objective(spec, cfg, surrogate.curve(Config(optimizer, lr, 0, BATCH, s)))[1]
            for s in range(len(surrogate.seeds))]  # fmt: skip


def seed_values(surrogate: Surrogate, spec, optimizer: str, lr: float,
                seeds: Sequence[int] | None = None) -> list[float | None]:  # fmt: skip
    """Samples to target as the verdict reads a confirmation run of `optimizer` at `lr` (warmup 0) with each
    training seed (default: every recorded seed): interpolated between the evaluations the run stores."""
    cfg = config_from_dict(spec.resolved_base())
    values = []
    for seed in range(len(surrogate.seeds)) if seeds is None else seeds:
        curve = surrogate.curve(Config(optimizer, lr, 0, BATCH, seed))
        hit = run_objective(spec, cfg, curve)[1]
        evals = curve.evaluations(cfg.eval.every_samples, cfg.budget.max_samples)
        values.append(None if hit is None else samples_between_evaluations(evals, cfg.eval.target_mlm_accuracy, hit))
    return values


def service_resolution(values: Runs, every: int) -> int:
    """The resolution `hpo.evidence.verdict.arm_runs` gives an arm: the evaluation interval where the measurement did
    not tell runs apart (a hit read at an evaluation point, or two that coincide), else 0."""
    from hpo.evidence.verdict import unresolved

    return every if unresolved(values, every) else 0


def seed_sampler(first: Runs, second: Runs, paired: bool) -> Sampler:
    """n runs per arm: n of the recorded seeds without replacement, the same seeds for both arms with `paired`."""

    def draw(rng: np.random.Generator, n: int) -> tuple[Runs, Runs]:
        mine = rng.choice(len(first), n, replace=False)
        theirs = mine if paired else rng.choice(len(second), n, replace=False)
        return [first[i] for i in mine], [second[i] for i in theirs]

    return draw


def seeds_cells(args) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The cells of part 1, and what they are drawn from."""
    table = load_table(args.seeds_table)
    spec = demo_spec(args.seeds_table)
    surrogate = Surrogate(table)
    adamw = seed_values(surrogate, spec, "adamw", BEST["adamw"])
    lamb = seed_values(surrogate, spec, "lamb", BEST["lamb"])
    every = table.eval_every
    resolution = {
        label: args.seeds_resolution if args.seeds_resolution is not None else service_resolution(v, every)
        for label, v in ((ADAMW, adamw), (LAMB, lamb))
    }
    truth_ratio = _geomean(lamb) / _geomean(adamw)
    context = {"adamw": _describe(adamw), "lamb": _describe(lamb), "ratio": truth_ratio, "resolution": resolution,
               "budget": table.max_samples}  # fmt: skip
    cells = []
    for paired in (True, False):
        for k in [*args.confirm, "auto"]:
            cells.append({"part": "seeds", "seeds": "same" if paired else "independent", "k": k,
                          "margin": args.margin, "adamw": adamw, "lamb": lamb, "budget": table.max_samples,
                          "resolution": resolution})  # fmt: skip
    return cells, context


def run_seeds_cell(cell: dict[str, Any], draws: int, rng: np.random.Generator) -> dict[str, float]:
    sampler = seed_sampler(cell["adamw"], cell["lamb"], cell["seeds"] == "same")
    memo = Memo()
    resolution = cell["resolution"]

    def ask(arms, margin, look=1, looks=1):  # each arm with its own resolution floor
        return memo([ArmRuns(a.label, a.samples_to_target, a.max_samples, resolution[a.label]) for a in arms], margin,
                    look, looks)  # fmt: skip

    return rates(sampler, cell["k"], draws, rng, better=LAMB, within_margin=False, margin=cell["margin"],
                 labels=(ADAMW, LAMB), budget=cell["budget"], resolution=0, ask=ask)  # fmt: skip


def _geomean(values: Runs) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values if v is not None))


def _describe(values: Runs) -> str:
    hits = [v for v in values if v is not None]
    return (f"{len(hits)}/{len(values)} hit, mean {statistics.fmean(hits):,.0f}, sd {statistics.stdev(hits):,.0f}, "
            f"geometric mean {_geomean(hits):,.0f}")  # fmt: skip


# --- part 2: GPU-scale spreads -------------------------------------------------------------------------------------


def draw_runs(rng: np.random.Generator, law: str, mean: float, cv: float, n: int) -> np.ndarray:
    """n samples to target with this mean and coefficient of variation: normal (sd = cv * mean) or log-normal
    (sigma² = ln(1 + cv²), mu = ln(mean) - sigma² / 2)."""
    if law == "normal":
        values = rng.normal(mean, cv * mean, n)
    elif law == "lognormal":
        sigma = math.sqrt(math.log1p(cv * cv))
        values = rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, n)
    else:
        raise ValueError(f"unknown law {law!r}: normal or lognormal")
    if (values <= 0).any():
        raise ValueError(f"a draw of {law} at cv {cv} is not positive: samples to target must be")
    return values


def spread_sampler(law: str, base: float, cv: float, difference: float) -> Sampler:
    """Arm A's runs (the law at mean base x (1 - difference)) and arm B's (at mean base), independent."""

    def draw(rng: np.random.Generator, n: int) -> tuple[Runs, Runs]:
        a = draw_runs(rng, law, base * (1 - difference), cv, n)
        b = draw_runs(rng, law, base, cv, n)
        return a.tolist(), b.tolist()

    return draw


def spread_cells(args) -> list[dict[str, Any]]:
    cells = []
    for law in args.laws:
        for cv in args.cvs:
            for difference in args.differences:
                margins = [args.margin] + ([m for m in args.tie_margins if m != args.margin] if difference == 0 else [])
                for margin in margins:
                    for k in [*args.spread_confirm, "auto"]:
                        cells.append({"part": "spread", "law": law, "cv": cv, "difference": difference,
                                      "margin": margin, "k": k, "base": args.base})  # fmt: skip
    return cells


def run_spread_cell(cell: dict[str, Any], draws: int, rng: np.random.Generator) -> dict[str, float]:
    difference, margin = cell["difference"], cell["margin"]
    sampler = spread_sampler(cell["law"], cell["base"], cell["cv"], difference)
    return rates(sampler, cell["k"], draws, rng, better="A" if difference > 0 else None,
                 within_margin=difference < margin, margin=margin, labels=("A", "B"), budget=None,
                 resolution=0)  # fmt: skip


# --- running the cells ---------------------------------------------------------------------------------------------


def run_cell(job: tuple[int, int, int, dict[str, Any]]) -> dict[str, Any]:
    """One cell with its own generator, seeded by (seed, part, cell index)."""
    seed, part, index, cell = job
    rng = np.random.default_rng([seed, part, index])
    started = time.process_time()
    result = (run_seeds_cell if cell["part"] == "seeds" else run_spread_cell)(cell, cell["draws"], rng)
    t_quantile.cache_clear()  # the verdict's cache of t quantiles: continuous degrees of freedom rarely repeat
    row = {key: value for key, value in cell.items() if key not in ("adamw", "lamb", "resolution")}
    return row | result | {"cpu_s": round(time.process_time() - started, 2)}


def run_cells(cells: list[dict[str, Any]], part: int, args, label: str) -> list[dict[str, Any]]:
    jobs = [(args.seed, part, i, cell | {"draws": args.draws}) for i, cell in enumerate(cells)]
    rows, started, shown = [], time.perf_counter(), 0.0
    pool = multiprocessing.Pool(args.jobs) if args.jobs > 1 else None
    try:
        results = pool.imap(run_cell, jobs) if pool else map(run_cell, jobs)
        for row in results:
            rows.append(row)
            elapsed = time.perf_counter() - started
            if elapsed - shown >= 20 or len(rows) == len(jobs):
                shown = elapsed
                print(f"  {label}: {len(rows)}/{len(jobs)} cells, {elapsed:.0f} s", file=sys.stderr, flush=True)
    finally:
        if pool:
            pool.close()
            pool.join()
    return rows


# --- part 3: random search's chance of a good pick -------------------------------------------------------------


def good_pick(surrogate: Surrogate, spec, cfg, config: Config, limit: float) -> bool:
    """`config` reaches the target on every recorded seed, with mean samples to target at most `limit`."""
    hits = [run_objective(spec, cfg, c)[1] for c in surrogate.curves(config)]
    return None not in hits and sum(hits) / len(hits) <= limit


def tuning_table(args, rng: random.Random) -> list[dict[str, Any]]:
    """P(an arm's best of n random-search trials is a good configuration), per arm and n."""
    table = load_table(args.table)
    spec = demo_spec(args.table)
    cfg = config_from_dict(spec.resolved_base())
    surrogate = Surrogate(table)
    rows = []
    for optimizer in ("adamw", "lamb"):
        best_truth, _ = truth(surrogate, spec, optimizer, BATCH, LR_RANGE)
        for n in args.trials:
            found = 0
            for rep in range(args.reps):
                seed = 1000 + rep
                picks = []
                for _ in range(n):
                    lr = math.exp(rng.uniform(math.log(LR_RANGE[0]), math.log(LR_RANGE[1])))
                    warmup = rng.choice(WARMUPS)
                    objective, _ = run_objective(spec, cfg, surrogate.curve(Config(optimizer, lr, warmup, BATCH, seed)))
                    picks.append((objective, lr, warmup))
                _, lr, warmup = min(picks, key=lambda p: p[0])  # min keeps the earliest of equal objectives
                found += good_pick(surrogate, spec, cfg, Config(optimizer, lr, warmup, BATCH), best_truth + args.near)
            rows.append({"part": "tuning", "optimizer": optimizer, "n": n, "good": found / args.reps,
                         "best_truth": best_truth})  # fmt: skip
            print(f"  tuning: {optimizer} n={n}: {found / args.reps:.1%}", file=sys.stderr, flush=True)
    return rows


# --- part 4: through hpo run ---------------------------------------------------------------------------------------


def end_to_end(args, delay: int, k: int | str, directory: Path) -> dict[str, Any]:
    """`args.e2e_reps` whole experiments through `hpo run`; each stored verdict against `decide` over the same
    confirmation seeds' interpolated values, at the same look."""
    table = load_table(args.seeds_table)
    spec = demo_spec(args.seeds_table)
    plain, delayed = Surrogate(table), Surrogate(table, {"lamb": ("adamw", delay)})
    handicap = {"lamb": {"curves_of": "adamw", "delay_samples": delay}}
    url = f"sqlite:///{directory / f'e2e-{delay}-{k}.db'}"
    counts, runs_used = dict.fromkeys(OUTCOMES, 0), 0
    started = time.perf_counter()
    for rep in range(args.e2e_reps):
        name = f"power-{delay}-{k}-{rep}"
        data = experiment(name, args.seeds_table, "random", rep, BATCH, LR_RANGE, 2, k, handicap, CAP)
        data["space"] = {"optimizer.name": {"choice": ["adamw", "lamb"]}, "schedule.warmup_steps": {"choice": [0]}}
        data["overrides"] |= {"optimizer.lr": BEST["adamw"], "schedule.warmup_steps": 0}
        run_quietly(name, data, directory, url)
        with SqlStorage(url) as storage:
            record = storage.get_experiment_by_name(name)
            stored = spec_from_stored(record)
            verdict = experiment_verdict(storage, record.id, stored)
        rounds = stored.budget.confirmation_rounds
        seeds = [1000 + rep + 1 + i for i in range(rounds[-1])]  # the confirmation seeds after the tuning seed
        first = seed_values(plain, spec, "adamw", BEST["adamw"], seeds)
        second = seed_values(delayed, spec, "lamb", BEST["adamw"], seeds)
        a = ArmRuns(ADAMW, tuple(first), table.max_samples, service_resolution(first, table.eval_every))
        b = ArmRuns(LAMB, tuple(second), table.max_samples, service_resolution(second, table.eval_every))
        if k == "auto":
            expected, n = sequential(a, b, rounds, stored.verdict.margin)
        else:
            expected, n = decide([a, b], stored.verdict.margin), k
        got = (verdict.outcome, verdict.winner, verdict.look, [arm.runs for arm in verdict.arms])
        want = (expected.outcome, expected.winner, expected.look, [n, n])
        if got != want:
            raise SystemExit(f"{name}: hpo run's verdict {got} differs from decide over seeds {seeds[:n]}: {want} "
                             f"({expected.line})")  # fmt: skip
        counts[judge(verdict, ADAMW if delay > 0 else None, delay == 0)] += 1
        runs_used += n
    n = args.e2e_reps
    print(f"  end to end: delay {delay}, k {k}: {n} experiments, {time.perf_counter() - started:.0f} s",
          file=sys.stderr, flush=True)  # fmt: skip
    return {"part": "end_to_end", "delay": delay, "k": k, "reps": n, **{key: c / n for key, c in counts.items()},
            "runs_per_arm": runs_used / n, "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip


# --- tables and the must-show lines --------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _k(k: int | str) -> str:
    return "auto" if k == "auto" else str(k)


def seeds_table(rows: list[dict[str, Any]], context: dict[str, Any], draws: int) -> str:
    lines = [f"Part 1, the seeds table (real pair; {draws:,} draws a cell): AdamW {context['adamw']}; LAMB "
             f"{context['lamb']}; LAMB / AdamW = {context['ratio']:.3f} (geometric means, interpolated samples to "
             f"target); resolution floor {context['resolution'][ADAMW]} / {context['resolution'][LAMB]}\n",
             "| k (runs per arm) | right: LAMB named (same / independent) | wrong: AdamW named | equivalent | not yet "
             "| runs per arm used |", "|---|---|---|---|---|---|"]  # fmt: skip
    by = {(r["seeds"], r["k"]): r for r in rows}
    for k in dict.fromkeys(r["k"] for r in rows):
        same, ind = by[("same", k)], by[("independent", k)]
        cells = [f"{_pct(same[o])} / {_pct(ind[o])}" for o in OUTCOMES]
        used = f"{same['runs_per_arm']:.1f} / {ind['runs_per_arm']:.1f}" if k == "auto" else str(k)
        lines.append(f"| {_k(k)} | " + " | ".join(cells) + f" | {used} |")
    return "\n".join(lines)


def spread_table(rows: list[dict[str, Any]], draws: int) -> str:
    ks = list(dict.fromkeys(r["k"] for r in rows))
    fixed = [k for k in ks if k != "auto"]
    lines = [f"Part 2, GPU-scale spreads ({draws:,} draws a cell; resolution 0): right (at a tie: equivalent) by "
             "runs per arm k; auto: right, and the mean runs per arm used; the most wrong winners and (d >= margin) "
             "false equivalences of the row's cells, fixed k and auto\n",
             "| law | CV | true difference | margin | " + " | ".join(f"k={k}" for k in fixed)
             + " | auto: right (runs per arm) | wrong winner, most | false equivalence, most |",
             "|---|---|---|---|" + "---|" * (len(fixed) + 3)]  # fmt: skip
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["law"], r["cv"], r["difference"], r["margin"]), []).append(r)
    for (law, cv, difference, margin), cells in groups.items():
        by = {r["k"]: r for r in cells}
        auto = by["auto"]
        wrong = max(r["wrong"] for r in cells)
        false_eq = "-" if difference < margin else _pct(max(r["equivalent"] for r in cells))
        lines.append(f"| {law} | {100 * cv:g} % | {100 * difference:g} % | ±{100 * margin:g} % | "
                     + " | ".join(_pct(by[k]["right"]) for k in fixed)
                     + f" | {_pct(auto['right'])} ({auto['runs_per_arm']:.1f}) | {_pct(wrong)} | "
                     f"{false_eq} |")  # fmt: skip
    return "\n".join(lines)


def tuning_markdown(rows: list[dict[str, Any]], trials: list[int], reps: int) -> str:
    lines = [f"Part 3, random search ({reps:,} repetitions a cell): P(an arm's best of n tuning trials is a good pick)"
             "\n", "| optimizer | best truth (samples) | " + " | ".join(f"n = {n}" for n in trials) + " |",
             "|---|---|" + "---|" * len(trials)]  # fmt: skip
    for optimizer in ("adamw", "lamb"):
        mine = [r for r in rows if r["optimizer"] == optimizer]
        lines.append(f"| {optimizer} | {mine[0]['best_truth']:,.0f} | " + " | ".join(_pct(r["good"]) for r in mine)
                     + " |")  # fmt: skip
    return "\n".join(lines)


def e2e_markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["Part 4, through `hpo run` (every stored verdict equal to `decide` over its confirmation seeds)\n",
             "| scenario | k | experiments | right | wrong winner | equivalent (arms differ) | not yet | runs per arm "
             "| seconds |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| delay={r['delay']} | {_k(r['k'])} | {r['reps']} | {_pct(r['right'])} | {_pct(r['wrong'])} | "
                     f"{_pct(r['equivalent'])} | {_pct(r['not_yet'])} | {r['runs_per_arm']:.1f} | "
                     f"{r['seconds']:.0f} |")  # fmt: skip
    return "\n".join(lines)


def fewest(rows: list[dict[str, Any]], key: str = "right", at_least: float = 0.8) -> int | None:
    """The fewest fixed runs per arm whose rate of `key` is at least `at_least` (None: no such k)."""
    ks = sorted(r["k"] for r in rows if r["k"] != "auto" and r[key] >= at_least)
    return ks[0] if ks else None


def must_show(seeds: list[dict[str, Any]], spread: list[dict[str, Any]], margin: float) -> list[dict[str, Any]]:
    """The brief's claims, each met or not with its figures."""
    checks = []

    def fixed(rows, **where):
        return [r for r in rows if r["k"] != "auto" and all(r[key] == value for key, value in where.items())]

    def at(rows, k):
        return next((r for r in rows if r["k"] == k), None)

    def fmt_k(rows, k, key="right"):
        return "no k" if k is None else f"k = {k} ({_pct(at(rows, k)[key])})"

    if seeds:
        same, ind = fixed(seeds, seeds="same"), fixed(seeds, seeds="independent")
        ks, ki = fewest(same), fewest(ind)
        wrong = max(r["wrong"] for r in seeds)
        met = ks is not None and ks <= 5 and wrong <= 0.05
        checks.append({"claim": "seeds table: the real pair named right in >= 80 % with at most 5 runs per arm "
                       "(fixed k), wrong <= 5 %", "met": met,
                       "figures": f"first k with >= 80 % right: same seeds {fmt_k(same, ks)}, independent "
                       f"{fmt_k(ind, ki)}; wrong winner at most {_pct(wrong)} (fixed k and auto)"})  # fmt: skip
    if spread:
        ten = {law: fixed(spread, law=law, cv=0.05, difference=0.10, margin=margin) for law in _laws(spread)}
        found = {law: fewest(rows) for law, rows in ten.items()}
        met = all(k is not None and k <= 6 for k in found.values())
        checks.append(
            {
                "claim": "CV 5 %: a 10 % difference named right in >= 80 % with at most 6 runs per arm",
                "met": met,
                "figures": "; ".join(f"{law}: {fmt_k(ten[law], k)}" for law, k in found.items()),
            }
        )
        ties = {law: fixed(spread, law=law, cv=0.05, difference=0.0, margin=0.075) for law in _laws(spread)}
        if all(ties.values()):
            found = {law: fewest(rows) for law, rows in ties.items()}
            met = all(k is not None and k <= 12 for k in found.values())
            autos = {law: at([r for r in spread if r["law"] == law and r["cv"] == 0.05 and r["difference"] == 0
                              and r["margin"] == 0.075], "auto") for law in ties}  # fmt: skip
            checks.append({"claim": "CV 5 %: a true tie declared equivalent within ±7.5 % in >= 80 % with at most 12 "
                           "runs per arm", "met": met,
                           "figures": "; ".join(f"{law}: {fmt_k(ties[law], k)}, auto {_pct(autos[law]['right'])}"
                                                f" ({autos[law]['runs_per_arm']:.1f} runs per arm)"
                                                for law, k in found.items())})  # fmt: skip
        worst = max(spread, key=lambda r: r["wrong"])
        over = [r for r in spread if r["wrong"] > 0.05]
        se = math.sqrt(0.05 * 0.95 / worst["draws"])
        listed = ", ".join(f"{r['law']} CV {100 * r['cv']:g} % d {100 * r['difference']:g} % margin {r['margin']} "
                           f"k {_k(r['k'])}: {_pct(r['wrong'])}" for r in over)  # fmt: skip
        pooled = ", ".join(f"{_k(k)} {_pct(rate)}" for k, rate in pooled_ties(spread).items())
        differing = max((r["wrong"] for r in spread if r["difference"] > 0), default=0.0)
        figures = (f"most: {_pct(worst['wrong'])} ({worst['law']}, CV {100 * worst['cv']:g} %, d "
                   f"{100 * worst['difference']:g} %, margin {worst['margin']}, k {_k(worst['k'])}; one standard error "
                   f"of a 5 % rate over {worst['draws']:,} draws is {_pct(se)}); cells above 5 %: {len(over)} of "
                   f"{len(spread)}, {sum(r['difference'] == 0 for r in over)} of them at a true tie ({listed}); at a "
                   f"tie, pooled over the tie cells by k: {pooled}; at a true difference at most "
                   f"{_pct(differing)}")  # fmt: skip
        checks.append({"claim": "wrong winner <= 5 % in every cell (ties included, sequential looks included)",
                       "met": not over, "figures": figures})  # fmt: skip
    return checks


def pooled_ties(spread: list[dict[str, Any]]) -> dict[int | str, float]:
    """The wrong-winner rate at a true tie by k, pooled over every tie cell (laws, CVs, margins) with that k: at a
    tie any winner is wrong, and the rule allows it in 5 % (two-sided) of the cases."""
    pooled: dict[int | str, list[float]] = {}
    for r in spread:
        if r["difference"] == 0:
            pooled.setdefault(r["k"], [0, 0])
            pooled[r["k"]][0] += r["wrong"] * r["draws"]
            pooled[r["k"]][1] += r["draws"]
    return {k: wrong / draws for k, (wrong, draws) in pooled.items()}


def _laws(rows: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r["law"] for r in rows))


# --- the command line ----------------------------------------------------------------------------------------------


def _k_arg(value: str) -> int | str:
    return value if value == "auto" else int(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict_power", description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--seeds-table", type=Path, default=SEEDS_TABLE)
    parser.add_argument("--draws", type=int, default=4000, help="draws per cell of parts 1-2 (default 4,000)")
    parser.add_argument("--confirm", type=int, nargs="*", default=list(range(2, 13)),
                        help="part 1: fixed runs per arm k (default 2 to 12; auto is always added)")  # fmt: skip
    parser.add_argument("--spread-confirm", type=int, nargs="*", default=[2, 3, 4, 5, 6, 8, 10, 12],
                        help="part 2: fixed runs per arm k (default 2-6, 8, 10, 12; auto is always added)")  # fmt: skip
    parser.add_argument("--margin", type=float, default=0.05, help="verdict.margin (default 0.05)")
    parser.add_argument("--tie-margins", type=float, nargs="*", default=[0.075],
                        help="more margins for the tie cells of part 2 (default 0.075)")  # fmt: skip
    parser.add_argument(
        "--seeds-resolution",
        type=float,
        default=None,
        help="part 1's resolution floor (default: the service's; 0, the values are interpolated)",
    )
    parser.add_argument("--laws", nargs="*", default=["normal", "lognormal"], choices=["normal", "lognormal"])
    parser.add_argument("--cvs", type=float, nargs="*", default=[0.03, 0.05, 0.10])
    parser.add_argument("--differences", type=float, nargs="*", default=[0.0, 0.02, 0.05, 0.10, 0.25])
    parser.add_argument("--base", type=float, default=8000, help="part 2: arm B's mean samples to target")
    parser.add_argument("--parts", type=int, nargs="*", default=[1, 2, 3], help="which of parts 1-3 (default all)")
    parser.add_argument("--trials", type=int, nargs="*", default=[5, 10, 20, 40, 80, 160], help="tuning trials per arm")
    parser.add_argument("--reps", type=int, default=1000, help="repetitions per tuning cell (default 1,000)")
    parser.add_argument("--near", type=int, default=1024, help="a good pick's truth is this close to the best")
    parser.add_argument("--seed", type=int, default=0, help="the random generators' seed (fixed: same tables)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="processes for parts 1-2 (default: every CPU; the tables do not depend on it)",
    )
    parser.add_argument("--end-to-end", type=_k_arg, nargs="*", default=[], metavar="K",
                        help="part 4 with K confirmation runs per arm (a number, or auto)")  # fmt: skip
    parser.add_argument("--e2e-reps", type=int, default=100, help="repetitions per part-4 scenario (default 100)")
    parser.add_argument("--e2e-delays", type=int, nargs="*", default=[0, 2048], help="part 4's delay scenarios")
    parser.add_argument("--json", type=Path, help="also write every row (and the must-show lines) here")
    parser.add_argument("--tables-from", type=Path, help="print the tables of a --json file again, computing nothing")
    args = parser.parse_args(argv)
    if args.tables_from:
        return print_tables(json.loads(args.tables_from.read_text()), args)
    started = time.perf_counter()
    out: dict[str, Any] = {
        "command": "python -m bench.verdict_power " + " ".join(sys.argv[1:] if argv is None else argv),  # fmt: skip
        "cpu": cpu_model(),
        "draws": args.draws,
        "reps": args.reps,
        "margin": args.margin,
    }
    seeds_rows: list[dict[str, Any]] = []
    spread_rows: list[dict[str, Any]] = []
    if 1 in args.parts:
        cells, context = seeds_cells(args)
        seeds_rows = run_cells(cells, 1, args, "part 1 (seeds table)")
        out |= {"seeds_context": context, "seeds": seeds_rows}
        print("\n" + seeds_table(seeds_rows, context, args.draws) + "\n", flush=True)
    if 2 in args.parts:
        spread_rows = run_cells(spread_cells(args), 2, args, "part 2 (spreads)")
        out["spread"] = spread_rows
        print("\n" + spread_table(spread_rows, args.draws) + "\n", flush=True)
    if 3 in args.parts:
        tuning = tuning_table(args, random.Random(args.seed))
        out["tuning"] = tuning
        print("\n" + tuning_markdown(tuning, args.trials, args.reps) + "\n", flush=True)
    if args.end_to_end:
        scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None
        with tempfile.TemporaryDirectory(prefix="power-", dir=scratch) as tmp:
            e2e = [end_to_end(args, d, k, Path(tmp)) for k in args.end_to_end for d in args.e2e_delays]
        out["end_to_end"] = e2e
        print("\n" + e2e_markdown(e2e) + "\n", flush=True)
    checks = must_show(seeds_rows, spread_rows, args.margin)
    out["must_show"] = checks
    for check in checks:
        print(f"- {'met' if check['met'] else 'NOT met'}: {check['claim']}: {check['figures']}")
    wall = time.perf_counter() - started
    cpu = sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
              for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))  # fmt: skip
    out |= {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "jobs": args.jobs}
    print(f"\n{wall:.0f} s wall, {cpu:.0f} CPU seconds, {args.jobs} process(es), CPU: {cpu_model()}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


def print_tables(out: dict[str, Any], args) -> int:
    """The tables and the must-show lines of a --json file."""
    if out.get("seeds"):
        print("\n" + seeds_table(out["seeds"], out["seeds_context"], out["draws"]) + "\n")
    if out.get("spread"):
        print("\n" + spread_table(out["spread"], out["draws"]) + "\n")
    if out.get("tuning"):
        trials = list(dict.fromkeys(r["n"] for r in out["tuning"]))
        print("\n" + tuning_markdown(out["tuning"], trials, out.get("reps", args.reps)) + "\n")
    if out.get("end_to_end"):
        print("\n" + e2e_markdown(out["end_to_end"]) + "\n")
    for check in must_show(out.get("seeds", []), out.get("spread", []), out.get("margin", args.margin)):
        print(f"- {'met' if check['met'] else 'NOT met'}: {check['claim']}: {check['figures']}")
    if "wall_s" in out:
        print(f"\n{out['wall_s']:.0f} s wall, {out['cpu_s']:.0f} CPU seconds, {out['jobs']} process(es), CPU: "
              f"{out['cpu']}; {out['command']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
