"""The learning-curve table: recorded runs of our trainer over a grid (bench/curves/curves.jsonl), read and checked.

The file is JSON lines: a first `{"kind": "meta", ...}` line (the grid, the fixed trainer settings, the data's
fingerprint), then one `{"kind": "run", ...}` line per run: its grid point (`optimizer`, `lr`, `warmup_steps`,
`global_batch_size`, `seed`), how it ended (`status`, `samples`, `samples_to_target`), its accuracy curve
(`curve`: [samples, mlm_accuracy] at every evaluation, to the full budget), its training loss and gradient noise
scale ([samples, value] every few steps), and its measured seconds. bench/curves/README.md documents the grid.
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

    @property
    def max_samples(self) -> int:
        return int(self.meta["fixed"]["budget.max_samples"])

    @property
    def eval_every(self) -> int:
        return int(self.meta["fixed"]["eval.every_samples"])

    def values(self, key: str) -> list:
        """The grid values of a trainer key the table varies (e.g. `optimizer.lr`)."""
        return sorted({getattr(run, DIMENSIONS[key]) for run in self.runs})

    def seeds(self) -> list[int]:
        return sorted({run.seed for run in self.runs})

    def line(self, optimizer: str, warmup_steps: int, global_batch_size: int) -> dict[float, dict[int, Run]]:
        """The runs of one (optimizer, warmup, batch) point: learning rate -> seed -> run."""
        runs = self._index.get((optimizer, warmup_steps, global_batch_size))
        if not runs:
            point = {"optimizer.name": optimizer, "schedule.warmup_steps": warmup_steps,
                     "batch.global_batch_size": global_batch_size}  # fmt: skip
            wrong = [k for k, v in point.items() if v not in self.values(k)]
            raise HpoError(
                f"{self.path}: no recorded runs at {', '.join(f'{k}={point[k]}' for k in wrong or point)}; the table "
                f"has " + "; ".join(f"{k} in {self.values(k)}" for k in wrong or point)
            )
        by_lr: dict[float, dict[int, Run]] = {}
        for run in runs:
            by_lr.setdefault(run.lr, {})[run.seed] = run
        return by_lr


def load_table(path: str | Path) -> CurveTable:
    """Read a curve table; a missing file or a bad line is an HpoError naming the file and the line."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise HpoError(
            f"cannot read the curve table {path}: {e.strerror}; generate it with "
            "`python -m bench.curves.generate` or point runner.simulation.table at it"
        ) from None
    records = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            records.append((number, json.loads(text)))
        except json.JSONDecodeError as e:
            raise HpoError(f"{path} line {number}: not JSON ({e.msg})") from None
    if not records or records[0][1].get("kind") != "meta":
        raise HpoError(f'{path} line 1: expected the table\'s meta record ({{"kind": "meta", ...}})')
    meta = records[0][1]
    for key in ("budget.max_samples", "eval.every_samples"):
        if key not in meta.get("fixed", {}):
            raise HpoError(f"{path} line 1: the meta record has no fixed[{key!r}]")
    runs = tuple(_run(path, number, record) for number, record in records[1:])
    if not runs:
        raise HpoError(f"{path}: no runs recorded yet; `python -m bench.curves.generate` records them")
    return CurveTable(path, meta, runs)


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
