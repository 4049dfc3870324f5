"""The shared model of a repetition: the experiment file, a simulated trial and its plan, the outcome row, and the
figures every peer is judged by."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from hpo.evidence.verdict import arm_runs, decide
from hpo.experiment.arms import arm_plans, trial_config
from hpo.objective import objective_value
from hpo.plan.forecast import first_hit  # shared with `hpo plan`
from hpo.runners.simulated import trained_run
from hpo.simulation.cost import Cost, experiment_cost
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import load_table
from hpo.trials import TrialKind, TrialState
from trainer.result import TrainResult, TrainStatus

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "hpo/simulation/tables/curves.jsonl"
OURS = ("random", "smac_bo", "smac_hyperband", "asha")
OPTUNA = ("optuna_tpe_median", "optuna_tpe_sh")
SYNETUNE = ("synetune_asha", "synetune_bohb", "synetune_tpe", "synetune_cqr")
TUNERS = OURS + OPTUNA + SYNETUNE
GPUS_PER_SLOT = 8
WARMUPS = [0, 40]
EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)  # simulated time 0 of the peers' runs
SYNETUNE_TICK_S = 1.0  # how often (simulated seconds) Syne Tune's tuner looks for ended trials


# ------------------------------------------------------------------------------------------------ the experiment
def trials_for(slots: int, per_slot: int = 2, minimum: int = 20) -> int:
    """Tuning trials (both arms) of an experiment on `slots` slots: max(minimum, per_slot x slots)."""
    return max(minimum, per_slot * slots)


def experiment(name: str, table: Path, tuner: str, rep: int, batch: int, lr: tuple[float, float] | None,
               slots: int, trials: int, confirm: int | str, compare: bool = True,
               cap: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The experiment file of one repetition: the table's dimensions on `slots` slots of 8 GPUs, at `batch` (its
    sample budget, evaluation interval and warmups there); `lr` None: each optimizer over its own grid range at
    `batch` (`--lr-from-table`, a large-batch table: `optimizer.lr@adamw`, `optimizer.lr@lamb`)."""
    from bench.verdict_calibration import arm_ranges, warmups

    loaded = load_table(table)
    meta = loaded.meta["fixed"]
    budget, every = loaded.max_samples_for(batch), loaded.eval_every_for(batch)
    ranges = arm_ranges(table, batch, lr)
    if ranges["adamw"] == ranges["lamb"]:
        rates: dict[str, Any] = {"optimizer.lr": {"float": list(ranges["adamw"]), "log": True}}
    else:
        if tuner in SYNETUNE:
            raise SystemExit(f"{tuner}: Syne Tune searches one space over both arms; with a learning-rate range per "
                             "optimizer (--lr-from-table) run our tuners or Optuna's")  # fmt: skip
        rates = {f"optimizer.lr@{o}": {"float": list(r), "log": True, "when": {"optimizer.name": o}}
                 for o, r in ranges.items()}  # fmt: skip
    space: dict[str, Any] = {
        "optimizer.name": {"choice": ["adamw", "lamb"]},
        **rates,
        "schedule.warmup_steps": {"choice": warmups(table, batch) if lr is None else WARMUPS},
    }
    return {
        "name": name,
        "base_config": str(ROOT / "trainer/configs/demo_cpu.yaml"),
        "overrides": {
            "seed": 1000 + rep,  # the training seed of the tuning trials; confirmations take the next ones
            "budget.max_samples": budget, "budget.max_time_s": None,
            "eval.every_samples": every, "eval.max_samples": meta.get("eval.max_samples", 512),
            "eval.target_mlm_accuracy": meta["eval.target_mlm_accuracy"],
            "batch.global_batch_size": batch, "batch.micro_batch_size": max(1, batch // GPUS_PER_SLOT),
        },
        "space": space,
        "compare": ["optimizer.name"] if compare else [],
        "tuner": {"name": tuner if tuner in OURS else "random", "seed": rep},
        "budget": {"trials": trials, "confirm_seeds": confirm, "max_parallel": slots,
                   **({"max_confirm_seeds": cap} if cap and confirm == "auto" else {}),
                   # Hyperband's smallest trial must reach the first evaluation (1/9 of 12,288 samples does)
                   **({"min_budget": max(1 / 9, every / budget)}
                      if tuner == "smac_hyperband" else {})},
        "resources": {"gpus_per_trial": GPUS_PER_SLOT},
        "runner": {"name": "simulated", "simulation": {"table": str(table), "gpu": "a100"}},
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------ the figures
@dataclass
class SimTrial:
    """A peer's trial, with the attributes of a stored trial that the cost and verdict functions read. `state` None:
    stopped by the peer's scheduler (pruned)."""

    number: int
    arm: str | None
    params: dict[str, Any]
    kind: TrialKind
    created_at: datetime
    started_at: datetime
    finished_at: datetime | None = None
    state: TrialState | None = None
    objective: float | None = None
    samples_to_target: int | None = None
    samples: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)


def best_per_arm(trials) -> dict[str | None, Any]:
    """Each arm's best tuning trial as the storage picks it: the lowest objective among COMPLETED tuning trials,
    ties to the lowest number."""
    best: dict[str | None, Any] = {}
    for t in sorted(trials, key=lambda t: t.number):
        rival = t.kind is TrialKind.TUNING and t.state is TrialState.COMPLETED and t.objective is not None
        if rival and (t.arm not in best or t.objective < best[t.arm].objective):
            best[t.arm] = t
    return best


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float, bool]:
    """(median, low, high, exact): the median and its distribution-free `level` interval from order statistics,
    the j-th and (n + 1 - j)-th smallest values with the largest j whose coverage P(j <= B <= n - j),
    B ~ Binomial(n, 1/2), is at least `level`. exact False: n is too small for such an interval (n < 6 at 95 %)
    and (low, high) is the range."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("no values")
    median = statistics.median(ordered)  # infinite when a middle value is
    pmf = [math.comb(n, i) / 2**n for i in range(n + 1)]
    best = None
    for j in range(1, n // 2 + 1):  # 1-based rank of the lower bound
        if sum(pmf[j : n - j + 1]) >= level:
            best = j
    if best is None:
        return median, ordered[0], ordered[-1], False
    return median, ordered[best - 1], ordered[n - best], True


def outcome_row(trials, spec, slots: int, verdict=None) -> dict[str, Any]:
    """The figures of one repetition from its trials (stored ones, or a peer's SimTrials); `verdict`: the one `hpo`
    gave from its storage (ours), else the rule over the trials (peers: samples to target at evaluations)."""
    hit = first_hit(trials, GPUS_PER_SLOT)
    cost: Cost | None = experiment_cost(trials, slots, GPUS_PER_SLOT)
    verdict = verdict or decide(arm_runs(spec, best_per_arm(trials), trials), spec.verdict.margin)
    return {
        "first_hit_gpu_h": None if hit is None else hit[0],
        "first_hit_wall_h": None if hit is None else hit[1],
        "answer_gpu_h": cost.gpu_hours if cost else None,
        "answer_wall_h": cost.wall_hours if cost else None,
        "idle_fraction": cost.idle_fraction if cost else None,
        "winner": verdict.winner,
        "outcome": verdict.outcome.value,
        "trials": sum(t.kind is TrialKind.TUNING for t in trials),
        "confirmation_runs": sum(t.kind is TrialKind.CONFIRMATION for t in trials),
    }


# ------------------------------------------------------------------------------------------------ one trial
@dataclass(frozen=True)
class Plan:
    """What a trial of a configuration trains, as the simulated runner would run it (full budget)."""

    evals: tuple[tuple[int, float], ...]  # (samples, accuracy) of each evaluation it makes
    samples: int  # where it stops: at the target, where it diverged, or at its budget
    hit: int | None  # samples to target
    diverged: bool
    objective: float


class TrialModel:
    """The simulated runner's trial (hpo/runners/simulated.py) for the peers: the same trainer config
    (`hpo.experiment.arms.trial_config`), curve (the surrogate), stopping rule, objective and duration."""

    def __init__(self, spec):
        self.spec = spec
        simulation = spec.runner.simulation
        self.surrogate = Surrogate(load_table(simulation.table))
        self.slot_samples_per_s = simulation.gpu_samples_per_s * spec.resources.gpus_per_trial
        self.sample_scale = simulation.sample_scale
        self._plans: dict[tuple, Plan] = {}
        self._configs: dict[tuple, Any] = {}

    def config(self, params: dict[str, Any]):
        """The trainer config of a trial with these parameters (`hpo.experiment.arms.trial_config`, cached)."""
        key = tuple(sorted(params.items()))
        if key not in self._configs:
            self._configs[key] = trial_config(self.spec, params)
        return self._configs[key]

    def seconds(self, samples: float) -> float:
        return max(samples, 0) * self.sample_scale / self.slot_samples_per_s

    def plan(self, params: dict[str, Any], seed: int | None = None) -> Plan:
        """The trial of `params` with training seed `seed` (None: the config's)."""
        key = (tuple(sorted(params.items())), seed)
        if key not in self._plans:
            cfg = self.config(params)
            seed = cfg.seed if seed is None else seed
            curve = self.surrogate.curve(Config(cfg.optimizer.name, cfg.optimizer.lr, cfg.schedule.warmup_steps,
                                                cfg.batch.global_batch_size, seed))  # fmt: skip
            run = trained_run(curve, cfg)  # as the simulated runner trains it
            evals, samples, diverged = run.evals, run.samples, run.diverged
            hit = next((s for s, a in evals if a >= cfg.eval.target_mlm_accuracy), None)
            status = (TrainStatus.DIVERGED if diverged else
                      TrainStatus.REACHED_TARGET if hit is not None else TrainStatus.BUDGET_EXHAUSTED)  # fmt: skip
            best = max((a for _, a in evals), default=None)
            objective = objective_value(self.spec, TrainResult(status, samples_to_target=hit, best_mlm_accuracy=best),
                                        cfg)  # fmt: skip
            self._plans[key] = Plan(tuple(evals), samples, hit, diverged, objective)
        return self._plans[key]

    def partial_objective(self, params: dict[str, Any], best_accuracy: float | None) -> float:
        """The objective of a run stopped now, with this best accuracy: the experiment's penalty for a miss."""
        result = TrainResult(TrainStatus.BUDGET_EXHAUSTED, best_mlm_accuracy=best_accuracy)
        return objective_value(self.spec, result, self.config(params))


def finish(trial: SimTrial, plan: Plan, at_s: float, pruned_at: int | None = None) -> None:
    """Close a peer's trial: as planned, or stopped by its scheduler after `pruned_at` samples."""
    trial.finished_at = EPOCH + timedelta(seconds=at_s)
    if pruned_at is not None:
        trial.state, trial.samples = None, pruned_at
        return
    trial.state = TrialState.DIVERGED if plan.diverged else TrialState.COMPLETED
    trial.objective, trial.samples_to_target, trial.samples = plan.objective, plan.hit, plan.samples


def run_confirmations(spec, model: TrialModel, trials: list[SimTrial], slots: int, start_s: float) -> None:
    """The Study's confirmation runs: `confirm_seeds` runs of each arm's best configuration with the training seeds
    after the config's, queued as soon as that arm's tuning trials have all ended (arm by arm, as the Study queues
    them), each started at the first moment a slot is free for its whole run. The peers' tuning trials keep the
    times they had: a confirmation fills capacity they leave and never delays one (the Study starts it at the
    first free slot, which may delay another arm's later tuning trial instead: the two schedules can differ
    slightly when one arm ends long before the other). `start_s`: nothing starts before it."""
    best = best_per_arm(trials)
    busy = [((t.started_at - EPOCH).total_seconds(), (t.finished_at - EPOCH).total_seconds())
            for t in trials if t.started_at is not None and t.finished_at is not None]  # fmt: skip
    queued = []
    for index, arm in enumerate(arm_plans(spec)):
        top = best.get(arm.label)
        if top is None:
            continue
        ends = [(t.finished_at - EPOCH).total_seconds() for t in trials
                if t.arm == arm.label and t.kind is TrialKind.TUNING and t.finished_at is not None]  # fmt: skip
        over = max(ends, default=start_s)
        seed = trial_config(spec, top.params).seed
        queued += [(over, index, k, arm, top, seed + 1 + k) for k in range(spec.budget.confirm_seeds)]
    for over, _, _, arm, top, seed in sorted(queued, key=lambda q: q[:3]):
        plan = model.plan(top.params, seed)
        duration = model.seconds(plan.samples)
        begin = first_free(busy, slots, max(over, start_s), duration)
        trial = SimTrial(len(trials), arm.label, dict(top.params), TrialKind.CONFIRMATION,
                         EPOCH + timedelta(seconds=over), EPOCH + timedelta(seconds=begin))  # fmt: skip
        finish(trial, plan, begin + duration)
        busy.append((begin, begin + duration))
        trials.append(trial)


def first_free(busy: list[tuple[float, float]], slots: int, earliest: float, duration: float) -> float:
    """The first moment at or after `earliest` from which fewer than `slots` of the `busy` (start, end) intervals
    overlap, for `duration` seconds."""
    candidates = sorted({earliest, *(end for _, end in busy if end > earliest)})
    for t in candidates:
        moments = [t, *(start for start, _ in busy if t < start < t + duration)]
        if all(sum(start <= m < end for start, end in busy) < slots for m in moments):
            return t
    return max(earliest, *(end for _, end in busy))


# ------------------------------------------------------------------------------------------------ ours
