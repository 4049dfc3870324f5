"""`hpo plan`'s verdict chances: how many confirmation runs per arm an answer needs, from a spread.

The verdict's chances from a spread (`--cv C --difference D`, or `--like PILOT`; `chances_forecast`): how many
confirmation runs per arm an answer needs, from evidence rather than the curve table. Each arm's confirmation runs
are drawn: ln samples to target ~ Normal(log_mean, log_sd), a miss (censored at the budget) with probability
1 - hit rate. A stated spread is log-normal at CV C in every arm (sigma² = ln(1 + C²)), the file's first arm at
(1 - D) x the others' geometric mean, every run a hit (as bench/verdict_power.py part 2 draws it). A pilot
(`pilot_evidence`, an experiment in the user's database, only read) gives each arm the mean and standard deviation
of ln samples to target of its best configuration's confirmation runs (plus its best tuning run when it has fewer
than 2), interpolated between evaluations as the verdict reads them, at least the verdict's floor of one evaluation
interval; its hit rate; and its difference, a miss counted at the sample budget as the verdict counts it, taken as
the truth (Welch's 95 % interval on those runs is printed beside it): an arm that misses the target in some runs
is not truly better for what it needs when it reaches it.
The runs are independent across arms (the service gives both arms the same seeds; on the seeds table that makes
answers a little likelier than drawn here). Every drawn experiment is asked of `hpo.evidence.verdict.decide` itself
as the service asks it: a fixed k at one look, or auto's rounds, look j of J, stopping at an answer or where more runs
would not decide (`confirmation_verdict`). It is judged as bench/verdict_power.py judges: right (the truly better
arm named; "equivalent" where every pair's true ratio lies within the margin), wrong winner, equivalent, not yet.
Each confirmation budget has its own generator seeded by (--seed, fixed or auto, its most runs per arm): the same
command prints the same numbers. `--power P` (`advise`) searches fixed k from 2 upwards to the first whose chance
of a right answer reaches P (at most 12), and auto at caps 6, 9 and 12, with each one's mean runs per arm.
`chances_forecast` computes them once; `chances_data` gives them as numbers (`hpo plan --json`'s `chances`) and
`chances_lines` prints them, made from those same numbers.

A batch-size study (`hpo.experiment.arms.batch_study`, two or more batch sizes) asks its question at each batch size:
its drawn experiments are asked of `hpo.evidence.verdict.batch_size_verdicts` as the service asks them (the error
shared over the declared batch sizes; auto's next round while the verdict at some batch size is "not yet" and more
runs may decide it), each batch size's verdict judged against the truth there, and a right answer of the study
(what `--power` counts) is the verdict right at every batch size (`batch_verdict_chances`). A stated spread has the
file's first optimizer (1 - D) x the others at every batch size.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hpo.evidence.confirmations import stored_curves
from hpo.evidence.verdict import (
    ArmRuns,
    Outcome,
    Verdict,
    arm_runs,
    batch_size_verdicts,
    compare,
    decide,
    samples_between_evaluations,
    t_quantile,
)
from hpo.experiment import Budget, spec_from_stored
from hpo.experiment.arms import (
    BATCH_KEY,
    OPTIMIZER_KEY,
    arm_label,
    arm_labels,
    arms,
    declared_batch_sizes,
    trial_config,
)
from hpo.plan.forecast import WIDTH, PlanError, share_interval
from hpo.plan.pilot_table import unfinished
from hpo.trials import TrialKind, TrialState
from search_spaces.space import trainer_key


@dataclass(frozen=True)
class ArmSpread:
    """How one arm's confirmation runs are drawn: ln samples to target ~ Normal(log_mean, log_sd), each run a miss
    (censored at max_samples, as the verdict counts one) with probability 1 - hit_rate."""

    label: str
    log_mean: float
    log_sd: float
    hit_rate: float = 1.0
    max_samples: int | None = None  # a miss's sample budget (None: every run reaches the target)
    resolution: float = 0.0  # the verdict's spread floor for such runs (hpo.evidence.verdict.ArmRuns.resolution)

    @property
    def counted_log_mean(self) -> float:
        """The mean ln samples to target of a run as the verdict counts it, a miss at its budget (it needed at
        least that many): hit_rate x log_mean + (1 - hit_rate) x ln max_samples. The truth compares arms by it, so
        an arm that misses the target is never truly better for what it reaches when it does."""
        if self.hit_rate >= 1 or self.max_samples is None:
            return self.log_mean
        return self.hit_rate * self.log_mean + (1 - self.hit_rate) * math.log(self.max_samples)

    @property
    def cv(self) -> float:
        """The coefficient of variation of samples to target under this log-normal law."""
        return math.sqrt(math.expm1(self.log_sd**2))


@dataclass(frozen=True)
class Evidence:
    """Every arm's spread, taken as the truth, and where it came from."""

    arms: tuple[ArmSpread, ...]
    source: tuple[str, ...]  # the lines that say so

    @property
    def better(self) -> str | None:
        """The truly better arm: the lowest geometric mean samples to target, a miss counted at its budget as the
        verdict counts it (`ArmSpread.counted_log_mean`; None: all arms tie exactly)."""
        best = min(self.arms, key=lambda a: a.counted_log_mean)
        return None if all(a.counted_log_mean == best.counted_log_mean for a in self.arms) else best.label

    def within(self, margin: float) -> bool:
        """The truth is "equivalent within ±margin": every pair's true ratio, in the verdict's order, lies inside
        (a miss counted at its budget)."""
        return all(1 - margin < math.exp(a.counted_log_mean - b.counted_log_mean) < 1 + margin
                   for i, a in enumerate(self.arms) for b in self.arms[i + 1 :])  # fmt: skip


