"""Forecast against outcome: does `hpo plan` predict what the experiments it plans then do?

For each experiment shape and slot count: `hpo plan` with R repetitions (`hpo.plan.forecast.run_plan`, seed 0: what a
user
reads before spending) against R other simulated runs of the same file with other seeds (`--seed` = R, so no
tuner or training seed is shared with the forecast; each is the study loop of `hpo run` on the simulated runner in
a database of its own, as a plan's repetition is: repetition 0 of seed 0 is `hpo run FILE` itself,
tests/hpo/plan/test_plan.py). Compared: the median GPU-hours to the verdict (within 20 % is the goal) and the share of
right answers (the truly better optimizer named; on the table LAMB needs about a quarter fewer samples than AdamW
at its best; goal: within 10 points).

Shapes, all on the learning-curve table `hpo/simulation/tables/curves.jsonl` (batch 32, the table's dimensions:
optimizer,
learning rate, warmup):
- `demo`: the CPU demo's budget (10 SMAC trials, `confirm_seeds: auto` up to 6). The demo presets themselves
  tune beta1, beta2 and weight decay, which the table does not vary, so `hpo plan` refuses them (it says so); this
  is their shape over what the table varies.
- `simulated-64`: search_spaces/presets/adam_vs_lamb_simulated.yaml as shipped (200 SMAC trials, auto up to 12).
- `asha`: the asha demo's tuner and budget (asha, eta 3, rungs 4,096 and 12,288 samples, 16 trials, auto up to 6).
Each at 8 and 64 slots (`--slots`).

    python -m bench.plan_forecast [--repetitions 50] [--shapes demo asha simulated-64] [--slots 8 64] [--jobs 2]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench.machine import cpu_model
from hpo.plan.forecast import PlanOptions, prepare_plan, run_plan
from hpo.simulation.table import shipped_table

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_simulated.yaml"
TRULY_BETTER = "optimizer.name=lamb"
SHAPES = {
    "demo": {"tuner": {"name": "smac_bo", "seed": 0},
             "budget": {"trials": 10, "confirm_seeds": "auto", "max_confirm_seeds": 6}},
    "simulated-64": {},
    "asha": {"tuner": {"name": "asha", "seed": 0,
                       "options": {"eta": 3, "min_samples": 4096, "max_samples": 12288, "sampler": "model",
                                   "min_points_in_model": 4}},
             "budget": {"trials": 16, "confirm_seeds": "auto", "max_confirm_seeds": 6}},
}  # fmt: skip


def shape_file(shape: str, directory: Path) -> Path:
    """The preset with the shape's tuner and budget, written (absolute paths) into `directory`."""
    data = yaml.safe_load(PRESET.read_text())
    data["base_config"] = str((PRESET.parent / data["base_config"]).resolve())
    table = data["runner"]["simulation"]["table"]
    if shipped_table(table) is None:  # a path, read from the preset's directory; a shipped table's name reads anywhere
        data["runner"]["simulation"]["table"] = str((PRESET.parent / table).resolve())
    for section, values in SHAPES[shape].items():
        data[section] = {**data.get(section, {}), **copy.deepcopy(values)} if section == "budget" else values
    data["name"] = f"forecast_{shape.replace('-', '_')}"
    path = directory / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def summary(repetitions) -> dict[str, Any]:
    n = len(repetitions)
    right = sum(r.outcome == "winner" and r.winner == TRULY_BETTER for r in repetitions)
    wrong = sum(r.outcome == "winner" and r.winner != TRULY_BETTER for r in repetitions)
    return {"n": n, "gpu_h": statistics.median(r.answer_gpu_h for r in repetitions),
            "wall_h": statistics.median(r.answer_wall_h for r in repetitions),
            "right": right / n, "wrong": wrong / n,
            "equivalent": sum(r.outcome == "equivalent" for r in repetitions) / n,
            "not_yet": sum(r.outcome == "not yet" for r in repetitions) / n}  # fmt: skip


def cell(task: tuple[str, int, int]) -> dict[str, Any]:
    shape, slots, reps = task
    started, cpu = time.perf_counter(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        path = shape_file(shape, Path(tmp))
        forecast = run_plan(prepare_plan(str(path), PlanOptions(reps, 0, slots)))
        outcome = run_plan(prepare_plan(str(path), PlanOptions(reps, reps, slots)))  # seeds R..2R-1: no overlap
    f, o = summary(forecast), summary(outcome)
    return {"shape": shape, "slots": slots, "forecast": f, "outcome": o,
            "gpu_h_off": f["gpu_h"] / o["gpu_h"] - 1, "right_off": f["right"] - o["right"],
            "seconds": time.perf_counter() - started, "cpu_s": time.process_time() - cpu}  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| shape | slots | GPU-h to the verdict: forecast / outcome (median) | off | right answers: forecast / "
        "outcome | off (points) | wrong: forecast / outcome | not yet: forecast / outcome | within goals |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        f, o = r["forecast"], r["outcome"]
        ok = abs(r["gpu_h_off"]) <= 0.20 and abs(r["right_off"]) <= 0.10
        lines.append(
            f"| {r['shape']} | {r['slots']} | {f['gpu_h']:,.1f} / {o['gpu_h']:,.1f} | {r['gpu_h_off']:+.1%} | "
            f"{f['right']:.0%} / {o['right']:.0%} | {100 * r['right_off']:+.0f} | {f['wrong']:.0%} / "
            f"{o['wrong']:.0%} | {f['not_yet']:.0%} / {o['not_yet']:.0%} | {'yes' if ok else '**no**'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plan_forecast", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=50, help="R: the plan's repetitions and the runs (50)")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--jobs", type=int, default=1, help="cells in parallel processes (default 1)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    tasks = [(s, n, args.repetitions) for s in args.shapes for n in args.slots]
    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        rows = []
        for row in pool.map(cell, tasks):
            rows.append(row)
            print(f"  {row['shape']} at {row['slots']} slots: {row['seconds']:.0f} s", file=sys.stderr, flush=True)
    print(table(rows))
    print(
        f"\n{time.perf_counter() - started:,.0f} s wall; CPU: {cpu_model()}; python -m bench.plan_forecast "
        + " ".join(argv if argv is not None else sys.argv[1:])
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
