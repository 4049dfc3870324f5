"""MLPerf training result files read into typed runs: pure, nothing is written.

A result file (`result_N.txt`) holds one run: `:::MLLOG {json}` lines (anything before the token on a line, such as
`0: ` or `[1,0]<stdout>:`, is dropped, as MLPerf's own parser does) among lines that are not MLLOG (launcher output,
the command line). Read as MLCommons published them (training rounds 0.7 to 5.0, every submitter):

- The benchmark: BERT's. A file whose `submission_benchmark` is another (MLCommons' layout keeps every benchmark of a
  system under `results/<system>/<benchmark>/`) is an error naming it; `result_files` leaves such files of a
  directory out, each with a note. A file that logs no benchmark is read as BERT.
- Ranks: an event repeated by several ranks (a `rank` in its metadata, else the launcher's label before the token:
  `srun -l`'s `3: `, Open MPI's `[1,3]<stdout>:`) counts once, from the lowest rank that logged that key (every rank
  logs the same settings; rank 0's curve is the run's).
- Repeated keys: a setting logged again with the same value is one setting; with another value it is an error
  (which one the run used is unknown). A number logged as a one-element list (`[3872218]`) is that number.
- The optimizer: `opt_name`, and an optimizer option on a logged command line (`--optimizer=FusedAdam`,
  `--opt lamb`, `--distributed_lamb`); closed BERT rules require neither, so a run that names none takes the caller's
  default (`--optimizer`). Names are read as submitters write them (`OPTIMIZERS`: apex's FusedAdam, FusedLAMB,
  DistributedFusedLAMB, torch's AdamW, lamb, adam, ...; case, `_`, `-` and a module path do not matter). A name
  the importer does not know is an error naming it, never replaced by the default, and so are two sources that
  name different optimizers. MLPerf's `adam` and apex's FusedAdam are the trainer's `adamw` (BERT's Adam decays
  weights decoupled).
- The target: a logged `eval_target` / `target_accuracy` event or a `--target_mlm_accuracy` on the command line,
  else unknown (the importer then uses MLPerf BERT's 0.720).
- The end: `run_stop` with `status` "success" reached the target it trained to; any other status is a miss; no
  `run_stop` is an unfinished run. No `run_start` is an error: the run never started. Samples at the end: a
  `train_samples` logged after the last evaluation (at run_stop; the last one), else the last evaluation's position
  (what MLPerf's RCP checker reads). A `train_samples` logged before the evaluations is the run's planned samples
  (Google's, Habana's, tinycorp's logs), not what it trained: it is not read, and a note says so.
- Samples to a target (`ResultRun.samples_to`): of a successful run, its first evaluation at or above the target,
  and where that is its last evaluation (MLPerf runs stop at the target) the samples at the end. A run that trained
  on past the target (our trainer with `eval.stop_at_target: false`, whose run_stop logs its budget) counts that
  first evaluation; a success whose evaluations never reach the target (a run of a lower target of its own: our
  trainer does not log its target) has none.
- The curve: `eval_accuracy` events in log order (a line repeated with the same `epoch_num`, value and time is one
  evaluation), each at a position in training samples (`CURVE_SOURCES`):
  - `epoch_num`, where it counts samples (BERT's rule from training 1.0 on; our trainer's logs);
  - `epoch_num` x `global_batch_size` where it counts steps (`CURVE_SOURCES["steps"]`);
  - which of the two `epoch_num` counts, a `train_samples` after the evaluations decides where it confirms one (the
    largest `epoch_num`, or that times the global batch size, at most one evaluation interval below it). Else it
    counts samples where every `epoch_num` is a multiple of the global batch size (a run evaluates after whole
    steps), and otherwise (an evaluation can come no sooner than one step) where the largest is at least the global
    batch size and above the logged training steps;
  - where it counts neither (many logs of training 0.7 to 2.0, NVIDIA's and Samsung's among them, give every
    evaluation `epoch_num` 1; others count steps that no `train_samples` confirms), the positions come from each
    evaluation's own `train_samples` metadata where every one has it (Google's open-division JAX logs of 1.1), else
    from the evaluation schedule, checked against the samples at the end (the run evaluated exactly as often as the
    schedule allows up to them): the logged command line's
    `--eval_iter_start_samples` and `--eval_iter_samples` (NVIDIA's code: evaluation k at the first step at or past
    start + k x interval), else MLPerf BERT's rule for the batch size B (every floor(0.05 x (230.23 B + 3,000,000) /
    25,000) x 25,000 samples), else, approximate, equal intervals in evaluation order ending at the samples at the
    end. Without a `train_samples` after the evaluations such a run is an error: at how many samples it reached
    the target is unknown. Another value at the same sample-counting `epoch_num` is an error (which one is the
    run's is unknown).
- The evaluation interval (`ResultRun.eval_every`): the most common gap between evaluations, the first of equally
  common ones, leaving out a last gap that ends at `train_samples` (an evaluation at the budget).
- The sample budget: the least of `opt_learning_rate_training_steps` x `global_batch_size` and a
  `--max_samples_termination` on the command line, at least the samples the run trained and evaluated.
- The cost: wall-clock from `run_start` to `run_stop` (MLPerf's time to train), and the accelerators of the result
  directory's system description (`<submitter>/systems/<system>.json` beside `<submitter>/results/<system>/`:
  `number_of_nodes` x `accelerators_per_node`), where there is one that says it (else none, with a note).

Every error is a `ResultFileError` whose message starts with `FILE:LINE:` (or `FILE:` for what is missing) and says
what is wrong.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hpo.errors import HpoError
from hpo.mlperf.optimizers import KNOWN_OPTIMIZERS, trainer_optimizer
from hpo.mlperf.systems import System, system_description

TOKEN = ":::MLLOG"
RESULT_GLOB = "result_*.txt"
RESULT_NAME = re.compile(r"result_\d+\.txt")  # of the files the glob finds, a run's result file
BENCHMARK = "bert"  # the submission_benchmark the importer reads


class ResultFileError(HpoError):
    """An MLPerf result or RCP file that cannot be read; the message names the file, the line and what is wrong."""


# trainer key -> the MLPerf keys that carry it, the first one logged wins (LAMB's keys also carry ADAM's values in
# published ADAM submissions to BERT, and in our trainer's logs)
HYPERPARAMETERS: dict[str, tuple[str, ...]] = {
    "optimizer.lr": ("opt_base_learning_rate",),
    "optimizer.eps": ("opt_lamb_epsilon", "opt_epsilon", "opt_adam_epsilon", "opt_adamw_epsilon"),
    "optimizer.beta1": ("opt_lamb_beta_1", "opt_adam_beta_1", "opt_adamw_beta_1"),
    "optimizer.beta2": ("opt_lamb_beta_2", "opt_adam_beta_2", "opt_adamw_beta_2"),
    "optimizer.weight_decay": ("opt_lamb_weight_decay_rate", "opt_adamw_weight_decay", "opt_weight_decay"),
    "schedule.power": ("opt_lamb_learning_rate_decay_poly_power",),
    "schedule.warmup_steps": ("opt_learning_rate_warmup_steps", "num_warmup_steps"),
    "schedule.start_warmup_step": ("start_warmup_step",),
    "schedule.total_steps": ("opt_learning_rate_training_steps",),
    "schedule.end_lr": ("opt_end_learning_rate",),
    "clipping.max_norm": ("opt_gradient_clip_norm",),
}
# settings that are names, not numbers (our trainer's logs: trainer/mlperf_log.py)
NAMED_HYPERPARAMETERS: dict[str, tuple[str, ...]] = {"clipping.strategy": ("opt_gradient_clipping",)}
INTEGER_KEYS = {"schedule.warmup_steps", "schedule.start_warmup_step", "schedule.total_steps"}
TARGET_KEYS = ("eval_target", "target_accuracy")
# how the evaluations' positions were read (ResultRun.curve): the first is the logged epoch_num
CURVE_SOURCES = {
    "epoch_num": "epoch_num (samples)",
    "steps": "epoch_num (steps) x global_batch_size, as train_samples confirms",
    "command line": "the logged command line's evaluation schedule (--eval_iter_start_samples, --eval_iter_samples)",
    "metadata": "eval_accuracy's own train_samples metadata",
    "mlperf rule": "MLPerf BERT's evaluation interval for the global batch size",
    "equal intervals": "equal intervals in evaluation order up to train_samples (approximate)",
}
# other settings read once per run (repeated with another value: an error)
OTHER_SETTINGS = ("global_batch_size", "seed", "opt_name", "gradient_accumulation_steps", "max_sequence_length",
                  "submission_org", "submission_platform", "submission_division", "submission_benchmark",
                  *TARGET_KEYS)  # fmt: skip
SETTINGS = tuple(dict.fromkeys([k for keys in (*HYPERPARAMETERS.values(), *NAMED_HYPERPARAMETERS.values())
                                 for k in keys] + list(OTHER_SETTINGS)))  # fmt: skip

_OPTION = re.compile(r"--(?:optimizer|optim|opt|opt_name|optimizer_name|optimizer_type)[= ]+['\"]?([A-Za-z][\w.-]*)")
_FLAG = re.compile(r"(?<![\w-])--(?:distributed_|fused_|use_)?(lamb|adamw|adam)(?![\w-])")
_TARGET = re.compile(r"--target_(?:mlm_)?accuracy[= ]+([0-9.eE+-]+)")
_MAX_SAMPLES = re.compile(r"--max_samples_termination[= ]+([0-9.eE+]+)")
_EVAL_START = re.compile(r"--eval_iter_start_samples[= ]+([0-9]+)(?![\w.])")
_EVAL_EVERY = re.compile(r"--eval_iter_samples[= ]+([0-9]+)(?![\w.])")


@dataclass(frozen=True)
class Event:
    line: int
    key: str
    value: Any
    metadata: dict[str, Any]
    time_ms: float | None


@dataclass(frozen=True)
class Evaluation:
    samples: int  # training samples at the evaluation (see the module docstring: the curve)
    accuracy: float
    time_ms: float | None
    line: int


@dataclass(frozen=True)
class ResultRun:
    """One run of a result file, as the importer needs it."""

    path: Path
    sha256: str  # of the file's MLLOG lines: the same run read twice has the same hash
    optimizer: str  # the trainer's name: adamw or lamb
    optimizer_source: str  # where it was named: `opt_name (line 12)`, `command line (line 3)`, `--optimizer`
    global_batch_size: int
    seed: int | None
    hyperparameters: dict[str, Any]  # trainer key -> value, for the keys the run logged
    logged: dict[str, Any]  # every setting as logged (MLPerf key -> value)
    submitter: str | None
    system: str | None
    status: str | None  # run_stop's status ("success", "aborted", ...); None: no run_stop (unfinished)
    train_samples: int | None  # logged after the last evaluation (the samples at the end)
    evaluations: tuple[Evaluation, ...]
    run_start_ms: float | None
    run_stop_ms: float | None
    last_ms: float | None  # the last timestamp in the file
    target: float | None  # the target the log names (None: not logged)
    budget: int  # the run's sample budget (see the module docstring)
    eval_every: int | None  # samples between evaluations (None: fewer than one evaluation)
    lines: int
    curve: str = "epoch_num"  # how the evaluations' positions were read: a key of CURVE_SOURCES
    hardware: System = field(default=System(None, None, None))
    notes: tuple[str, ...] = field(default=())

    @property
    def reached(self) -> bool:
        """run_stop says success: the run reached the target it trained to (see `samples_to` for another target)."""
        return self.status == "success"

    @property
    def samples(self) -> int:
        """Samples trained: train_samples, else the last evaluation's position (0: none)."""
        if self.train_samples is not None:
            return self.train_samples
        return self.evaluations[-1].samples if self.evaluations else 0

    def first_at(self, target: float) -> Evaluation | None:
        """The first evaluation at or above `target`; None where none is."""
        return next((e for e in self.evaluations if e.accuracy >= target), None)

    def samples_to(self, target: float | None) -> int | None:
        """Samples to `target` of a successful run: its first evaluation at or above `target`, and where that is the
        last evaluation (the run stopped there, as MLPerf runs do) the samples at the end; None for a miss and for a
        success whose evaluations never reach `target`. Without a `target` (or without evaluations), the samples at
        the end."""
        if not self.reached:
            return None
        if target is None or not self.evaluations:
            return self.samples
        hit = self.first_at(target)
        if hit is None:
            return None
        return self.samples if hit is self.evaluations[-1] else hit.samples

    @property
    def samples_to_target(self) -> int | None:
        """Samples to the logged target (`samples_to`; without one, the samples at the end of a successful run)."""
        return self.samples_to(self.target)

    @property
    def best_accuracy(self) -> float | None:
        return max((e.accuracy for e in self.evaluations), default=None)

    @property
    def final_accuracy(self) -> float | None:
        return self.evaluations[-1].accuracy if self.evaluations else None

    @property
    def wall_clock_s(self) -> float | None:
        """run_start to run_stop in seconds (MLPerf's time to train); None without both."""
        if self.run_start_ms is None or self.run_stop_ms is None:
            return None
        return max(self.run_stop_ms - self.run_start_ms, 0.0) / 1000

    @property
    def accelerator_hours(self) -> float | None:
        """Accelerators x wall-clock hours; None where either is unknown."""
        seconds, accelerators = self.wall_clock_s, self.hardware.accelerators
        return None if seconds is None or accelerators is None else accelerators * seconds / 3600


