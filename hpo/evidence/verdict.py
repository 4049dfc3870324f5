"""The verdict of a comparison: which arm reaches the target in fewer samples and by how much, or that the arms
are equivalent within a margin, or not yet (and about how many runs per arm would decide).

Evidence. An arm's runs are its best configuration's confirmation trials (`budget.confirm_seeds`: the
configuration its tuner picked, re-run with other training seeds). The best tuning trial itself is not a run
here: it was selected as the best of its arm's trials, so its seed was lucky as well as its configuration good,
and it flatters its arm by an amount that depends on the arm's spread and trial count (measured in BENCHMARKS.md,
"Verdict calibration"); the confirmation runs are not selected at all. Unless nothing selected it: a tuning trial
whose final record says `unselected` (`UNSELECTED_KEY`: an imported run whose configuration is the only one of its
arm, hpo.mlperf) is a run of the evidence like its confirmation runs, and no pick is judged for its arm. A run that
failed on bad data says nothing about the arm and is left out.

Quantity. Per run, samples to target *between* evaluation points: the run's `mlm_accuracy` curve, linearly
interpolated between the last evaluation below the target and the first at or above it. The stored
`samples_to_target` keeps MLPerf's meaning (the first evaluation at or above the target); runs that hit at the
same evaluation are not identical measurements, and treating them so gave zero-width intervals. A run without
an evaluation below the target before its hit (or without a stored curve) counts its stored value. In an arm
with such a run, or with two runs whose values coincide (interpolated on identical curves: a replayed seed,
training that ignores its seed), the measurement did not tell the runs apart and their spread says nothing of
the seed-to-seed spread: the arm's spread is then at least the resolution of one evaluation interval (every / √12,
the standard deviation of a uniform error over one interval), in the verdict's test and in the arm's 95 %
interval (`ArmSummary.floored` says so), so runs that agree exactly never make an interval of zero width. Runs the
interpolation tells apart keep their own spread, however small: between evaluations it resolves more finely
than one interval, and a floor on every arm would throw that away.

Misses are censored. A run that missed the target (it used its whole sample budget, diverged, crashed or timed
out) needed *more than the budget*: it enters as the budget, the least it would have needed. That can only make
its arm look faster than it is, so a claim that another arm beats it stays conservative, and an arm with a miss
is never named the winner nor equivalent.

Statistics, on the log scale (the answers are ratios: "A needs 24 % fewer samples than B"). For two arms A and
B with runs x (ln samples): the difference d = mean(x_A) - mean(x_B), Welch's standard error and degrees of
freedom, Student's t quantiles (scipy); the ratio of A's to B's geometric mean samples is exp(d), its interval
exp(d ± t · se).

Error control: the guarantee is a wrong winner in at most 5 % of experiments; the tests run at `ALPHA` = 4 %
over the whole experiment. At a true tie a two-sided test at level a names an arm in a of the cases by
construction, so a test at 5 % measured 5.0-5.9 % in 12 of 108 tie cells of the power study (4,000 draws each,
one standard error 0.3 %; runs not log-normal, few degrees of freedom); the point below 5 % keeps every cell of
it under the guarantee (BENCHMARKS.md, "Verdict power").
- Arms: Bonferroni over the k(k - 1)/2 pairs of k arms (with two arms, one pair: no correction). Each pair is
  tested at a = level / pairs; the intervals shown are those tests' intervals.
- Looks: with sequential confirmations (`confirm_seeds: auto`), the verdict is asked after each of J rounds. An
  alpha-spending function (Lan-DeMets, Pocock type: spent(t) = ALPHA · ln(1 + (e - 1) t) at information
  fraction t = j / J) gives look j the level spent(j / J) - spent((j - 1) / J). The looks' levels add up to
  ALPHA, so by Bonferroni over the looks the error over all of them is at most ALPHA whatever the looks'
  correlation (conservative; exact boundaries would need the joint law of Welch statistics). With a fixed
  `confirm_seeds` there is one look at the full ALPHA.

The outcomes, in order:
- not yet, before any test, when an arm's tuning has found no configuration that reaches the target (none of its
  tuning trials nor of its best configuration's confirmation runs reached it; under a multi-fidelity tuner the
  tuning trials may all be short, and the confirmations at the full budget show it): the comparison would be
  between a tuned arm and an untuned one, so it says so and asks
  for more tuning trials (or a larger sample budget); more confirmation runs would not help. Calibration found
  most wrong winners on the real pair there (BENCHMARKS.md, "Verdict calibration").
- winner: A reached the target in every one of at least 2 runs and, against every other arm B, the two-sided
  (1 - a) interval of A/B lies below 1. At a true tie this happens in at most a of the cases (either way).
  Unless an arm B that A beats had its configuration picked on evidence its own runs contradict: B's confirmation
  runs missed the target at least once and the tuning run that picked it reached the target sooner than A's runs
  do (a lucky seed) or never reached it (picked on accuracy short of the target, as a multi-fidelity tuner picks
  at a short budget, where a high learning rate looks good early). Then A beat a configuration, not B tuned: not
  yet, more tuning trials would decide. The cost bench found asha's wrong winners there (BENCHMARKS.md).
- equivalent within ±m: every arm reached the target in every one of at least 2 runs and, for every pair, the
  (1 - 2a) interval of the ratio lies within (1 - m, 1 + m): two one-sided tests at level a each (TOST).
- not yet: otherwise, with the runs per arm that would likely decide (80 % power at this look's level, normal
  approximation, at the observed spread and difference); `runs_needed` is None where more confirmation runs
  would not decide (no arm reached the target, an arm's tuning found nothing that does, a pick was lucky, or every
  arm missed the target in some run: a winner must always reach it and equivalence needs every arm to, and a miss
  stays a miss however many runs follow).
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from itertools import combinations, pairwise

from scipy import special  # scipy.stats's quantiles are these functions; importing it costs 0.5 s more

from hpo.experiment.arms import arm_label, arms, trial_config
from hpo.mlperf import UNSELECTED_KEY
from hpo.objective import NOT_HYPERPARAMETER_ERRORS
from hpo.trials import TrialKind, TrialState

ALPHA = 0.04  # the tests' level over the whole experiment: a wrong winner in at most 5 % (module docstring)
DEFAULT_MARGIN = 0.05  # `verdict.margin`: "equivalent" means within ±5 % samples to target
POWER = 0.8  # the chance to decide that "not yet" sizes its estimate of the runs needed for


class Outcome(str, Enum):
    WINNER = "winner"
    EQUIVALENT = "equivalent"
    NOT_YET = "not yet"


@dataclass(frozen=True)
class ArmRuns:
    """The evidence of one arm: samples to target per finished run (None: the run missed the target)."""

    label: str
    samples_to_target: tuple[float | None, ...]
    max_samples: int | None  # the runs' sample budget, which a miss used up (None: no run)
    resolution: float = 0.0  # samples between evaluations: the arm's spread is at least resolution / √12
    found: bool = True  # a configuration of the arm is known to reach the target (a tuning or confirmation run did)
    # samples to target of the tuning run that picked the configuration (between evaluations, as the runs'): inf
    # where it missed the target (picked on its accuracy, e.g. at a short multi-fidelity budget), None where unknown
    picked: float | None = None

    def __post_init__(self) -> None:  # ln of each: a count of samples, finite and positive
        bad = [s for s in self.samples_to_target if s is not None and not (math.isfinite(s) and s > 0)]
        if bad:
            raise ValueError(f"arm {self.label}: samples to target must be finite and positive, got {bad[0]!r} "
                             "(a run that missed the target is None)")  # fmt: skip


@dataclass(frozen=True)
class ArmSummary:
    label: str
    runs: int
    hits: int
    mean: float | None  # over the hits
    low: float | None  # the 95 % t interval of that mean, at least 0 (None with fewer than 2 hits)
    high: float | None
    max_samples: int | None
    # the evaluation interval (samples) whose resolution gives the interval, where the hits' own spread was below
    # it (they agree within a fraction of one interval, or exactly); None: the interval is the hits' spread
    floored: float | None = None

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.runs if self.runs else None

    def describe(self) -> str:
        """`optimizer.name=lamb: 3 of 3 runs reached the target; samples to target 4,779 (95 % interval ...)`."""
        if not self.runs:
            return f"{self.label}: no completed run"
        text = f"{self.label}: {self.hits} of {self.runs} run(s) reached the target"
        if self.mean is None:
            return text
        text += f"; samples to target {self.mean:,.0f}"
        if self.low is None:
            return text + " (one run: no interval)"
        if self.floored is not None:
            return text + (f" (95 % interval {self.low:,.0f} to {self.high:,.0f}: the runs agree closer than one "
                           f"evaluation interval of {self.floored:,.0f} samples can tell, so the interval is that "
                           "resolution's, not their spread's)")  # fmt: skip
        return text + f" (95 % interval {self.low:,.0f} to {self.high:,.0f})"


@dataclass(frozen=True)
class Comparison:
    """Arm `a` against arm `b`: the ratio of their geometric mean samples to target, with two intervals."""

    a: str
    b: str
    ratio: float  # a's samples / b's samples: below 1, a needs fewer
    low: float  # the (1 - level) interval of the ratio (the winner's test)
    high: float
    equivalence_low: float  # the (1 - 2 level) interval (the two one-sided tests of equivalence)
    equivalence_high: float
    level: float  # the test's level for this pair at this look
    b_samples: float  # b's geometric mean samples to target: the ratio times it is a's
    se: float  # standard error of the log ratio
    df: float  # Welch's degrees of freedom
    runs: tuple[int, int]
    b_misses: int = 0  # b's runs that missed the target (counted at the budget: a's advantage is at least this)

    @property
    def percent(self) -> float:
        return 100 * (self.ratio - 1)

    def in_samples(self, ratio: float) -> float:
        """A ratio as a difference in samples: a's samples minus b's."""
        return (ratio - 1) * self.b_samples

    def as_dict(self) -> dict:
        return {
            "arm": self.a,
            "against": self.b,
            "percent": 100 * (self.ratio - 1),
            "interval_percent": [100 * (self.low - 1), 100 * (self.high - 1)],
            "samples": self.in_samples(self.ratio),
            "interval_samples": [self.in_samples(self.low), self.in_samples(self.high)],
            "confidence": 1 - self.level,
            "equivalence_interval_percent": [100 * (self.equivalence_low - 1), 100 * (self.equivalence_high - 1)],
        }


@dataclass(frozen=True)
class Verdict:
    arms: tuple[ArmSummary, ...]
    winner: str | None  # the winning arm's label
    line: str  # the one-line verdict
    outcome: Outcome = Outcome.NOT_YET
    margin: float = DEFAULT_MARGIN
    comparisons: tuple[Comparison, ...] = ()  # the leader against every other arm (all pairs when equivalent)
    look: int = 1  # which look of how many (sequential confirmations)
    looks: int = 1
    runs_needed: int | None = None  # "not yet": runs per arm that would likely decide
    shared: int = 1  # how many verdicts share the error (a batch-size study: its batch sizes; `decide`'s family)

    def as_dict(self) -> dict:
        """The verdict as plain data (the CLI's YAML, the API): outcome, differences with intervals, margin, runs."""
        return {
            "outcome": self.outcome.value,
            "winner": self.winner,
            "line": self.line,
            "margin": self.margin,
            "look": self.look,
            "looks": self.looks,
            "runs_per_arm": {arm.label: arm.runs for arm in self.arms},
            "runs_needed": self.runs_needed,
            "differences": [c.as_dict() for c in self.comparisons],
        }


@functools.cache
def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with df degrees of freedom (scipy's `stdtrit`, which `scipy.stats.t.ppf`
    evaluates; cached: the power benchmark asks for the same few quantiles many thousand times)."""
    return float(special.stdtrit(df, p))


def look_level(look: int, looks: int, alpha: float = ALPHA) -> float:
    """The level of look `look` of `looks`: the increment of the Pocock-type spending function (module docstring)."""
    if not 1 <= look <= looks:
        raise ValueError(f"look {look} of {looks}: a look is counted from 1 to the number of looks")

    def spent(t: float) -> float:
        return alpha * math.log1p((math.e - 1) * t)

    return spent(look / looks) - spent((look - 1) / looks)


def samples_between_evaluations(curve: Sequence[tuple[float, float]], target: float, stored: float) -> float:
    """Samples to target interpolated on the accuracy curve [(samples, accuracy), ...] between the last evaluation
    below `target` and the first at or above it; `stored` (MLPerf's first evaluation at or above it) where no
    evaluation below the target precedes that one."""
    below = None
    for samples, accuracy in sorted(curve):
        if samples > stored:
            break
        if accuracy >= target:
            if below is None or samples != stored:
                return stored
            s0, a0 = below
            return s0 + (target - a0) / (accuracy - a0) * (samples - s0)
        below = (samples, accuracy)
    return stored


def summarize(runs: ArmRuns) -> ArmSummary:
    """Hit rate, mean samples to target over the hits, and its 95 % t interval, whose spread is at least one
    evaluation interval's resolution (`runs.resolution` / √12): hits that agree closer than that, or exactly, give
    the interval of that resolution, not one of zero width (module docstring)."""
    hits = [s for s in runs.samples_to_target if s is not None]
    mean = statistics.fmean(hits) if hits else None
    low = high = None
    floored = None
    if len(hits) >= 2:
        spread, floor = statistics.stdev(hits), runs.resolution / math.sqrt(12)
        floored = runs.resolution if spread < floor else None
        half = t_quantile(0.975, len(hits) - 1) * max(spread, floor) / math.sqrt(len(hits))
        low, high = max(mean - half, 0.0), mean + half  # a count of samples: never below 0 (few runs, wide t)
    return ArmSummary(runs.label, len(runs.samples_to_target), len(hits), mean, low, high, runs.max_samples, floored)


def _logs(runs: ArmRuns) -> list[float]:
    """ln samples per run, a miss at its budget (censored: the least it would have needed)."""
    return [math.log(s if s is not None else runs.max_samples) for s in runs.samples_to_target]


def _variance(runs: ArmRuns, logs: list[float]) -> float:
    """The sample variance of ln samples, at least that of one evaluation interval's resolution."""
    floor = runs.resolution / math.sqrt(12) / math.exp(statistics.fmean(logs))
    return max(statistics.variance(logs), floor * floor)


def compare(a: ArmRuns, b: ArmRuns, level: float) -> Comparison:
    """a against b (each with at least 2 runs): Welch on ln samples (module docstring)."""
    xa, xb = _logs(a), _logs(b)
    va, vb = _variance(a, xa) / len(xa), _variance(b, xb) / len(xb)
    se = math.sqrt(va + vb)
    spread = va * va / (len(xa) - 1) + vb * vb / (len(xb) - 1)
    df = (va + vb) ** 2 / spread if spread > 0 else math.inf  # no spread at all (and no resolution): exact
    d = statistics.fmean(xa) - statistics.fmean(xb)
    wide, narrow = t_quantile(1 - level / 2, df) * se, t_quantile(1 - level, df) * se
    return Comparison(a.label, b.label, math.exp(d), math.exp(d - wide), math.exp(d + wide), math.exp(d - narrow),
                      math.exp(d + narrow), level, math.exp(statistics.fmean(xb)), se, df, (len(xa), len(xb)),
                      b.samples_to_target.count(None))  # fmt: skip


def decide(arms: Sequence[ArmRuns], margin: float = DEFAULT_MARGIN, look: int = 1, looks: int = 1,
           family: int = 1) -> Verdict:  # fmt: skip
    """Each arm's summary and the verdict (see the module docstring for the rule). `family`: how many verdicts
    share the error (e.g. one per batch size of a study): each is tested at 1 / family of the level (Bonferroni)."""
    summaries = tuple(summarize(a) for a in arms)
    pairs = max(1, len(arms) * (len(arms) - 1) // 2)
    level = look_level(look, looks) / pairs / max(1, family)
    common = {"margin": margin, "look": look, "looks": looks, "shared": max(1, family)}
    unfound = [a.label for a in arms if not a.found]
    if unfound:
        return Verdict(summaries, None, f"not yet: {_not_found(unfound)}", **common)
    short = next((a for a in arms if len(a.samples_to_target) < 2), None)
    if short is not None:
        why = f"{short.label} has {len(short.samples_to_target)} run(s); a comparison needs at least 2 per arm"
        return Verdict(summaries, None, f"not yet: {why}", runs_needed=2, **common)
    hitting = [a for a in arms if any(s is not None for s in a.samples_to_target)]
    if not hitting or len(arms) < 2:
        why = "no arm reached the target" if len(arms) > 1 else "one arm: nothing to compare"
        return Verdict(summaries, None, f"not yet: {why}", **common)
    leader = min(hitting, key=lambda a: statistics.fmean(_logs(a)))
    against = tuple(compare(leader, b, level) for b in arms if b is not leader)
    if _always_hit(leader) and all(c.high < 1 for c in against):
        lucky = [b for b in arms if b is not leader and _lucky(b, leader)]
        if lucky:
            return Verdict(summaries, None, _lucky_line(leader, lucky, against), comparisons=against, **common)
        return Verdict(summaries, leader.label, _winner_line(against, margin), Outcome.WINNER, comparisons=against,
                       **common)  # fmt: skip
    every = tuple(compare(a, b, level) for a, b in combinations(arms, 2))
    if all(_always_hit(a) for a in arms) and all(1 - margin < c.equivalence_low and c.equivalence_high < 1 + margin
                                                 for c in every):  # fmt: skip
        return Verdict(summaries, None, _equivalent_line(every, margin), Outcome.EQUIVALENT, comparisons=every,
                       **common)  # fmt: skip
    if not any(_always_hit(a) for a in arms):  # neither a winner nor "equivalent" can come of more runs
        return Verdict(summaries, None, _all_missed_line(arms, against, margin), comparisons=against, **common)
    needed = _runs_needed(against, margin, level)
    return Verdict(summaries, None, _not_yet_line(leader, against, margin, needed), comparisons=against,
                   runs_needed=needed, **common)  # fmt: skip


def batch_size_verdicts(points: Iterable[tuple[int, str, ArmRuns]], margin: float = DEFAULT_MARGIN, look: int = 1,
                        looks: int = 1, declared: Collection[int] = ()) -> dict[int, Verdict]:  # fmt: skip
    """Global batch size -> the verdict between the optimizers measured there (two or more), by `decide` on their
    runs at look `look` of `looks` (each arm's runs of the rounds up to it, as the caller cut them), the error shared
    over the batch sizes compared and those `declared` (`hpo.experiment.arms.declared_batch_sizes`: a study's
    batch sizes whose runs have not come yet count, so a verdict does not change when they come; Bonferroni: each at
    1 / their number of the look's level, `Verdict.shared`), so together they name a wrong winner in at most 5 %: in
    a batch-size study the experiment's verdict compares arms across batch sizes too, and this is the answer at
    each. `points`: (batch size, optimizer, its runs there); the runs of one
    optimizer at one batch size from several points (experiments) are pooled (`pool`). The report's verdict at each
    batch size, `hpo export --batch-size` and the confirmation rounds of a batch-size study read it. Ascending by
    batch size."""
    by_batch: dict[int, dict[str, list[ArmRuns]]] = {}
    for batch, optimizer, runs in points:
        by_batch.setdefault(batch, {}).setdefault(optimizer, []).append(runs)
    compared = {b: groups for b, groups in sorted(by_batch.items()) if len(groups) >= 2}
    family = len(set(compared) | set(declared))
    return {batch: decide([pool(name, mine) for name, mine in sorted(groups.items())], margin, look, looks, family)
            for batch, groups in compared.items()}  # fmt: skip


def pool(label: str, members: Sequence[ArmRuns]) -> ArmRuns:
    """The runs of several arms (one optimizer at one batch size, from several experiments) as one arm's: their
    runs together, the largest budget and the widest resolution; found where any member's tuning found a
    configuration that reaches the target. The pick of the pool is that of the member whose pick the verdict would
    judge lucky first (`_lucky`: a member with a miss among its runs, whose tuning run never reached the target,
    else the soonest), so the pool is lucky exactly where one of its members is; None where no member with a miss
    has a known pick."""
    if len(members) == 1:
        return replace(members[0], label=label)
    picks = [m.picked for m in members if m.picked is not None and None in m.samples_to_target]
    picked = math.inf if any(math.isinf(p) for p in picks) else min(picks, default=None)
    return ArmRuns(label, tuple(s for m in members for s in m.samples_to_target),
                   max(m.max_samples or 0 for m in members) or None, max(m.resolution for m in members),
                   any(m.found for m in members), picked)  # fmt: skip


def _not_found(labels: Sequence[str]) -> str:
    """The arms compared may be optimizers, clipping strategies or batch sizes: the line names neither, only arms;
    with several arms unfound, a list ("A, B and C") and what holds for each."""
    if len(labels) == 1:
        names, each, claim = labels[0], "", "it"
    else:
        names, each, claim = f"{', '.join(labels[:-1])} and {labels[-1]}", "for each, ", "any of them"
    return (f"the tuning of {names} has found no configuration that reaches the target yet ({each}none of its "
            "finished tuning trials nor of its best configuration's runs reached it): a claim against "
            f"{claim} would be about its tuning, not about the arm; more tuning trials (budget.trials) or a larger "
            "sample budget would decide, not more confirmation runs")  # fmt: skip


def _lucky(b: ArmRuns, leader: ArmRuns) -> bool:
    """Whether b's configuration was picked on evidence its own confirmation runs contradict, so that a claim
    against b would be about the pick, not the arm: b's confirmation runs missed the target at least once,
    and the tuning run that picked it either reached the target sooner than the leader's runs do (it ranked the
    configuration ahead of the leader: a lucky seed) or never reached it at all (picked on its accuracy short of
    the target, as a multi-fidelity tuner picks at a short budget, where a high learning rate looks good early)."""
    if b.picked is None or None not in b.samples_to_target:
        return False
    return math.isinf(b.picked) or math.log(b.picked) < statistics.fmean(_logs(leader))


def _lucky_line(leader: ArmRuns, lucky: Sequence[ArmRuns], against: Sequence[Comparison]) -> str:
    parts = []
    for b in lucky:
        why = ("its tuning run never reached it (picked on its accuracy short of the target)" if math.isinf(b.picked)
               else f"its tuning run reached it sooner than {leader.label} does (a lucky seed)")  # fmt: skip
        parts.append(f"{b.label}'s configuration missed the target in {b.samples_to_target.count(None)} of "
                     f"{len(b.samples_to_target)} confirmation run(s) and {why}")  # fmt: skip
    names = " and ".join(b.label for b in lucky)
    ahead = "; ".join(f"{c.a} vs {c.b}: {_pct(c.ratio)} ({100 * (1 - c.level):.3g} % interval {_pct(c.low)} to "
                      f"{_pct(c.high)})" for c in against)  # fmt: skip
    return (f"not yet: {'; '.join(parts)}: {leader.label} beat a configuration, not {names} tuned ({ahead}); "
            "more tuning trials (budget.trials) would decide, not more confirmation runs")  # fmt: skip


def _always_hit(runs: ArmRuns) -> bool:
    return len(runs.samples_to_target) >= 2 and all(s is not None for s in runs.samples_to_target)


def _runs_needed(against: Sequence[Comparison], margin: float, level: float) -> int:
    """Runs per arm at which the hardest pair would likely decide (a winner or equivalence, whichever needs fewer):
    n = 2 ((z + z_power) s / distance)², s the spread of one run (√(n/2) se), at this look's level."""
    z_power = special.ndtri(POWER)  # the normal quantile (scipy.stats.norm.ppf)
    needed = 0
    for c in against:
        n = min(c.runs)
        spread, d = c.se * math.sqrt(n / 2), abs(math.log(c.ratio))
        bound = math.log1p(margin) if c.ratio >= 1 else -math.log1p(-margin)
        distances = [(d, special.ndtri(1 - level / 2)), (bound - d, special.ndtri(1 - level))]
        options = [2 * ((z + z_power) * spread / gap) ** 2 for gap, z in distances if gap > 0]
        needed = max(needed, math.ceil(min(options)) if options else n + 1)
    return max(needed, min(min(c.runs) for c in against) + 1)


def _all_missed_line(arms: Sequence[ArmRuns], against: Sequence[Comparison], margin: float) -> str:
    """Every arm missed the target in some run: a winner must reach it in every run and equivalence needs every arm
    to, and a miss stays a miss, so more confirmation runs cannot decide."""
    misses = ", ".join(f"{a.label} {a.samples_to_target.count(None)} of {len(a.samples_to_target)}" for a in arms)
    return (f"not yet: {_differences(against)}, neither a winner nor within ±{100 * margin:g} %; every arm missed "
            f"the target in some run ({misses}), and a winner must reach it in every run (equivalence: every arm): "
            "more confirmation runs cannot decide; more tuning trials (budget.trials) for a configuration that "
            "reaches it every time, or a larger sample budget, would")  # fmt: skip


def _pct(ratio: float) -> str:
    percent = 100 * (ratio - 1)
    return f"{percent:+.1f} %" if abs(percent) < 1e4 else f"{percent:+.1e} %"  # two runs' interval can be 1e22 %


def _winner_line(against: Sequence[Comparison], margin: float) -> str:
    """`lamb needs 24.1 % fewer samples than adamw (95 % interval 17.0 % to 30.2 % fewer: 1,950 samples, ...)`."""
    parts = []
    for c in against:
        confidence = 100 * (1 - c.level)
        parts.append(f"{100 * (1 - c.ratio):.1f} % fewer samples than {c.b} ({confidence:.3g} % interval "
                     f"{100 * (1 - c.high):.1f} % to {100 * (1 - c.low):.1f} % fewer; {-c.in_samples(c.ratio):,.0f} "
                     f"fewer samples, {-c.in_samples(c.high):,.0f} to {-c.in_samples(c.low):,.0f})")  # fmt: skip
        if c.b_misses:
            parts[-1] += (f", at least: {c.b} missed the target in {c.b_misses} of {c.runs[1]} run(s), counted at its "
                          "budget")  # fmt: skip
    return f"{against[0].a} needs " + "; ".join(parts) + f" [margin ±{100 * margin:g} %]"


def _equivalent_line(every: Sequence[Comparison], margin: float) -> str:
    parts = [f"{c.a} vs {c.b}: {_pct(c.ratio)} ({100 * (1 - 2 * c.level):.3g} % interval {_pct(c.equivalence_low)} "
             f"to {_pct(c.equivalence_high)})" for c in every]  # fmt: skip
    names = " and ".join(dict.fromkeys(label for c in every for label in (c.a, c.b)))
    return f"{names} are equivalent within ±{100 * margin:g} %: " + "; ".join(parts)


def _differences(against: Sequence[Comparison]) -> str:
    """`lamb vs adamw: -26.1 % (96 % interval -45.7 % to +0.5 %; -2,038 samples)`, one per pair."""
    return "; ".join(f"{c.a} vs {c.b}: {_pct(c.ratio)} ({100 * (1 - c.level):.3g} % interval {_pct(c.low)} to "
                     f"{_pct(c.high)}; {c.in_samples(c.ratio):+,.0f} samples)" for c in against)  # fmt: skip


def _not_yet_line(leader: ArmRuns, against: Sequence[Comparison], margin: float, needed: int) -> str:
    missed = "" if _always_hit(leader) else f"; {leader.label} missed the target in some runs"
    have = min(min(c.runs) for c in against)
    return (f"not yet: {_differences(against)}, neither a winner nor within ±{100 * margin:g} %{missed}; about "
            f"{needed} runs per arm would likely decide (now {have})")  # fmt: skip


def arm_runs(spec, best: Mapping[str, object], trials: Sequence[object],
             curves: Mapping[int, Sequence[tuple[float, float]]] | None = None,
             reached: Collection[str | None] | None = None) -> list[ArmRuns]:  # fmt: skip
    """The evidence of every arm of `spec` from its stored trials: the finished confirmation trials of the best
    tuning trial of each arm as the storage chose it (`best` maps an arm's label to it, as `best_per_arm` does;
    None is the key without compare). `curves` maps a trial's id to its (samples, mlm_accuracy) evaluations,
    for samples to target between evaluations, the runs' and each best trial's (the pick, `ArmRuns.picked`:
    `hpo.evidence.confirmations.stored_curves` reads both); a trial without one counts its stored samples to target
    (MLPerf's, up to an evaluation interval late).
    `reached`: the arms with a completed tuning trial that reached the target, where the caller counted them (then
    `trials` need only be the confirmation trials); None: from the tuning trials among `trials`."""
    evidence, curves = [], curves or {}
    for fixed in arms(spec):
        key = arm_label(fixed) if fixed else None
        label, top = key or "all", best.get(key)
        if top is None:  # no tuning trial of the arm completed (none yet, or all failed or diverged)
            evidence.append(ArmRuns(label, (), None, found=False))
            continue
        cfg = trial_config(spec, top.params)
        target, every = cfg.eval.target_mlm_accuracy, cfg.eval.every_samples
        runs = tuple(_samples(t, curves.get(getattr(t, "id", None), ()), target) for t in confirmations(top, trials))
        resolution = every if unresolved(runs, every) else 0
        tuned = (
            top.arm in reached
            if reached is not None
            else any(_reached(t) is not None for t in trials if t.kind is TrialKind.TUNING and t.arm == top.arm)
        )
        found = tuned or any(s is not None for s in runs)
        picked = _samples(top, curves.get(getattr(top, "id", None), ()), target)
        picked = None if unselected(top) else math.inf if picked is None else picked
        evidence.append(ArmRuns(label, runs, cfg.budget.max_samples, resolution, found, picked))
    return evidence


def unresolved(runs: Sequence[float | None], every: int) -> bool:
    """Whether the measurement did not tell some of these runs' samples to target apart (module docstring): a hit
    read at an evaluation (a multiple of `every`), or two hits that coincide (read at the same evaluation, or
    interpolated on identical curves)."""
    hits = sorted(s for s in runs if s is not None)
    return any(s % every == 0 for s in hits) or any(math.isclose(a, b, rel_tol=1e-9) for a, b in pairwise(hits))


def confirmations(top, trials: Sequence[object]) -> list:
    """The finished confirmation trials of the configuration of `top` (a best tuning trial), and `top` itself where
    nothing selected it (`UNSELECTED_KEY`), bad data left out."""
    runs = [t for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == top.arm and t.params == top.params
            and t.state.finished and not _bad_data(t)]  # fmt: skip
    return [top, *runs] if unselected(top) and top.state.finished and not _bad_data(top) else runs


def unselected(trial) -> bool:
    """Whether nothing picked this trial on its outcome (`UNSELECTED_KEY` in its final record): it is evidence."""
    return (trial.metrics or {}).get(UNSELECTED_KEY) is True


def _samples(trial, curve: Sequence[tuple[float, float]], target: float) -> float | None:
    if trial.state is not TrialState.COMPLETED or trial.samples_to_target is None:
        return None
    return samples_between_evaluations(curve, target, trial.samples_to_target)


def _reached(trial) -> int | None:
    return trial.samples_to_target if trial.state is TrialState.COMPLETED else None


def _bad_data(trial) -> bool:
    return (trial.metrics or {}).get("error") in NOT_HYPERPARAMETER_ERRORS


def verdict_lines(verdict: Verdict, confirmation_plan: str) -> list[str]:
    """The verdict as printed: what the numbers are made of, one line per arm, and the verdict line."""
    lines = [f"samples to target per arm (confirmation runs of its best configuration: {confirmation_plan}; "
             "interpolated between evaluations):"]  # fmt: skip
    lines += [f"  {arm.describe()}" for arm in verdict.arms]
    look = f" (look {verdict.look} of {verdict.looks})" if verdict.looks > 1 else ""
    lines.append(f"verdict{look}: {verdict.line}")
    return lines
