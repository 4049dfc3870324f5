"""A 1-second dummy trial for the controller-overhead benchmark: it ends `--seconds` after it was launched.

Four ways it runs:
- with `--db --trial-id`, like the trial entry (`hpo.trial.entry`): it claims its QUEUED trial and records a
  result in the database (so the benchmark exercises the real control plane of our runners);
- with `--db --experiment-id --arm --run-dir`, like the NNI trial entry (`hpo.nni.trial`), under NNI's manager:
  it takes its parameters from NNI (`nni.get_next_parameter()`), creates its QUEUED trial with worker
  `nni:<NNI trial id>`, claims it, records a result and reports it to NNI as the final result;
- with `--db --experiment-id --params JSON`, started by another engine (Optuna): it does the same work in the
  database as a trial of ours (imports the storage, creates its trial, claims it, records a result), so that
  engine's trials cost the machine what ours do;
- without `--db`, it only waits (the light Optuna baseline records the result itself).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
from pathlib import Path

from hpo.trials import TrialResult, TrialState

OBJECTIVE = 64.0


def result() -> TrialResult:
    return TrialResult(TrialState.COMPLETED, objective=OBJECTIVE, samples_to_target=64, best_mlm_accuracy=0.9,
                       metrics={"status": "reached_target", "samples": 64})  # fmt: skip


def wait(launched_at: float, seconds: float) -> None:
    time.sleep(max(0.0, launched_at + seconds - time.time()))


def run_queued(db: str, trial_id: int, attempt: int, launched_at: float, seconds: float) -> None:
    """A trial our runner created: claim it, wait, record the result."""
    from hpo.storage import SqlStorage

    with SqlStorage(db) as storage:
        storage.mark_trial_running(trial_id, pid=os.getpgrp(), host=socket.gethostname(), attempt=attempt)
        wait(launched_at, seconds)
        storage.finish_trial(trial_id, result(), attempt=attempt)


def run_own(storage, experiment_id: int, params: dict, arm: str | None, worker: str | None, launched_at: float,
            seconds: float) -> None:  # fmt: skip
    """A trial another engine started: create its QUEUED trial, claim it, wait, record the result."""
    from hpo.trials import TrialSpec

    trial_id = storage.create_trial(experiment_id, TrialSpec(None, params, arm))
    storage.mark_trial_running(trial_id, pid=os.getpgrp(), host=socket.gethostname(), worker=worker, attempt=0)
    wait(launched_at, seconds)
    storage.finish_trial(trial_id, result(), attempt=0)


def run_nni(db: str, experiment_id: int, arm: int, launched_at: float, seconds: float) -> None:
    """A trial NNI's manager started: parameters from NNI, record the trial as `hpo.nni.trial` does, wait, record
    the result and report it to NNI."""
    import nni

    from hpo.experiment import spec_from_stored
    from hpo.experiment.arms import arm_plans
    from hpo.nni.jobs import WORKER_PREFIX
    from hpo.storage import SqlStorage
    from search_spaces.nni import from_nni_params

    worker = WORKER_PREFIX + nni.get_trial_id()
    with SqlStorage(db) as storage:
        plan = arm_plans(spec_from_stored(storage.get_experiment(experiment_id)))[arm]
        params = {**plan.fixed, **from_nni_params(nni.get_next_parameter(), plan.space)}
        run_own(storage, experiment_id, params, plan.label, worker, launched_at, seconds)
    nni.report_final_result(OBJECTIVE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--launched-at", type=float, required=True, help="time.time() when the runner launched it")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--db", help="the experiment's database URL")
    ap.add_argument("--trial-id", type=int, help="the QUEUED trial our runner created")
    ap.add_argument("--attempt", type=int, default=0)
    ap.add_argument("--workdir", help="ignored (the trial entry's argument)")
    ap.add_argument("--experiment-id", type=int, help="under NNI: the experiment's id in the database")
    ap.add_argument("--arm", type=int, help="under NNI: the compare arm this NNI experiment runs")
    ap.add_argument("--run-dir", type=Path, help="ignored (the NNI trial entry's argument)")
    ap.add_argument("--params", type=json.loads, help="started by another engine: the trial's parameters (JSON)")
    args = ap.parse_args()
    if args.db and args.trial_id is not None:
        run_queued(args.db, args.trial_id, args.attempt, args.launched_at, args.seconds)
    elif args.db and args.experiment_id is not None and args.arm is not None:
        run_nni(args.db, args.experiment_id, args.arm, args.launched_at, args.seconds)
    elif args.db and args.experiment_id is not None and args.params is not None:
        from hpo.storage import SqlStorage

        with SqlStorage(args.db) as storage:
            run_own(storage, args.experiment_id, args.params, None, None, args.launched_at, args.seconds)
    elif args.db:
        ap.error("--db needs --trial-id (our runners), --experiment-id and --arm (NNI), or --experiment-id and "
                 "--params (another engine)")  # fmt: skip
    else:
        wait(args.launched_at, args.seconds)


if __name__ == "__main__":
    from hpo.trial.exit import exit_recorded

    main()
    exit_recorded(0)
