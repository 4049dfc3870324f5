"""A real experiment on the learning-curve table: what `hpo plan` runs when the table cannot serve the file as it is.

A GPU preset tunes BERT-large (its learning rates, batch sizes and sample budget) and dimensions the table does not
vary (β1, β2, weight decay, a clipping threshold). The plan keeps what decides an experiment's cost and its
chance of an answer, the file's shape: its arms, tuner, trial budget, confirmation policy, slots and GPUs per
trial. It moves the rest onto the table, and states each move as an assumption that the plan prints:

- the table's model and data: its base config and fixed settings (budget, evaluations, target) replace the
  file's; one table sample stands for `sample_scale` of the file's samples (its budget over the table's; where the
  table's runs have another length at each batch size, `batch_sample_scale`: at each its own), so simulated
  durations are those of the file's budget on the file's GPUs. A file that sets its budget per batch
  size (one-value choices conditioned on the batch size) has each batch size's budget over the table's at the
  batch size read for it, which must be one number at every batch size: in other proportions one table sample
  cannot stand for the same number of the file's samples everywhere, and the move is refused (HpoError naming
  each batch size's budget and the table's), never read as a run length held at its best;
- learning rates over the table's grid at each optimizer and batch size (where the best of each lies), warmup
  over the table's; batch sizes the file tunes or compares read the table's, smallest to smallest;
- a dimension the table does not vary is held at its best: it is assumed not to change samples to target, and
  leaves the space; one the file compares stays (its arms stay) and every arm reads the same curves, so the plan
  forecasts the chances of an answer when those arms are truly equal (`runner.simulation.assume_no_effect`).

It is pure: the file's self-contained form and the table in, the simulated form and the assumptions out.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml

import trainer
from hpo.errors import HpoError
from hpo.runners.simulated import batch_budgets
from hpo.simulation.table import DIMENSIONS, CurveTable
from search_spaces.space import trainer_key
from trainer.config import config_from_dict, set_dotted

BATCH, LR, WARMUP, OPTIMIZER = "batch.global_batch_size", "optimizer.lr", "schedule.warmup_steps", "optimizer.name"


def simulated_resources(resources: dict[str, Any]) -> dict[str, Any]:
    """A real file's resources as the simulated runner takes them: slots of whole GPUs on no machine of its own,
    without the host's process limits (what a simulated file may not set: `hpo.experiment.checks`)."""
    return {**resources, "machines": [], "memory_limit_mb": None, "cpu_slots": 1, "trials_per_gpu": 1}


