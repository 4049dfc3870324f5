"""`hpo plan --power P` alone: advice on tuning trials. The file planned again at 0.5x and 2x its tuning trials
(and, for `confirm_seeds: auto`, at confirmation caps 6, 9 and 12), the same repetitions each: every cell's right
answers with their interval and median GPU-hours, and the cheapest cell whose right answers reach P."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

from hpo.experiment.arms import arm_labels
from hpo.plan.forecast import (
    WIDTH,
    Plan,
    Repetition,
    check_repetition_seeds,
    percentile_range,
    prepare_plan,
    right_answers,
    run_plan,
    share_interval,
)

TRIALS_FACTORS = (0.5, 1.0, 2.0)  # the trials advice's grid: the file's tuning trials times these
CONFIRM_CAPS = (6, 9, 12)  # and, for confirm_seeds: auto, these caps (budget.max_confirm_seeds)


@dataclass(frozen=True)
class TrialsCell:
    """The plan at one tuning budget and confirmation cap: its repetitions' right answers and cost (the advice)."""

    trials: int  # budget.trials (all arms together)
    per_arm: float
    max_confirm_seeds: int | None  # budget.max_confirm_seeds (confirm_seeds: auto); None: the file's fixed count
    right: int
    repetitions: int
    gpu_hours: float  # median to the verdict
    wall_hours: float


def check_advice_seeds(base: Plan) -> None:
    """Before any repetition runs: the advice's cells confirm with caps up to the largest of CONFIRM_CAPS, whose
    last confirmation runs must still take seeds the database keeps (`check_repetition_seeds`)."""
    budget = base.spec.budget
    caps = (*CONFIRM_CAPS, budget.most_confirm_seeds) if budget.sequential else (budget.most_confirm_seeds,)
    check_repetition_seeds(base.file_seeds, base.options, max(caps))


def advice_budgets(trials: int, arms: int, equal: bool = True) -> list[int]:
    """The tuning budgets of the trials advice: TRIALS_FACTORS times `trials`, at least 2 per arm and, `equal` (the
    file does not allow unequal arms), each a multiple of the arms, as `hpo run` requires (10 trials of 2 arms at
    0.5x is 4, not 5)."""
    if equal:
        return sorted({arms * max(round(trials * f / arms), 2) for f in TRIALS_FACTORS})
    return sorted({max(round(trials * f), 2 * arms) for f in TRIALS_FACTORS})


def trials_advice(base: Plan, known: Sequence[Repetition], jobs: int = 1, progress=None) -> list[TrialsCell]:
    """The plan `base` (its repetitions `known`, already run) over a small grid: TRIALS_FACTORS times its tuning trials
    (at least 2 per arm) and, when it confirms with `auto`, each cap of CONFIRM_CAPS; every cell with the same
    repetitions' seeds: how often it gives a right answer, and what it costs (`hpo plan --power` without a spread).
    `progress(done, total)` after each cell run here."""
    budget = base.spec.budget
    arms = max(len(arm_labels(base.spec)), 1)
    budgets = advice_budgets(budget.trials, arms, equal=base.spec.allow_unequal_arms is None)
    caps: list[int | None] = sorted({*CONFIRM_CAPS, budget.most_confirm_seeds}) if budget.sequential else [None]
    grid = [(trials, cap) for trials in budgets for cap in caps]
    cells = []
    for i, (trials, cap) in enumerate(grid):
        plan, repetitions = base, list(known)
        if trials != budget.trials or cap not in (None, budget.most_confirm_seeds):
            plan = prepare_plan(base.source, replace(base.options, trials=trials, max_confirm_seeds=cap))
            repetitions = run_plan(plan, jobs=jobs)
        if progress:
            progress(i + 1, len(grid))
        cells.append(TrialsCell(trials, trials / arms, cap, right_answers(plan, repetitions), len(repetitions),
                                percentile_range([r.answer_gpu_h for r in repetitions])[0],
                                percentile_range([r.answer_wall_h for r in repetitions])[0]))  # fmt: skip
    return cells


def advice_data(cells: Sequence[TrialsCell], power: float) -> list[dict]:
    """The --power table as `hpo plan --json` gives it: each cell with its right answers' 95 % interval, as printed,
    and whether they reach `power`."""
    return [asdict(c) | dict(zip(("low", "high"), share_interval(c.right, c.repetitions), strict=True))
            | {"reaches": c.right / c.repetitions >= power} for c in cells]  # fmt: skip


