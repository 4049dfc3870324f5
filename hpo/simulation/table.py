"""The learning-curve table: recorded runs of our trainer over a grid (hpo/simulation/tables/curves.jsonl), read and
checked.

The file is JSON lines: a first `{"kind": "meta", ...}` line (the grid, the fixed trainer settings, the data's
fingerprint), then one `{"kind": "run", ...}` line per run: its grid point (`optimizer`, `lr`, `warmup_steps`,
`global_batch_size`, `seed`), how it ended (`status`, `samples`, `samples_to_target`), its accuracy curve
(`curve`: [samples, mlm_accuracy] at every evaluation, to the full budget), its training loss and gradient noise
scale ([samples, value] every few steps), and its measured seconds. bench/curves/README.md documents the grid.

Two kinds of meta line. A table with one budget (curves.jsonl) has `fixed["budget.max_samples"]` and
`fixed["eval.every_samples"]`, the same for every run. A table with a plan per global batch size
(large_batch.jsonl) has them per batch instead: `grid["batches"]["512"] = {"max_samples": ..., "every": ...,
"warmup_steps": ..., "lr": {"adamw": [...], "lamb": [...]}, "micro": ...}` (`warmup_steps` a number, or a list where
the batch size's runs have several: `hpo plan` writes such a plan when it reads a batch size of a one-budget table
into a table of several, hpo.plan.combined). `max_samples_for(batch)` and `eval_every_for(batch)` answer both (a
one-budget table gives the same value for every batch).

A table may be partial (the generator appends run by run): `gaps` says which runs a range of learning rates
at one point still lacks, so an experiment that needs them is refused by name before it starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpo.errors import HpoError

# The trainer keys the table varies, and the name of each in the table's records.
DIMENSIONS = {
    "optimizer.name": "optimizer",
    "optimizer.lr": "lr",
    "schedule.warmup_steps": "warmup_steps",
    "batch.global_batch_size": "global_batch_size",
}
# Trainer keys a simulated trial reads besides the table's dimensions: where it stops and how often it evaluates.
# A table with a budget per batch size needs them set per batch size (per arm), so an experiment may set them
# in its space as well as in its overrides.
RUN_LENGTH = ("budget.max_samples", "eval.every_samples")
# The tables that ship with hpo (package data; bench/curves/generate.py writes them and bench/curves/README.md
# documents their grids): an experiment file names one by its name (`table: curves`) instead of a path.
TABLES = Path(__file__).with_name("tables")
IN_A_CHECKOUT = "(in a checkout of the project: bench/ is not installed with hpo)"
_BUDGET_KEYS = {"budget.max_samples": "max_samples", "eval.every_samples": "every"}  # fixed key -> per-batch key
Series = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Run:
    """One recorded training run."""

    optimizer: str
    lr: float
    warmup_steps: int
    global_batch_size: int
    seed: int
    status: str  # the trainer's: reached_target, budget_exhausted or diverged
    samples: int  # samples trained (less than the budget only when it diverged)
    curve: Series  # (samples, mlm_accuracy) at every evaluation
    loss: Series = ()
    noise_scale: Series = ()
    train_time_s: float = 0.0

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"


@dataclass(frozen=True)
class CurveTable:
    """Every run of the table, indexed by grid point; `meta` is the file's first line."""

    path: Path
    meta: dict[str, Any]
    runs: tuple[Run, ...]
    _index: dict[tuple, list[Run]] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for run in self.runs:
            self._index.setdefault((run.optimizer, run.warmup_steps, run.global_batch_size), []).append(run)
        for runs in self._index.values():
            runs.sort(key=lambda r: (r.lr, r.seed))

    # -- budgets -------------------------------------------------------------------------------------------
    @property
    def per_batch(self) -> bool:
        """Whether each global batch size has its own budget, evaluation interval and grid (meta grid.batches)."""
        return "batches" in self.meta.get("grid", {})

    @property
    def max_samples(self) -> int:
        """The sample budget of every run, in a table with one budget (else use `max_samples_for`)."""
        return self._single("budget.max_samples")

    @property
    def eval_every(self) -> int:
        """The evaluation interval of every run, in a table with one budget (else use `eval_every_for`)."""
        return self._single("eval.every_samples")

    def max_samples_for(self, global_batch_size: int) -> int:
        """The sample budget the runs at this global batch size trained (and the curves end at)."""
        return self._per_batch("budget.max_samples", global_batch_size)

    def eval_every_for(self, global_batch_size: int) -> int:
        """The evaluation interval of the runs at this global batch size."""
        return self._per_batch("eval.every_samples", global_batch_size)

    def batch_sizes(self) -> list[int]:
        """The global batch sizes of the table's grid, generated or not (the recorded ones where the meta
        record does not list them)."""
        grid = self.meta.get("grid", {})
        planned = [int(b) for b in grid["batches"]] if self.per_batch else grid.get("global_batch_size", [])
        return sorted(set(planned) | set(self.values("batch.global_batch_size")))

    def _single(self, key: str) -> int:
        if self.per_batch:
            raise HpoError(f"{self.path}: the table has a {key} per global batch size (batch.global_batch_size in "
                           f"{self.batch_sizes()}); ask for one batch size's")  # fmt: skip
        return int(self.meta["fixed"][key])

    def _per_batch(self, key: str, global_batch_size: int) -> int:
        if not self.per_batch:
            return int(self.meta["fixed"][key])
        plan = self._plan(global_batch_size)
        if plan is None:
            raise HpoError(f"{self.path}: no batch.global_batch_size={global_batch_size}; the table has "
                           f"batch.global_batch_size in {self.batch_sizes()}")  # fmt: skip
        return int(plan[_BUDGET_KEYS[key]])

    def _plan(self, global_batch_size: int) -> dict[str, Any] | None:
        return self.meta["grid"]["batches"].get(str(global_batch_size)) if self.per_batch else None

    # -- the grid --------------------------------------------------------------------------------------------
    def values(self, key: str) -> list:
        """The recorded values of a trainer key the table varies (e.g. `optimizer.lr`)."""
        return sorted({getattr(run, DIMENSIONS[key]) for run in self.runs})

    def seeds(self) -> list[int]:
        """The recorded training seeds (the surrogate's seed s reads `seeds()[s % len(seeds())]`)."""
        return sorted({run.seed for run in self.runs})

    def grid_seeds(self) -> list[int]:
        """The training seeds of the table's grid, generated or not: its meta record's, with the recorded ones."""
        return sorted(set(self.meta.get("grid", {}).get("seed", [])) | set(self.seeds()))

    def grid_values(self, key: str, global_batch_size: int | None = None) -> list:
        """The values of a dimension in the table's grid, generated or not: its meta record's, with the recorded
        ones (for a table with a plan per batch size: at `global_batch_size`, or at any batch size)."""
        if key == "batch.global_batch_size":
            return self.batch_sizes()
        runs = [r for r in self.runs if global_batch_size is None or r.global_batch_size == global_batch_size]
        if self.per_batch:
            batches = self.meta["grid"]["batches"]
            plans = [batches.get(str(global_batch_size), {})] if global_batch_size is not None else batches.values()
            planned = [v for plan in plans for v in _plan_values(plan, key)]
        else:
            planned = self.meta.get("grid", {}).get(DIMENSIONS[key], [])
        return sorted(set(planned) | {getattr(r, DIMENSIONS[key]) for r in runs})

    def learning_rates(self, optimizer: str, warmup_steps: int, global_batch_size: int) -> list[float]:
        """The grid learning rates of one (optimizer, warmup, batch) point, generated or not."""
        if self.per_batch:
            planned = (self._plan(global_batch_size) or {}).get("lr", {}).get(optimizer, [])
        else:
            planned = self.meta.get("grid", {}).get("lr", [])
        recorded = [r.lr for r in self._index.get((optimizer, warmup_steps, global_batch_size), [])]
        return _distinct(sorted(float(lr) for lr in [*planned, *recorded]))

    def outside(self, optimizer: str, warmup_steps: int, global_batch_size: int) -> str | None:
        """Why (optimizer, warmup, batch) is not a point of the table's grid, naming the values the table has
        (at that batch size, for a table with a plan per batch size); None when it is one, generated or not."""
        point = {"optimizer.name": optimizer, "schedule.warmup_steps": warmup_steps,
                 "batch.global_batch_size": global_batch_size}  # fmt: skip
        batch = global_batch_size if global_batch_size in self.batch_sizes() else None
        wrong = [k for k, v in point.items() if v not in self.grid_values(k, batch)]
        if not wrong:
            return None
        at = f" at batch.global_batch_size={batch}" if self.per_batch and batch is not None else ""
        return (f"{self.path}: no recorded runs at {', '.join(f'{k}={point[k]}' for k in wrong)}; the table has "
                + "; ".join(f"{k} in {self.grid_values(k, batch)}" for k in wrong) + at)  # fmt: skip

    def gaps(self, optimizer: str, warmup_steps: int, global_batch_size: int, low: float, high: float) -> str | None:
        """The runs a grid point still lacks (a table being generated) to serve learning rates in [low, high]
        with every seed of the table's grid, e.g. `seeds 1, 2 at lr 0.01, 0.0178`; None when it has them all.
        Needed are the grid learning rates in the range and, where a bound lies between two, the one beyond it
        (the surrogate blends the two neighbours)."""
        recorded = [(r.lr, r.seed) for r in self._index.get((optimizer, warmup_steps, global_batch_size), [])]
        missing: dict[tuple[int, ...], list[float]] = {}
        for lr in _needed(self.learning_rates(optimizer, warmup_steps, global_batch_size), low, high):
            have = {seed for r, seed in recorded if math.isclose(r, lr, rel_tol=1e-9)}
            lacking = tuple(s for s in self.grid_seeds() if s not in have)
            if lacking:
                missing.setdefault(lacking, []).append(lr)
        if not missing:
            return None
        return "; ".join(f"{_listed(list(seeds), 'seed')} at lr {', '.join(f'{lr:g}' for lr in lrs)}"
                         for seeds, lrs in missing.items())  # fmt: skip

    def resume_hint(self) -> str:
        """How to complete a partial table: a pilot's (`hpo table`) by its pilot, a generated one by its generator."""
        source = str(self.meta.get("source", ""))
        if source.startswith("experiment "):
            stopped = self.meta.get("fixed", {}).get("eval.stop_at_target")
            return (f"the table holds the runs of {source}: run the pilot as a grid over every learning rate and "
                    f"seed the experiment needs, to the full budget{' (eval.stop_at_target: false)' if stopped else ''}"
                    " (the documentation's Planning page, A pilot's curves), then write its table again with "
                    "`hpo table`")  # fmt: skip
        flag = " --large-batch" if self.per_batch else ""
        return f"the table is not complete yet: `python -m bench.curves.generate{flag}` resumes it {IN_A_CHECKOUT}"

    def line(self, optimizer: str, warmup_steps: int, global_batch_size: int) -> dict[float, dict[int, Run]]:
        """The runs of one (optimizer, warmup, batch) point: learning rate -> seed -> run."""
        runs = self._index.get((optimizer, warmup_steps, global_batch_size))
        if not runs:
            point = point_label(optimizer, warmup_steps, global_batch_size)
            raise HpoError(
                self.outside(optimizer, warmup_steps, global_batch_size)
                or f"{self.path}: no recorded runs at {point} (a point of the table's grid); {self.resume_hint()}"
            )
        by_lr: dict[float, dict[int, Run]] = {}
        for run in runs:
            by_lr.setdefault(run.lr, {})[run.seed] = run
        return by_lr