def table_proxy(spec, data: dict[str, Any], table: CurveTable) -> tuple[dict[str, Any], list[str]]:
    """(`data`, the self-contained form of `spec`, moved onto `table` for `runner: simulated`; the assumptions that
    move states). HpoError when even the file's shape cannot be kept (more batch sizes, or other optimizers, than
    the table records)."""
    source = spec.source
    base = config_from_dict(spec.resolved_base())  # the file's base config with its overrides: budget, batch
    batches = _batch_map(data, table, base.batch.global_batch_size, source)
    smallest = min(batches.values())
    space, held, equal, lengths = {}, [], [], set()
    for name, param in data["space"].items():
        key = trainer_key(name)
        if key in _RUN_LENGTH:  # the table's run length at each batch size stands for the file's (the scale below)
            lengths.add(key)
        elif key == OPTIMIZER:
            _check_optimizers(param.get("choice", []), table, source, name)
            space[name] = param
        elif key in DIMENSIONS:
            tuned = OPTIMIZER in {trainer_key(n) for n in data["space"]}
            space.update(_on_table(name, param, key, table, batches, None if tuned else base.optimizer.name))
        elif name in data.get("compare", []):
            space[name], equal = param, [*equal, key]
        else:
            held.append(key)
    space = {name: _drop_conditions(param, held) for name, param in space.items()}
    if data["tuner"]["name"] == "grid":
        _check_grid_kept(data["space"], space, source)
    fixed = {k: v for k, v in table.meta["fixed"].items() if not table.per_batch or k not in _RUN_LENGTH}
    overrides = {**fixed, **_batch_overrides(table, batches, base, data, space)}
    if WARMUP not in {trainer_key(n) for n in space} and base.schedule.warmup_steps not in _warmups(table, smallest):
        overrides[WARMUP] = _warmups(table, smallest)[0]  # the file's fixed warmup is not in the table: the table's
    if OPTIMIZER not in {trainer_key(n) for n in space}:
        _check_optimizers([base.optimizer.name], table, source, "the base config's optimizer.name")
        overrides[OPTIMIZER] = base.optimizer.name
    if table.per_batch and BATCH in {trainer_key(n) for n in space}:
        space.update(_run_lengths(table, batches))
    elif table.per_batch:  # one batch size: its run length as settings
        (batch,) = batches.values()
        overrides |= {"budget.max_samples": table.max_samples_for(batch), "eval.every_samples":
                      table.eval_every_for(batch), WARMUP: _warmups(table, batch)[0]}  # fmt: skip
    budgets = None  # the file's budget at each of its batch sizes, where it sets one per batch size
    if "budget.max_samples" in lengths:
        budgets = {b: batch_budgets(spec).get(b, base.budget.max_samples) for b in batches}
    by_batch: dict[int, float] = {}  # a table batch size -> its own scale (one budget, runs of other lengths)
    if budgets:
        scale = _scale(spec, table, batches, budgets)
    else:
        scale = base.budget.max_samples / _table_budget(table, batches)
        theirs = {t: table.max_samples_for(t) for t in sorted(set(batches.values()))}
        if table.per_batch and len(set(theirs.values())) > 1:
            by_batch = {t: base.budget.max_samples / n for t, n in theirs.items()}
    table_base = _table_base(table, spec)
    for key, value in overrides.items():
        set_dotted(table_base, key, value)
    moved = {**data, "base_config": table_base, "overrides": {}, "space": space, "engine": "local",
             "runner": {"name": "simulated", "simulation": {"table": str(table.path), "sample_scale": scale,
                                                            "batch_sample_scale": by_batch,
                                                            "assume_no_effect": equal}},
             "resources": simulated_resources(data["resources"])}  # fmt: skip
    moved.pop("allow_unequal_arms", None)  # what made the file's arms unequal is held at its best (or is the table's)
    if table.per_batch and BATCH in {trainer_key(n) for n in space}:
        moved["allow_unequal_arms"] = "planned on the curve table: each batch size has the table's own run length"
    assumptions = _assumptions(table, base, scale, held, equal, batches, budgets, by_batch)
    if data["tuner"]["name"] == "nni_smac":  # SMAC3 inside NNI's manager; the plan runs the study loop itself
        moved["tuner"] = {**data["tuner"], "name": "smac_bo", "options": {}}
        assumptions.append("tuner nni_smac (SMAC3 inside NNI's manager) planned as smac_bo, the same SMAC3 Bayesian "
                           "optimization, with its default options")  # fmt: skip
    return moved, assumptions


_RUN_LENGTH = ("budget.max_samples", "eval.every_samples")


def _check_grid_kept(file_space: dict[str, Any], space: dict[str, Any], source: str) -> None:
    """A grid's trials are the combinations of its choices: moved onto the table, a learning rate over the table's
    range (no longer a choice) or a dimension held at its best (no longer tuned) makes it another grid. HpoError
    naming them; choices moved value for value (the compared batch sizes) keep it."""
    changed = [name for name, param in file_space.items()
               if len(space.get(name, {}).get("choice") or []) != len(param.get("choice") or [])]  # fmt: skip
    if changed:
        raise HpoError(f"{source}: tuner grid: its trials are the combinations of its choices, and the move onto the "
                       f"table would not keep those of {', '.join(changed)} (a learning rate over the table's range, "
                       "what the table does not vary held at its best): a grid is planned only as it is, over a "
                       "table that has its values")  # fmt: skip


def _check_optimizers(names: list[str], table: CurveTable, source: str, where: str) -> None:
    missing = [n for n in names if n not in table.values(OPTIMIZER)]
    if missing:
        raise HpoError(f"{source}: {where}: the curve table {table.path} records {table.values(OPTIMIZER)}, not "
                       f"{missing}: the plan cannot stand in for them")  # fmt: skip