@dataclass(frozen=True)
class Confirmations:
    """A confirmation budget: a fixed k (one look), or auto with a cap (a look after each round)."""

    k: int | None  # confirm_seeds: k; None: auto
    cap: int | None = None  # auto's max_confirm_seeds

    @property
    def rounds(self) -> tuple[int, ...]:
        budget = Budget(trials=2, confirm_seeds=self.k if self.k is not None else "auto", max_confirm_seeds=self.cap)
        return budget.confirmation_rounds

    def __str__(self) -> str:
        if self.k is not None:
            return f"confirm_seeds: {self.k}"
        return f"confirm_seeds: auto, max_confirm_seeds: {self.cap}"


@dataclass(frozen=True)
class Chances:
    """The verdict's outcomes over drawn experiments with one confirmation budget."""

    choice: Confirmations
    draws: int
    right_winner: int  # the truly better arm named
    wrong_winner: int  # another arm named (at a true tie: any arm)
    equivalent: int
    not_yet: int
    runs: int  # confirmation runs per arm used, summed over the draws
    within: bool  # the truth is within the margin: "equivalent" is a right answer

    @property
    def right(self) -> int:
        return self.right_winner + (self.equivalent if self.within else 0)

    @property
    def power(self) -> float:
        """The chance of a right answer."""
        return self.right / self.draws

    @property
    def wrong(self) -> int:
        """Wrong answers: another arm named, or "equivalent" where the truth is not within the margin."""
        return self.wrong_winner + (0 if self.within else self.equivalent)

    @property
    def runs_per_arm(self) -> float:
        return self.runs / self.draws


def file_confirmations(spec) -> Confirmations | None:
    """The file's confirmation budget (None: confirm_seeds 0, no verdict)."""
    budget = spec.budget
    if budget.sequential:
        return Confirmations(None, budget.most_confirm_seeds)
    return Confirmations(budget.confirm_seeds) if budget.confirm_seeds else None


def stated_evidence(labels: Sequence[str], cv: float, difference: float) -> Evidence:
    """Every arm log-normal at this coefficient of variation, the first arm's samples (1 - difference) x the others'
    (the ratio of geometric means, as bench/verdict_power.py states it), every run a hit."""
    if len(labels) < 2:
        raise PlanError("a stated spread needs an experiment with compare arms: the verdict compares arms")
    sigma = math.sqrt(math.log1p(cv * cv))
    base = math.log(STATED_SAMPLES) - sigma * sigma / 2
    arms = tuple(ArmSpread(label, base + (math.log1p(-difference) if i == 0 else 0.0), sigma)
                 for i, label in enumerate(labels))  # fmt: skip
    truth = ("the tie: every arm needs the same samples" if difference == 0 else
             f"{labels[0]} needs {difference:.1%} fewer samples than {' and '.join(labels[1:])}")  # fmt: skip
    return Evidence(arms, (f"a stated spread: samples to target log-normal with a CV of {cv:.1%} in every arm, every "
                           f"run reaching the target; the truth: {truth}",))  # fmt: skip


def batch_places(spec) -> dict[str, tuple[int, str]] | None:
    """Arm label -> (global batch size, optimizer) of a batch-size study of two or more optimizers at two or more
    batch sizes, whose question is the verdict at each batch size; None for another file (one verdict between its
    arms, as the service asks it of a study of one optimizer: `Evidence.deciding`)."""
    if not declared_batch_sizes(spec):  # not a batch-size study, or one optimizer: no verdict at each batch size
        return None
    places = {arm_label(fixed): (int(fixed[BATCH_KEY]), str(fixed[OPTIMIZER_KEY])) for fixed in arms(spec)}
    return places if len({batch for batch, _ in places.values()}) >= 2 else None


def stated_batch_evidence(places: Mapping[str, tuple[int, str]], cv: float, difference: float) -> Evidence:
    """A batch-size study's stated spread: every arm log-normal at this coefficient of variation, the first
    optimizer's samples (1 - difference) x the others' at every batch size (the verdict compares within a batch
    size only), every run a hit."""
    sigma = math.sqrt(math.log1p(cv * cv))
    base = math.log(STATED_SAMPLES) - sigma * sigma / 2
    optimizers = list(dict.fromkeys(optimizer for _, optimizer in places.values()))
    arms = tuple(ArmSpread(label, base + (math.log1p(-difference) if optimizer == optimizers[0] else 0.0), sigma)
                 for label, (_, optimizer) in places.items())  # fmt: skip
    truth = ("the tie: every optimizer needs the same samples" if difference == 0 else
             f"{optimizers[0]} needs {difference:.1%} fewer samples than {' and '.join(optimizers[1:])}")  # fmt: skip
    return Evidence(arms, (f"a stated spread: samples to target log-normal with a CV of {cv:.1%} in every arm, every "
                           f"run reaching the target; the truth at every batch size: {truth}",))  # fmt: skip


