"""Imported experiments: MLPerf training results (`hpo import mlperf`) and mlperf-logging's reference convergence
points (`hpo import rcp`) read into the database as finished experiments, one trial per run.

    hpo import mlperf PATH... --name NAME [--compare optimizer,global_batch_size] [--optimizer lamb] [--target 0.72]
    hpo import rcp FILE [--name NAME]

`hpo.mlperf.logs` reads result files (`result_*.txt`: MLCommons' published layout and what our trainer writes with
`log.mlperf`; with `optimizers`, the names submitters give optimizers, and `systems`, their hardware),
`hpo.mlperf.rcp` reads an RCP file (`rcps_bert.json` of a training ruleset), and `hpo.mlperf.importer` turns
either into an experiment (a synthetic spec and its trials) and writes it. Reading is
pure and checks every file before anything is written: a file that cannot be read is a `ResultFileError` naming
the file, the line and what is missing, and nothing of any file is written.

How runs are stored, and why. The verdict (`hpo.evidence.verdict`, shared by `hpo best --per-arm`, `hpo status`, the
report
and the API) reads, per arm, the runs of the configuration of the arm's best tuning trial (`storage.best_per_arm`):
its confirmation trials and, where nothing picked it on its outcome, that tuning trial itself (`UNSELECTED_KEY`). An
import stores its runs in that same shape, so every reader works on it unchanged and counts the same runs:

- the runs are grouped into configurations: runs whose hyperparameters (and, when compared, system or submitter)
  are all equal; an arm (`--compare`) may hold several configurations;
- per configuration, one run is its tuning trial and every other run is a confirmation trial of exactly the same
  parameters (with the run's seed). The tuning run is the first in file order (`result_0` before `result_1`, an RCP
  list's first seed) among the runs that ended (a run_stop): it is never chosen by how fast it was; it has to have
  ended because an unfinished (failed) run can never be its arm's best and its configuration would then have no
  evidence at all;
- every run is evidence: a configuration alone in its arm was picked by nothing, so its tuning trial carries
  `UNSELECTED_KEY` and the verdict counts it with the others (an MLPerf BERT submission's 10 runs are 10 runs of
  evidence, an RCP batch size's 20 seeds 20). Only in an arm with several configurations is the best one picked, on
  each one's tuning run (the fewest samples, as in a tuned experiment); those tuning runs are then left out of the
  evidence, as a tuned experiment's are, and the import says so.

What a run becomes: its hyperparameters from the logged keys (a value the trainer cannot take is left out, with a
note), the optimizer (`hpo.mlperf.logs`: `opt_name` and the logged command lines, named as submitters name them,
else `--optimizer`), the global batch size, samples to target (of a successful `run_stop`, the first evaluation at
or above the import's target; where that is the last one, `train_samples` at `run_stop`, which MLPerf's RCP checker
reads for BERT, else the last evaluation's position; an aborted run, and a success that never evaluated at the
import's target, is a miss, COMPLETED without samples to target; a run without `run_stop` is FAILED, also a miss for
the verdict), its `eval_accuracy` curve as `mlm_accuracy` points at their positions in samples (`epoch_num` in
samples or in steps, or where it is neither the evaluation schedule, see `hpo.mlperf.logs`), the system as the
trial's worker, and in its final record (`metrics`) the system, submitter, file, how the curve was placed, its
wall-clock (run_start to run_stop), its system description's accelerators and accelerator-hours, and the content
hash. The content hash (sha256 of the file's MLLOG lines; of the
record and seed for an RCP) makes a second import of the same files add nothing.

The stored spec is a synthetic experiment (`hpo.experiment.spec_from_stored` loads it): a `choice` parameter per
hyperparameter over the values the runs used, `compare` from `--compare`, and a base config with the target
(the log's, else MLPerf BERT's 0.720), the sample budget (per configuration, from the logged training steps x global
batch size or a logged `--max_samples_termination`, at least what the runs trained) and the evaluation interval (from
the curves). The model and data are not in an MLPerf log: the trainer's defaults (BERT-large) stand in, so `hpo
export` of an imported experiment gives the hyperparameters, not the submission's system. Its `imported` entry
(`IMPORTED_KEY` beside `experiment` and `run_dir`) says where it came from; status, the report and the API show it.
"""

from __future__ import annotations

from typing import Any

IMPORTED_KEY = "imported"  # the stored spec's entry of an imported experiment (beside `experiment`, `run_dir`)
HASH_KEY = "import_sha256"  # a trial's final-record entry: the content hash of the run it was read from
UNSELECTED_KEY = "unselected"  # a tuning trial's final-record entry: True where nothing picked it on its outcome
KINDS = {"mlperf": "MLPerf training results", "rcp": "MLPerf reference convergence points (RCP)"}


def imported(record) -> dict[str, Any] | None:
    """Where an imported experiment came from (its stored `imported` entry); None for an experiment that ran here."""
    value = (getattr(record, "spec", None) or {}).get(IMPORTED_KEY)
    return dict(value) if isinstance(value, dict) else None


def imported_line(info: dict[str, Any], held: int | None = None) -> str:
    """`imported: 3 runs from 3 MLPerf training results file(s) (hpo import mlperf); nothing ran here`, the target
    and where it came from, and what a run cost per arm where the runs logged it (`cost_line`); `held`: the runs the
    experiment holds, where an import cut short stored fewer than its files have (`imported: 83 of 263 run(s) ...`)."""
    kind = str(info.get("kind", "mlperf"))
    runs = int(info.get("runs", 0))
    count = f"{held} of {runs}" if held is not None and held < runs else f"{runs}"
    files = info.get("files") or []
    cost = info.get("cost") or {}
    costs = "".join(f"; arm {arm}: {cost_line(c)}" for arm, c in cost.items() if isinstance(c, dict) and cost_line(c))
    target = info.get("target")  # (an import of an earlier version of hpo did not store it)
    aim = f"; target {target:g} ({info.get('target_from')})" if isinstance(target, int | float) else ""
    return (f"imported: {count} run(s) from {len(files)} file(s) of {KINDS.get(kind, kind)} "
            f"(hpo import {kind}); nothing was tuned or trained here{aim}{costs}")  # fmt: skip


IMPORT_VERDICT_NOTE = ("(an imported experiment: its runs are the evidence as the result files logged them and "
                       "nothing is tuned or confirmed here, so where the verdict asks for more tuning trials or "
                       "confirmation runs, more result files would decide: import them with these under another "
                       "--name)")  # fmt: skip


def cost_line(cost: dict[str, Any] | None) -> str:
    """`per run 22.3 s on 1,024 accelerators: 6.35 accelerator-hours` (means over an arm's runs, as
    `hpo.mlperf.importer.cost_per_arm` keeps them); '' without a cost."""
    if not cost or cost.get("wall_clock_s") is None:
        return ""
    counts = "/".join(f"{n:,}" for n in cost.get("accelerators") or [])
    line = f"per run {duration(cost['wall_clock_s'])}" + (f" on {counts} accelerators" if counts else "")
    hours = cost.get("accelerator_hours")
    return line + (f": {hours:,.3g} accelerator-hours" if hours is not None else " (accelerators unknown)")


def duration(seconds: float) -> str:
    """`42.0 s`, `17.5 min`, `3.25 h`."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"