def _batch_map(data: dict[str, Any], table: CurveTable, base_batch: int, source: str) -> dict[int, int]:
    """The file's global batch sizes -> the table's, smallest to smallest."""
    values = sorted({v for n, p in data["space"].items() if trainer_key(n) == BATCH for v in p.get("choice", [])})
    values = values or [base_batch]
    ours = table.batch_sizes()
    if len(values) > len(ours):
        raise HpoError(f"{source}: batch.global_batch_size: the file has {len(values)} batch sizes {values}, the curve "
                       f"table {table.path} records {len(ours)} ({ours}); compare at most {len(ours)}")  # fmt: skip
    return dict(zip(values, ours, strict=False))


def _on_table(
    name: str, param: dict[str, Any], key: str, table: CurveTable, batches: dict[int, int], optimizer: str | None
) -> dict:
    """A tuned table dimension over the table's grid, its conditions on batch sizes moved with the batch sizes
    (`optimizer`: the one every trial uses, where the file does not tune it)."""
    when = {k: ([batches[v] for v in c] if isinstance(c, list) else batches.get(c, c)) if trainer_key(k) == BATCH
            else c for k, c in (param.get("when") or {}).items()}  # fmt: skip
    extra = {"when": when} if when else {}
    if key == BATCH:
        return {name: {"choice": [batches[v] for v in param["choice"]], **extra}}
    if key == WARMUP:
        return {} if table.per_batch else {name: {"choice": table.grid_values(WARMUP), **extra}}  # per batch below
    at = [when[k] for k in when if trainer_key(k) == BATCH] or list(batches.values())
    optimizers = [when[k] for k in when if trainer_key(k) == OPTIMIZER] or ([optimizer] if optimizer else [])
    optimizers = optimizers or table.values(OPTIMIZER)
    grids = [g for o in optimizers for b in at for w in _warmups(table, b) if (g := table.learning_rates(o, w, b))]
    low, high = max(g[0] for g in grids), min(g[-1] for g in grids)  # inside the grid wherever it is active
    return {name: {"float": [low, high], "log": True, **extra}}


def _warmups(table: CurveTable, batch: int) -> list[int]:
    return [int(w) for w in table.grid_values(WARMUP, batch)]


def _drop_conditions(param: dict[str, Any], held: list[str]) -> dict[str, Any]:
    when = {k: c for k, c in (param.get("when") or {}).items() if trainer_key(k) not in held}
    return {**{k: v for k, v in param.items() if k != "when"}, **({"when": when} if when else {})}


def _batch_overrides(table, batches, base, data, space) -> dict[str, Any]:
    """The batch size where the file does not tune it, and a micro batch that every batch size splits into."""
    resources = data["resources"]
    ranks = resources["cpu_ranks_per_trial"] if resources.get("gpus") == "none" else resources["gpus_per_trial"]
    ranks = max(1, int(ranks or 1))
    smallest = min(batches.values())
    micro = smallest // ranks if smallest % ranks == 0 else smallest
    out: dict[str, Any] = {"batch.micro_batch_size": micro}
    if BATCH not in {trainer_key(n) for n in space}:
        out[BATCH] = batches[base.batch.global_batch_size]
    return out


def _run_lengths(table: CurveTable, batches: dict[int, int]) -> dict[str, Any]:
    """A table with a plan per batch size: its budget, evaluation interval and warmup there, as one-value choices."""
    space: dict[str, Any] = {}
    for key, values in (("budget.max_samples", table.max_samples_for), ("eval.every_samples", table.eval_every_for),
                        (WARMUP, lambda b: _warmups(table, b)[0])):  # fmt: skip
        for b in sorted(set(batches.values())):
            space[f"{key}@b{b}"] = {"choice": [values(b)], "when": {BATCH: b}}
    return space


