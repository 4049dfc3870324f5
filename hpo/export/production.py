"""Exporting a best trial as a production run: a complete trainer config, and the `torchrun` line that runs it.

    text = render(record, trial, "yaml")                      # -> Export(text, warnings, media_type)
    render(record, trial, "torchrun", nodes=2, gpus_per_node=8, config_path="best.yaml")

Everything here is pure: an experiment record (its stored, self-contained spec) and a trial record in, text out.
Choosing the trial (overall, per arm, per batch size) is the caller's job, through the storage.

The exported config is the experiment's base config with its overrides, the trial's parameters, and the full
training budget. A multi-fidelity tuner's trial may have run on a fraction of it (a short rung): its export says so,
in a comment, a warning and the JSON's provenance (`samples_trained`, the trial's `trial_max_samples` and the
export's `max_samples`). Nothing trial-specific is kept: the
trial's report file and checkpoint directory are set by the controller, not by the stored spec, so they never
appear. Every exported config writes an MLPerf log (`log.mlperf`, MLPerf's mllog events from rank 0, see
trainer/mlperf_log.py) to `mlperf/result_0.txt`, relative to the directory the trainer runs in, unless the
experiment's config names a file of its own; the YAML says where in a comment. When the config runs on more
ranks than micro batches fit into the global batch, the micro batch is reduced (the global batch, which is what
the optimizer sees, never changes) and a comment says so.

Formats: `yaml` (the config, with the provenance as comments: `python -m trainer --config FILE` runs it),
`json` (`{"provenance": ..., "warnings": [...], "config": ...}`: JSON has no comments, so the runnable config is
the `config` member), and `torchrun` (the command line, with the provenance as shell comments).

An experiment of the simulated runner trained nothing: its trials' numbers were read from a learning-curve table.
Its export says so where a user reads it: the first comment line, the `reached the target` line, a warning (in the
file, on the console, in the JSON's `warnings` and the API's X-HPO-Warning header) and `simulated: true` in the
JSON's provenance.

No stored or user-supplied text can break the file: the config is written by the YAML dumper (which quotes and
escapes any string), a comment shows the characters that would end its line or that YAML cannot carry as escapes,
and a config path with such characters is refused (the torchrun line must name it as it is).
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import PurePath
from typing import Any, Literal

import yaml

from hpo.errors import HpoError
from hpo.mlperf import imported
from hpo.storage.base import ExperimentRecord, TrialRecord
from hpo.trials import objective_text

Format = Literal["yaml", "json", "torchrun"]
FORMATS: tuple[str, ...] = ("yaml", "json", "torchrun")
MEDIA_TYPES = {"yaml": "application/yaml", "json": "application/json", "torchrun": "text/x-shellscript"}
RENDEZVOUS_PORT = 29400
MLPERF_LOG = "mlperf/result_0.txt"  # log.mlperf of an exported config: MLPerf's result file name for run 0

# Characters that end a line for YAML (LF, CR, NEL, U+2028/9) or for Python's str.splitlines (also VT, FF,
# U+001C-1E), those YAML cannot carry at all (other C0/C1 controls, DEL, surrogates, U+FFFE/F), and U+FFFD, what
# bytes that are not UTF-8 in the API's query string become (a name no one typed).
_LINE_UNSAFE = r"\x00-\x1f\x7f-\x9f\u2028\u2029\ufffd\ufffe\uffff"
LINE_UNSAFE = re.compile(rf"[{_LINE_UNSAFE}\ud800-\udfff]")
# The same rule as a JSON-schema pattern for the API's config_path (a query string never holds a surrogate).
CONFIG_PATH_PATTERN = f"^[^{_LINE_UNSAFE}]+$"


class ExportError(HpoError):
    """A best config cannot be exported as asked (an unknown arm, a batch that cannot be split over the ranks)."""


@dataclass(frozen=True)
class Provenance:
    """Where an exported config comes from."""

    experiment: str
    trial: int
    arm: str | None
    metric: str  # the experiment's objective metric
    direction: str
    objective: float | None
    reached_target: bool
    target_mlm_accuracy: float
    samples_to_target: int | None
    best_mlm_accuracy: float | None
    samples_trained: int | None  # the trial's training samples (its final record); None where it kept none
    trial_max_samples: int  # the trial's budget.max_samples: below max_samples for a short multi-fidelity rung
    max_samples: int  # the export's budget.max_samples: the full budget
    params: dict[str, Any]
    simulated: bool = False  # runner: simulated: the numbers were read from a learning-curve table, not trained
    chosen: str = "the best trial"  # why this trial (`export_arm`): an arm asked for, the verdict's winner, ...
    imported: str | None = None  # an imported experiment's kind (`hpo import mlperf`, `rcp`): its runs ran elsewhere


@dataclass(frozen=True)
class Export:
    text: str
    warnings: tuple[str, ...]
    media_type: str


def arm_labels(spec) -> list[str]:
    """The experiment's arms as stored on trials (`optimizer.name=lamb`); [] when it compares nothing."""
    from hpo.experiment.arms import (
        arm_labels as labels,  # the trainer config models: built on first use, not at start-up
    )

    return labels(spec)