STATED_SAMPLES = 10_000  # a stated spread's slower arms' mean samples to target (the verdict is free of scale)
PILOT_CONFIDENCE = 0.95  # the pilot's difference is printed with its interval at this confidence


def pilot_evidence(storage, name: str, labels: Sequence[str],
                   places: Mapping[str, tuple[int, str]] | None = None) -> Evidence:  # fmt: skip
    """The spread of experiment `name` (read only): per arm, ln samples to target of its best configuration's
    confirmation runs, plus its best tuning run when it has fewer than 2, interpolated between evaluations as the
    verdict reads them; its hit rate; the floor of one evaluation interval where the verdict would apply it.
    `PilotError` when an arm has fewer than 2 runs that reached the target, or the arms are not the file's. With
    `places` (`batch_places`: a batch-size study), the truth is said at each batch size, between its optimizers."""
    record = storage.get_experiment_by_name(name)
    spec = spec_from_stored(record)
    pilot_labels = arm_labels(spec)
    if sorted(pilot_labels) != sorted(labels):
        raise PilotError(f"--like {name}: it compares {_names(pilot_labels)}, the file {_names(labels)}: a pilot "
                         "must have the file's arms (the same compare keys and values)")  # fmt: skip
    trials = storage.list_trials(record.id)
    best = storage.best_per_arm(record.id)
    runs = {r.label: r for r in arm_runs(spec, best, trials, stored_curves(storage, trials, best.values()))}
    arms, pilot_runs = [], {}
    why = unfinished(record)  # a pilot still running: its runs so far
    so_far = f", of the runs that ended so far (it has not finished; {why})" if why else ""
    lines = [f"the spread of experiment {name} in your database (read only){so_far}, taken as the truth:"]
    for label in labels:
        values, origin = _pilot_values(storage, spec, runs[label], best.get(label), trials)
        hits = [v for v in values if v is not None]
        if len(hits) < 2:
            raise PilotError(_too_little(name, label, len(values), len(hits), why))
        logs = [math.log(v) for v in hits]
        floor = (
            runs[label].resolution / math.sqrt(12) / math.exp(statistics.fmean(logs))
        )  # hpo.evidence.verdict's floor
        arm = ArmSpread(label, statistics.fmean(logs), max(statistics.stdev(logs), floor), len(hits) / len(values),
                        runs[label].max_samples, runs[label].resolution)  # fmt: skip
        arms.append(arm)
        pilot_runs[label] = ArmRuns(label, tuple(values), runs[label].max_samples, runs[label].resolution)
        lines.append(f"  {label}: {len(hits)} of {len(values)} {origin} reached the target; samples to target "
                     f"geometric mean {math.exp(arm.log_mean):,.0f}, CV {arm.cv:.1%} (sd of ln "
                     f"{arm.log_sd:.3f})")  # fmt: skip
    if places is None:
        return Evidence(tuple(arms), tuple(lines + _pilot_truth(arms, pilot_runs)))
    for batch in sorted({b for b, _ in places.values()}):
        here = [replace(a, label=places[a.label][1]) for a in arms if places[a.label][0] == batch]
        runs_here = {places[label][1]: replace(r, label=places[label][1]) for label, r in pilot_runs.items()
                     if places[label][0] == batch}  # fmt: skip
        lines += _pilot_truth(here, runs_here, f" at batch {batch:,}", notes=False)
    return Evidence(tuple(arms), tuple(lines + _pilot_notes(arms)))


def _pilot_truth(arms: Sequence[ArmSpread], runs: dict[str, ArmRuns], where: str = "", notes: bool = True
                 ) -> list[str]:  # fmt: skip
    """The pilot's difference, taken as the truth, with its own 95 % interval: how sure it is. Both count a miss at
    its budget, as the verdict does (`ArmSpread.counted_log_mean`: an arm that misses needed at least that many):
    the interval is Welch's on ln samples of the pilot's runs (hpo.evidence.verdict.compare at the 5 % level, with
    the verdict's floor of one evaluation interval). `where`: ` at batch 128`; `notes`: the notes after it."""
    top = min(arms, key=lambda a: a.counted_log_mean)
    rest = [a for a in arms if a.counted_log_mean != top.counted_log_mean]
    if not rest:
        return [f"  the truth{where}: the arms tie exactly"]
    parts = []
    for arm in rest:
        c = compare(runs[top.label], runs[arm.label], 1 - PILOT_CONFIDENCE)
        parts.append(f"{-math.expm1(top.counted_log_mean - arm.counted_log_mean):.1%} fewer than {arm.label} (the "
                     f"pilot's 95 % interval: {_fewer(1 - c.high)} to {_fewer(1 - c.low)})")  # fmt: skip
    lines = [f"  the truth{where}: {top.label} needs {'; '.join(parts)}"]
    return lines + (_pilot_notes(arms) if notes else [])


