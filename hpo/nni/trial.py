"""The NNI trial entry: what NNI's manager runs for every trial of an `engine: nni` experiment.

    python -m hpo.nni.trial --experiment-id N --arm I --run-dir DIR [--db URL]

The database URL comes from `<run dir>/nni/database.url` (mode 0600, written by the engine) unless `--db` is
given: NNI shows a trial's command line in its web UI and REST API, and `ps` shows it to everyone.
It takes its parameters from NNI (`nni.get_next_parameter()`), records a QUEUED trial in our database with worker
`nni:<NNI trial id>` (in the same write; the number is assigned atomically), and runs it through
`hpo.trial.entry.run_trial` exactly like the local engine's trials, with one more reporter that sends each
evaluated accuracy to NNI as an intermediate result (what the median-stop assessor reads). The final result NNI
gets is the objective stored in our database, in the experiment's direction, when the tuner is to be told one
(`hpo.objective.tuner_feedback`); otherwise the process exits non-zero and NNI tells its tuner the trial failed.

Confirmation runs. In an NNI experiment of an arm's confirmation runs (`hpo.nni.confirm`) NNI's parameters are
the arm's best configuration and a training seed (`hpo.nni.config.CONFIRMATION_SEED`): the trial records no new
row, it runs the QUEUED confirmation run of its arm with that seed and configuration, which the engine created
(kind confirmation, the seed), at that run's attempt.

Process group. NNI's manager starts every trial in its own process group (NNI's launcher makes the manager a
group leader; the trial, run by a shell the manager spawns, inherits it). The trial first leads a process group
of its own (`lead_process_group`), so the `pid` it records (its process group, as under the local engine) holds
the trial and its children only: ending that group never ends the manager, its tuner or the other trials.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from pathlib import Path
from typing import Any

from hpo.errors import DatabaseUnavailableError, DiskFullError, HpoError
from hpo.experiment import spec_from_stored
from hpo.experiment.arms import ArmPlan, arm_plans, trial_config
from hpo.files import full_disk
from hpo.nni.config import database_url_file, split_confirmation
from hpo.nni.confirm import queued_confirmation
from hpo.nni.jobs import DISK_FULL, WORKER_PREFIX
from hpo.objective import NOT_TOLD, tuner_feedback
from hpo.storage import SqlStorage
from hpo.storage.retry import outage_bound
from hpo.trial.entry import WORKER_ENV, run_trial
from hpo.trial.outcome import EXIT_DATABASE_UNREACHABLE, EXIT_DISK_FULL
from hpo.trials import TrialSpec
from search_spaces.nni import from_nni_params


class NniReporter:
    """A trainer reporter that forwards evaluations to NNI: {"default": mlm_accuracy, "samples": n, "trial": our
    trial number} (NNI's own "Trial No." counts per NNI experiment, so its web UI shows ours as a metric key)."""

    def __init__(self, number: int) -> None:
        import nni

        self.nni, self.number = nni, number

    def intermediate(self, metrics: dict[str, Any]) -> None:
        accuracy = metrics.get("mlm_accuracy")
        if isinstance(accuracy, int | float) and not isinstance(accuracy, bool):
            report = {"default": float(accuracy), "samples": metrics.get("samples"), "trial": self.number}
            self.nni.report_intermediate_result(report)

    def final(self, result: Any) -> None:
        """The final result goes to NNI after it is stored (see `main`), so both carry the same objective."""


def run(db_url: str, experiment_id: int, arm: int, run_dir: Path) -> int:
    """Ask NNI for parameters, record and run the trial; returns the process exit code."""
    import nni  # only NNI's trials have it to import (and need it)

    lead_process_group()
    worker = WORKER_PREFIX + nni.get_trial_id()
    # the bound of the environment or the default until the stored experiment says its own, as the local engine's
    # trial (hpo.trial.entry): a trial that NNI starts while the database is away waits for it from its first read
    with SqlStorage(db_url, outage_s=outage_bound()) as storage:
        stored = storage.get_experiment(experiment_id)
        spec = spec_from_stored(stored)
        storage.wait_for_outages(outage_bound(spec.database.outage_s))
        plan = arm_plans(spec)[arm]
        generated, seed = split_confirmation(nni.get_next_parameter())
        if seed is None:
            trial_id, attempt = tuning_trial(storage, experiment_id, spec, plan, generated, worker), 0
        else:
            trial_id, attempt = confirmation_run(storage, experiment_id, plan, seed, generated)
        number = storage.get_trial(trial_id).number
        os.environ[WORKER_ENV] = worker
        workdir = Path(run_dir) / "trials" / f"{number:05d}"
        try:
            result = run_trial(storage, trial_id, attempt, workdir, [NniReporter(number)])
        except (DiskFullError, OSError) as e:  # not the configuration's failure: not charged, the engine stops
            if isinstance(e, OSError) and e.errno != errno.ENOSPC:
                raise
            full = full_disk(workdir) or str(e)
            with contextlib.suppress(HpoError):  # a stop closed its record meanwhile
                storage.interrupt_trial(trial_id, DISK_FULL + full, attempt=attempt)
            with contextlib.suppress(OSError):  # its log may be on that disk
                print(f"error: trial {number}: {e}", file=sys.stderr)
            return EXIT_DISK_FULL
    feedback = tuner_feedback(spec, result.state, result.objective, result.metrics)
    if feedback is None or feedback is NOT_TOLD:
        print(f"trial {number}: {result.state.value} ({result.reason})", file=sys.stderr)
        return 1
    nni.report_final_result({"default": result.objective, "trial": number})
    return 0


def tuning_trial(storage, experiment_id: int, spec, plan: ArmPlan, generated: dict[str, Any], worker: str) -> int:
    """Record a QUEUED tuning trial with the parameters NNI's tuner generated (flattened to our names, with the
    arm's fixed values) under the NNI trial's worker; returns its id. The worker comes with the row, in one write:
    a trial killed before it starts leaves a row its engine finds (`hpo.nni.jobs.reconcile`), not a queued row
    nobody claims beside a second one the engine adds."""
    params = {**plan.fixed, **from_nni_params(generated, plan.space)}
    try:
        batch = trial_config(spec, params).batch.global_batch_size
    except Exception:  # an invalid configuration: run_trial records it as failed
        batch = None
    return storage.create_trial(
        experiment_id, TrialSpec(None, params, plan.label, global_batch_size=batch), worker=worker
    )


def confirmation_run(storage, experiment_id: int, plan: ArmPlan, seed: int, params: dict[str, Any]) -> tuple[int, int]:
    """(id, attempt) of the queued confirmation run of the arm with the seed and configuration NNI gave this trial
    (the engine created it; `hpo.nni.confirm`); HpoError when there is none."""
    run = queued_confirmation(storage, experiment_id, plan.label, seed, params)
    if run is None:
        raise HpoError(f"experiment {experiment_id} has no queued confirmation run of {plan.label or 'its best'} "
                       f"with seed {seed} and parameters {params}; it ran already or was recorded")  # fmt: skip
    return run.id, run.attempt


def lead_process_group() -> int:
    """Make this process the leader of a process group of its own (it is in the NNI manager's); returns it."""
    with contextlib.suppress(OSError):  # a session leader cannot: it leads its group already
        os.setpgid(0, 0)
    return os.getpgrp()


def database_url(run_dir: Path) -> str:
    """The database URL the engine left for the trials of a run directory."""
    path = database_url_file(run_dir)
    try:
        return path.read_text().strip()
    except OSError as e:
        raise HpoError(
            f"{path}: cannot read the database URL ({e.strerror}); the NNI engine writes it when it "
            "starts the experiment (on a remote machine, the run directory must be shared)"
        ) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpo.nni.trial", description=__doc__.split("\n")[0])
    parser.add_argument("--db", help="the experiment's database URL (default: read from the run directory)")
    parser.add_argument("--experiment-id", type=int, required=True, help="the experiment's id in that database")
    parser.add_argument("--arm", type=int, required=True, help="the index of the compare arm this NNI experiment runs")
    parser.add_argument("--run-dir", type=Path, required=True, help="the experiment's run directory")
    args = parser.parse_args(argv)
    try:
        return run(args.db or database_url(args.run_dir), args.experiment_id, args.arm, args.run_dir)
    except DatabaseUnavailableError as e:  # past the bound: said in a line, as the local engine's trial says it
        print(f"error: NNI trial of experiment {args.experiment_id}, arm {args.arm}: {e}", file=sys.stderr)
        return EXIT_DATABASE_UNREACHABLE


if __name__ == "__main__":
    from hpo.trial.exit import exit_recorded

    exit_recorded(main())