def _scale(spec, table: CurveTable, batches: dict[int, int], budgets: dict[int, int]) -> float:
    """The file's samples one table sample stands for, where the file sets its budget per batch size: its budget at
    each batch size over the table's at the batch size read for it, the same at every one; HpoError naming them
    where they differ."""
    ratios = {b: budgets[b] / table.max_samples_for(t) for b, t in batches.items()}
    first = next(iter(ratios.values()))
    if all(math.isclose(r, first, rel_tol=1e-9) for r in ratios.values()):
        return first
    each = "; ".join(f"batch {b:,} trains {budgets[b]:,} samples, read from the table's batch {t:,}, whose runs stop "
                     f"at {table.max_samples_for(t):,} (one table sample = {ratios[b]:,.4g} of the file's)"
                     for b, t in batches.items())  # fmt: skip
    raise HpoError(f"{spec.source}: budget.max_samples: the file sets a budget per batch size, and the curve table "
                   f"{table.path} has them in other proportions: {each}; one table sample cannot stand for the same "
                   "number of the file's samples at every batch size")  # fmt: skip


def _table_budget(table: CurveTable, batches: dict[int, int]) -> int:
    return max(table.max_samples_for(b) for b in batches.values())


def _table_base(table: CurveTable, spec) -> dict[str, Any]:
    """The table's base trainer config, as shipped in the trainer package; a table that names none (a pilot's, as
    `hpo table` writes it: its runs trained the pilot's model) takes the file's own, with its overrides: the curves,
    not the model, are what the simulated trials read."""
    if "base_config" not in table.meta:
        return copy.deepcopy(spec.resolved_base())
    path = Path(trainer.__file__).parent / "configs" / Path(table.meta["base_config"]).name
    return yaml.safe_load(path.read_text())


def _samples(scale: float) -> str:
    """A count of file samples per table sample: whole above 100 (651), else to 3 significant digits (0.5, not 0)."""
    return f"{scale:,.0f}" if scale >= 100 else f"{scale:,.3g}"


def _assumptions(table, base, scale, held, equal, batches, budgets, by_batch) -> list[str]:
    stands = f"{_samples(scale)} of the file's {base.budget.max_samples:,} samples"
    if by_batch:
        stands = f"the file's {base.budget.max_samples:,} samples over the table's run at each batch size (below)"
    if budgets:
        stands = f"{scale:,.4g} of the file's samples (its budget at each batch size over the table's there)"
    lines = [
        f"planned on the curve table {table.path.name} (the tiny BERT of its base config, on its data): the "
        f"file's shape (arms, tuner, trials, confirmations, slots, GPUs per trial) on the table's curves; one "
        f"table sample stands for {stands}",
        "learning rates over the table's grid at each optimizer and batch size, warmup over the table's",
    ]
    # fmt: skip
    if held:
        lines.append(f"held at their best, assumed not to change samples to target (the table does not vary them): "
                     f"{', '.join(held)}")  # fmt: skip
    if equal:
        lines.append(f"compared but not in the table: {', '.join(equal)}; every arm reads the same curves, so the "
                     "outcomes are the chances of an answer when these arms are truly equal")  # fmt: skip
    if len(batches) > 1 or next(iter(batches)) != next(iter(batches.values())):
        pairs = ", ".join(f"{a:,} -> {b:,}" for a, b in batches.items())
        lines.append(f"global batch sizes read the table's, smallest to smallest: {pairs}")
    theirs = {b: table.max_samples_for(b) for b in sorted(set(batches.values()))}
    if budgets and len(set(budgets.values())) > 1:  # the file's own budget at each batch size, as the table's
        pairs = ", ".join(f"{theirs[t]:,} at table batch {t:,} for the file's {budgets[b]:,} at {b:,}"
                          for b, t in batches.items())  # fmt: skip
        lines.append(f"each batch size trains the file's own budget there, in the table's proportions: {pairs}")
    elif by_batch:  # a scale at each batch size (`batch_sample_scale`)
        lengths = ", ".join(f"{n:,} at {b:,}" for b, n in theirs.items())
        scales = ", ".join(f"{_samples(s)} at {b:,}" for b, s in by_batch.items())
        lines.append(f"the table's runs are of other lengths at each batch size ({lengths} samples): one table "
                     f"sample stands for the file's budget over the table's run there ({scales}), so a full run "
                     f"lasts the file's {base.budget.max_samples:,} samples at every batch size")  # fmt: skip
    return lines
