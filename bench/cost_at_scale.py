"""Cost to an answer at scale: simulated GPU-hours and wall-clock of an ADAM-vs-LAMB answer on 8, 64 and 1,024 slots.

On the simulated cluster (`runner: simulated` over the learning-curve table, hpo/simulation/tables/curves.jsonl; a
slot is
8 A100s, one table sample stands for 256 BERT-large samples: the runner's duration model, a conversion and not a
GPU measurement), one `adam_vs_lamb_simulated`-style experiment per repetition:

- the space is the table's dimensions (optimizer: the compared arms; log learning rate over `--lr`; warmup 0 or
  40), at global batch `--batch`;
- trials scale with the cluster: trials = max(`--min-trials`, `--trials-per-slot` x slots) = max(20, 2 x slots),
  split equally over the two arms (two waves of trials on a full cluster), then `--confirm` (2) confirmation
  runs of each arm's best configuration;
- repetition r: tuner seed r, training seed 1000 + r for the tuning trials (as bench/verdict_calibration.py),
  1001 + r, 1002 + r for the confirmations.

Tuners. Ours, through the real control plane (`hpo run` in-process: Study, tuners, SQLite storage in /dev/shm,
verdict): `random`, `smac_bo`, `smac_hyperband` and `asha` (its defaults: eta 3, rungs 1,024, 4,096 and 12,288
samples, new configurations from SMAC3's random forest); under the multi-fidelity tuners promoted configurations
continue from their checkpoint: only new samples are charged. Peers, on the same surrogate, the same duration
model, the same arms, budgets and training seeds, the same rule for the best configuration (lowest objective
among completed tuning trials, ties to the earliest) and the same confirmation runs and verdict rule
(`hpo.evidence.verdict`):

- `optuna_tpe_median`, `optuna_tpe_sh`: Optuna's TPE sampler (seeded with the tuner seed, defaults otherwise)
  with its MedianPruner (defaults) / SuccessiveHalvingPruner (reduction factor 3 from the first evaluation, as
  Syne Tune's ASHA: rungs at 1,024, 3,072 and 9,216 samples), one study per arm, asked round-robin as our Study
  asks its arms' controllers, driven through ask/tell by a discrete-event clock of N slots here. Each evaluation
  is reported as an intermediate value (the objective the trial would score if it stopped there: the
  experiment's miss penalty from its best accuracy so far) and the pruner is asked; a pruned trial stops at that
  evaluation and is charged only the samples it trained (its slot is free from that moment).
- `synetune_asha`, `synetune_bohb`, `synetune_tpe`, `synetune_cqr`: Syne Tune 0.16's own simulator backend
  (`UserBlackboxBackend` + `SimulatorCallback`, N workers) over a user blackbox backed by our surrogate; ASHA
  (stopping type, grace period one evaluation, reduction factor 3, rungs in evaluations), BOHB (the same ASHA
  with TPE's kernel densities proposing new configurations: Syne Tune 0.16's model-based multi-fidelity
  baseline; MOBSTER and Hyper-Tune are gone from 0.16), and two of its single-fidelity model-based baselines:
  TPE (its kernel-density BO) and CQR (conformal quantile regression, gradient-boosted
  trees; its import needs xgboost). One scheduler per arm behind a scheduler that asks them round-robin with the
  same quotas. Syne Tune 0.16 no longer has its Gaussian-process `BayesianOptimization` (the GP baseline is
  `BOTorch`, which needs botorch and gpytorch: not installed here); BORE imports xgboost too. The runs end at the
  table's events: `_advance_by_outside_time` is switched off (Syne Tune would add this process's real seconds to
  the simulated clock; here every tuner's decision time is left out of simulated time and shown apart, as CPU
  seconds), start/stop/report delays are 0, and the tuner looks for ended trials every simulated second.
  Install: `make bench-deps` (pip `--no-deps`: syne-tune 0.16 requires xgboost, whose wheel requires a 350 MB
  NCCL wheel used only for multi-GPU training; ASHA, TPE and the simulator import without xgboost, CQR needs it).

Per tuner, slots and repetition (simulated time starts when the first trial is created):

- first hit (`hpo.plan.forecast.first_hit`, as `hpo plan`): the first trial, in simulated finishing time, that reached
the
  target (samples_to_target recorded): wall-clock = its end - the start; GPU-hours = the busy slot-time of every
  trial up to that moment (trials still running then count up to it) x 8 GPUs;
- answer (the verdict): the end of the experiment (the last confirmation run): GPU-hours, wall-clock, and the
  fraction of slot-time left idle (`hpo.simulation.cost`: slots x wall-clock - busy, over slots x wall-clock);
- the verdict (which arm wins, or no winner) and the CPU seconds this process spent on the repetition (ours: the
  control plane with its SQLite storage and the simulated runner's records; peers: the tuner and this file's
  simulation).

Summaries over `--seeds` repetitions: the median and its 95 % distribution-free interval from order statistics
(the j-th and k-th smallest values with P(j <= B < k) >= 0.95, B ~ Binomial(n, 1/2); it needs n >= 6, below
that the range is shown). A repetition without any hit counts as infinitely late.

Controller CPU (`--cpu-trials`): our study loop alone on the simulated runner (one arm over the whole space,
`--cpu-slots` 64 slots, so that results come back while the history grows; no confirmations), for `random` and
`smac_bo` at 100, 1,000 and 10,000 trials: process CPU per trial of the loop without the simulated runner's own
work (on a real cluster the trials write their records), and the tuner's ask + tell CPU per decision over the last
tenth of the trials (at that history), and that cost over each tenth of the asks (the trend). A run is stopped
after `--cpu-limit-s` CPU seconds (at the loop's next turn; the trials it reached are reported), and larger sizes
are then skipped. 1,024 slots of 10-minute trials need about 1.7 decisions a second; the cost table's CPU column
shows what whole experiments took with 1,024 trials in flight.

The runs use a copy of the table without its training-loss and noise-scale series (`--full-records` keeps them):
the simulated runner writes every point of them as a record, which is most of its time and changes no duration,
objective or decision.

Run time (process CPU per repetition on the 2-core Xeon, measured on the test suite's synthetic table and a
partial real one): at 8 and 64 slots at most 3 and 10 s (smac_bo), most tuners well under a second; at 1,024 slots
(2,048 trials) random 13-18 s, Optuna about 9 s, Syne Tune 3-16 s, smac_hyperband about 520 s and smac_bo about
1,240 s (SMAC's ask with a thousand trials in flight and a growing history). 50 seeds of everything would take
about a day; `--seed-cap` gives SMAC fewer repetitions at 1,024 slots (the table's n column says how many), and
`--jobs` runs repetitions in parallel processes (the figures do not depend on it).

    python -m bench.cost_at_scale --jobs 2 --seed-cap smac_bo@1024=6 --seed-cap smac_hyperband@1024=10

`--rows FILE` appends each repetition's row to FILE as it ends and skips, on a later run with the same set-up,
the repetitions FILE already holds: a run stopped half-way goes on where it stopped, and more tuners or seeds can
be added to the same table later (the CPU column then mixes runs: say so where it is quoted).
    python -m bench.cost_at_scale --seeds 3 --slots 8 64 --table T   # a quick look (T: a smaller table)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import hashlib
import heapq
import io
import itertools
import json
import logging
import math
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from hpo.evidence.confirmations import stored_verdict
from hpo.evidence.verdict import arm_runs, decide
from hpo.experiment.arms import ArmPlan, arm_plans, trial_config
from hpo.objective import objective_value
from hpo.plan.forecast import first_hit, without_progress_series  # shared with `hpo plan`
from hpo.runners.simulated import trained_run
from hpo.simulation.cost import Cost, experiment_cost
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import load_table
from hpo.trials import TrialKind, TrialState
from search_spaces.space import CategoricalParam, FloatParam
from trainer.result import TrainResult, TrainStatus

ROOT = Path(__file__).resolve().parents[1]
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
def run_ours(tuner: str, slots: int, rep: int, args, directory: Path) -> list[Any]:
    """One repetition through `hpo run` (in this process); its stored trials and spec."""
    from bench.verdict_calibration import run_quietly
    from hpo.experiment import spec_from_stored
    from hpo.storage import SqlStorage

    name = f"{tuner}-{slots}-{rep}"
    data = experiment(
        name,
        args.run_table,
        tuner,
        rep,
        args.batch,
        args.lr,
        slots,
        trials_for(slots, args.trials_per_slot, args.min_trials),
        args.confirm,
        cap=args.cap,
    )
    url = f"sqlite:///{directory / f'{name}.db'}"
    run_quietly(name, data, directory, url)
    with SqlStorage(url) as storage:
        record = storage.get_experiment_by_name(name)
        trials, spec = storage.list_trials(record.id), spec_from_stored(record)
        verdict = stored_verdict(storage, record.id, spec)
    for suffix in ("", "-wal", "-shm"):
        (directory / f"{name}.db{suffix}").unlink(missing_ok=True)
    return [trials, spec, verdict]


# ------------------------------------------------------------------------------------------------ Optuna
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
def repetition(tuner: str, slots: int, rep: int, args) -> dict[str, Any]:
    """Run one repetition of `tuner` on `slots` slots; its figures."""
    cpu = time.process_time()
    with tempfile.TemporaryDirectory(prefix=f"cost-{tuner}-", dir=args.scratch) as tmp:
        directory = Path(tmp)
        verdict = None
        if tuner in OURS:
            trials, spec, verdict = run_ours(tuner, slots, rep, args, directory)
        else:
            data = experiment(f"{tuner}-{slots}-{rep}", args.run_table, tuner, rep, args.batch, args.lr, slots,
                              trials_for(slots, args.trials_per_slot, args.min_trials), args.confirm)  # fmt: skip
            from hpo.experiment import experiment_from_dict

            spec = experiment_from_dict(data, data["name"], base_dir=directory)
            model = TrialModel(spec)
            if tuner in OPTUNA:
                trials = run_optuna(tuner, spec, model, rep, slots)
            else:
                trials = run_synetune(tuner, spec, model, rep, slots, directory)
    row = {"tuner": tuner, "slots": slots, "seed": rep, **outcome_row(trials, spec, slots, verdict)}
    row["cpu_s"] = time.process_time() - cpu
    return row


def _confirm(value: str) -> int | str:
    return value if value == "auto" else int(value)


def _repetition(task: tuple[str, int, int, Any]) -> dict[str, Any]:
    return repetition(*task)


def run_setup(args) -> dict[str, Any]:
    """What a repetition's figures depend on besides (tuner, slots, seed): rows of another set-up are not reused."""
    return {"table_sha256": hashlib.sha256(args.table.read_bytes()).hexdigest()[:16], "batch": args.batch,
            "lr": "table" if args.lr is None else list(args.lr), "trials_per_slot": args.trials_per_slot,
            "min_trials": args.min_trials, "confirm": args.confirm, "full_records": args.full_records,
            **({"cap": args.cap} if args.confirm == "auto" else {})}  # fmt: skip