def trials_advice_lines(cells: Sequence[TrialsCell], power: float, confirm, by_batch: bool = False) -> list[str]:
    """The --power table over tuning budgets (and confirmation caps), and the advice to copy into the file
    (`by_batch`: a batch-size study's, right where the verdict at every batch size is)."""
    wanted = f"{power:.0%}"
    caps = sorted({c.max_confirm_seeds for c in cells if c.max_confirm_seeds is not None})
    capped = bool(caps)
    over = (f"its tuning trials x the confirmation cap (max_confirm_seeds {', '.join(map(str, caps))})"
            if capped else f"its tuning trials, confirm_seeds {confirm} kept")  # fmt: skip
    head = "budget.trials (per arm), cap" if capped else "budget.trials (per arm)"
    judged = "the verdict at every batch size right against the truth there" if by_batch else (
        "judged against the truth above")  # fmt: skip
    lines = [f"advice for a right answer in at least {wanted} of experiments ({judged}): the "
             f"file planned at {', '.join(f'{f:g}x' for f in TRIALS_FACTORS)} {over}",
             f"  {head:<{WIDTH - 2}}{'right':>14}{'95 % interval':>17}{'GPU-h':>10}{'wall h':>9}"]  # fmt: skip
    for c in cells:
        low, high = share_interval(c.right, c.repetitions)
        mark = f"  reaches {wanted}" if c.right / c.repetitions >= power else ""
        label = f"{c.trials} ({c.per_arm:g})" + (f", {c.max_confirm_seeds}" if capped else "")
        lines.append(f"  {label:<{WIDTH - 2}}{f'{c.right}/{c.repetitions}':>8}"
                     f"{c.right / c.repetitions:>6.0%}{f'{low:.0%} to {high:.0%}':>17}{c.gpu_hours:>10,.1f}"
                     f"{c.wall_hours:>9.2f}{mark}")  # fmt: skip
    enough = [c for c in cells if c.right / c.repetitions >= power]
    if enough:
        c = min(enough, key=lambda c: (c.gpu_hours, c.trials))
        cap = f", confirm_seeds: auto, max_confirm_seeds: {c.max_confirm_seeds}" if capped else ""
        lines.append(f"cheapest that reaches it: budget: {{trials: {c.trials}{cap}}}  ({c.per_arm:g} tuning trials "
                     f"per arm; median {c.gpu_hours:,.1f} GPU-hours to the verdict)")  # fmt: skip
    else:
        best = max(cells, key=lambda c: c.right / c.repetitions)
        where = f"budget.trials {best.trials}" + (f", max_confirm_seeds {best.max_confirm_seeds}" if capped else "")
        lines.append(f"none of these budgets reaches {wanted} (at most {best.right / best.repetitions:.0%}, at "
                     f"{where}): {_what_helps(cells)}")  # fmt: skip
    return lines


def _what_helps(cells: Sequence[TrialsCell]) -> str:
    """What the cells say would buy more right answers: more tuning trials where the right answers rose with them,
    more confirmation runs where they rose with the cap (a cap that changes nothing is not advised)."""
    right = {(c.trials, c.max_confirm_seeds): c.right / c.repetitions for c in cells}
    trials = sorted({t for t, _ in right})
    caps = sorted({cap for _, cap in right}, key=lambda cap: cap or 0)
    by_trials = any(right[(a, cap)] < right[(b, cap)] for cap in caps for a, b in zip(trials, trials[1:], strict=False))
    by_cap = any(right[(t, a)] < right[(t, b)] for t in trials for a, b in zip(caps, caps[1:], strict=False))
    more_trials = f"more tuning trials than {trials[-1]} (budget.trials)"
    more_runs = "more confirmation runs (see --cv/--like with --power for their chances)"
    if by_trials and not by_cap:
        capped = " (a larger confirmation cap changed no answer here)" if len(caps) > 1 else ""
        return f"{more_trials}: the right answers rose with the tuning trials{capped}"
    if by_cap and not by_trials:
        return f"{more_runs}: the right answers rose with the confirmation cap, not with the tuning trials"
    if by_trials:
        return f"{more_trials} and {more_runs}"
    return (
        "neither more tuning trials nor more confirmation runs changed an answer here: a larger sample budget "
        "(budget.max_samples), or see --cv/--like with --power for the confirmation runs' chances"
    )