def point_label(optimizer: str, warmup_steps: int, global_batch_size: int) -> str:
    """A grid point as errors name it: `optimizer.name=lamb, schedule.warmup_steps=10, batch.global_batch_size=512`."""
    point = {
        "optimizer.name": optimizer,
        "schedule.warmup_steps": warmup_steps,
        "batch.global_batch_size": global_batch_size,
    }
    return ", ".join(f"{key}={value}" for key, value in point.items())


def load_table(path: str | Path) -> CurveTable:
    """Read a curve table; a missing file or a bad line is an HpoError naming the file and the line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise HpoError(
            f"cannot read the curve table {path}: {e.strerror}; generate it with "
            f"`python -m bench.curves.generate` {IN_A_CHECKOUT} or point runner.simulation.table at it"
        ) from None
    except UnicodeDecodeError as e:
        raise HpoError(f"{path}: not a curve table: not UTF-8 text (byte 0x{e.object[e.start : e.start + 1].hex()} "
                       f"at offset {e.start}); a table is JSON lines, as `python -m bench.curves.generate` writes "
                       "them") from None  # fmt: skip
    lines = text.splitlines()
    being_written = len(lines) if not text.endswith("\n") else None  # the generator appends whole lines
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append((number, json.loads(line)))
        except json.JSONDecodeError as e:
            if number == being_written and number > 1:
                continue  # a run the generator is still appending: not recorded yet
            raise HpoError(f"{path} line {number}: not JSON ({e.msg})") from None
    if not records or records[0][1].get("kind") != "meta":
        raise HpoError(f'{path} line 1: expected the table\'s meta record ({{"kind": "meta", ...}})')
    meta = records[0][1]
    _check_budgets(path, meta)
    runs = tuple(_run(path, number, record) for number, record in records[1:])
    batches = meta.get("grid", {}).get("batches")
    if not runs:
        command = "python -m bench.curves.generate" + (" --large-batch" if batches is not None else "")
        raise HpoError(f"{path}: no runs recorded yet; `{command}` records them {IN_A_CHECKOUT}")
    for (number, _), run in zip(records[1:], runs, strict=True):
        if batches is not None and str(run.global_batch_size) not in batches:
            raise HpoError(f"{path} line {number}: global_batch_size {run.global_batch_size} has no plan in the meta "
                           f"record's grid.batches ({', '.join(batches)})")  # fmt: skip
    return CurveTable(path, meta, runs)


def _check_budgets(path: Path, meta: dict[str, Any]) -> None:
    """One budget and evaluation interval for the whole table (meta fixed), or one per batch size (meta
    grid.batches), never both and never neither."""
    fixed, batches = meta.get("fixed", {}), meta.get("grid", {}).get("batches")
    if batches is None:
        for key in _BUDGET_KEYS:
            if key not in fixed:
                raise HpoError(f"{path} line 1: the meta record has no fixed[{key!r}] (nor a budget per batch "
                               "size in grid.batches)")  # fmt: skip
        return
    both = [key for key in _BUDGET_KEYS if key in fixed]
    if both:
        raise HpoError(f"{path} line 1: the meta record has both fixed[{both[0]!r}] and a budget per batch size "
                       "(grid.batches); keep one")  # fmt: skip
    if not isinstance(batches, dict) or not batches:
        raise HpoError(f"{path} line 1: grid.batches must map each global batch size to its plan")
    for batch, plan in batches.items():
        where = f"{path} line 1: grid.batches[{batch!r}]"
        if not str(batch).isdigit() or not isinstance(plan, dict):
            raise HpoError(f"{where}: expected a global batch size mapped to its plan (max_samples, every, lr, ...)")
        for key in _BUDGET_KEYS.values():
            value = plan.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise HpoError(f"{where}: needs {key!r}, a positive number of samples (got {value!r})")
        lrs = plan.get("lr", {})
        if not isinstance(lrs, dict) or not all(isinstance(v, list) for v in lrs.values()):
            raise HpoError(f"{where}: 'lr' must map each optimizer to its list of learning rates")


def _run(path: Path, number: int, record: dict[str, Any]) -> Run:
    try:
        run = Run(
            optimizer=str(record["optimizer"]),
            lr=float(record["lr"]),
            warmup_steps=int(record["warmup_steps"]),
            global_batch_size=int(record["global_batch_size"]),
            seed=int(record["seed"]),
            status=str(record["status"]),
            samples=int(record["samples"]),
            curve=_series(record["curve"]),
            loss=_series(record.get("loss", [])),
            noise_scale=_series(record.get("noise_scale", [])),
            train_time_s=float(record.get("train_time_s", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise HpoError(f"{path} line {number}: not a run record ({type(e).__name__}: {e})") from None
    if not run.lr > 0 or any(not math.isfinite(a) for _, a in run.curve):
        raise HpoError(f"{path} line {number}: lr must be > 0 and accuracies finite")
    return run


def _series(pairs) -> Series:
    return tuple((int(s), float(v)) for s, v in pairs)


def _plan_values(plan: dict[str, Any], key: str) -> list:
    """The values of a dimension in one batch size's plan (meta grid.batches[batch])."""
    lrs = plan.get("lr", {})
    if key == "optimizer.name":
        return list(lrs)
    if key == "optimizer.lr":
        return [lr for values in lrs.values() for lr in values]
    warmups = plan.get("warmup_steps", [])
    return list(warmups) if isinstance(warmups, list) else [warmups]


