"""The verdict of a comparison: samples to target per arm, with its uncertainty, and which arm wins.

The runs of an arm are its best tuning trial (the configuration its tuner picked) and that configuration's
confirmation trials (`budget.confirm_seeds`: the same parameters re-run with other training seeds), 1 + k
runs in all. The best tuning run was picked as the best of its arm, so it flatters its arm; every arm gets
the same selection (the same number of tuning trials), and the confirmation runs are not selected at all. Under a
multi-fidelity tuner (Hyperband, ASHA) the best tuning trial may have stopped at a lower rung without reaching the
target: it says nothing about the samples the configuration needs beyond its rung, so it is not a run here (only
its confirmation runs, at the full budget, are); one that reached the target at a low rung is a run (its samples
to target are exact).

Per arm, over its finished runs (a run that failed on bad data says nothing about the arm and is left out):

- hit rate: the runs that reached the target, of all runs. A miss (the run used its whole sample budget,
  diverged, crashed or timed out) counts as a miss; no penalty value ever enters the numbers below.
- samples to target: the mean over the n runs that reached the target, and its 95 % interval
  mean ± t(0.975, n - 1) · s / √n (Student's t, s the sample standard deviation). It needs n ≥ 2.

The rule, in one line: arm A wins when it reached the target in every one of at least 2 runs and, against
every other arm B, either A's interval lies entirely below B's (upper(A) < lower(B)), or B reached the
target in none of at least 2 runs while A's interval lies below B's sample budget (then B's runs all needed
more samples than A's interval allows). Otherwise there is "no winner at this evidence", with the reason.
Overlapping intervals are not proof that the arms are equal: more confirmation seeds narrow them.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpo.arms import arm_label, arms, trial_config
from hpo.objective import NOT_HYPERPARAMETER_ERRORS
from hpo.trials import TrialKind, TrialState

LEVEL = 0.95
NO_WINNER = "no winner at this evidence"


@dataclass(frozen=True)
class ArmRuns:
    """The evidence of one arm: samples to target per finished run (None: the run missed the target)."""

    label: str
    samples_to_target: tuple[int | None, ...]
    max_samples: int | None  # the runs' sample budget, which a miss used up (None: no run)


@dataclass(frozen=True)
class ArmSummary:
    label: str
    runs: int
    hits: int
    mean: float | None  # over the hits
    low: float | None  # the 95 % interval (None with fewer than 2 hits)
    high: float | None
    max_samples: int | None

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.runs if self.runs else None

    @property
    def always_hit(self) -> bool:
        return self.runs >= 2 and self.hits == self.runs

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
        return text + f" (95 % interval {self.low:,.0f} to {self.high:,.0f})"


@dataclass(frozen=True)
class Verdict:
    arms: tuple[ArmSummary, ...]
    winner: str | None  # the winning arm's label
    line: str  # the one-line verdict


@functools.cache
def t_quantile(p: float, df: int) -> float:
    """The p quantile of Student's t with df degrees of freedom (p > 0.5), by bisection on its CDF (cached: the
    power benchmark asks for the same few quantiles many thousand times)."""
    low, high = 0.0, 1.0
    while _t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0: 1 - I_x(df/2, 1/2) / 2 with x = df / (df + t²)."""
    return 1.0 - 0.5 * _incomplete_beta(df / (df + t * t), df / 2, 0.5)


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b) (continued fraction, modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below this point
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    return front * _beta_fraction(x, a, b) / a


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of I_x(a, b), evaluated by the modified Lentz method."""
    tiny = 1e-300

    def step(num: float, c: float, d: float) -> tuple[float, float]:
        d = 1.0 + num * d
        c = 1.0 + num / c
        return (c if abs(c) > tiny else tiny), 1.0 / (d if abs(d) > tiny else tiny)

    c, d = 1.0, 1.0 / (1.0 - (a + b) * x / (a + 1))
    h = d
    for m in range(1, 400):
        c, d = step(m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)), c, d)
        h *= c * d
        c, d = step(-(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)), c, d)
        h *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return h


def summarize(runs: ArmRuns) -> ArmSummary:
    """Hit rate, mean samples to target over the hits, and its 95 % t interval."""
    hits = [s for s in runs.samples_to_target if s is not None]
    mean = statistics.fmean(hits) if hits else None
    low = high = None
    if len(hits) >= 2:
        half = t_quantile((1 + LEVEL) / 2, len(hits) - 1) * statistics.stdev(hits) / math.sqrt(len(hits))
        low, high = mean - half, mean + half
    return ArmSummary(runs.label, len(runs.samples_to_target), len(hits), mean, low, high, runs.max_samples)


def decide(arms: Sequence[ArmRuns]) -> Verdict:
    """Each arm's summary and the one-line verdict (see the module docstring for the rule)."""
    summaries = tuple(summarize(a) for a in arms)
    candidates = sorted((s for s in summaries if s.always_hit), key=lambda s: s.mean)
    if not candidates:
        return Verdict(summaries, None, f"{NO_WINNER}: no arm reached the target in every one of at least 2 runs")
    best, beaten = candidates[0], []
    for other in (s for s in summaries if s is not best):
        how, why_not = _beats(best, other)
        if why_not:
            return Verdict(summaries, None, f"{NO_WINNER}: {why_not}")
        beaten.append(how)
    return Verdict(summaries, best.label, f"{best.label} wins: its 95 % interval lies below {'; '.join(beaten)}")


def _beats(best: ArmSummary, other: ArmSummary) -> tuple[str, str | None]:
    """(how `best` beats `other`, None) or ("", why it does not)."""
    if not other.runs:
        return "", f"{other.label} has no completed run"
    if other.runs >= 2 and other.hits == 0:
        if other.max_samples is not None and best.high < other.max_samples:
            return f"{other.label}'s sample budget ({other.max_samples:,}), which none of its runs reached", None
        return "", f"{best.label}'s interval reaches the sample budget that {other.label}'s runs all used up"
    if other.low is None:
        return "", f"{other.label} reached the target in {other.hits} of {other.runs} run(s): no interval"
    if best.high < other.low:
        return f"{other.label}'s", None
    if other.high < best.low:
        missed = other.runs - other.hits
        return "", f"{other.label} needs fewer samples when it reaches the target, but missed it in {missed} run(s)"
    return "", f"the intervals of {best.label} and {other.label} overlap"


def arm_runs(spec, best: Mapping[str, object], trials: Sequence[object]) -> list[ArmRuns]:
    """The evidence of every arm of `spec` from its stored trials: the best tuning trial of each arm as the
    storage chose it (`best` maps an arm's label to it, as `best_per_arm` does; None is the key without
    compare) and that configuration's finished confirmation trials."""
    evidence = []
    for fixed in arms(spec):
        key = arm_label(fixed) if fixed else None
        label, top = key or "all", best.get(key)
        if top is None:
            evidence.append(ArmRuns(label, (), None))
            continue
        confirmations = [t for t in trials if t.kind is TrialKind.CONFIRMATION and t.arm == top.arm
                         and t.params == top.params and t.state.finished and not _bad_data(t)]  # fmt: skip
        tuned = (top,) if _full_run(top) else ()
        runs = tuple(_reached(t) for t in (*tuned, *confirmations))
        evidence.append(ArmRuns(label, runs, trial_config(spec, top.params).budget.max_samples))
    return evidence


def _full_run(trial) -> bool:
    """The trial ran its configuration's full sample budget, or reached the target before its own end."""
    return getattr(trial, "budget", 1.0) >= 1.0 - 1e-9 or _reached(trial) is not None


def _reached(trial) -> int | None:
    return trial.samples_to_target if trial.state is TrialState.COMPLETED else None


def _bad_data(trial) -> bool:
    return (trial.metrics or {}).get("error") in NOT_HYPERPARAMETER_ERRORS


def verdict_lines(verdict: Verdict, confirm_seeds: int) -> list[str]:
    """The verdict as printed: what the numbers are made of, one line per arm, and the verdict line."""
    made_of = f"the best configuration + {confirm_seeds} confirmation seed(s)" if confirm_seeds else (
        "the best configuration only; budget.confirm_seeds re-runs it with other seeds"
    )  # fmt: skip
    lines = [f"samples to target per arm ({made_of}):"]
    lines += [f"  {arm.describe()}" for arm in verdict.arms]
    lines.append(f"verdict: {verdict.line}")
    return lines