def _fewer(share: float) -> str:
    """A share fewer samples in words: `12.5% fewer`, and a negative one as what it is, `113.3% more`."""
    return f"{share:.1%} fewer" if share >= 0 else f"{-share:.1%} more"


def _pilot_notes(arms: Sequence[ArmSpread]) -> list[str]:
    """What the pilot's truth assumes: how a miss counts (where an arm missed), and that it is an estimate."""
    missed = ["  (a miss counts at the sample budget, as the verdict counts it: that arm needed at least that many)"]
    return (missed if any(a.hit_rate < 1 for a in arms) else []) + [
        "  (the chances below hold where the truth is the pilot's estimate; a short pilot's is uncertain)"
    ]


class PilotError(PlanError):
    """An experiment `--like` cannot take a spread from (too few runs that reached the target, other arms)."""


def _pilot_values(storage, spec, runs: ArmRuns, top, trials) -> tuple[list[float | None], str]:
    """An arm's runs: its confirmation runs; when there are fewer than 2, its best tuning run too (a miss counts as
    one), with the tuning runs of the same configuration with other training seeds (a grid pilot over `seed`)."""
    values = list(runs.samples_to_target)
    if len(values) >= 2 or top is None or top.state is not TrialState.COMPLETED:
        return values, "confirmation runs"
    seeded = _without_seed(top.params) != top.params  # the training seed is a tuned parameter (a grid pilot)
    same = [t for t in trials if seeded and t.id != top.id and t.kind is TrialKind.TUNING and t.budget >= 1.0
            and t.state.finished and _without_seed(t.params) == _without_seed(top.params)]  # fmt: skip
    target = trial_config(spec, top.params).eval.target_mlm_accuracy
    for trial in [top, *same]:
        if trial.state is not TrialState.COMPLETED or trial.samples_to_target is None:
            values.append(None)  # a miss of the configuration: counts in its hit rate
            continue
        curve = [(m.samples, m.value) for m in storage.get_metrics(trial.id, "mlm_accuracy") if m.samples is not None]
        values.append(samples_between_evaluations(curve, target, trial.samples_to_target))
    origin = f"runs (its best tuning run{' and its other seeds' if same else ''} too)"
    return values, origin


def _without_seed(params: dict) -> dict:
    return {k: v for k, v in params.items() if trainer_key(k) != "seed"}


def _too_little(name: str, label: str, runs: int, hits: int, why: str | None = None) -> str:
    """`why`: what to do about a pilot that has not finished (`hpo.plan.pilot_table.unfinished`)."""
    then = "Run the pilot with `budget.confirm_seeds: 3` or more"
    if why:
        then = f"Experiment {name} has not finished: {why}"
    elif runs >= 2:  # it had the runs, and they missed: more of them would miss too
        then = ("Its runs missed the target: run the pilot where this arm reaches it (a larger budget.max_samples, "
                "other learning rates)")  # fmt: skip
    return (f"--like {name}: too little evidence for a spread: in arm {label}, {hits} of {runs} run(s) reached the "
            "target (its best configuration's confirmation runs, and its best tuning run when there are fewer "
            f"than 2); a spread needs at least 2 per arm. {then}; or state a spread with --cv and "
            "--difference")  # fmt: skip


def _names(labels: Sequence[str]) -> str:
    return " and ".join(labels) if labels else "no arms"


def confirmation_verdict(arms: Sequence[ArmRuns], rounds: Sequence[int], margin: float) -> tuple[Verdict, int]:
    """The verdict the service reaches over these runs (each arm's runs in the order they would finish): look j
    of J over the first rounds[j - 1] runs, stopping at an answer or where more runs would not decide (the rule of
    `hpo.evidence.confirmations.runs_to_queue`); (that verdict, the runs per arm it used)."""
    for look, n in enumerate(rounds, 1):
        verdict = decide([replace(a, samples_to_target=a.samples_to_target[:n]) for a in arms], margin, look,
                         len(rounds))  # fmt: skip
        if verdict.outcome is not Outcome.NOT_YET or verdict.runs_needed is None:
            return verdict, n
    return verdict, rounds[-1]


