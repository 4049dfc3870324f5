"""Verdict power: how many confirmation seeds and tuning trials an ADAM-vs-LAMB answer needs for 80 % power.

The verdict (`hpo.verdict.decide`: each arm's runs, a 95 % t interval of samples to target over its hits, a winner
only when the intervals separate) is a pure function of the runs of each arm, so its power splits in two:

1. **Confirmation power** (given the tuner found each arm's best configuration): each arm's 1 + k runs (its best
   tuning run and k confirmation seeds) are 1 + k recorded training seeds of that configuration, drawn without
   replacement from the seeds table (bench/curves/seeds.jsonl: 20 seeds at each optimizer's best point of batch
   32, AdamW lr 1e-3 and LAMB lr 1e-2, warmup 0), and `decide` names the winner or none. Two ways to draw: the
   same seeds for both arms (as `hpo run` gives both arms the same training seeds) and each arm its own draw
   (independent seed noise, as between arms whose runs share nothing). Scenarios: `real` (LAMB's best point
   against AdamW's) and `delay=D` (AdamW against AdamW's own curves D samples later, through the surrogate's
   handicap: AdamW truly better by D samples; D = 0 is a true tie).
   Counted over `--draws` draws (a fixed random generator): right, wrong winner, no winner.
   The selection effect of the best tuning run (it was picked as its arm's best, so it flatters its arm) is not in
   this part: bench/verdict_calibration.py measures it through the whole control plane.
2. **Tuning trials** (random search): how often an arm's best of n tuning trials lies at a configuration that
   reaches the target on every recorded seed of the learning-curve table (bench/curves/curves.jsonl) with a truth
   (mean samples to target over its seeds) within `--near` samples of the arm's best truth: the configurations
   where part 1 applies. Each trial draws its learning rate log-uniformly over the space and its warmup uniformly
   from {0, 40}, trains with the repetition's training seed (as `hpo run` gives every tuning trial the same
   seed), and scores the experiment's objective; the best is the lowest objective, ties to the earliest.

3. **Through the control plane** (`--end-to-end K`): delay scenarios (`--e2e-delays`) with K confirmation seeds,
   `--e2e-reps` times through `hpo run` on the seeds table (the space is the optimizer and warmup 0, lr fixed at
   AdamW's best: 1 tuning trial per arm, then K confirmations, training seeds 1000 + r, ..., 1000 + r + K as the
   calibration gives them). Each repetition's verdict must equal `decide` over the same recorded seeds (seed s
   reads recorded seed s mod 20): a check that part 1 computes what the service does.

Power of the whole experiment is about P(right | k) when both arms' picks are good, which happens with probability
P(good | n) squared; the table says which (n, k) reach 80 %.

    python -m bench.verdict_power --end-to-end 6           # 4,000 draws a confirmation cell, 1,000 a tuning cell
    python -m bench.verdict_power --draws 500 --reps 100   # a quick look
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.verdict_calibration import TABLE, WARMUPS, experiment, run_objective, run_quietly, truth
from hpo.experiment import experiment_from_dict, spec_from_stored
from hpo.local_engine import experiment_verdict
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import load_table
from hpo.storage import SqlStorage
from hpo.verdict import ArmRuns, decide
from trainer.config import config_from_dict

ROOT = Path(__file__).resolve().parents[1]
SEEDS_TABLE = ROOT / "bench/curves/seeds.jsonl"
BEST = {"adamw": 0.001, "lamb": 0.01}  # each optimizer's best point of batch 32 (bench/curves/README.md)
LR_RANGE = (3.1623e-4, 0.1)
BATCH = 32


def demo_spec(table: Path):
    """The calibration experiment's spec (its objective, budget and evaluation set-up) on `table`."""
    return experiment_from_dict(experiment("power", table, "random", 0, BATCH, LR_RANGE, 10, 2, None), check_arms=False)


