"""Optuna (TPE with the median pruner, or with successive halving) on the same surrogate and simulated clock."""

from __future__ import annotations

import heapq
import itertools
from datetime import timedelta
from typing import Any

from bench.cost_at_scale.common import EPOCH, SimTrial, TrialModel, finish, run_confirmations
from hpo.experiment.arms import arm_plans
from hpo.trials import TrialKind
from search_spaces.space import CategoricalParam, FloatParam


def run_optuna(tuner: str, spec, model: TrialModel, seed: int, slots: int) -> list[SimTrial]:
    """TPE + a pruner per arm, asked round-robin, on a discrete-event clock of `slots` slots."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    arms = arm_plans(spec)
    spec_every = model.config({}).eval.every_samples  # Optuna's steps are samples here

    def pruner():
        pruners = optuna.pruners
        if tuner == "optuna_tpe_median":
            return pruners.MedianPruner()
        # the rungs of our asha and Syne Tune's ASHA: the first evaluation, then x eta (3)
        return pruners.SuccessiveHalvingPruner(min_resource=spec_every, reduction_factor=3)

    studies = [optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed),
                                   pruner=pruner()) for _ in arms]  # fmt: skip
    trials: list[SimTrial] = []
    created = [0] * len(arms)
    events: list[tuple[float, int, Any]] = []
    order = itertools.count()
    free, now = slots, 0.0

    def start(i: int) -> None:
        arm = arms[i]
        handle = studies[i].ask()
        params = {**arm.fixed, **{name: _suggest(handle, name, arm.space[name]) for name in arm.space.names}}
        plan = model.plan(params)
        trial = SimTrial(len(trials), arm.label, params, TrialKind.TUNING, EPOCH + timedelta(seconds=now),
                         EPOCH + timedelta(seconds=now))  # fmt: skip
        trials.append(trial)
        step = (i, handle, trial, plan, now, 0)
        at = plan.evals[0][0] if plan.evals else plan.samples
        heapq.heappush(events, (now + model.seconds(at), next(order), step))

    while True:
        while free > 0:
            open_arms = [i for i, arm in enumerate(arms) if created[i] < arm.quota]
            if not open_arms:
                break
            i = min(open_arms, key=lambda i: created[i])
            created[i] += 1
            free -= 1
            start(i)
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] == now:
            i, handle, trial, plan, began, k = heapq.heappop(events)[2]
            study = studies[i]
            if k < len(plan.evals):  # an evaluation
                samples = plan.evals[k][0]
                best = max(a for _, a in plan.evals[: k + 1])
                handle.report(model.partial_objective(trial.params, best), step=samples)
                if samples >= plan.samples and k == len(plan.evals) - 1:  # it ends here: target or budget
                    study.tell(handle, plan.objective)
                    finish(trial, plan, now)
                    free += 1
                    continue
                if handle.should_prune():
                    study.tell(handle, state=optuna.trial.TrialState.PRUNED)
                    finish(trial, plan, now, pruned_at=samples)
                    free += 1
                    continue
                at = plan.evals[k + 1][0] if k + 1 < len(plan.evals) else plan.samples
                heapq.heappush(events, (began + model.seconds(at), next(order), (i, handle, trial, plan, began, k + 1)))
            else:  # it diverged after its last evaluation: told its objective, as our tuners are
                study.tell(handle, plan.objective)
                finish(trial, plan, now)
                free += 1
    run_confirmations(spec, model, trials, slots, 0.0)
    return trials


def _suggest(handle, name: str, param) -> Any:
    if isinstance(param, CategoricalParam):
        return handle.suggest_categorical(name, list(param.choices))
    if isinstance(param, FloatParam):
        return handle.suggest_float(name, param.low, param.high, log=param.log)
    return handle.suggest_int(name, param.low, param.high, log=param.log)


# ------------------------------------------------------------------------------------------------ Syne Tune