def verdict_chances(evidence: Evidence, margin: float, choice: Confirmations, draws: int, seed: int = 0) -> Chances:
    """The verdict's outcomes over `draws` experiments whose confirmation runs are drawn from `evidence`, each
    asked of `hpo.evidence.verdict.decide` as the service asks it under `choice`. Seeded by (seed, choice): the same
    arguments give the same counts."""
    rounds = choice.rounds
    rng = np.random.default_rng([seed, 0 if choice.k is not None else 1, rounds[-1]])
    columns = [_draw_runs(rng, arm, draws, rounds[-1]) for arm in evidence.arms]
    better, counts, runs = evidence.better, dict.fromkeys(("right", "wrong", "equivalent", "not yet"), 0), 0
    for d in range(draws):
        arms = [ArmRuns(a.label, column[d], a.max_samples, a.resolution)
                for a, column in zip(evidence.arms, columns, strict=True)]  # fmt: skip
        verdict, used = confirmation_verdict(arms, rounds, margin)
        runs += used
        if verdict.outcome is Outcome.WINNER:
            counts["right" if verdict.winner == better else "wrong"] += 1
        else:
            counts[verdict.outcome.value] += 1
    t_quantile.cache_clear()  # continuous degrees of freedom rarely repeat: do not keep thousands of quantiles
    return Chances(choice, draws, counts["right"], counts["wrong"], counts["equivalent"], counts["not yet"], runs,
                   evidence.within(margin))  # fmt: skip


@dataclass(frozen=True)
class BatchChances:
    """A batch-size study's verdicts at each batch size over drawn experiments with one confirmation budget."""

    at: dict[int, Chances]  # batch size -> the outcomes of the verdict there, judged against the truth there
    # the study's answer: right_winner counts the draws right at every batch size, wrong_winner those wrong at some
    # (a wrong winner, or "equivalent" where the truth is not within the margin), not_yet the rest
    every: Chances
    truths: dict[int, Evidence]  # batch size -> the spreads of the optimizers there (labelled by optimizer)


def batch_confirmation_verdicts(runs: Sequence[tuple[int, str, ArmRuns]], rounds: Sequence[int], margin: float,
                                declared: Sequence[int]) -> tuple[dict[int, Verdict], int]:  # fmt: skip
    """The verdicts at each batch size the service reaches over these runs ((batch size, optimizer, runs in the
    order they would finish)): look j of J over the first rounds[j - 1] runs, stopping when no verdict is "not yet"
    where more runs may decide (`hpo.evidence.confirmations.runs_to_queue` over `Evidence.deciding`); (those
    verdicts, the runs per arm they used)."""
    for look, n in enumerate(rounds, 1):
        cut = ((b, o, replace(r, samples_to_target=r.samples_to_target[:n])) for b, o, r in runs)
        verdicts = batch_size_verdicts(cut, margin, look, len(rounds), declared)
        if not any(v.outcome is Outcome.NOT_YET and v.runs_needed is not None for v in verdicts.values()):
            return verdicts, n
    return verdicts, rounds[-1]


def batch_verdict_chances(evidence: Evidence, places: Mapping[str, tuple[int, str]], margin: float,
                          choice: Confirmations, draws: int, seed: int = 0) -> BatchChances:  # fmt: skip
    """`verdict_chances` of a batch-size study (`places`: `batch_places`): each drawn experiment asked at every batch
    size as the service asks it (`batch_confirmation_verdicts`), each verdict judged against the truth at its batch
    size (the arms there, by optimizer), and the study right where every batch size is. Seeded as
    `verdict_chances`."""
    rounds = choice.rounds
    rng = np.random.default_rng([seed, 0 if choice.k is not None else 1, rounds[-1]])
    columns = [_draw_runs(rng, arm, draws, rounds[-1]) for arm in evidence.arms]
    batches = sorted({batch for batch, _ in places.values()})
    truths = {b: Evidence(tuple(replace(a, label=places[a.label][1]) for a in evidence.arms if places[a.label][0] == b),
                          ()) for b in batches}  # fmt: skip
    counts = {b: dict.fromkeys(("right", "wrong", "equivalent", "not yet"), 0) for b in batches}
    every = dict.fromkeys(("right", "wrong"), 0)
    runs = 0
    for d in range(draws):
        drawn = [(*places[a.label], ArmRuns(places[a.label][1], column[d], a.max_samples, a.resolution))
                 for a, column in zip(evidence.arms, columns, strict=True)]  # fmt: skip
        verdicts, used = batch_confirmation_verdicts(drawn, rounds, margin, batches)
        runs += used
        judged = {b: _judged(verdicts.get(b), truths[b], margin) for b in batches}
        for b, outcome in judged.items():
            counts[b][outcome] += 1
        right = [o == "right" or (o == "equivalent" and truths[b].within(margin)) for b, o in judged.items()]
        wrong = [o == "wrong" or (o == "equivalent" and not truths[b].within(margin)) for b, o in judged.items()]
        every["right"] += all(right)
        every["wrong"] += any(wrong)
    t_quantile.cache_clear()
    at = {b: Chances(choice, draws, c["right"], c["wrong"], c["equivalent"], c["not yet"], runs,
                     truths[b].within(margin)) for b, c in counts.items()}  # fmt: skip
    total = Chances(choice, draws, every["right"], every["wrong"], 0, draws - every["right"] - every["wrong"], runs,
                    False)  # fmt: skip
    return BatchChances(at, total, truths)


def _judged(verdict: Verdict | None, truth: Evidence, margin: float) -> str:
    """right, wrong (a winner), equivalent or not yet: one verdict against its truth (None: not asked: not yet)."""
    if verdict is None:
        return "not yet"
    if verdict.outcome is Outcome.WINNER:
        return "right" if verdict.winner == truth.better else "wrong"
    return verdict.outcome.value