def seed_samples(surrogate: Surrogate, spec, optimizer: str, lr: float) -> list[int | None]:
    """Samples to target of `optimizer` at `lr` (warmup 0) under every recorded seed (None: missed)."""
    cfg = config_from_dict(spec.resolved_base())
    return [run_objective(spec, cfg, surrogate.curve(Config(optimizer, lr, 0, BATCH, s)))[1]
            for s in range(len(surrogate.seeds))]  # fmt: skip


def confirmation_power(better: list[int | None], worse: list[int | None], k: int, draws: int, budget: int,
                       rng: random.Random, paired: bool = False) -> dict[str, float]:  # fmt: skip
    """Outcome rates of `decide` when each arm has 1 + k runs drawn without replacement from its seeds: the same
    seeds for both arms with `paired` (as `hpo run` gives both arms the same training seeds; the lists are then
    indexed by seed), else each arm its own draw."""
    counts = {"right": 0, "wrong": 0, "none": 0}
    for _ in range(draws):
        mine = rng.sample(range(len(better)), 1 + k)
        theirs = mine if paired else rng.sample(range(len(worse)), 1 + k)
        a = ArmRuns("better", tuple(better[i] for i in mine), budget)
        b = ArmRuns("worse", tuple(worse[i] for i in theirs), budget)
        winner = decide([a, b]).winner
        counts["none" if winner is None else "right" if winner == "better" else "wrong"] += 1
    return {key: n / draws for key, n in counts.items()}


def confirmation_table(args, rng: random.Random) -> list[dict[str, Any]]:
    table = load_table(args.seeds_table)
    spec = demo_spec(args.seeds_table)
    budget = table.max_samples
    plain = Surrogate(table)
    adamw = seed_samples(plain, spec, "adamw", BEST["adamw"])
    lamb = seed_samples(plain, spec, "lamb", BEST["lamb"])
    scenarios = [("real", lamb, adamw)]
    for delay in args.delays:
        delayed = Surrogate(table, {"lamb": ("adamw", delay)})
        scenarios.append((f"delay={delay}", adamw, seed_samples(delayed, spec, "lamb", BEST["adamw"])))
    rows = []
    for label, better, worse in scenarios:
        for k in args.confirm:
            if 1 + k > len(better):
                continue
            for paired in (True, False):
                rates = confirmation_power(better, worse, k, args.draws, budget, rng, paired)
                rows.append({"scenario": label, "k": k, "seeds": "same" if paired else "independent",
                             "better": _describe(better), "worse": _describe(worse), **rates})  # fmt: skip
    return rows


def _describe(samples: list[int | None]) -> str:
    hits = [s for s in samples if s is not None]
    mean = sum(hits) / len(hits) if hits else math.nan
    return f"{len(hits)}/{len(samples)} hit, mean {mean:,.0f}"


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
            rows.append({"optimizer": optimizer, "n": n, "good": found / args.reps, "best_truth": best_truth})
            print(f"  {optimizer} n={n}: {found / args.reps:.1%}", file=sys.stderr)
    return rows