def result_files(paths: Iterable[str | Path], note: Callable[[str], None] = lambda _: None) -> list[Path]:
    """The result files of `paths`: a file as given, a directory's `result_*.txt` at any depth (natural order).

    A directory's file that logs another `submission_benchmark` than bert (MLCommons' layout keeps every benchmark of
    a system under results/<system>/<benchmark>/) is left out, each with a `note`; a file named as given is read as
    it is (`read_result_file` refuses another benchmark by name)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # result_N.txt only: not what tools write beside one (the compliance checker's result_0.txt.checker.txt)
            files = sorted((f for f in path.rglob(RESULT_GLOB) if RESULT_NAME.fullmatch(f.name)), key=_natural)
            if not files:
                raise ResultFileError(f"{path}: no {RESULT_GLOB} file in this directory (MLPerf results are "
                                      "<system>/<benchmark>/result_N.txt)")  # fmt: skip
            others = {file: benchmark for file in files if (benchmark := _other_benchmark(file)) is not None}
            for file, benchmark in others.items():
                note(f"note: {file.resolve()}: submission_benchmark {benchmark!r}, not bert: skipped")
            if len(others) == len(files):
                names = ", ".join(sorted(set(others.values())))
                raise ResultFileError(f"{path}: no BERT result file in this directory: its {len(files)} "
                                      f"{RESULT_GLOB} file(s) are of other benchmarks ({names})")  # fmt: skip
            found.extend(file for file in files if file not in others)
        elif path.is_file():
            found.append(path)
        elif path.exists():  # a device or a pipe (/dev/null, <(...)): not a file a run wrote
            raise ResultFileError(f"{path}: not a regular file or a directory: name result files or their directory "
                                  "(copy a stream to a file first)")  # fmt: skip
        else:
            raise ResultFileError(f"{path}: no such file or directory")
    unique = list(dict.fromkeys(p.resolve() for p in found))
    return sorted(unique, key=_natural)


def _other_benchmark(path: Path) -> str | None:
    """The `submission_benchmark` a result file logs where that is not bert; None where it is bert or not logged (or
    the file cannot be read here: reading it says why)."""
    with contextlib.suppress(OSError), path.open("rb") as lines:
        for raw in lines:
            line = raw.decode("latin-1")
            if TOKEN not in line or '"submission_benchmark"' not in line:
                continue
            with contextlib.suppress(json.JSONDecodeError):
                data = json.loads(line[line.find(TOKEN) + len(TOKEN) :])
                if isinstance(data, dict) and data.get("key") == "submission_benchmark":
                    value = data.get("value")
                    return None if value is None or _is_bert(value) else str(value)
    return None


def _is_bert(benchmark: Any) -> bool:
    return str(benchmark).strip().lower() == BENCHMARK


def _natural(path: Path) -> list[Any]:
    """`result_2.txt` before `result_10.txt`."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def read_text(path: Path, what: str = "an MLPerf result file") -> str:
    """The file's text: UTF-8 (after a byte order mark, if any), else Latin-1 (as MLPerf's parser reads them); a
    directory, an empty file and one that is not text (NUL bytes: UTF-16, a binary) are errors naming the file and
    what to do."""
    if path.is_dir():
        raise ResultFileError(f"{path}: a directory, not {what}: name the file")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ResultFileError(f"{path}: cannot read the file ({e.strerror})") from None
    if not data.strip():
        raise ResultFileError(f"{path}: the file is empty, so not {what} (a copy that did not finish?): name a "
                              "complete one")  # fmt: skip
    try:
        return data.decode("utf-8-sig")  # a byte order mark (as some editors save UTF-8) is not part of the text
    except UnicodeDecodeError:
        return data.decode("latin-1")  # as MLPerf's parser reads them