def _draw_runs(rng: np.random.Generator, arm: ArmSpread, draws: int, n: int) -> list[tuple[float | None, ...]]:
    """`draws` rows of n runs of one arm: samples to target, None for a miss."""
    samples = np.exp(rng.normal(arm.log_mean, arm.log_sd, (draws, n)))
    hits = rng.random((draws, n)) < arm.hit_rate
    return [tuple(float(s) if hit else None for s, hit in zip(row, hit_row, strict=True))
            for row, hit_row in zip(samples, hits, strict=True)]  # fmt: skip


ADVICE_FIXED = tuple(range(2, 13))  # confirm_seeds: k searched for --power
ADVICE_CAPS = (6, 9, 12)  # confirm_seeds: auto with these max_confirm_seeds
DRAWS = 2000  # drawn experiments a confirmation budget (one standard error of an 80 % chance: 0.9 points)


@dataclass(frozen=True)
class Advice:
    """For a wanted chance of a right answer: the fixed k searched upwards until one reaches it, and auto's caps."""

    power: float
    fixed: tuple[Chances, ...]
    auto: tuple[Chances, ...]

    @property
    def fewest_fixed(self) -> Chances | None:
        return next((c for c in self.fixed if c.power >= self.power), None)

    @property
    def smallest_cap(self) -> Chances | None:
        return next((c for c in self.auto if c.power >= self.power), None)


def advise(evidence: Evidence, margin: float, power: float, draws: int, seed: int = 0,
           known: Sequence[Chances] = (), drawn: Callable[[Confirmations], Chances] | None = None
           ) -> Advice:  # fmt: skip
    """The fewest fixed confirmation runs per arm (2 to 12) whose chance of a right answer reaches `power`, and
    auto at caps 6, 9 and 12 (`known`: chances already computed, reused where their budget is searched; `drawn`: the
    chances of a budget, `verdict_chances` of `evidence` unless given)."""
    done = {c.choice: c for c in known if c.draws == draws}
    drawn = drawn or (lambda choice: verdict_chances(evidence, margin, choice, draws, seed))

    def chances(choice: Confirmations) -> Chances:
        return done.get(choice) or drawn(choice)

    fixed = []
    for k in ADVICE_FIXED:
        fixed.append(chances(Confirmations(k)))
        if fixed[-1].power >= power:
            break
    auto = tuple(chances(Confirmations(None, cap)) for cap in ADVICE_CAPS)
    return Advice(power, tuple(fixed), auto)


@dataclass(frozen=True)
class ChancesForecast:
    """The verdict's chances, computed once (`chances_forecast`): printed by `chances_lines`, as data (`hpo plan
    --json`) by `chances_data`, both from the same numbers."""

    evidence: Evidence
    margin: float
    by_batch: bool  # a batch-size study (`batch_places`): the verdict at each batch size
    mine: Chances | BatchChances | None  # with the file's confirmation budget (None: confirm_seeds 0, no verdict)
    advice: Advice | None  # with --power
    draws: int
    seed: int = 0


def chances_forecast(spec, evidence: Evidence, draws: int = DRAWS, power: float | None = None,
                     seed: int = 0) -> ChancesForecast:  # fmt: skip
    """The verdict's chances with the file's confirmation budget and, for a wanted `power`, the advice. A batch-size
    study's (`batch_places`) are of the verdict at each batch size (`batch_verdict_chances`)."""
    margin, choice = spec.verdict.margin, file_confirmations(spec)
    places = batch_places(spec)
    if places is None:
        mine = verdict_chances(evidence, margin, choice, draws, seed) if choice else None
        advice = advise(evidence, margin, power, draws, seed, [mine] if mine else []) if power else None
        return ChancesForecast(evidence, margin, False, mine, advice, draws, seed)
    by_batch = batch_verdict_chances(evidence, places, margin, choice, draws, seed) if choice else None

    def drawn(budget: Confirmations) -> Chances:
        return batch_verdict_chances(evidence, places, margin, budget, draws, seed).every

    known = [by_batch.every] if by_batch else []
    advice = advise(evidence, margin, power, draws, seed, known, drawn) if power else None
    return ChancesForecast(evidence, margin, True, by_batch, advice, draws, seed)


def chances_lines(forecast: ChancesForecast) -> list[str]:
    """What `hpo plan --cv/--like` prints: where the spread comes from, the verdict's chances with the file's
    confirmation budget, and with --power the advice table; of a batch-size study, the outcomes of the verdict at
    each batch size against the truth there, and how often it is right at every batch size (the study's right
    answer, which --power counts)."""
    return chances_data(forecast)["lines"]


