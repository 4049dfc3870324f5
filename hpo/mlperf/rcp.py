"""mlperf-logging's reference convergence points (RCPs) read into typed records: pure, nothing is written.

An RCP file (`mlperf_logging/rcp_checker/training_<ruleset>/rcps_<benchmark>.json`) maps a record name to one
reference configuration: `Benchmark`, `BS` (the global batch size), `Hyperparams` (under the keys of the
benchmark's rules: for BERT `opt_base_learning_rate`, `opt_epsilon`, `opt_lamb_beta_1`, ...), and its samples to
converge per seed, `Epochs to converge` (BERT counts epochs in samples; newer benchmarks say `samples to converge`),
with where they came from (`Creator`, `Platform`, `When`). MLPerf's RCP checker compares a submission's mean
against these. Every value is a run that reached the target (MLPerf BERT: 0.720 masked-LM accuracy); the
records carry no curves and no optimizer name: BERT's are LAMB runs (the reference implementation), which is what
their `opt_lamb_*` keys say.

Errors are `ResultFileError`s naming the file and the record (or the JSON's line for a file that does not parse).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpo.mlperf.logs import HYPERPARAMETERS, INTEGER_KEYS, ResultFileError, not_text, read_text
from hpo.mlperf.optimizers import KNOWN_OPTIMIZERS, trainer_optimizer

SAMPLES_KEYS = ("Epochs to converge", "samples to converge")


@dataclass(frozen=True)
class RcpRecord:
    """One reference configuration and its samples to converge per seed (in the file's order)."""

    name: str  # the record's key, e.g. bert_ref_256
    benchmark: str
    global_batch_size: int
    optimizer: str  # the trainer's name
    hyperparameters: dict[str, Any]  # trainer key -> value
    logged: dict[str, Any]  # Hyperparams as in the file
    samples: tuple[int, ...]  # samples to converge, one per seed
    creator: str | None
    platform: str | None
    when: str | None

    def run_hash(self, index: int) -> str:
        """The content hash of seed `index` of this record: a second import of the same file adds nothing."""
        content = json.dumps([self.benchmark, self.name, self.global_batch_size, self.logged, index,
                              self.samples[index]], sort_keys=True)  # fmt: skip
        return hashlib.sha256(content.encode()).hexdigest()


def read_rcp_file(path: str | Path, benchmark: str = "bert") -> list[RcpRecord]:
    """The records of an RCP file for `benchmark` (ordered by batch size, then name); other benchmarks are refused."""
    path = Path(path)
    what = f"an RCP file (mlperf_logging/rcp_checker/training_<ruleset>/rcps_{benchmark}.json)"
    text = read_text(path, what)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        why = not_text(path, text, "an RCP file") or f"{path}:{e.lineno}: not {what}: its JSON does not parse ({e.msg})"
        raise ResultFileError(why) from None
    if not isinstance(data, dict) or not data:
        raise ResultFileError(f"{path}: not {what}: expected a mapping of record name -> record")
    records = [_record(path, str(name), body, benchmark) for name, body in data.items()]
    return sorted(records, key=lambda r: (r.global_batch_size, r.name))


def ruleset(path: str | Path) -> str | None:
    """The ruleset of an RCP file from its folder (`training_5.0.0` -> `5.0.0`), None when the folder says none."""
    match = re.fullmatch(r"\w+?_(\d+\.\d+\.\d+)", Path(path).resolve().parent.name)
    return match.group(1) if match else None


def _record(path: Path, name: str, body: Any, benchmark: str) -> RcpRecord:
    where = f"{path}: record {name}"
    if not isinstance(body, dict):
        raise ResultFileError(f"{where}: expected a mapping with BS, Hyperparams and Epochs to converge")
    if body.get("Benchmark") != benchmark:
        raise ResultFileError(f"{where}: Benchmark is {body.get('Benchmark')!r}; this project trains {benchmark}, "
                              f"whose RCPs are rcps_{benchmark}.json")  # fmt: skip
    batch = body.get("BS")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ResultFileError(f"{where}: BS is {batch!r}, not a positive global batch size")
    key = next((k for k in SAMPLES_KEYS if k in body), None)
    samples = body.get(key) if key else None
    if not isinstance(samples, list) or not samples:
        raise ResultFileError(f"{where}: no {SAMPLES_KEYS[0]} list (the samples to converge per seed)")
    for i, value in enumerate(samples):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise ResultFileError(f"{where}: {key}[{i}] is {value!r}, not a positive number of samples")
    hyper = body.get("Hyperparams") or {}
    if not isinstance(hyper, dict):
        raise ResultFileError(f"{where}: Hyperparams is not a mapping")
    values = {}
    for trainer_key, mlperf_keys in HYPERPARAMETERS.items():
        mlperf_key = next((k for k in mlperf_keys if k in hyper), None)
        if mlperf_key is not None:
            values[trainer_key] = _value(where, mlperf_key, hyper[mlperf_key], trainer_key in INTEGER_KEYS)
    optimizer = trainer_optimizer(hyper.get("opt_name", "lamb"))
    if optimizer is None:
        raise ResultFileError(f"{where}: opt_name {hyper['opt_name']!r} is not an optimizer the importer knows "
                              f"({KNOWN_OPTIMIZERS})")  # fmt: skip
    return RcpRecord(name, benchmark, batch, optimizer, values, dict(hyper),
                     tuple(round(v) for v in samples), _text(body.get("Creator")), _text(body.get("Platform")),
                     _text(body.get("When")))  # fmt: skip


def _value(where: str, key: str, value: Any, whole: bool) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ResultFileError(f"{where}: Hyperparams.{key} is {value!r}, not a number")
    if whole:
        if not float(value).is_integer():
            raise ResultFileError(f"{where}: Hyperparams.{key} is {value!r}, not a whole number")
        return int(value)
    return float(value)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
