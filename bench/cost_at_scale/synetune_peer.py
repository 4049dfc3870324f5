"""Syne Tune (ASHA, BOHB, TPE, CQR) on the same surrogate and simulated clock, with its simulator backend."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.cost_at_scale.common import EPOCH, SYNETUNE_TICK_S, SimTrial, TrialModel, finish, run_confirmations
from hpo.experiment.arms import ArmPlan, arm_plans, trial_config
from hpo.trials import TrialKind
from search_spaces.space import CategoricalParam, FloatParam


def synetune_available(tuner: str) -> str | None:
    """None when `tuner` can run here, else why not."""
    try:
        import syne_tune  # noqa: F401
    except ImportError:
        return "syne-tune is not installed (make bench-deps)"
    if tuner == "synetune_cqr":
        try:
            import xgboost  # noqa: F401
        except ImportError:
            return "Syne Tune's CQR imports xgboost, which is not installed (make bench-deps)"
    return None


def run_synetune(tuner: str, spec, model: TrialModel, seed: int, slots: int, directory: Path) -> list[SimTrial]:
    """Syne Tune's simulator backend over our surrogate, one scheduler per arm asked round-robin."""
    import numpy as np

    os.environ["SYNETUNE_FOLDER"] = str(directory / "synetune")
    from syne_tune import StoppingCriterion, Tuner
    from syne_tune.backend.simulator_backend.simulator_backend import SimulatorConfig
    from syne_tune.backend.simulator_backend.simulator_callback import SimulatorCallback
    from syne_tune.blackbox_repository.blackbox import Blackbox
    from syne_tune.blackbox_repository.simulated_tabular_backend import UserBlackboxBackend
    from syne_tune.config_space import choice, loguniform, uniform
    from syne_tune.optimizer import baselines
    from syne_tune.optimizer.scheduler import TrialScheduler

    logging.getLogger("syne_tune").setLevel(logging.ERROR)
    np.random.seed(seed)
    random.seed(seed)
    arms = arm_plans(spec)
    cfg = trial_config(spec, {**arms[0].fixed, **{n: _any_value(arms[0].space[n]) for n in arms[0].space.names}})
    n_evals = cfg.budget.max_samples // cfg.eval.every_samples
    train_seed = cfg.seed

    def domain(param):
        if isinstance(param, CategoricalParam):
            return choice(list(param.choices))
        if isinstance(param, FloatParam):
            return (loguniform if param.log else uniform)(param.low, param.high)
        raise NotImplementedError("integer parameters: not in the table's dimensions")

    def arm_space(arm: ArmPlan) -> dict[str, Any]:
        return {**{n: domain(arm.space[n]) for n in arm.space.names}, **arm.fixed}  # the arm's value: a constant

    names = sorted({n for arm in arms for n in [*arm.space.names, *arm.fixed]})

    class SurrogateBlackbox(Blackbox):
        """Our surrogate as a Syne Tune blackbox: per evaluation (fidelity 1..E) the objective so far, the
        simulated seconds since the trial started, and the samples; NaN after the trial's end."""

        def __init__(self):
            space = {n: choice([a.fixed[n] for a in arms]) if n in arms[0].fixed else domain(arms[0].space[n])
                     for n in names}  # fmt: skip
            super().__init__(space, {"evals": list(range(1, n_evals + 1))}, ["objective", "elapsed", "samples"])

        @property
        def fidelity_values(self):
            return np.arange(1, n_evals + 1)

        def _objective_function(self, configuration, fidelity=None, seed=None):
            params = {n: configuration[n] for n in names}
            plan = model.plan(params, seed)
            rows = np.full((n_evals, 3), np.nan)
            for k, (samples, _) in enumerate(plan.evals):
                best = max(a for _, a in plan.evals[: k + 1])
                value = plan.objective if samples >= plan.samples else model.partial_objective(params, best)
                rows[k] = (value, model.seconds(samples), samples)
            return rows

    class Backend(UserBlackboxBackend):
        """Each trial's reports end where our runner's trial ends (the target, its budget, or where it diverged:
        a last report at that point with its penalty), and its start and end on the simulated clock are kept."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.began: dict[int, float] = {}
            self.ended: dict[int, float] = {}
            self.last: dict[int, dict] = {}

        def config_objectives(self, config, seed):
            params = {n: config[n] for n in names}
            rows = self.blackbox.objective_function(params, seed=seed)
            results = [{"objective": float(o), "elapsed": float(e), "samples": int(s), "evals": k + 1}
                       for k, (o, e, s) in enumerate(rows) if not np.isnan(o)]  # fmt: skip
            plan = model.plan(params, seed)
            if plan.diverged:
                results.append({"objective": plan.objective, "elapsed": model.seconds(plan.samples),
                                "samples": plan.samples, "evals": max(len(results), 1)})  # fmt: skip
            return results

        def _advance_by_outside_time(self):
            pass  # simulated time is the table's alone (see the module docstring)

        def _process_start_event(self, trial_id, time_event, config=None):
            self.began[trial_id] = time_event
            super()._process_start_event(trial_id, time_event, config=config)

        def _process_complete_event(self, trial_id, time_event, status):
            self.ended.setdefault(trial_id, time_event)
            super()._process_complete_event(trial_id, time_event, status)

        def _process_stop_event(self, trial_id, time_event):
            self.ended.setdefault(trial_id, time_event)
            super()._process_stop_event(trial_id, time_event)

        def _process_on_trial_result_event(self, time_event, event):
            self.last[event.trial_id] = event.result
            super()._process_on_trial_result_event(time_event, event)

    def scheduler(arm: ArmPlan):
        space = arm_space(arm)
        if tuner == "synetune_asha":
            return baselines.ASHA(space, metric="objective", time_attr="evals", max_t=n_evals, random_seed=seed)
        if tuner == "synetune_bohb":  # ASHA's rungs with TPE's kernel densities proposing new configurations
            return baselines.BOHB(space, metric="objective", time_attr="evals", max_t=n_evals, random_seed=seed)
        if tuner == "synetune_tpe":
            return baselines.TPE(space, metric="objective", random_seed=seed)
        return baselines.CQR(space, metric="objective", random_seed=seed)

    class Arms(TrialScheduler):
        """The arms' schedulers asked round-robin (the arm with quota left that started the fewest trials), each
        told only its own trials; no suggestion once every quota is used, so the tuner waits for the last ones."""

        def __init__(self):
            super().__init__(random_seed=seed)
            self.inner = [scheduler(arm) for arm in arms]
            self.created = [0] * len(arms)

        def _of(self, trial) -> Any:
            return next(s for arm, s in zip(arms, self.inner, strict=True)
                        if all(trial.config.get(k) == v for k, v in arm.fixed.items()))  # fmt: skip

        def suggest(self):
            open_arms = [i for i, arm in enumerate(arms) if self.created[i] < arm.quota]
            if not open_arms:
                return None
            i = min(open_arms, key=lambda i: self.created[i])
            self.created[i] += 1
            suggestion = self.inner[i].suggest()
            if suggestion is not None:
                suggestion.config = {**suggestion.config, **arms[i].fixed}
            return suggestion

        def on_trial_add(self, trial):
            self._of(trial).on_trial_add(trial)

        def on_trial_error(self, trial):
            self._of(trial).on_trial_error(trial)

        def on_trial_result(self, trial, result):
            return self._of(trial).on_trial_result(trial, result)

        def on_trial_complete(self, trial, result):
            self._of(trial).on_trial_complete(trial, result)

        def on_trial_remove(self, trial):
            self._of(trial).on_trial_remove(trial)

        def metric_names(self):
            return ["objective"]

        def metric_mode(self):
            return "min"

        def metadata(self):
            return {"scheduler_name": f"{tuner} per arm"}

    backend = Backend(SurrogateBlackbox(), elapsed_time_attr="elapsed", seed=train_seed,
                      simulator_config=SimulatorConfig(0, 0, 0, 0, 0), tuner_sleep_time=SYNETUNE_TICK_S)  # fmt: skip
    tuner_run = Tuner(trial_backend=backend, scheduler=Arms(), n_workers=slots, sleep_time=0,
                      stop_criterion=StoppingCriterion(max_num_trials_started=spec.budget.trials + slots),
                      callbacks=[SimulatorCallback()], save_tuner=False, wait_trial_completion_when_stopping=True,
                      print_update_interval=1e12, results_update_interval=1e12, suffix_tuner_name=False,
                      tuner_name=f"st-{tuner.replace('_', '-')}-{seed}")  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        tuner_run.run()
    trials: list[SimTrial] = []
    for trial_id in sorted(backend.began):
        config = backend._trial_dict[trial_id].config
        params = {n: config[n] for n in names}
        label = next(arm.label for arm in arms if all(params.get(k) == v for k, v in arm.fixed.items()))
        plan = model.plan(params, train_seed)
        began, ended = backend.began[trial_id], backend.ended[trial_id]
        trial = SimTrial(len(trials), label, params, TrialKind.TUNING, EPOCH + timedelta(seconds=began),
                         EPOCH + timedelta(seconds=began))  # fmt: skip
        reported = int(backend.last.get(trial_id, {}).get("samples", 0))
        finish(trial, plan, ended, pruned_at=None if reported >= plan.samples else reported)
        trials.append(trial)
    run_confirmations(spec, model, trials, slots, 0.0)
    return trials


def _any_value(param) -> Any:
    return param.choices[0] if isinstance(param, CategoricalParam) else param.low


# ------------------------------------------------------------------------------------------------ one repetition