def not_text(path: Path, text: str, what: str) -> str:
    """Why a file that does not read as `what` may not be text at all (NUL bytes: UTF-16 or a binary), and what to do;
    '' where it holds none."""
    if "\0" not in text:
        return ""
    kind = "UTF-16, as its byte order mark says" if text[:2] in ("\xff\xfe", "\xfe\xff") else "UTF-16 or binary"
    return (f"{path}: not UTF-8 text: it holds NUL bytes ({kind}); {what} is UTF-8 text: convert a UTF-16 file "
            "(iconv -f UTF-16 -t UTF-8) and import the copy")  # fmt: skip


def read_result_file(path: str | Path, default_optimizer: str | None = None) -> ResultRun:
    """One run from its result file (see the module docstring); raises ResultFileError naming the file and line."""
    path = Path(path)
    text = read_text(path)
    events, payloads, commands = _parse(path, text)
    if not events:
        raise ResultFileError(not_text(path, text, "an MLPerf result file")
                              or f"{path}: no {TOKEN} line: not an MLPerf result file")  # fmt: skip
    by_key = _lowest_rank(events)
    settings = {key: _setting(path, by_key[key]) for key in SETTINGS if key in by_key}
    benchmark = settings.get("submission_benchmark")
    if benchmark is not None and benchmark.value is not None and not _is_bert(benchmark.value):
        raise ResultFileError(f"{path}:{benchmark.line}: submission_benchmark is {benchmark.value!r}, not bert: "
                              "hpo import mlperf reads BERT results only (a directory's files of other benchmarks "
                              "are skipped; name BERT's files or their directory)")  # fmt: skip
    starts = by_key.get("run_start", [])
    if not starts:
        raise ResultFileError(f"{path}: no run_start event: the run never started, there is nothing to import")
    batch = _batch(path, settings)
    optimizer, logged_name, source = _optimizer(path, settings.get("opt_name"), commands, default_optimizer)
    hyper = _hyperparameters(path, settings)
    status, stop = _run_stop(path, by_key.get("run_stop", []))
    logged_evals = _logged_evaluations(path, by_key.get("eval_accuracy", []), stop)
    train_samples, notes = _end_samples(path, by_key.get("train_samples", []), logged_evals, starts[0])
    evaluations, curve = _curve(path, logged_evals, train_samples, batch, hyper, commands, starts[0])
    if status == "success" and train_samples is None and not evaluations:
        raise ResultFileError(f"{path}:{stop.line}: run_stop with status success, but neither train_samples nor an "
                              "eval_accuracy says at how many samples the target was reached")  # fmt: skip
    seed = _whole(path, settings["seed"], "seed") if "seed" in settings else None
    times = [e.time_ms for e in events if e.time_ms is not None]
    system = _text(settings.get("submission_platform"))
    run = ResultRun(
        path=path,
        sha256=hashlib.sha256("\n".join(payloads).encode()).hexdigest(),
        optimizer=optimizer,
        optimizer_source=source,
        global_batch_size=batch,
        seed=seed,
        hyperparameters=hyper,
        logged={key: event.value for key, event in settings.items()},
        submitter=_text(settings.get("submission_org")),
        system=system,
        status=status,
        train_samples=train_samples,
        evaluations=evaluations,
        run_start_ms=starts[0].time_ms,
        run_stop_ms=stop.time_ms if stop else None,
        last_ms=max(times) if times else None,
        target=_target(path, settings, commands),
        budget=0,
        eval_every=_every(evaluations, train_samples),
        lines=len(text.splitlines()),
        curve=curve,
        hardware=system_description(path),
        notes=(*((f"optimizer {logged_name!r} named by {source}",) if logged_name else ()), *notes),
    )
    return _with_budget(run, hyper, commands)


