"""`python -m bench.cost_at_scale`: the command line."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

from bench.cost_at_scale.common import GPUS_PER_SLOT, OURS, SYNETUNE, TABLE, TUNERS
from bench.cost_at_scale.controller_cpu import controller_cpu
from bench.cost_at_scale.repetitions import _confirm, _repetition, read_rows, run_setup
from bench.cost_at_scale.synetune_peer import synetune_available
from bench.cost_at_scale.tables import print_cost_table, print_cpu_table, summary_rows
from bench.machine import cpu_model
from hpo.plan.forecast import without_progress_series  # shared with `hpo plan`
from hpo.simulation.table import load_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cost_at_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 64, 1024])
    parser.add_argument("--seeds", type=int, default=50, help="repetitions per tuner and slot count")
    parser.add_argument(
        "--seed-cap",
        action="append",
        default=[],
        metavar="TUNER@SLOTS=N",
        help="fewer repetitions for one tuner at one slot count (e.g. smac_bo@1024=10); repeatable",
    )
    parser.add_argument("--tuners", nargs="+", default=list(TUNERS), choices=TUNERS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, nargs=2, default=(3.1623e-4, 0.1))
    parser.add_argument("--lr-from-table", action="store_true",
                        help="each optimizer over its own learning-rate range of the table at --batch (a large-batch "
                        "table: hpo/simulation/tables/large_batch.jsonl), instead of --lr for both")  # fmt: skip
    parser.add_argument("--trials-per-slot", type=int, default=2)
    parser.add_argument("--min-trials", type=int, default=20)
    parser.add_argument("--confirm", type=_confirm, default=2, help="confirmation seeds per arm, or auto (ours only)")
    parser.add_argument("--cap", type=int, default=None, help="max_confirm_seeds with --confirm auto (default 12)")
    parser.add_argument("--jobs", type=int, default=1, help="repetitions run in parallel processes")
    parser.add_argument("--full-records", action="store_true", help="keep the table's loss and noise-scale series")
    parser.add_argument(
        "--cpu-trials",
        type=int,
        nargs="*",
        default=[100, 1000, 10000],
        help="history sizes of the controller CPU measurement (none: skip it)",
    )
    parser.add_argument("--cpu-slots", type=int, default=64, help="slots of the controller CPU measurement")
    parser.add_argument("--cpu-tuners", nargs="+", default=["random", "smac_bo"], choices=OURS)
    parser.add_argument("--cpu-limit-s", type=float, default=180.0, help="CPU seconds per CPU measurement run")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument(
        "--rows",
        type=Path,
        help="append each repetition's row to this JSON-lines file as it ends, and skip the repetitions it "
        "already holds for the same set-up (a run stopped half-way goes on where it stopped)",
    )
    args = parser.parse_args(argv)
    if args.lr_from_table:
        args.lr = None  # each optimizer over its own range of the table at --batch (`experiment`)
    if args.confirm == "auto" and set(args.tuners) - set(OURS):
        parser.error(f"--confirm auto runs through hpo's own study loop: --tuners {' '.join(OURS)} only")
    caps: dict[tuple[str, int], int] = {}
    for text in args.seed_cap:
        try:
            who, n = text.split("=")
            tuner, slots = who.split("@")
            caps[(tuner, int(slots))] = int(n)
        except ValueError:
            parser.error(f"--seed-cap {text!r}: expected TUNER@SLOTS=N, e.g. smac_bo@1024=10")
    args.scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None  # SQLite's syncs cost nothing in memory
    started = time.perf_counter()
    tuners, skipped = [], []
    for tuner in args.tuners:
        why = synetune_available(tuner) if tuner in SYNETUNE else None
        (skipped.append(f"{tuner}: {why}") if why else tuners.append(tuner))
    with tempfile.TemporaryDirectory(prefix="cost-at-scale-", dir=args.scratch) as tmp:
        args.run_table = args.table if args.full_records else without_progress_series(args.table, Path(tmp) / "t.jsonl")
        setup = run_setup(args)
        rows = read_rows(args.rows, setup) if args.rows else []
        have = {(r["tuner"], r["slots"], r["seed"]) for r in rows}
        tasks = [(tuner, slots, rep, args) for slots in args.slots for tuner in tuners
                 for rep in range(min(args.seeds, caps.get((tuner, slots), args.seeds)))
                 if (tuner, slots, rep) not in have]  # fmt: skip
        tasks.sort(key=lambda t: (t[1], t[1] >= 1024 and t[0].startswith("smac")))  # SMAC at 1,024 slots last
        if have:
            print(f"  {len(rows)} repetitions read from {args.rows}; {len(tasks)} to run", file=sys.stderr)
        pool = concurrent.futures.ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
        results = (pool.submit(_repetition, t) for t in tasks) if pool else (_repetition(t) for t in tasks)
        if pool:
            results = concurrent.futures.as_completed(list(results))
        for done, result in enumerate(results, 1):
            row = result.result() if pool else result
            rows.append(row)
            if args.rows:
                with args.rows.open("a") as f:
                    f.write(json.dumps({"setup": setup, **row}, default=str) + "\n")
            if done % 10 == 0 or done == len(tasks):
                print(f"  {done}/{len(tasks)} repetitions ({time.perf_counter() - started:,.0f} s)", file=sys.stderr)
        if pool:
            pool.shutdown()
        rows = [r for r in rows if r["slots"] in args.slots and r["tuner"] in tuners]
        cpu_rows = []
        for tuner in args.cpu_tuners:
            limited = None
            for n in sorted(args.cpu_trials):
                if limited:
                    cpu_rows.append({"tuner": tuner, "trials": n, "skipped": limited})
                    continue
                row = controller_cpu(tuner, n, args, Path(tmp))
                cpu_rows.append(row)
                print(f"  controller CPU {tuner} {n}: {row['asked']} asked, {row['cpu_s']:.0f} s", file=sys.stderr)
                if row["stopped"]:
                    limited = f"{n:,} reached {row['asked']:,} in {args.cpu_limit_s:.0f} CPU s"
    meta = load_table(args.table).meta
    command = "python -m bench.cost_at_scale " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"\n`{command.strip()}` on {cpu_model()} ({os.cpu_count()} CPUs), {time.perf_counter() - started:,.0f} s; "
          f"table {args.table} (data {str(meta.get('data_sha256', '?'))[:12]}), batch {args.batch}, lr "
          f"{'each optimizer its grid range' if args.lr is None else f'{args.lr[0]:g}-{args.lr[1]:g}'}, "
          f"trials = max({args.min_trials}, {args.trials_per_slot} x slots) over 2 "
          f"arms + {args.confirm} confirmation seeds per arm; slot = {GPUS_PER_SLOT} A100s.\n")  # fmt: skip
    for line in skipped:
        print(f"not run: {line}")
    print("Median [95 % interval of the median, order statistics; * = range, fewer than 6 repetitions] over the "
          "repetitions; simulated hours; 'first hit': until the first trial that reached the target ended; "
          "'answer': until the verdict (last confirmation run).\n")  # fmt: skip
    print_cost_table(rows)
    if cpu_rows:
        print(f"\nController CPU on the simulated runner (one arm over the whole space, {args.cpu_slots} slots, no "
              "confirmations); 1,024 slots of 10-minute trials need about 1.7 decisions a second.\n")  # fmt: skip
        print_cpu_table(cpu_rows)
    if args.json:
        args.json.write_text(json.dumps({"command": command, "cpu": cpu_model(), "rows": rows,
                                         "summary": summary_rows(rows), "controller_cpu": cpu_rows},
                                        indent=1, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":  # SMAC3/ConfigSpace iterate over sets of strings (hpo.cli.main.entry)
        os.execve(sys.executable, [sys.executable, "-m", "bench.cost_at_scale", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    sys.exit(main())