def check_arm(spec, arm: str | None) -> None:
    """Refuse an arm the experiment does not have, naming the ones it has."""
    if arm is None:
        return
    known = arm_labels(spec)
    if arm not in known:
        hint = f"its arms are {', '.join(known)}" if known else "it compares nothing, so it has no arms"
        raise ExportError(f"experiment {spec.name} has no arm {arm!r}: {hint}")


def export_arm(
    spec,
    arm: str | None,
    global_batch_size: int | None,
    winner: Callable[[int | None], str | None],
    best_batch: Callable[[], int | None] = lambda: None,
) -> tuple[str | None, str]:
    """The arm whose best trial is exported, and why (a comment of the export): the arm asked for; else, in an
    experiment that compares arms, the winner of the verdict (`winner(global_batch_size)`, asked only then: the
    experiment's, or with a global batch size asked for the one that compared runs at that size, e.g. a batch-size
    study's verdict there), whose best trial may not be the best trial overall (a lucky seed of the other arm); else
    every arm (at the global batch size asked for). A batch-size study's own verdict compares arms across batch sizes
    too, a question it does not ask: without a batch size asked for, its export is at the batch size of the best
    trial of any arm (`best_batch()`: the fewest samples to target), by the verdict there."""
    from hpo.experiment.arms import batch_study  # the trainer config models: built on first use, not at start-up

    if arm is not None:
        return arm, "the best trial of the arm asked for"
    if not spec.compare:
        return None, "the best trial"
    if global_batch_size is None and batch_study(spec.compare):
        at = best_batch()
        named = winner(at) if at is not None else None
        if named is not None:
            return named, (f"the best trial of the verdict's winner at global batch size {at}, that of the best trial "
                           "of any arm (a batch-size study: --batch-size exports another size's)")  # fmt: skip
        return None, (f"the best trial of any arm, at global batch size {at}, where no verdict names a winner yet (a "
                      "batch-size study: --batch-size exports another size's)")  # fmt: skip
    named = winner(global_batch_size)
    if global_batch_size is not None:
        if named is not None:
            return named, "the best trial of the verdict's winner at the global batch size asked for"
        return None, ("the best trial of any arm at the global batch size asked for: no verdict names a winner at "
                      "that size yet (--arm exports an arm's best)")  # fmt: skip
    if named is not None:
        return named, "the best trial of the verdict's winner"
    return None, "the best trial of any arm: the verdict names no winner yet (--arm exports an arm's best)"


def other_batch_sizes(storage, record: ExperimentRecord, arm: str | None, batch_size: int | None, action: str,
                      ask: str) -> str | None:  # fmt: skip
    """Why a batch size asked for has no best trial when completed tuning trials (of `arm`) with an objective exist at
    other global batch sizes: the message names those sizes (`action`: what would be done with the trial; `ask`:
    how to ask for a size, e.g. `--batch-size ` or `global_batch_size=`). None without a batch size, or when no
    completed trial (of that arm) could be the best at any size. It lists trials: asked only for the message."""
    from hpo.trials import TrialKind, TrialState

    if batch_size is None:
        return None
    completed = storage.list_trials(record.id, state=TrialState.COMPLETED, arm=arm)
    sizes = sorted({t.global_batch_size for t in completed if t.kind is TrialKind.TUNING and t.objective is not None
                    and t.global_batch_size is not None} - {batch_size})  # fmt: skip
    if not sizes:
        return None
    of_arm = f" of arm {arm}" if arm else ""
    other = " (or another of those)" if len(sizes) > 1 else ""
    return (f"experiment {record.name} has no completed trial{of_arm} with global batch size {batch_size} {action}; "
            f"its completed trials{of_arm} have global batch size {', '.join(map(str, sizes))}: {ask}{sizes[0]}"
            f"{other}")  # fmt: skip