def read_rows(path: Path, setup: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an earlier run of the same set-up in `path` (none if it does not exist); a line of another
    set-up is left alone, a line that is not JSON stops with its line number."""
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(
                f"{path}:{number}: not a JSON line ({e}); delete the line to run that repetition again"
            ) from None
        if row.pop("setup", None) == setup:
            rows.append(row)
    return rows


# ------------------------------------------------------------------------------------------------ controller CPU
class _Timed:
    """A controller whose ask and tell are timed (process CPU), per trial in the order asked; `on_ask` is called
    before each ask (the CPU limit)."""

    def __init__(self, inner, log: list[float], on_ask):
        self.inner, self.log, self.on_ask, self.handles = inner, log, on_ask, {}

    def ask(self):
        self.on_ask()
        begin = time.process_time()
        suggestion = self.inner.ask()
        self.handles[id(suggestion)] = len(self.log)
        self.log.append(time.process_time() - begin)
        return suggestion

    def tell(self, suggestion, cost):
        begin = time.process_time()
        self.inner.tell(suggestion, cost)
        index = self.handles.pop(id(suggestion), None)
        if index is not None:
            self.log[index] += time.process_time() - begin

    def replay(self, params, budget, cost):
        self.inner.replay(params, budget, cost)


class _TimedRunner:
    """The simulated runner with the CPU of its submit and poll (the trials' own work) summed."""

    def __init__(self, inner):
        self.inner, self.cpu_s = inner, 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def submit(self, launch):
        begin = time.process_time()
        try:
            return self.inner.submit(launch)
        finally:
            self.cpu_s += time.process_time() - begin

    def poll(self):
        begin = time.process_time()
        try:
            return self.inner.poll()
        finally:
            self.cpu_s += time.process_time() - begin


def controller_cpu(tuner: str, trials: int, args, directory: Path) -> dict[str, Any]:
    """Our study loop alone on the simulated runner, one arm over the whole space: CPU per trial and per decision
    as the history grows (see the module docstring); stopped after `args.cpu_limit_s` CPU seconds."""
    from hpo.engine.study import Study
    from hpo.experiment import experiment_from_dict, stored_form
    from hpo.runners import build_runner
    from hpo.storage import SqlStorage

    name, slots = f"cpu-{tuner}-{trials}", args.cpu_slots
    data = experiment(name, args.run_table, tuner, 0, args.batch, args.lr, slots, trials, 0, compare=False)
    spec = experiment_from_dict(data, name, base_dir=directory)
    url = f"sqlite:///{directory / f'{name}.db'}"
    storage = SqlStorage(url, upgrade=True)
    run_dir = directory / name
    eid = storage.create_experiment(spec.name, stored_form(spec, run_dir), spec.direction)
    runner = _TimedRunner(build_runner(spec))
    runner.attach(storage, eid)
    study = Study(spec, storage, eid, run_dir, runner, url)
    decisions: list[float] = []
    wall, cpu = time.perf_counter(), time.process_time()

    def limit() -> None:  # the study stops at its loop's next turn (the asks of this turn still run)
        if study.stop_reason is None and time.process_time() - cpu > args.cpu_limit_s:
            study.stop_reason = "the benchmark's CPU limit"

    for arm in study.arms:
        arm.controller = _Timed(arm.controller, decisions, limit)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        study.run()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done = storage.count_trials(eid, state=TrialState.COMPLETED) + storage.count_trials(eid, state=TrialState.DIVERGED)
    storage.close()
    last = decisions[len(decisions) - max(1, len(decisions) // 10) :]
    per_decision = statistics.fmean(last) if last else None
    tenth = max(1, len(decisions) // 10)  # the trend: mean ms per decision over each tenth of the asks
    trend = [(min(i + tenth, len(decisions)), 1000 * statistics.fmean(decisions[i : i + tenth]))
             for i in range(0, len(decisions), tenth)]  # fmt: skip
    return {
        "tuner": tuner, "trials": trials, "slots": slots, "asked": len(decisions), "finished": done,
        "stopped": len(decisions) < trials or done < trials, "wall_s": wall, "cpu_s": cpu,
        "runner_cpu_s": runner.cpu_s, "loop_ms_per_trial": 1000 * (cpu - runner.cpu_s) / max(len(decisions), 1),
        "tuner_ms_per_decision_last_tenth": None if per_decision is None else 1000 * per_decision,
        "decisions_per_cpu_s": None if not per_decision else 1 / per_decision, "trend_ms": trend,
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------ the tables
def cell(values: list[float | None], digits: int = 1, percent: bool = False) -> str:
    """`median [low-high]` over the repetitions (None counts as infinite); `*`: the range (n < 6)."""
    numbers = [math.inf if v is None else v for v in values]
    if not numbers:
        return "-"
    median, low, high, exact = median_interval(numbers)

    def fmt(v: float) -> str:
        if math.isinf(v):
            return "never"
        return f"{100 * v:.{digits}f} %" if percent else f"{v:,.{digits}f}"

    return f"{fmt(median)} [{fmt(low)}-{fmt(high)}]{'' if exact else '*'}"


def grouped(rows: list[dict[str, Any]]) -> list[tuple[int, str, list[dict[str, Any]]]]:
    """The repetitions by (slots, tuner), in table order."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["slots"], row["tuner"]), []).append(row)
    order = sorted(groups, key=lambda key: (key[0], TUNERS.index(key[1])))
    return [(slots, tuner, groups[(slots, tuner)]) for slots, tuner in order]


def verdicts(group: list[dict[str, Any]]) -> dict[str, int]:
    """How often each arm won (or 'none': no winner)."""
    counts: dict[str, int] = {}
    for row in group:
        key = (row["winner"] or "none").removeprefix("optimizer.name=")
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


FIGURES = ("first_hit_gpu_h", "first_hit_wall_h", "answer_gpu_h", "answer_wall_h", "idle_fraction", "cpu_s")


def summary_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (slots, tuner): n, hits, verdicts and every figure's median, low, high, exact (None: never, no hit)."""

    def figure(values: list[float | None]) -> dict[str, Any]:
        median, low, high, exact = median_interval([math.inf if v is None else v for v in values])
        finite = {k: None if math.isinf(v) else v for k, v in (("median", median), ("low", low), ("high", high))}
        return {**finite, "exact": exact}

    return [{"slots": slots, "tuner": tuner, "n": len(group), "trials": group[0]["trials"],
             "hits": sum(r["first_hit_wall_h"] is not None for r in group), "verdicts": verdicts(group),
             **{key: figure([r[key] for r in group]) for key in FIGURES}}
            for slots, tuner, group in grouped(rows)]  # fmt: skip


def print_cost_table(rows: list[dict[str, Any]]) -> None:
    print("| slots | tuner | n | trials | first hit: GPU-h | first hit: wall h | answer: GPU-h | answer: wall h | "
          "idle slot-time | verdict (of n) | CPU s / rep |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for slots, tuner, group in grouped(rows):
        hits = sum(r["first_hit_wall_h"] is not None for r in group)
        named = ", ".join(f"{k} {v}" for k, v in verdicts(group).items())
        print(f"| {slots:,} | {tuner} | {len(group)} | {group[0]['trials']:,} | "
              f"{cell([r['first_hit_gpu_h'] for r in group])} | {cell([r['first_hit_wall_h'] for r in group], 2)}"
              f"{'' if hits == len(group) else f' ({hits} hit)'} | {cell([r['answer_gpu_h'] for r in group])} | "
              f"{cell([r['answer_wall_h'] for r in group], 2)} | "
              f"{cell([r['idle_fraction'] for r in group], 1, True)} | {named} | "
              f"{cell([r['cpu_s'] for r in group])} |")  # fmt: skip


def print_cpu_table(rows: list[dict[str, Any]]) -> None:
    print("| tuner | trials | reached | slots | loop CPU ms / trial (without the runner) | tuner ask + tell CPU ms / "
          "decision (last tenth) | decisions / CPU s | CPU s | wall s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("skipped"):
            print(f"| {r['tuner']} | {r['trials']:,} | not run: {r['skipped']} | | | | | | |")
            continue
        per = r["tuner_ms_per_decision_last_tenth"]
        rate = r["decisions_per_cpu_s"]
        reached = f"{r['asked']:,}" + (" (CPU limit)" if r["stopped"] else "")
        print(f"| {r['tuner']} | {r['trials']:,} | {reached} | {r['slots']:,} | {r['loop_ms_per_trial']:.1f} | "
              f"{'-' if per is None else f'{per:.1f}'} | {'-' if rate is None else f'{rate:,.1f}'} | "
              f"{r['cpu_s']:.1f} | {r['wall_s']:.1f} |")  # fmt: skip
    for r in rows:
        if not r.get("skipped") and (r["tuner_ms_per_decision_last_tenth"] or 0) >= 1:
            trend = ", ".join(f"{n:,}: {ms:,.0f}" for n, ms in r["trend_ms"])
            print(f"\n{r['tuner']}, {r['trials']:,} trials: tuner CPU ms per decision by trials asked: {trend}")


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cost_at_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 64, 1024])
    parser.add_argument("--seeds", type=int, default=50, help="repetitions per tuner and slot count")
    parser.add_argument(
        "--seed-cap",
        action="append",
        default=[],
        metavar="TUNER@SLOTS=N",
        help="fewer repetitions for one tuner at one slot count (e.g. smac_bo@1024=10); repeatable",
    )
    parser.add_argument("--tuners", nargs="+", default=list(TUNERS), choices=TUNERS)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, nargs=2, default=(3.1623e-4, 0.1))
    parser.add_argument("--lr-from-table", action="store_true",
                        help="each optimizer over its own learning-rate range of the table at --batch (a large-batch "
                        "table: hpo/simulation/tables/large_batch.jsonl), instead of --lr for both")  # fmt: skip
    parser.add_argument("--trials-per-slot", type=int, default=2)
    parser.add_argument("--min-trials", type=int, default=20)
    parser.add_argument("--confirm", type=_confirm, default=2, help="confirmation seeds per arm, or auto (ours only)")
    parser.add_argument("--cap", type=int, default=None, help="max_confirm_seeds with --confirm auto (default 12)")
    parser.add_argument("--jobs", type=int, default=1, help="repetitions run in parallel processes")
    parser.add_argument("--full-records", action="store_true", help="keep the table's loss and noise-scale series")
    parser.add_argument(
        "--cpu-trials",
        type=int,
        nargs="*",
        default=[100, 1000, 10000],
        help="history sizes of the controller CPU measurement (none: skip it)",
    )
    parser.add_argument("--cpu-slots", type=int, default=64, help="slots of the controller CPU measurement")
    parser.add_argument("--cpu-tuners", nargs="+", default=["random", "smac_bo"], choices=OURS)
    parser.add_argument("--cpu-limit-s", type=float, default=180.0, help="CPU seconds per CPU measurement run")
    parser.add_argument("--json", type=Path, help="also write every row here")
    parser.add_argument(
        "--rows",
        type=Path,
        help="append each repetition's row to this JSON-lines file as it ends, and skip the repetitions it "
        "already holds for the same set-up (a run stopped half-way goes on where it stopped)",
    )
    args = parser.parse_args(argv)
    if args.lr_from_table:
        args.lr = None  # each optimizer over its own range of the table at --batch (`experiment`)
    if args.confirm == "auto" and set(args.tuners) - set(OURS):
        parser.error(f"--confirm auto runs through hpo's own study loop: --tuners {' '.join(OURS)} only")
    caps: dict[tuple[str, int], int] = {}
    for text in args.seed_cap:
        try:
            who, n = text.split("=")
            tuner, slots = who.split("@")
            caps[(tuner, int(slots))] = int(n)
        except ValueError:
            parser.error(f"--seed-cap {text!r}: expected TUNER@SLOTS=N, e.g. smac_bo@1024=10")
    args.scratch = "/dev/shm" if Path("/dev/shm").is_dir() else None  # SQLite's syncs cost nothing in memory
    started = time.perf_counter()
    tuners, skipped = [], []
    for tuner in args.tuners:
        why = synetune_available(tuner) if tuner in SYNETUNE else None
        (skipped.append(f"{tuner}: {why}") if why else tuners.append(tuner))
    with tempfile.TemporaryDirectory(prefix="cost-at-scale-", dir=args.scratch) as tmp:
        args.run_table = args.table if args.full_records else without_progress_series(args.table, Path(tmp) / "t.jsonl")
        setup = run_setup(args)
        rows = read_rows(args.rows, setup) if args.rows else []
        have = {(r["tuner"], r["slots"], r["seed"]) for r in rows}
        tasks = [(tuner, slots, rep, args) for slots in args.slots for tuner in tuners
                 for rep in range(min(args.seeds, caps.get((tuner, slots), args.seeds)))
                 if (tuner, slots, rep) not in have]  # fmt: skip
        tasks.sort(key=lambda t: (t[1], t[1] >= 1024 and t[0].startswith("smac")))  # SMAC at 1,024 slots last
        if have:
            print(f"  {len(rows)} repetitions read from {args.rows}; {len(tasks)} to run", file=sys.stderr)
        pool = concurrent.futures.ProcessPoolExecutor(args.jobs) if args.jobs > 1 else None
        results = (pool.submit(_repetition, t) for t in tasks) if pool else (_repetition(t) for t in tasks)
        if pool:
            results = concurrent.futures.as_completed(list(results))
        for done, result in enumerate(results, 1):
            row = result.result() if pool else result
            rows.append(row)
            if args.rows:
                with args.rows.open("a") as f:
                    f.write(json.dumps({"setup": setup, **row}, default=str) + "\n")
            if done % 10 == 0 or done == len(tasks):
                print(f"  {done}/{len(tasks)} repetitions ({time.perf_counter() - started:,.0f} s)", file=sys.stderr)
        if pool:
            pool.shutdown()
        rows = [r for r in rows if r["slots"] in args.slots and r["tuner"] in tuners]
        cpu_rows = []
        for tuner in args.cpu_tuners:
            limited = None
            for n in sorted(args.cpu_trials):
                if limited:
                    cpu_rows.append({"tuner": tuner, "trials": n, "skipped": limited})
                    continue
                row = controller_cpu(tuner, n, args, Path(tmp))
                cpu_rows.append(row)
                print(f"  controller CPU {tuner} {n}: {row['asked']} asked, {row['cpu_s']:.0f} s", file=sys.stderr)
                if row["stopped"]:
                    limited = f"{n:,} reached {row['asked']:,} in {args.cpu_limit_s:.0f} CPU s"
    meta = load_table(args.table).meta
    command = "python -m bench.cost_at_scale " + shlex.join(argv if argv is not None else sys.argv[1:])
    print(f"\n`{command.strip()}` on {cpu_model()} ({os.cpu_count()} CPUs), {time.perf_counter() - started:,.0f} s; "
          f"table {args.table} (data {str(meta.get('data_sha256', '?'))[:12]}), batch {args.batch}, lr "
          f"{'each optimizer its grid range' if args.lr is None else f'{args.lr[0]:g}-{args.lr[1]:g}'}, "
          f"trials = max({args.min_trials}, {args.trials_per_slot} x slots) over 2 "
          f"arms + {args.confirm} confirmation seeds per arm; slot = {GPUS_PER_SLOT} A100s.\n")  # fmt: skip
    for line in skipped:
        print(f"not run: {line}")
    print("Median [95 % interval of the median, order statistics; * = range, fewer than 6 repetitions] over the "
          "repetitions; simulated hours; 'first hit': until the first trial that reached the target ended; "
          "'answer': until the verdict (last confirmation run).\n")  # fmt: skip
    print_cost_table(rows)
    if cpu_rows:
        print(f"\nController CPU on the simulated runner (one arm over the whole space, {args.cpu_slots} slots, no "
              "confirmations); 1,024 slots of 10-minute trials need about 1.7 decisions a second.\n")  # fmt: skip
        print_cpu_table(cpu_rows)
    if args.json:
        args.json.write_text(json.dumps({"command": command, "cpu": cpu_model(), "rows": rows,
                                         "summary": summary_rows(rows), "controller_cpu": cpu_rows},
                                        indent=1, default=str))  # fmt: skip
    return 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") != "0":  # SMAC3/ConfigSpace iterate over sets of strings (hpo.cli.main.entry)
        os.execve(sys.executable, [sys.executable, "-m", "bench.cost_at_scale", *sys.argv[1:]],
                  {**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    sys.exit(main())