def chances_data(forecast: ChancesForecast) -> dict[str, Any]:
    """The verdict's chances as data (`hpo plan --json`'s `chances`), from which the printed lines (`lines`) are
    made: `draws`, `seed`, `margin`, `by_batch` (a batch-size study), `arms`, `source` (the spread's lines), the
    file's `confirmations` (`confirm_seeds` k or "auto", `max_confirm_seeds`, the runs per arm of its `rounds`; None
    without confirmation runs), `truth` (the truly `better` arm, None at a tie; `within` the margin: "equivalent"
    is right), `outcomes` (key -> `label`, `count`, `share` of the draws and its 95 % Wilson interval `low`,
    `high`; of a batch-size study `right` at every batch size and `wrong` at some, with `at_batches`: per batch
    size its `truth` and `outcomes`), `runs_per_arm` (mean confirmation runs per arm) and `advice` (with --power)."""
    mine, evidence, draws = forecast.mine, forecast.evidence, forecast.draws
    data: dict[str, Any] = {
        "draws": draws, "seed": forecast.seed, "margin": forecast.margin, "by_batch": forecast.by_batch,
        "arms": len(evidence.arms), "source": list(evidence.source), "confirmations": None,
        "truth": None if forecast.by_batch else _truth_data(evidence, forecast.margin), "outcomes": None,
        "at_batches": {}, "runs_per_arm": None, "advice": None,
    }  # fmt: skip
    if isinstance(mine, BatchChances):
        data["at_batches"] = {batch: {"truth": _truth_data(mine.truths[batch], forecast.margin),
                                      "outcomes": _outcomes_data(mine.truths[batch], chances, forecast.margin)}
                              for batch, chances in mine.at.items()}  # fmt: skip
        data["outcomes"] = {
            "right": _share_data("a right answer at every batch size", mine.every.right, draws),
            "wrong": _share_data("a wrong answer at some batch size", mine.every.wrong, draws),
        }
        mine = mine.every
    elif mine is not None:
        data["outcomes"] = _outcomes_data(evidence, mine, forecast.margin)
    if mine is not None:
        data["confirmations"], data["runs_per_arm"] = _confirmations_data(mine.choice), mine.runs_per_arm
    if forecast.advice is not None:
        data["advice"] = _advice_data(forecast.advice, len(evidence.arms))
    return data | {"lines": _chances_text(data)}


def _truth_data(evidence: Evidence, margin: float) -> dict[str, Any]:
    return {"better": evidence.better, "within": evidence.within(margin)}


def _confirmations_data(choice: Confirmations) -> dict[str, Any]:
    return {"confirm_seeds": "auto" if choice.k is None else choice.k, "max_confirm_seeds": choice.cap,
            "rounds": list(choice.rounds)}  # fmt: skip


def _outcomes_data(evidence: Evidence, chances: Chances, margin: float) -> dict[str, dict[str, Any]]:
    """The outcome rows of one verdict, as printed: key -> its label, count, share and interval."""
    better = evidence.better
    equivalent = f"equivalent within ±{margin:.0%}" + (" (right)" if chances.within else " (wrong)")
    rows = [("right_winner", f"right: {better} named", chances.right_winner)] if better else []
    rows += [("wrong_winner", "wrong: another arm named" if better else "wrong: an arm named", chances.wrong_winner),
             ("equivalent", equivalent, chances.equivalent), ("not_yet", "not yet", chances.not_yet),
             ("right", "a right answer", chances.right)]  # fmt: skip
    return {key: _share_data(label, count, chances.draws) for key, label, count in rows}


def _share_data(label: str, count: int, total: int) -> dict[str, Any]:
    low, high = share_interval(count, total)
    return {"label": label, "count": count, "share": count / total, "low": low, "high": high}


def _advice_data(advice: Advice, arms: int) -> dict[str, Any]:
    """The --power table as data: each searched budget's right answers (with their interval), not yet and wrong
    ones of its draws, its runs, and whether it `reaches` the wanted `power`; the fewest fixed k and the smallest
    auto cap that reach it (None: none)."""

    def row(c: Chances) -> dict[str, Any]:
        low, high = share_interval(c.right, c.draws)
        return _confirmations_data(c.choice) | {
            "draws": c.draws, "right": c.right, "not_yet": c.not_yet, "wrong": c.wrong, "share": c.power,
            "low": low, "high": high, "runs_per_arm": c.runs_per_arm, "runs_in_all": c.runs_per_arm * arms,
            "reaches": c.power >= advice.power,
        }  # fmt: skip

    fixed, auto = advice.fewest_fixed, advice.smallest_cap
    return {
        "power": advice.power,
        "budgets": [row(c) for c in (*advice.fixed, *advice.auto)],
        "fewest_fixed": fixed.choice.k if fixed else None,
        "smallest_cap": auto.choice.cap if auto else None,
    }


