"""A pilot experiment's learning curves as a curve table (`hpo table`), for `hpo plan --like` and the simulated runner.

Every full-budget run of the pilot that trained to its end (completed or diverged) becomes a run record of the
table format (hpo.simulation.table): its grid point (optimizer, learning rate, warmup, global batch size, read from
the trial's own trainer config), its training seed, how it ended and its stored accuracy curve (and training loss).
The meta line holds the pilot's budget, evaluation interval, target and `eval.stop_at_target`, which must be the
same for every run. A run that stopped at the target has a curve that ends there: the simulated runner blends two
learning rates' curves, and a blend of curves that never rise past the target falls short of it, so `hpo plan
--like` uses a pilot's curves only when it ran with `eval.stop_at_target: false` (as bench/curves' tables do).

The simulated runner blends the curves of one recorded seed at the two grid learning rates around a proposed one,
so a table serves an experiment only where every learning rate it may need has every seed: a pilot run as a grid
(tuner `grid` over learning rates and training seeds) is such a table; a tuned pilot (one seed per learning rate,
more seeds only at the best) is not, and `hpo plan --like` then says which runs are missing and plans over the
file's own table with the pilot's spread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hpo.errors import HpoError
from hpo.experiment.arms import trial_config
from hpo.experiment.loading import spec_from_stored
from hpo.files import write_whole
from hpo.storage.base import Storage, TrialRecord
from hpo.trials import TrialState

FORMAT = 1
ENDED = (TrialState.COMPLETED, TrialState.DIVERGED)  # trained to its budget, its target or its divergence


class PilotTableError(HpoError):
    """A pilot whose runs cannot make a curve table (none finished, budgets that differ)."""


def pilot_table(storage: Storage, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(meta record, run records) of experiment `name`'s full-budget runs that ended, in trial order; a
    configuration run twice with one seed keeps its first run. Reads only."""
    record = storage.get_experiment_by_name(name)
    spec = spec_from_stored(record)
    trials = [t for t in storage.list_trials(record.id) if t.state in ENDED and t.budget >= 1.0]
    if not trials:
        why = unfinished(record)  # a pilot still running: wait for it
        raise PilotTableError(f"experiment {name}: no full-budget run ended (completed or diverged): nothing to "
                              "make a curve table of" + (f"; {why}" if why else ""))  # fmt: skip
    series = storage.get_experiment_metrics(record.id, ["mlm_accuracy", "loss"], times=False)
    runs: dict[tuple, dict[str, Any]] = {}
    fixed: dict[str, Any] | None = None
    for trial in trials:
        cfg = trial_config(spec, trial.params)
        own = {"budget.max_samples": cfg.budget.max_samples, "eval.every_samples": cfg.eval.every_samples,
               "eval.target_mlm_accuracy": cfg.eval.target_mlm_accuracy,
               "eval.stop_at_target": cfg.eval.stop_at_target}  # fmt: skip
        if fixed is None:
            fixed = own
        elif own != fixed:
            key = next(k for k in own if own[k] != fixed[k])
            raise PilotTableError(f"experiment {name}: trial {trial.number} has {key} = {own[key]}, the pilot's "
                                  f"first run {fixed[key]}: a curve table needs one budget, interval and "
                                  "target")  # fmt: skip
        run = _run(trial, cfg, series.get(trial.id, []))
        runs.setdefault(tuple(run[k] for k in ("optimizer", "lr", "warmup_steps", "global_batch_size", "seed")), run)
    assert fixed is not None
    meta = {
        "kind": "meta",
        "format": FORMAT,
        "source": f"experiment {name} ({len(runs)} runs)",
        "fixed": fixed,
        "grid": {"seed": sorted({r["seed"] for r in runs.values()})},
    }
    return meta, list(runs.values())


def unfinished(record) -> str | None:
    """What to do about a pilot that has not finished (its runs so far are all a table or a spread can read), or
    None for a finished one."""
    from hpo.engine.liveness import liveness

    state = liveness(record)
    if state == "finished":
        return None
    if state == "live":
        return f"it is still running: wait for it to finish (`hpo status {record.name}`)"
    if state == "failed":
        return f"it failed (`hpo status {record.name}` says why)"
    return f"it is {state}: `hpo resume {record.name}` finishes it"


def _run(trial: TrialRecord, cfg, metrics) -> dict[str, Any]:
    curve = [[m.samples, m.value] for m in metrics if m.name == "mlm_accuracy" and m.samples is not None]
    loss = [[m.samples, m.value] for m in metrics if m.name == "loss" and m.samples is not None]
    if trial.state is TrialState.DIVERGED:
        status = "diverged"
    else:
        status = "reached_target" if trial.samples_to_target is not None else "budget_exhausted"
    trained = int(trial.metrics.get("samples") or (curve[-1][0] if curve else 0))
    return {
        "kind": "run",
        "optimizer": cfg.optimizer.name,
        "lr": cfg.optimizer.lr,
        "warmup_steps": cfg.schedule.warmup_steps,
        "global_batch_size": trial.global_batch_size or cfg.batch.global_batch_size,
        "seed": trial.seed if trial.seed is not None else cfg.seed,
        "status": status,
        "samples": trained,
        "samples_to_target": trial.samples_to_target,
        "curve": curve,
        "loss": loss,
        "trial": trial.number,
    }


def write_table(path: Path, meta: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    """The table as JSON lines (meta first); refuses to replace a file. A path it cannot write (its directory
    missing, a directory itself, a full disk) raises PilotTableError naming it."""
    text = "\n".join(json.dumps(r) for r in [meta, *runs]) + "\n"
    try:
        write_whole(Path(path), text, replace=False)  # whole or not at all: a cut table would read as a shorter one
    except FileExistsError:
        raise PilotTableError(f"{path}: exists; give a new file (a curve table never replaces one)") from None
    except OSError as exc:
        raise PilotTableError(f"{path}: cannot write the curve table: {exc.strerror or exc}") from None
