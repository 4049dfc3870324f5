"""The shipped learning-curve tables batch size by batch size: what `hpo plan` reads a real file from when no one
table has every batch size the file runs to the budget it trains there.

The shipped tables record one trainer (the tiny BERT of trainer/configs/demo_cpu.yaml on the demo corpus), each over
its own batch sizes and run lengths (bench/curves/README.md): curves.jsonl trains batch 32 and 128 to 12,288
samples, large_batch.jsonl batch 128 to 49,152 and 512, 1,024 and 2,048 to budgets of their own. A file that trains
batch 32 to 12,288 samples and batch 128 to 49,152 (batch_scaling_demo_cpu) is in neither table as a whole, and in
the two together. `covering_table` reads each batch size the file's trials may run from the first table of
`SHIPPED` that has it to the largest budget a trial trains there:

- all from one table: that table (the file is then planned over it as it is, as over the default one);
- from several: their combination, only where they share their set-up, everything a curve depends on besides its
  run length: the base config, the data (sha256), the fixed settings (evaluation set, target, stop at target, log
  interval) and the recorded seeds. What differs by batch size (budget, evaluation interval, warmup, micro-batch,
  learning-rate grid) is each batch size's plan, as in a table with a plan per batch size (hpo.simulation.table);
- none: HpoError naming the batch size, the file's budget there and what each table has.

The combination is such a table: its meta line holds the shared set-up, one plan per batch size (a one-budget
table's batch size keeps its warmups as a list) and `combined`, the table each batch size was read from; its runs
are the source tables' records at those batch sizes, unchanged. It is written to a temporary directory that lives
as long as the process (the simulated runner reads a table from a file).
"""

from __future__ import annotations

import atexit
import copy
import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hpo.errors import HpoError
from hpo.files import write_whole
from hpo.runners.simulated import batch_budgets
from hpo.simulation.table import RUN_LENGTH, TABLES, CurveTable, load_table

SHIPPED = (TABLES / "curves.jsonl", TABLES / "large_batch.jsonl")  # the default table first
OPTIMIZER, LR, WARMUP = "optimizer.name", "optimizer.lr", "schedule.warmup_steps"


def covering_table(spec, tables: tuple[Path, ...] = SHIPPED) -> Path:
    """The table that has every batch size `spec`'s trials may run to the budget they train there: one of `tables`,
    or their combination (written to a temporary file); HpoError saying which batch size none has, or why the
    tables that have them cannot be combined."""
    loaded = [load_table(t) for t in tables]
    sources: dict[int, CurveTable] = {}
    for batch, budget in batch_budgets(spec).items():
        table = next((t for t in loaded if batch in t.batch_sizes() and t.max_samples_for(batch) >= budget), None)
        if table is None:
            has = "; ".join(f"{t.path.name} {_lengths(t)}" for t in loaded)
            raise HpoError(f"no shipped learning-curve table has batch.global_batch_size={batch:,} to "
                           f"{budget:,} samples (the file's budget there): {has}")  # fmt: skip
        sources[batch] = table
    used = list({id(t): t for t in sources.values()}.values())
    if len(used) == 1:
        return used[0].path
    setups = [(t, _setup(t)) for t in used]
    for table, setup in setups[1:]:
        differ = [k for k in setup if setup[k] != setups[0][1][k]]
        if differ:
            first = setups[0][0]
            raise HpoError(f"the shipped tables that have the file's batch sizes, {first.path.name} and "
                           f"{table.path.name}, differ in {', '.join(differ)}: their curves are not of one set-up and "
                           "cannot be read as one table")  # fmt: skip
    return _write(sources, setups[0][1])


def sources_line(table: CurveTable) -> str | None:
    """Where a combined table's batch sizes come from, as the plan prints it; None for any other table."""
    combined = table.meta.get("combined")
    if not combined:
        return None
    parts = [f"{int(b):,} from {name} (to {table.max_samples_for(int(b)):,} samples)" for b, name in combined.items()]
    return (f"the shipped tables batch size by batch size: {', '.join(parts)}; one trainer, base config, data and "
            "evaluation set")  # fmt: skip


def _lengths(table: CurveTable) -> str:
    """`has 32, 128 to 12,288 samples` or `has 128 to 49,152, 512 to 163,840 samples`."""
    batches = table.batch_sizes()
    if not table.per_batch:
        return f"has {', '.join(f'{b:,}' for b in batches)} to {table.max_samples:,} samples"
    return "has " + ", ".join(f"{b:,} to {table.max_samples_for(b):,}" for b in batches) + " samples"


def _setup(table: CurveTable) -> dict[str, Any]:
    """What a curve of the table depends on besides its batch size's plan."""
    meta = table.meta
    return {
        "base_config": meta.get("base_config"),
        "data_sha256": meta.get("data_sha256"),
        "fixed settings": {k: v for k, v in meta.get("fixed", {}).items() if k not in RUN_LENGTH},
        "seeds": table.grid_seeds(),
        "trainer revision": table.meta.get("trainer_revision", 1),  # trainer.CURVES_REVISION of the runs
    }


def _plan(table: CurveTable, batch: int) -> dict[str, Any]:
    """The table's plan at `batch`, as a table with a plan per batch size writes it."""
    if table.per_batch:
        return copy.deepcopy(table.meta["grid"]["batches"][str(batch)])
    warmups = [int(w) for w in table.grid_values(WARMUP, batch)]
    plan: dict[str, Any] = {
        "max_samples": table.max_samples_for(batch),
        "every": table.eval_every_for(batch),
        "warmup_steps": warmups[0] if len(warmups) == 1 else warmups,
        "lr": {o: table.grid_values(LR, batch) for o in table.grid_values(OPTIMIZER, batch)},
    }
    micro = table.meta.get("grid", {}).get("micro_batch_size", {}).get(str(batch))
    return plan | ({"micro": micro} if micro is not None else {})


def _write(sources: dict[int, CurveTable], setup: dict[str, Any]) -> Path:
    meta = {
        "kind": "meta",
        "format": 1,
        "base_config": setup["base_config"],
        "fixed": setup["fixed settings"],
        "grid": {"batches": {str(b): _plan(t, b) for b, t in sources.items()}, "seed": setup["seeds"]},
        "data_sha256": setup["data_sha256"],
        "trainer_revision": setup["trainer revision"],
        "combined": {str(b): t.path.name for b, t in sources.items()},
    }
    runs = [record for b, t in sources.items() for record in _records(t.path) if record["global_batch_size"] == b]
    path = _scratch() / ("+".join(f"{t.path.stem}-b{b}" for b, t in sources.items()) + ".jsonl")
    write_whole(path, "\n".join(json.dumps(r) for r in [meta, *runs]) + "\n")
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    """The run records of a table, as the file holds them."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("kind") == "run"]


@functools.cache
def _scratch() -> Path:
    """A temporary directory for the combined tables, removed when the process ends."""
    directory = Path(tempfile.mkdtemp(prefix="hpo-combined-tables-"))
    atexit.register(shutil.rmtree, directory, True)
    return directory
