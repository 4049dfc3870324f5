"""Report speed: time to build one experiment's HTML report from 100, 1,000 and 10,000 stored trials, and the page's
size.

The experiment is the `adam_vs_lamb_demo_cpu` preset (2 arms, 6 tuned dimensions) stored in a temporary SQLite
file with synthetic trials that look like real ones: parameters sampled from the preset's space, 70 % reaching
the target, 20 % missing it, 5 % diverged, 5 % failed, 2 confirmation seeds per arm; each trial stores 12
evaluations and 24 progress reports with the noise scale (the curves a 12,288-sample trial reports). The time
covers everything `hpo report` does for one experiment: reading storage, the verdict, the importance surrogate,
the figures and the page: the wall time, and the CPU time of this process (what a shared machine's load changes
least). Goals: seconds for 100 trials; at 10,000 trials at most 5 s and a page of at most 1 MB (issue 34).
Storing 10,000 trials takes about a minute.

    python bench/report.py [--trials 100 1000 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from hpo.experiment import load_experiment, stored_form
from hpo.experiment.arms import arm_of
from hpo.storage import MetricPoint, SqlStorage
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState

PRESET = Path(__file__).resolve().parents[1] / "search_spaces/presets/adam_vs_lamb_demo_cpu.yaml"
MAX_SAMPLES = 12_288
EVALS = 12
PROGRESS = 24


def populate(storage: SqlStorage, trials: int, seed: int = 0) -> str:
    """Store the preset with `trials` synthetic tuning trials and 2 confirmation seeds per arm; returns its name."""
    spec = load_experiment(PRESET)
    name = f"bench-report-{trials}"
    experiment_id = storage.create_experiment(name, stored_form(spec, "/tmp/bench-report"), spec.direction)
    rng = random.Random(seed)
    best: dict[str, tuple[float, dict]] = {}
    for number in range(trials):
        params = spec.space.sample(rng)
        arm = arm_of(spec, params)
        objective = _store_trial(storage, experiment_id, number, params, arm, TrialKind.TUNING, None, rng)
        if objective is not None and objective < best.get(arm, (float("inf"), {}))[0]:
            best[arm] = (objective, params)
    number = trials
    for arm, (_, params) in sorted(best.items()):
        for seed_offset in (1, 2):
            _store_trial(storage, experiment_id, number, params, arm, TrialKind.CONFIRMATION, 1234 + seed_offset, rng)
            number += 1
    return name


def _store_trial(storage, experiment_id, number, params, arm, kind, seed, rng) -> float | None:
    trial_id = storage.create_trial(experiment_id, TrialSpec(number, params, arm, 1.0, (), 32, kind, seed))
    storage.mark_trial_running(trial_id, pid=1, host="bench")
    draw = rng.random()
    target_at = rng.randrange(2, EVALS + 1) * (MAX_SAMPLES // EVALS) if draw < 0.7 else None
    samples = target_at or MAX_SAMPLES
    storage.add_metrics(trial_id, _curve(samples, target_at is not None, rng))
    if draw < 0.9:
        state, objective, reason = TrialState.COMPLETED, float(target_at or 2 * MAX_SAMPLES * 1.3), None
    elif draw < 0.95:
        state, objective, reason = TrialState.DIVERGED, 2 * MAX_SAMPLES * 2.0, "loss is nan"
    else:
        state, objective, reason = TrialState.FAILED, None, "crashed"
    final = {"samples": samples, "status": "reached_target" if target_at else "budget_exhausted"}
    result = TrialResult(state, reason, objective, target_at, None, 0.13 if target_at else 0.1, 30.0, final)
    storage.finish_trial(trial_id, result)
    return objective if state is TrialState.COMPLETED else None


def _curve(samples: int, reached: bool, rng: random.Random) -> list[MetricPoint]:
    points = []
    for i in range(1, PROGRESS + 1):
        at = samples * i // PROGRESS
        points.append(MetricPoint(2 * i, at, {"loss": 7 - 3 * at / MAX_SAMPLES, "noise_scale": rng.uniform(20, 80)}))
    for i in range(1, EVALS + 1):
        at = samples * i // EVALS
        if at <= samples:
            accuracy = 0.07 + (0.06 if reached else 0.04) * at / samples
            points.append(
                MetricPoint(2 * i * PROGRESS // EVALS + 1, at, {"mlm_accuracy": accuracy, "time_s": at / 400})
            )
    return points


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[100, 1000], help="tuning trials (default 100 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="builds timed per size (default 3)")
    args = parser.parse_args(argv)
    from hpo.report.html import experiment_report

    print(f"{'trials':>7} {'stored in':>10} {'build p50':>10} {'build max':>10} {'CPU p50':>9} {'page':>9} "
          f"{'table rows':>10}")  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        storage = SqlStorage(f"sqlite:///{directory}/bench.db", upgrade=True)
        experiment_report(storage, populate(storage, 4))  # warm-up: imports (matplotlib, scikit-learn)
        for trials in args.trials:
            started = time.perf_counter()
            name = populate(storage, trials)
            stored_s = time.perf_counter() - started
            times, cpu, html = [], [], ""
            for _ in range(args.repeats):
                started, cpu_started = time.perf_counter(), time.process_time()
                html = experiment_report(storage, name)
                times.append(time.perf_counter() - started)
                cpu.append(time.process_time() - cpu_started)
            print(f"{trials:>7,} {stored_s:>9.1f}s {statistics.median(times):>9.2f}s {max(times):>9.2f}s "
                  f"{statistics.median(cpu):>8.2f}s {len(html) / 1e6:>7.2f}MB {html.count('<tr>'):>10,}")  # fmt: skip
        storage.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