def _chances_text(data: dict[str, Any]) -> list[str]:
    """`chances_lines` from `chances_data`'s numbers."""
    by_batch, draws = data["by_batch"], data["draws"]
    what = ("the verdict at each batch size itself (hpo.evidence.verdict.batch_size_verdicts" if by_batch else
            "the verdict itself (hpo.evidence.verdict.decide")  # fmt: skip
    lines = [f"the verdict's chances{' at each batch size' if by_batch else ''}: {draws:,} drawn experiments a "
             f"confirmation budget (seed {data['seed']}), each arm's confirmation runs drawn log-normally from the "
             f"spread below and judged by {what}, margin ±{data['margin']:.0%}) as `hpo run` asks it; no training, "
             "no simulated cluster"]  # fmt: skip
    lines += [f"  {line}" if not line.startswith("  ") else line for line in data["source"]]
    budget = data["confirmations"]
    if budget is None:
        lines += ["", "this file has no confirmation runs (budget.confirm_seeds: 0): its verdict has no evidence"]
    elif by_batch:
        lines += ["", f"outcome with this file's {_budget_words(budget)}, the verdict at each of "
                      f"{len(data['at_batches'])} batch sizes (the error shared over them; of {draws:,} draws; 95 % "
                      "Wilson interval of the share)"]  # fmt: skip
        for batch, there in data["at_batches"].items():
            lines.append(f"  at batch {batch:,}:")
            lines += [_share_line(f"  {row['label']}", row) for row in there["outcomes"].values()]
    else:
        lines += ["", f"outcome with this file's {_budget_words(budget)} (of {draws:,} draws; 95 % Wilson "
                      "interval of the share)"]  # fmt: skip
    if budget is not None:
        lines += [_share_line(row["label"], row) for row in data["outcomes"].values()]
        lines.append(f"  {'confirmation runs per arm (mean)':<{WIDTH - 2}}{data['runs_per_arm']:>11.1f}")
    if data["advice"] is not None:
        every = " (the verdict right at every batch size)" if by_batch else ""
        lines += [""] + advice_lines(data["advice"], data["arms"], every)
    return lines


def _budget_words(budget: dict[str, Any]) -> str:
    if budget["confirm_seeds"] != "auto":
        return f"confirm_seeds: {budget['confirm_seeds']} (one look)"
    return f"confirm_seeds: auto (looks after {', '.join(map(str, budget['rounds']))} runs per arm)"


def _choice_words(budget: dict[str, Any]) -> str:
    """A budget as the file says it (`Confirmations.__str__`)."""
    if budget["confirm_seeds"] != "auto":
        return f"confirm_seeds: {budget['confirm_seeds']}"
    return f"confirm_seeds: auto, max_confirm_seeds: {budget['max_confirm_seeds']}"


def _share_line(label: str, row: dict[str, Any]) -> str:
    return f"  {label:<{WIDTH - 2}}{row['count']:>5} {row['share']:>6.1%}   {row['low']:.1%} to {row['high']:.1%}"


def advice_lines(advice: dict[str, Any], arms: int, what: str = "") -> list[str]:
    """The --power table (`chances_data`'s `advice`): each searched budget's chance of a right answer (`what` it
    is, where not the verdict's) and its cost, and the advice to copy."""
    wanted = f"{advice['power']:.0%}"
    lines = [f"advice for a right answer{what} in at least {wanted} of experiments: fixed confirm_seeds searched from "
             f"2 up to the first that reaches it, and auto at max_confirm_seeds {', '.join(map(str, ADVICE_CAPS))}",
             f"  {'under budget: in the experiment file':<{WIDTH}}{'right':>7}{'not yet':>9}{'wrong':>7}"
             f"{'runs per arm':>14}{'runs in all':>13}"]  # fmt: skip
    for row in advice["budgets"]:
        mark = f"  reaches {wanted}" if row["reaches"] else ""
        lines.append(f"  {_choice_words(row):<{WIDTH}}{row['share']:>7.1%}{row['not_yet'] / row['draws']:>9.1%}"
                     f"{row['wrong'] / row['draws']:>7.1%}{row['runs_per_arm']:>14.1f}{row['runs_in_all']:>13.1f}"
                     f"{mark}")  # fmt: skip
    fixed = [row for row in advice["budgets"] if row["confirm_seeds"] != "auto"]
    auto = {row["max_confirm_seeds"]: row for row in advice["budgets"] if row["confirm_seeds"] == "auto"}
    if (k := advice["fewest_fixed"]) is not None:
        share = next(row["share"] for row in fixed if row["confirm_seeds"] == k)
        lines.append(f"fewest fixed: confirm_seeds: {k}  ({k} runs per arm, {k * arms} confirmation runs in all; a "
                     f"right answer in {share:.1%})")  # fmt: skip
    else:
        lines.append(f"no fixed confirm_seeds up to {ADVICE_FIXED[-1]} reaches {wanted} (at {ADVICE_FIXED[-1]}: "
                     f"{fixed[-1]['share']:.1%}): the spread is too wide for the difference; more tuning, a "
                     "larger margin, or accepting a lower chance")  # fmt: skip
    if (cap := advice["smallest_cap"]) is not None:
        lines.append(f"smallest auto cap: confirm_seeds: auto + max_confirm_seeds: {cap}  "
                     f"({auto[cap]['runs_per_arm']:.1f} runs per arm on average, at most {cap}; a right answer "
                     f"in {auto[cap]['share']:.1%})")  # fmt: skip
    else:
        lines.append(f"no auto cap up to {ADVICE_CAPS[-1]} reaches {wanted}")
    return lines