def read_result_files(paths: Sequence[Path], default_optimizer: str | None = None) -> list[ResultRun]:
    """Every file read (all are checked before the caller writes anything); the same run twice is an error."""
    runs = [read_result_file(p, default_optimizer) for p in paths]
    seen: dict[str, Path] = {}
    for run in runs:
        if run.sha256 in seen:
            raise ResultFileError(f"{run.path}: the same run as {seen[run.sha256]} (the same MLLOG lines)")
        seen[run.sha256] = run.path
    return runs


# ------------------------------------------------------------------------------------------------ lines


def _parse(path: Path, text: str) -> tuple[list[Event], list[str], list[tuple[int, str]]]:
    events, payloads, commands = [], [], []
    for number, line in enumerate(text.splitlines(), 1):
        at = line.find(TOKEN)
        if at < 0:
            if "--" in line:
                commands.append((number, line))
            continue
        payload = line[at + len(TOKEN) :].strip()
        try:
            data = json.loads(payload)
        except json.JSONDecodeError as e:
            raise ResultFileError(f"{path}:{number}: a broken {TOKEN} line: its JSON does not parse "
                                  f"({e.msg.removesuffix(' at')} at column {e.colno} of the JSON): the file is damaged "
                                  "or cut short (a copy that did not finish, a run still writing it); copy it again "
                                  "from where it came, or leave it out") from None  # fmt: skip
        if not isinstance(data, dict) or not isinstance(data.get("key"), str):
            raise ResultFileError(f"{path}:{number}: a {TOKEN} line without a key")
        metadata = data.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ResultFileError(f"{path}:{number}: {data['key']}: its metadata is not a mapping")
        if "rank" not in metadata and (rank := _prefix_rank(line[:at])) is not None:
            metadata = {**metadata, "rank": rank}  # the launcher's rank label stands in for the metadata's
        stamp = data.get("time_ms")
        time_ms = float(stamp) if isinstance(stamp, int | float) and not isinstance(stamp, bool) else None
        events.append(Event(number, data["key"], data.get("value"), metadata, time_ms))
        payloads.append(payload)
    return events, payloads, commands


