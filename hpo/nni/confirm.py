"""Confirmation runs under engine: nni: the rows the engine creates, and which of them an NNI trial runs.

The rule is the local engine's (`hpo.engine.study`, `hpo.evidence.confirmations`): once an arm's tuning is over, its
best
configuration (as the storage names it) is re-run with the training seeds after the configuration's own (its
seed + 1, + 2, ..., continuing after the existing confirmation runs of that configuration), as QUEUED trials of
kind confirmation created by the controller, `runs_to_queue` of them per arm (one round with a fixed
`confirm_seeds`; with auto, the next round only when every arm finished the current one and the verdict at that
look says "not yet"). So both engines store the same rows, and `hpo status`, the report and the verdict read
them alike.

Under NNI each arm's queued runs of one configuration are one NNI experiment
(`hpo.nni.config.confirmation_experiment_config`), whose trials get the configuration and a seed from NNI; the
trial then runs the queued row of its arm with that seed and configuration (`queued_confirmation`), at the row's
attempt. A stopped run is recorded INTERRUPTED and re-queued by a resume (the same row, its next attempt), so a
resume never re-runs a finished confirmation run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpo.evidence.confirmations import runs_to_queue, stored_evidence
from hpo.experiment.arms import ArmPlan, arm_plans, trial_config
from hpo.storage.base import Storage, TrialRecord
from hpo.trials import TrialKind, TrialSpec, TrialState


def next_seeds(spec, best: TrialRecord, trials: Sequence[TrialRecord], count: int) -> list[int]:
    """The training seeds of `count` more confirmation runs of `best`'s configuration: after the highest seed of
    its existing confirmation runs, else after the configuration's own seed (as `hpo.engine.study` queues them)."""
    seeds = [t.seed for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == best.arm
             and t.params == best.params and t.seed is not None]  # fmt: skip
    last = max(seeds, default=trial_config(spec, best.params).seed)
    return [last + k for k in range(1, count + 1)]


def queue_round(spec, storage: Storage, experiment_id: int) -> list[TrialRecord]:
    """Create the confirmation runs every arm should have by now (`hpo.evidence.confirmations.runs_to_queue`, asked
    with the verdicts at the current look under `confirm_seeds: auto`); returns the new rows. An arm without a completed
    tuning trial gets none (there is nothing to confirm; the verdict says so)."""
    trials = storage.list_trials(experiment_id)
    evidence = stored_evidence(storage, experiment_id)
    verdicts = evidence.deciding(spec).values() if spec.budget.sequential else None
    target = runs_to_queue(spec, trials, verdicts, evidence.best)
    created = []
    for plan in arm_plans(spec):
        have = sum(1 for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == plan.label)
        best = storage.best_trial(experiment_id, arm=plan.label) if have < target else None
        if best is None:
            continue
        for seed in next_seeds(spec, best, trials, target - have):
            run = TrialSpec(None, best.params, plan.label, 1.0, (), best.global_batch_size, TrialKind.CONFIRMATION,
                            seed)  # fmt: skip
            created.append(storage.get_trial(storage.create_trial(experiment_id, run)))
    return created


def waiting(storage: Storage, experiment_id: int, plan: ArmPlan) -> list[TrialRecord]:
    """The arm's queued confirmation runs of one configuration (the first queued one's), in number order: what
    one NNI experiment runs."""
    queued = [t for t in storage.list_trials(experiment_id, state=TrialState.QUEUED, arm=plan.label)
              if t.kind is TrialKind.CONFIRMATION and t.arm == plan.label]  # fmt: skip
    return [t for t in queued if t.params == queued[0].params]


def queued_confirmation(storage: Storage, experiment_id: int, arm: str | None, seed: int,
                        params: Mapping[str, Any]) -> TrialRecord | None:  # fmt: skip
    """The queued confirmation run of `arm` with this training seed and configuration (None when there is none:
    it ran or was recorded meanwhile)."""
    for t in storage.list_trials(experiment_id, state=TrialState.QUEUED, arm=arm):
        if t.kind is TrialKind.CONFIRMATION and t.arm == arm and t.seed == seed and t.params == dict(params):
            return t
    return None