def _needed(lrs: list[float], low: float, high: float) -> list[float]:
    """The grid learning rates a learning rate in [low, high] reads: those inside, and the neighbour beyond a
    bound that is not itself a grid point."""
    needed = [lr for lr in lrs if low * (1 - 1e-9) <= lr <= high * (1 + 1e-9)]
    if not any(math.isclose(low, lr, rel_tol=1e-9) for lr in lrs):
        needed += [lr for lr in lrs if lr < low][-1:]
    if not any(math.isclose(high, lr, rel_tol=1e-9) for lr in lrs):
        needed += [lr for lr in lrs if lr > high][:1]
    return sorted(needed)


def _distinct(values: list[float]) -> list[float]:
    out: list[float] = []
    for v in values:
        if not out or not math.isclose(out[-1], v, rel_tol=1e-9):
            out.append(v)
    return out


def _listed(values: list, word: str) -> str:
    """`seed 1` or `seeds 1, 2`."""
    return f"{word}{'s' if len(values) != 1 else ''} {', '.join(map(str, values))}"


def shipped_table(name: str) -> Path | None:
    """The shipped table called `name` (`curves`, `large_batch`, `seeds`), or None when `name` names none."""
    path = TABLES / f"{name}.jsonl"
    return path if name.isidentifier() and path.is_file() else None
