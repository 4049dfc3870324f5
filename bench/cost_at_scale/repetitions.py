"""One repetition of a tuner at a cluster size, run in a worker process, and the rows file that a stopped run
goes on from."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cost_at_scale.common import OPTUNA, OURS, TrialModel, experiment, outcome_row, trials_for
from bench.cost_at_scale.optuna_peer import run_optuna
from bench.cost_at_scale.ours import run_ours
from bench.cost_at_scale.synetune_peer import run_synetune


def repetition(tuner: str, slots: int, rep: int, args) -> dict[str, Any]:
    """Run one repetition of `tuner` on `slots` slots; its figures."""
    cpu = time.process_time()
    with tempfile.TemporaryDirectory(prefix=f"cost-{tuner}-", dir=args.scratch) as tmp:
        directory = Path(tmp)
        verdict = None
        if tuner in OURS:
            trials, spec, verdict = run_ours(tuner, slots, rep, args, directory)
        else:
            data = experiment(f"{tuner}-{slots}-{rep}", args.run_table, tuner, rep, args.batch, args.lr, slots,
                              trials_for(slots, args.trials_per_slot, args.min_trials), args.confirm)  # fmt: skip
            from hpo.experiment import experiment_from_dict

            spec = experiment_from_dict(data, data["name"], base_dir=directory)
            model = TrialModel(spec)
            if tuner in OPTUNA:
                trials = run_optuna(tuner, spec, model, rep, slots)
            else:
                trials = run_synetune(tuner, spec, model, rep, slots, directory)
    row = {"tuner": tuner, "slots": slots, "seed": rep, **outcome_row(trials, spec, slots, verdict)}
    row["cpu_s"] = time.process_time() - cpu
    return row


def _confirm(value: str) -> int | str:
    return value if value == "auto" else int(value)


def _repetition(task: tuple[str, int, int, Any]) -> dict[str, Any]:
    return repetition(*task)


def run_setup(args) -> dict[str, Any]:
    """What a repetition's figures depend on besides (tuner, slots, seed): rows of another set-up are not reused."""
    return {"table_sha256": hashlib.sha256(args.table.read_bytes()).hexdigest()[:16], "batch": args.batch,
            "lr": "table" if args.lr is None else list(args.lr), "trials_per_slot": args.trials_per_slot,
            "min_trials": args.min_trials, "confirm": args.confirm, "full_records": args.full_records,
            **({"cap": args.cap} if args.confirm == "auto" else {})}  # fmt: skip


def read_rows(path: Path, setup: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an earlier run of the same set-up in `path` (none if it does not exist); a line of another
    set-up is left alone, a line that is not JSON stops with its line number."""
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(
                f"{path}:{number}: not a JSON line ({e}); delete the line to run that repetition again"
            ) from None
        if row.pop("setup", None) == setup:
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ controller CPU