# what launchers put before a rank's lines: `srun -l`'s `3: `, Open MPI's --tag-output `[1,3]<stdout>:`
_PREFIX_RANK = re.compile(r"\s*(\d+)\s*:\s*|\s*\[\d+,(\d+)\]<std(?:out|err)>:\s*")


def _prefix_rank(prefix: str) -> int | None:
    """The rank a launcher's label before the MLLOG token names; None where there is no such label."""
    match = _PREFIX_RANK.fullmatch(prefix)
    return None if match is None else int(match.group(1) or match.group(2))


def _rank(event: Event) -> int | None:
    rank = event.metadata.get("rank")
    if isinstance(rank, int) and not isinstance(rank, bool):
        return rank
    if isinstance(rank, str) and rank.strip().isdigit():
        return int(rank)
    return None


def _lowest_rank(events: Sequence[Event]) -> dict[str, list[Event]]:
    """key -> its events, from the lowest rank that logged it (events without a rank are kept)."""
    by_key: dict[str, list[Event]] = {}
    for event in events:
        by_key.setdefault(event.key, []).append(event)
    for key, mine in by_key.items():
        ranks = [r for r in map(_rank, mine) if r is not None]
        if ranks:
            lowest = min(ranks)
            by_key[key] = [e for e in mine if _rank(e) in (None, lowest)]
    return by_key