def end_to_end(args, delay: int, k: int, directory: Path) -> dict[str, Any]:
    """Part 3: `args.e2e_reps` whole experiments through `hpo run`; their verdicts against `decide` on their seeds."""
    table = load_table(args.seeds_table)
    spec = demo_spec(args.seeds_table)
    adamw = seed_samples(Surrogate(table), spec, "adamw", BEST["adamw"])
    delayed = seed_samples(Surrogate(table, {"lamb": ("adamw", delay)}), spec, "lamb", BEST["adamw"])
    handicap = {"lamb": {"curves_of": "adamw", "delay_samples": delay}}
    url = f"sqlite:///{directory / f'e2e-{delay}-{k}.db'}"
    counts = {"right": 0, "wrong": 0, "none": 0}
    for rep in range(args.e2e_reps):
        name = f"power-{delay}-{k}-{rep}"
        data = experiment(name, args.seeds_table, "random", rep, BATCH, LR_RANGE, 2, k, handicap)
        data["space"] = {"optimizer.name": {"choice": ["adamw", "lamb"]}, "schedule.warmup_steps": {"choice": [0]}}
        data["overrides"] |= {"optimizer.lr": BEST["adamw"], "schedule.warmup_steps": 0}
        run_quietly(name, data, directory, url)
        with SqlStorage(url) as storage:
            record = storage.get_experiment_by_name(name)
            winner = experiment_verdict(storage, record.id, spec_from_stored(record)).winner
        seeds = [(1000 + rep + i) % len(table.seeds()) for i in range(k + 1)]
        budget = table.max_samples
        expected = decide([ArmRuns("optimizer.name=adamw", tuple(adamw[i] for i in seeds), budget),
                           ArmRuns("optimizer.name=lamb", tuple(delayed[i] for i in seeds), budget)])  # fmt: skip
        if winner != expected.winner:
            raise SystemExit(f"{name}: hpo run's verdict {winner} differs from decide over seeds {seeds}: "
                             f"{expected.line}")  # fmt: skip
        truly = "optimizer.name=adamw" if delay > 0 else None
        counts["none" if winner is None else "right" if winner == truly else "wrong"] += 1
    return {"scenario": f"delay={delay}", "k": k, **{key: n / args.e2e_reps for key, n in counts.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.verdict_power", description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--seeds-table", type=Path, default=SEEDS_TABLE)
    parser.add_argument("--draws", type=int, default=4000, help="draws per cell (default 4,000)")
    parser.add_argument("--delays", type=int, nargs="*", default=[0, 1024, 2048, 3072])
    parser.add_argument("--confirm", type=int, nargs="*", default=[2, 3, 4, 6, 9, 14, 19])
    parser.add_argument("--trials", type=int, nargs="*", default=[5, 10, 20, 40, 80, 160], help="tuning trials per arm")
    parser.add_argument("--reps", type=int, default=1000, help="repetitions per tuning cell (default 1,000)")
    parser.add_argument("--near", type=int, default=1024, help="a good pick's truth is this close to the best")
    parser.add_argument("--seed", type=int, default=0, help="the random generator's seed (fixed: same tables)")
    parser.add_argument(
        "--end-to-end", type=int, nargs="*", default=[], metavar="K", help="part 3 with K confirmations"
    )
    parser.add_argument("--e2e-reps", type=int, default=200, help="repetitions per part-3 scenario (default 200)")
    parser.add_argument("--e2e-delays", type=int, nargs="*", default=[0, 2048], help="part 3's delay scenarios")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    rows = confirmation_table(args, rng)
    print(f"\n1. Confirmation power ({args.draws:,} draws a cell; runs per arm = 1 + k)\n")
    print("| scenario | better arm's seeds | worse arm's seeds | k | arms' seeds | right | wrong winner | no winner |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['scenario']} | {r['better']} | {r['worse']} | {r['k']} | {r['seeds']} | {r['right']:.1%} | "
              f"{r['wrong']:.1%} | {r['none']:.1%} |")  # fmt: skip
    tuning = tuning_table(args, rng)
    print(f"\n2. Tuning trials (random search, {args.reps:,} repetitions a cell): P(the best trial is a good pick)\n")
    print("| optimizer | best truth | " + " | ".join(f"n={n}" for n in args.trials) + " |")
    print("|---|---|" + "---|" * len(args.trials))
    for optimizer in ("adamw", "lamb"):
        mine = [r for r in tuning if r["optimizer"] == optimizer]
        print(f"| {optimizer} | {mine[0]['best_truth']:,.0f} | " + " | ".join(f"{r['good']:.1%}" for r in mine) + " |")
    if args.end_to_end:
        scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None
        with tempfile.TemporaryDirectory(prefix="power-", dir=scratch) as tmp:
            e2e = [end_to_end(args, d, k, Path(tmp)) for k in args.end_to_end for d in args.e2e_delays]
        print(f"\n3. Through hpo run ({args.e2e_reps} repetitions; every verdict equal to decide over its seeds)\n")
        print("| scenario | k | right | wrong winner | no winner |\n|---|---|---|---|---|")
        for r in e2e:
            print(f"| {r['scenario']} | {r['k']} | {r['right']:.1%} | {r['wrong']:.1%} | {r['none']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