def production_config(spec, trial: TrialRecord, ranks: int = 1) -> dict[str, Any]:
    """The complete trainer config (a plain mapping) of `trial` at the full budget, fit for `ranks` ranks."""
    from hpo.experiment.arms import trial_config  # the trainer config models: built on first use, not at start-up

    config = trial_config(spec, trial.params, fidelity=1.0).model_dump(mode="json")
    config["batch"]["micro_batch_size"] = micro_batch_for(
        config["batch"]["global_batch_size"], config["batch"]["micro_batch_size"], ranks
    )
    return config


def with_mlperf_log(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with `log.mlperf` set to MLPERF_LOG where the experiment left it off (a file it names stays)."""
    log = config.setdefault("log", {})
    if not log.get("mlperf"):
        log["mlperf"] = MLPERF_LOG
    return config


def micro_batch_for(global_batch: int, micro_batch: int | str, ranks: int) -> int | str:
    """The largest micro batch <= `micro_batch` that `global_batch` splits into evenly over `ranks` ranks (`auto`
    stays: the trainer chooses among the divisors of a rank's batch)."""
    if ranks < 1:
        raise ExportError(f"the number of ranks must be at least 1, got {ranks}")
    if global_batch % ranks:
        raise ExportError(
            f"batch.global_batch_size {global_batch} cannot be split evenly over {ranks} ranks; "
            "choose nodes x GPUs per node that divides it (`hpo export`'s --nodes and --gpus-per-node, the API's "
            "nodes and gpus_per_node)"
        )
    per_rank = global_batch // ranks
    if micro_batch == "auto":
        return micro_batch
    return next(m for m in range(min(micro_batch, per_rank), 0, -1) if per_rank % m == 0)


def split_of(batch: dict[str, Any], ranks: int) -> str:
    """How the trainer splits `batch` (a config's `batch` section, fit for `ranks` ranks) over them."""
    global_batch, micro = batch["global_batch_size"], batch["micro_batch_size"]
    if micro == "auto":
        return (f"global_batch_size {global_batch} = {global_batch // ranks} sequences a rank x {ranks} rank(s); "
                "micro_batch_size auto: the trainer picks a divisor of a rank's sequences")  # fmt: skip
    steps = global_batch // (micro * ranks)
    return (f"global_batch_size {global_batch} = micro_batch_size {micro} x {ranks} rank(s) x {steps} accumulation "
            "step(s)")  # fmt: skip


def check_config_file(path: str, saved: Any, nodes: int, gpus_per_node: int, export_again: str) -> None:
    """Refuse a torchrun line for a config file (`saved`: its parsed YAML) whose batch the trainer would refuse on
    these ranks (its `accumulation_steps` rule: one exported for other ranks); `export_again`: the command that
    exports it for them."""
    batch = saved.get("batch") if isinstance(saved, dict) else None
    if not isinstance(batch, dict) or not {"global_batch_size", "micro_batch_size"} <= batch.keys():
        return  # not an exported config: the trainer says what it lacks
    global_batch, micro, ranks = batch["global_batch_size"], batch["micro_batch_size"], nodes * gpus_per_node
    per_step = ranks if micro == "auto" else micro * ranks
    if not isinstance(global_batch, int) or not isinstance(per_step, int) or global_batch % per_step == 0:
        return
    raise ExportError(
        f"{path} has batch.micro_batch_size {micro} of batch.global_batch_size {global_batch}: the trainer refuses "
        f"it on {ranks} ranks ({nodes} x {gpus_per_node}; {global_batch} is no multiple of "
        f"{ranks if micro == 'auto' else f'{micro} x {ranks}'}); export it for these ranks first: {export_again}"
    )


def provenance(record: ExperimentRecord, spec, trial: TrialRecord, config: dict[str, Any],
               chosen: str = "the best trial") -> Provenance:  # fmt: skip
    """Where the exported `config` (from `production_config`) comes from."""
    target, full = float(config["eval"]["target_mlm_accuracy"]), int(config["budget"]["max_samples"])
    return Provenance(
        experiment=record.name,
        trial=trial.number,
        arm=trial.arm,
        metric=spec.objective.metric,
        direction=spec.direction,
        objective=trial.objective,
        reached_target=reached_target(trial, target),
        target_mlm_accuracy=target,
        samples_to_target=trial.samples_to_target,
        best_mlm_accuracy=trial.best_mlm_accuracy,
        samples_trained=samples_trained(trial),
        trial_max_samples=trial_max_samples(spec, trial, full),
        max_samples=full,
        params=dict(trial.params),
        simulated=spec.runner.name == "simulated",
        chosen=chosen,
        imported=(imported(record) or {}).get("kind"),
    )


def samples_trained(trial: TrialRecord) -> int | None:
    """The samples `trial` trained (its final record's `samples`), or None where the record has none."""
    samples = trial.metrics.get("samples")
    return int(samples) if isinstance(samples, int | float) and not isinstance(samples, bool) else None


def trial_max_samples(spec, trial: TrialRecord, full: int) -> int:
    """The budget.max_samples `trial` ran with: `full` (the export's) unless a multi-fidelity tuner ran it on a
    fraction of it (a rung: `trial.budget` < 1), as the controller shortened it (`trial_config`)."""
    from hpo.experiment.arms import trial_config  # the trainer config models: built on first use, not at start-up

    if not 0 < trial.budget < 1:
        return full
    return trial_config(spec, trial.params, fidelity=trial.budget).budget.max_samples


def reached_target(trial: TrialRecord, target: float) -> bool:
    """Whether the trial reached the experiment's target accuracy (the trainer reports samples_to_target then)."""
    if trial.samples_to_target is not None or trial.metrics.get("status") == "reached_target":
        return True
    return trial.best_mlm_accuracy is not None and trial.best_mlm_accuracy >= target


def warnings_for(origin: Provenance, among: str | None = None) -> tuple[str, ...]:
    """What a user must know before training the export: a best that missed the target (`among`: the trials it is
    the best of where not all of the experiment's, e.g. `arm optimizer.name=lamb`), or that ran only a short rung of
    the budget, numbers that are simulated."""
    warnings = []
    if not origin.reached_target:
        best = "no accuracy" if origin.best_mlm_accuracy is None else f"mlm_accuracy {origin.best_mlm_accuracy:.4f}"
        of = f"{among} of experiment" if among else "experiment"
        warnings.append(
            f"no trial of {of} {origin.experiment} reached the target mlm_accuracy "
            f"{origin.target_mlm_accuracy}: trial {origin.trial} is only the best of the misses (it reached {best}); "
            "tune further before production"
        )
    if origin.trial_max_samples < origin.max_samples:
        warnings.append(short_budget_warning(origin))
    if origin.simulated:
        warnings.append(SIMULATED.format(experiment=origin.experiment))
    return tuple(warnings)


def short_budget_warning(origin: Provenance) -> str:
    """A best trial that ran a short rung of a multi-fidelity tuner: the export trains the full budget, which that
    trial never reached."""
    trained = origin.samples_trained if origin.samples_trained is not None else origin.trial_max_samples
    what = (f"trained {origin.samples_trained:,} samples" if origin.samples_trained is not None else
            "kept no count of the samples it trained")  # fmt: skip
    return (f"trial {origin.trial} ran only a fraction of the sample budget: it {what} on a short rung of the "
            f"multi-fidelity tuner (budget.max_samples {origin.trial_max_samples:,} of {origin.max_samples:,}); this "
            f"config has the full budget of {origin.max_samples:,} samples, and how it trains past {trained:,} "
            "samples is untested")  # fmt: skip


def device_warning(config: dict[str, Any], ranks: int) -> tuple[str, ...]:
    """A config for several ranks that trains on the CPU (a CPU experiment's base config): said, as it is seldom
    what an export for GPUs means."""
    if ranks == 1 or config.get("device") != "cpu":
        return ()
    return (f"the config trains on device cpu (from the experiment's base config), so its {ranks} ranks are CPU "
            "processes; set device: cuda (or auto) to train on GPUs",)  # fmt: skip


def ranks_warning(spec, trial: TrialRecord, config: dict[str, Any], ranks: int) -> tuple[str, ...]:
    """Clipping that acts on each rank's gradient before the ranks average theirs (before_allreduce, bucketwise)
    clips another gradient on another number of ranks than the trial trained on: its max norm was tuned on that
    one. Said, with the export that keeps it."""
    strategy = config.get("clipping", {}).get("strategy")
    trained = len(trial.gpus) or spec.resources.ranks_per_trial(spec.resources.gpus != "none")
    if strategy not in ("before_allreduce", "bucketwise") or trained == ranks:
        return ()
    return (f"trial {trial.number} trained on {trained} rank(s) with clipping.strategy {strategy}, which clips each "
            f"rank's gradient before the ranks average them: on {ranks} rank(s) it clips another gradient than the "
            f"one its clipping.max_norm was tuned on; export for {trained} rank(s) (--nodes x --gpus-per-node) to "
            "train what was tuned",)  # fmt: skip


# ASCII only: the API sends a warning as the X-HPO-Warning header too.
SIMULATED = (
    "experiment {experiment} ran on the simulated runner: no training happened; its objective, samples to target "
    "and accuracy were read from a recorded learning-curve table, so this config is untested until you train it"
)


def check_config_path(config_path: str) -> None:
    """Refuse a config path the torchrun line cannot name on one line (see LINE_UNSAFE); quotes, spaces and
    other Unicode text are fine: the line quotes the path for the shell."""
    if not config_path:
        raise ExportError("the config path is empty: name the YAML file the torchrun command runs")
    bad = LINE_UNSAFE.search(config_path)
    if bad:
        what = ("U+FFFD, what bytes that are not UTF-8 become," if bad.group() == "\ufffd" else
                f"the control or line-break character {bad.group()!r}")  # fmt: skip
        raise ExportError(
            f"config path {config_path!r} holds {what} "
            f"(position {bad.start()}), which would break the exported file's `run:` line; name a file without "
            "control characters (`hpo export --config-path` / `-o`, or the API's config_path)"
        )


EXPORT_HEADER = "# Best configuration of experiment "  # the first line of a YAML or torchrun export


def is_export(text: str) -> bool:
    """Whether `text` is what `render` writes: a YAML or torchrun export (its first comment line) or a JSON one (an
    object with `provenance` and `config`). `hpo export -o` replaces such a file and no other."""
    if text.startswith(EXPORT_HEADER) and "exported by `hpo export`" in text.partition("\n")[0]:
        return True
    try:
        body = json.loads(text)
    except ValueError:
        return False
    return isinstance(body, dict) and {"provenance", "config"} <= body.keys()


def export_origin(text: str) -> str | None:
    """What an earlier export (`is_export`) holds, as `hpo export -o` says when it replaces it: `a yaml export of
    trial 3 of experiment exp`; None for any other text."""
    if not is_export(text):
        return None
    if text.startswith(EXPORT_HEADER):
        lines = text.splitlines()
        experiment = lines[0][len(EXPORT_HEADER) :].partition(", exported by")[0]
        number = re.match(r"# trial (\d+)", lines[1]) if len(lines) > 1 else None
        trial = number.group(1) if number else None
        body = next((line for line in lines if not line.startswith("#")), "")
        fmt = "torchrun" if body.startswith("torchrun ") else "yaml"
    else:
        origin = json.loads(text)["provenance"]
        origin = origin if isinstance(origin, dict) else {}
        fmt, trial, experiment = "json", origin.get("trial"), origin.get("experiment")
    parts = [f"a {fmt} export", *([f"of trial {trial}"] if trial is not None else []),
             *([f"of experiment {experiment}"] if experiment else [])]  # fmt: skip
    return comment_text(" ".join(parts))


def comment_text(text: str) -> str:
    r"""`text` fit for one comment line: characters in LINE_UNSAFE as Python escapes (`\x85`, `\u2028`)."""
    return LINE_UNSAFE.sub(lambda m: ascii(m.group())[1:-1], text)


def torchrun_command(config_path: str, nodes: int = 1, gpus_per_node: int = 1, run_id: str = "hpo") -> str:
    """`torchrun --nnodes N --nproc_per_node G [rendezvous] -m trainer --config FILE` as one shell line.

    One node rendezvouses on a free local port (`--standalone`); several use the c10d rendezvous at
    `$MASTER_ADDR:$MASTER_PORT` (default port 29400), and the same line is run on every node.
    The path is quoted for the shell; one that cannot stay on the line is refused (`check_config_path`).
    """
    check_config_path(config_path)
    if nodes < 1 or gpus_per_node < 1:
        raise ExportError(f"--nodes and --gpus-per-node must be at least 1, got {nodes} and {gpus_per_node}")
    parts = ["torchrun", "--nnodes", str(nodes), "--nproc_per_node", str(gpus_per_node)]
    if nodes == 1:
        parts.insert(1, "--standalone")
    else:
        endpoint = f'"${{MASTER_ADDR:?set MASTER_ADDR to the first node}}:${{MASTER_PORT:-{RENDEZVOUS_PORT}}}"'
        run_id = shlex.quote(comment_text(run_id))
        parts += ["--rdzv_backend", "c10d", "--rdzv_endpoint", endpoint, "--rdzv_id", run_id]
    return " ".join([*parts, "-m", "trainer", "--config", shlex.quote(config_path)])


def render(
    record: ExperimentRecord,
    trial: TrialRecord,
    fmt: Format | str,
    *,
    nodes: int = 1,
    gpus_per_node: int = 1,
    config_path: str = "best.yaml",
    spec=None,
    chosen: str = "the best trial",
    among: str | None = None,
) -> Export:
    """The best config of `record` taken from `trial`, in `fmt`, for `nodes` x `gpus_per_node` ranks
    (`spec`: the experiment's parsed spec when the caller has it already; `chosen`: why this trial, from
    `export_arm`; `among`: the trials it is the best of where not all of the experiment's, from `chosen_trial`)."""
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    if spec is None:
        from hpo.experiment import spec_from_stored  # the trainer config models: built on first use, not at start-up

        spec = spec_from_stored(record)
    command = torchrun_command(config_path, nodes, gpus_per_node, record.name)
    config = with_mlperf_log(production_config(spec, trial, nodes * gpus_per_node))
    origin = provenance(record, spec, trial, config, chosen)
    warnings = (warnings_for(origin, among) + device_warning(config, nodes * gpus_per_node)
                + ranks_warning(spec, trial, config, nodes * gpus_per_node))  # fmt: skip
    if fmt == "json":
        body = {"provenance": asdict(origin), "warnings": list(warnings), "command": command, "config": config}
        text = json.dumps(body, indent=2) + "\n"
    else:
        tuned_micro = production_config(spec, trial)["batch"]["micro_batch_size"]
        comments = _comment_lines(origin, tuned_micro, config, warnings, command, nodes * gpus_per_node)
        body = command + "\n" if fmt == "torchrun" else yaml.safe_dump(config, sort_keys=False)
        text = "\n".join(f"# {comment_text(line)}" if line else "#" for line in comments) + "\n" + body
    return Export(text, warnings, MEDIA_TYPES[fmt])


def _comment_lines(
    origin: Provenance, tuned_micro: int | str, config: dict[str, Any], warnings, command: str, ranks: int
) -> list[str]:
    objective = "none" if origin.objective is None else objective_text(origin.objective)
    simulated = " (simulated: read from a learning-curve table, not trained)" if origin.simulated else ""
    lines = [
        f"Best configuration of experiment {origin.experiment}, exported by `hpo export`."
        + (" SIMULATED: no training happened." if origin.simulated else ""),
        f"trial {origin.trial}" + (f", arm {origin.arm}" if origin.arm else ""),
        f"chosen as {origin.chosen}",
    ]
    if origin.imported:
        lines.append(f"imported (hpo import {origin.imported}): the hyperparameters of a run of MLPerf's, trained "
                     "on its submitter's cluster; set data.train and data.eval to your shards, and export with "
                     "--nodes and --gpus-per-node for your ranks")  # fmt: skip
    if origin.trial_max_samples < origin.max_samples:
        trained = "" if origin.samples_trained is None else f", trained {origin.samples_trained:,} samples"
        lines.append(f"trial budget: a short rung, budget.max_samples {origin.trial_max_samples:,} of the full "
                     f"{origin.max_samples:,}{trained}; exported at the full budget")  # fmt: skip
    missed = ""
    if origin.metric == "samples_to_target" and not origin.reached_target and origin.objective is not None:
        trained = f" in {origin.samples_trained:,} samples" if origin.samples_trained is not None else ""
        missed = f": the target was not reached{trained}, so this is the penalty of a miss, not samples to target"
    lines.append(f"objective: {origin.metric} = {objective} ({origin.direction}){missed}")
    if origin.reached_target:
        reached = f"after {origin.samples_to_target:,} samples" if origin.samples_to_target is not None else ""
        lines.append(f"reached the target mlm_accuracy {origin.target_mlm_accuracy} {reached}".rstrip() + simulated)
    lines += [f"WARNING: {warning}" for warning in warnings]
    lines += [f"tuned: {key} = {value}" for key, value in origin.params.items()]
    if tuned_micro != config["batch"]["micro_batch_size"]:
        lines.append(f"batch.micro_batch_size lowered from {tuned_micro} so the global batch splits over the ranks")
    lines.append(f"batch: {split_of(config['batch'], ranks)}")
    mlperf = config["log"]["mlperf"]
    where = "" if PurePath(mlperf).is_absolute() else ", relative to the directory the command runs in"
    lines.append(f"MLPerf log (mllog events of rank 0): {mlperf}{where}")
    lines += ["", f"run: {command}"]
    return lines