def _setting(path: Path, events: Sequence[Event]) -> Event:
    """The one value of a setting: repeats with the same value are one; another value is an error."""
    first = events[0]
    for other in events[1:]:
        if other.value != first.value:
            raise ResultFileError(f"{path}:{other.line}: {first.key} is logged again with another value "
                                  f"({first.value!r} at line {first.line}, {other.value!r} here): which one the run "
                                  "used is unknown")  # fmt: skip
    return first


MAX_LOGGED = 2**53  # the largest whole number a float holds exactly: far above any count or setting of a run


def _number(path: Path, event: Event, key: str) -> float:
    value = event.value
    if isinstance(value, list) and len(value) == 1:  # Graphcore's train_samples: [3872218]
        value = value[0]
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ResultFileError(f"{path}:{event.line}: {key} is {event.value!r}, not a number")
    if abs(value) > MAX_LOGGED:
        raise ResultFileError(f"{path}:{event.line}: {key} is {event.value!r}, larger than any count or setting of a "
                              f"run (at most 2**53): the line is damaged")  # fmt: skip
    return float(value)


def _whole(path: Path, event: Event, key: str) -> int:
    value = _number(path, event, key)
    if not value.is_integer():
        raise ResultFileError(f"{path}:{event.line}: {key} is {event.value!r}, not a whole number")
    return int(value)


def _text(event: Event | None) -> str | None:
    return None if event is None or event.value is None else str(event.value)


def _batch(path: Path, settings: dict[str, Event]) -> int:
    if "global_batch_size" not in settings:
        raise ResultFileError(f"{path}: no global_batch_size event: the run's global batch size is missing")
    batch = _whole(path, settings["global_batch_size"], "global_batch_size")
    if batch < 1:
        raise ResultFileError(f"{path}:{settings['global_batch_size'].line}: global_batch_size {batch} is not positive")
    return batch


def _hyperparameters(path: Path, settings: dict[str, Event]) -> dict[str, Any]:
    hyper = {}
    for trainer_key, mlperf_keys in HYPERPARAMETERS.items():
        event = next((settings[k] for k in mlperf_keys if k in settings), None)
        if event is not None:
            hyper[trainer_key] = (_whole(path, event, event.key) if trainer_key in INTEGER_KEYS
                                  else _number(path, event, event.key))  # fmt: skip
    for trainer_key, mlperf_keys in NAMED_HYPERPARAMETERS.items():
        event = next((settings[k] for k in mlperf_keys if k in settings), None)
        if event is not None:
            hyper[trainer_key] = _text(event)
    return hyper


def _optimizer(path: Path, event: Event | None, commands: Sequence[tuple[int, str]],
               default: str | None) -> tuple[str, str | None, str]:  # fmt: skip
    """(the trainer's optimizer, the name as logged, where it was named); every name the log gives must be known and
    all must agree, else an error; a log that names none takes `default`."""
    named: dict[str, tuple[str, str]] = {}  # trainer's name -> (name as logged, where)
    if event is not None:
        optimizer = trainer_optimizer(event.value)
        if optimizer is None:
            raise ResultFileError(f"{path}:{event.line}: opt_name {event.value!r} is not an optimizer the importer "
                                  f"knows ({KNOWN_OPTIMIZERS})")  # fmt: skip
        named[optimizer] = (str(event.value), f"opt_name (line {event.line})")
    for number, line in commands:
        for match in (*_OPTION.finditer(line), *_FLAG.finditer(line)):
            optimizer = trainer_optimizer(match.group(1))
            if optimizer is None:
                raise ResultFileError(f"{path}:{number}: the logged command line names optimizer {match.group(1)!r} "
                                      f"({match.group(0)}), which the importer does not know ({KNOWN_OPTIMIZERS}); "
                                      "--optimizer applies only to runs that name none")  # fmt: skip
            named.setdefault(optimizer, (match.group(1), f"the command line (line {number})"))
    if len(named) > 1:
        where = ", ".join(f"{name} by {source}" for name, source in named.values())
        raise ResultFileError(f"{path}: the log names different optimizers ({where}): which one the run used is "
                              "unknown")  # fmt: skip
    if named:
        optimizer, (name, source) = next(iter(named.items()))
        return optimizer, name, source
    if default is not None:
        return default, None, "--optimizer"
    raise ResultFileError(f"{path}: the optimizer is not named: no opt_name event and no optimizer option on a "
                          "logged command line; give it with --optimizer (BERT's reference optimizer is "
                          "lamb)")  # fmt: skip


def _run_stop(path: Path, events: Sequence[Event]) -> tuple[str | None, Event | None]:
    if not events:
        return None, None
    statuses = [str(e.metadata.get("status")).lower() for e in events]
    for event, status in zip(events, statuses, strict=True):  # the first line whose status differs is named
        if status != statuses[0]:
            raise ResultFileError(f"{path}:{event.line}: run_stop is logged again with another status ({status} "
                                  f"here, {statuses[0]} at line {events[0].line}): how the run ended is "
                                  "unknown")  # fmt: skip
    return statuses[0], events[0]


def _logged_evaluations(path: Path, events: Sequence[Event], stop: Event | None) -> list[tuple[float, Event]]:
    """(epoch_num, event) of every evaluation up to run_stop, in log order; a line repeated with the same epoch_num,
    value and time is one evaluation (the same value at another time is another evaluation: a run whose accuracy
    stays put)."""
    seen, evaluations = set(), []
    for event in events:
        if stop is not None and event.line > stop.line:
            continue
        epoch = event.metadata.get("epoch_num")
        if isinstance(epoch, bool) or not isinstance(epoch, int | float) or not math.isfinite(epoch):
            raise ResultFileError(f"{path}:{event.line}: eval_accuracy without a numeric epoch_num in its metadata "
                                  "(the training samples at the evaluation)")  # fmt: skip
        if abs(epoch) > MAX_LOGGED:
            raise ResultFileError(f"{path}:{event.line}: eval_accuracy's epoch_num is {epoch!r}, larger than any "
                                  "count of a run (at most 2**53): the line is damaged")  # fmt: skip
        accuracy = _number(path, event, "eval_accuracy")
        if not 0.0 <= accuracy <= 1.0:  # a percentage would count as past any target from the first evaluation
            raise ResultFileError(f"{path}:{event.line}: eval_accuracy is {event.value!r}, not a fraction from 0 to "
                                  "1 (MLPerf logs the masked-LM accuracy as a fraction, e.g. 0.72)")  # fmt: skip
        if (epoch, accuracy, event.time_ms) not in seen:
            seen.add((epoch, accuracy, event.time_ms))
            evaluations.append((float(epoch), replace(event, value=accuracy)))
    return evaluations


def _end_samples(path: Path, events: Sequence[Event], evaluations: Sequence[tuple[float, Event]],
                 start: Event) -> tuple[int | None, list[str]]:  # fmt: skip
    """train_samples logged after the last evaluation (after run_start without one), the last of them; notes for
    those logged before (the planned samples, not read)."""
    after = evaluations[-1][1].line if evaluations else start.line
    end = [e for e in events if e.line > after]
    notes = [f"train_samples {e.value} at line {e.line} precedes the evaluations (the planned samples, not those "
             "trained): not read" for e in events if e.line <= after][-1:]  # fmt: skip
    return (_whole(path, end[-1], "train_samples") if end else None), notes


def _curve(path: Path, logged: Sequence[tuple[float, Event]], end: int | None, batch: int, hyper: dict[str, Any],
           commands: Sequence[tuple[int, str]], start: Event) -> tuple[tuple[Evaluation, ...], str]:  # fmt: skip
    """The evaluations at their positions in samples and how those were read (a key of CURVE_SOURCES)."""
    epochs = [epoch for epoch, _ in logged]
    unit = _epoch_unit(epochs, end, batch, hyper.get("schedule.total_steps"))
    if unit == "samples":
        return _by_epoch_num(path, logged), "epoch_num"
    carried = [_carried(e) for _, e in logged]
    if None not in carried:
        return tuple(
            Evaluation(s, e.value, e.time_ms, e.line) for s, (_, e) in zip(carried, logged, strict=True)
        ), "metadata"
    if unit == "steps":
        return _by_epoch_num(path, logged, batch), "steps"
    if end is None:
        raise ResultFileError(f"{path}:{logged[-1][1].line}: eval_accuracy's epoch_num counts epochs or steps, not "
                              f"samples (the largest is {max(epochs):g}: below the global batch size {batch} or at "
                              "most the logged training steps, and not every one a multiple of the batch size), and "
                              "no train_samples follows the evaluations: at how many samples the run reached the "
                              "target is unknown")  # fmt: skip
    trained = [e for _, e in logged if e.line > start.line]
    before = [Evaluation(0, e.value, e.time_ms, e.line) for _, e in logged if e.line < start.line]
    positions, source = _scheduled(len(trained), end, batch, commands)
    placed = [Evaluation(s, e.value, e.time_ms, e.line) for s, e in zip(positions, trained, strict=True)]
    return tuple(before + placed), source


def _epoch_unit(epochs: Sequence[float], end: int | None, batch: int, steps: int | None) -> str:
    """What eval_accuracy's epoch_num counts: "samples", "steps", or "other" (epochs, or steps nothing confirms).

    A train_samples after the evaluations (`end`) decides where it confirms one reading: the largest epoch_num at
    most one evaluation interval (the largest gap between epoch_nums, from 0) below it reads as samples, that times
    the global batch size as steps (samples where both fit: a global batch of 1 or 2). Else samples where every
    epoch_num is a multiple of the global batch size (a run evaluates after whole steps: our trainer's logs, whatever
    their decay horizon) or the largest is at least the batch size and above the logged training steps (MLPerf's
    published logs); anything else (every evaluation at epoch_num 1, steps up to the training steps) is "other"."""
    if not epochs:
        return "samples"
    top = max(epochs)
    marks = sorted({0.0, *epochs})
    gap = max(b - a for a, b in zip(marks, marks[1:], strict=False)) if len(marks) > 1 else 0.0
    if end is not None:
        if top <= end <= top + gap:
            return "samples"
        if top * batch <= end <= (top + gap) * batch:
            return "steps"
    if top >= batch and (all(epoch % batch == 0 for epoch in epochs) or steps is None or top > steps):
        return "samples"
    return "other"


def _carried(event: Event) -> int | None:
    """The samples an evaluation's own metadata gives (`train_samples`, `train_samples_since_beginning`), if any."""
    for key in ("train_samples", "train_samples_since_beginning"):
        value = event.metadata.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
            return round(value)
    return None


def _by_epoch_num(path: Path, logged: Sequence[tuple[float, Event]], per: int = 1) -> tuple[Evaluation, ...]:
    """One point per epoch_num at epoch_num x `per` samples (1: epoch_num counts samples; the global batch size: it
    counts steps), in order of samples; another value at the same epoch_num is an error."""
    points: dict[int, Evaluation] = {}
    for epoch, event in logged:
        samples = round(epoch * per)
        if samples > MAX_LOGGED:
            raise ResultFileError(
                f"{path}:{event.line}: eval_accuracy at epoch_num {epoch:g} is past 2**53 "
                f"samples{f' at global batch size {per}' if per > 1 else ''}: the line is damaged"
            )
        seen = points.get(samples)
        if seen is not None and seen.accuracy != event.value:
            raise ResultFileError(f"{path}:{event.line}: eval_accuracy at epoch_num {epoch:g} is logged again "
                                  f"with another value ({seen.accuracy!r} at line {seen.line}, {event.value!r} "
                                  "here)")  # fmt: skip
        points.setdefault(samples, Evaluation(samples, event.value, event.time_ms, event.line))
    return tuple(points[s] for s in sorted(points))


def mlperf_eval_interval(batch: int) -> int:
    """MLPerf BERT's evaluation interval in samples for global batch size `batch` (training rules from 1.0)."""
    return max(math.floor(0.05 * (230.23 * batch + 3_000_000) / 25_000) * 25_000, 25_000)


def _scheduled(n: int, end: int, batch: int, commands: Sequence[tuple[int, str]]) -> tuple[list[int], str]:
    """Positions of n evaluations of a run that trained `end` samples: the first schedule that fits, else equal
    intervals (see the module docstring)."""
    schedules = []
    logged = _logged_schedule(commands)
    if logged is not None:
        schedules.append((*logged, "command line"))
    rule = mlperf_eval_interval(batch)
    schedules.append((rule, rule, "mlperf rule"))
    for first, every, source in schedules:
        positions = [math.ceil((first + k * every) / batch) * batch for k in range(n + 1)]
        if n and positions[n - 1] <= end < positions[n]:
            return positions[:n], source
    return [round(end * (k + 1) / n) for k in range(n)], "equal intervals"


def _logged_schedule(commands: Sequence[tuple[int, str]]) -> tuple[int, int] | None:
    """(--eval_iter_start_samples, --eval_iter_samples) of the logged command line, where it gives a positive pair."""
    for _, line in commands:
        first, every = _EVAL_START.search(line), _EVAL_EVERY.search(line)
        if first and every and int(every.group(1)) > 0:
            return int(first.group(1)), int(every.group(1))
    return None


def _every(evaluations: Sequence[Evaluation], end: int | None) -> int | None:
    """Samples between evaluations: the most common gap, the first of equally common ones, leaving out a last gap that
    ends at `end` (train_samples) when there are others (a run that evaluates once more at its budget: every 16
    samples up to 40 gives 16, 32, 40, every 16); else the first evaluation's position."""
    if not evaluations:
        return None
    gaps = [b.samples - a.samples for a, b in zip(evaluations, evaluations[1:], strict=False)]
    if len(gaps) > 1 and evaluations[-1].samples == end:
        gaps.pop()
    if not gaps:
        return evaluations[0].samples or None
    return Counter(gaps).most_common(1)[0][0] or None  # most_common keeps the first of equal counts


def _target(path: Path, settings: dict[str, Event], commands: Sequence[tuple[int, str]]) -> float | None:
    for key in TARGET_KEYS:
        if key in settings:
            return _number(path, settings[key], key)
    for _, line in commands:
        match = _TARGET.search(line)
        if match:
            try:
                return float(match.group(1))
            except ValueError:
                continue
    return None


def _with_budget(run: ResultRun, hyper: dict[str, Any], commands: Sequence[tuple[int, str]]) -> ResultRun:
    limits = []
    if "schedule.total_steps" in hyper:
        limits.append(hyper["schedule.total_steps"] * run.global_batch_size)
    for _, line in commands:
        match = _MAX_SAMPLES.search(line)
        if match:
            with contextlib.suppress(ValueError):
                limits.append(int(float(match.group(1))))
    trained = max([run.samples, *(e.samples for e in run.evaluations)])
    budget = max(min(limits), trained) if limits else trained
    return replace(run, budget=max(budget, 1))
