"""The batch-size view, on an experiment's page (its arms at two or more batch sizes) and on the comparison page:
samples and steps to target per batch size, the fit of `hpo.evidence.batch_scaling` with its intervals, and the
verdict at each batch size."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from html import escape
from typing import TYPE_CHECKING

from hpo.evidence.batch_scaling import WELL, BatchScaling, Estimate
from hpo.evidence.verdict import ALPHA, DEFAULT_MARGIN, ArmSummary
from hpo.experiment.arms import batch_study
from hpo.report.data import (
    ExperimentData,
)
from hpo.report.markup import cell, fmt_interval, fmt_noise, fmt_samples, html_table, img, tagged
from hpo.report.scaling import ScalingPoint, batch_verdicts, experiment_runs, scaling_fits, scaling_points

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def scaling_notes(experiments: Sequence[ExperimentData]) -> str:
    notes = ["One point per arm: its optimizer and global batch size, the mean samples to target over its runs that "
             "reached the target (the best configuration's confirmation seeds) with the 95 % t interval, the "
             "hit rate, and the noise scale measured by the arm's trials at that batch size (median, minimum to "
             "maximum). Where the noise scale sits far below the batch, a larger batch buys little."]  # fmt: skip
    if any(d.confirm_seeds != "auto" and d.confirm_seeds < 2 for d in experiments):
        notes.append("Some experiments ran fewer than 2 confirmation seeds: their points have no interval.")
    if any(d.imported for d in experiments):
        notes.append("Imported experiments (hpo import) are lines of their own, named after them, never pooled with "
                     "the experiments that ran here. MLPerf's reference (an RCP import, black squares) is BERT-large "
                     "on MLPerf's data to 0.720 masked-LM accuracy: its shape, not its numbers, is what compares with "
                     "another model or data set.")  # fmt: skip
    return "".join(f"<p class=note>{escape(n)}</p>" for n in notes)


def scaling_table(points: Sequence[ScalingPoint]) -> str:
    rows = []
    for p in points:
        key = f"{p.experiment}/{p.arm}"
        ev = p.evidence
        noise = (
            "–"
            if p.noise_scale is None
            else f"{'≥ ' if p.noise_lower_bounds else ''}{fmt_noise(p.noise_scale)} ({fmt_noise(p.noise_low)} to "
            f"{fmt_noise(p.noise_high)})"
            + (f"; lower bound: {p.noise_lower_bounds} of {p.noise_trials} estimates" if p.noise_lower_bounds else "")
        )
        ratio = "–" if p.noise_scale is None else f"{p.global_batch_size / p.noise_scale:.2g}×"
        steps = fmt_steps(ev, p.global_batch_size)
        fields = [("batch", f"{p.global_batch_size:,}"), ("experiment", p.experiment), ("arm", p.arm),
                  ("hits", f"{ev.hits} of {ev.runs}"), ("mean", fmt_samples(ev.mean)),
                  ("interval", fmt_interval(ev.low, ev.high)), ("steps", steps), ("noise", noise),
                  ("ratio", ratio)]  # fmt: skip
        rows.append(tagged(key, p.optimizer, fields))
    head = ["optimizer", "global batch", "experiment", "arm", "reached target", "mean samples to target",
            "95 % interval", "optimizer steps to target (95 %)", "noise scale", "batch / noise scale"]  # fmt: skip
    return html_table(head, rows)


def verdicts_by_batch(points: Sequence[ScalingPoint], margin: float, declared: Collection[int] = ()) -> str:
    """Per global batch size with two or more optimizers: the verdict between them (`scaling.batch_verdicts`, the
    error shared over the batch sizes compared and those `declared`)."""
    verdicts = batch_verdicts(points, margin, declared)
    if not verdicts:
        return ""
    rows = [cell(f"{batch:,}", "batch_verdict_batch", str(batch))
            + cell(verdict.outcome.value, "batch_verdict_outcome", str(batch))
            + cell(verdict.line, "batch_verdict_line", str(batch), "l")
            for batch, verdict in verdicts.items()]  # fmt: skip
    return ("<h2>The verdict at each batch size</h2><p>At each global batch size, the optimizers' runs there (the "
            "best configuration's confirmation runs of each arm) compared by the verdict's rule (Welch on ln samples "
            f"to target; margin ±{100 * margin:g} %). {_shared(next(iter(verdicts.values())).shared)}</p>"
            + html_table(["global batch", "outcome", "verdict"], rows))  # fmt: skip


def shared_note(shared: int) -> str:
    """The error of the verdicts at each batch size, for a line: `the error shared over 3 batch sizes`."""
    return f"the error shared over {shared} batch sizes" if shared > 1 else "one batch size compared"


def _shared(compared: int) -> str:
    """How the verdicts at each batch size share the error (`Verdict.shared` of them)."""
    spent = "spent over the confirmation rounds as the experiment's verdict spends it"
    if compared == 1:
        return f"One batch size is compared: its verdict has the whole {100 * ALPHA:g} % ({spent})."
    return (
        f"The error is shared over the {compared} batch sizes (each tested at 1 / {compared} of the "
        f"{100 * ALPHA:g} %, {spent}), so all of them together name a wrong winner in at most 5 %."
    )


BATCH_FIGURE = "samples to target and noise scale against batch size"  # the figure's alt text
BatchSizes = tuple[list[ScalingPoint], dict[str, BatchScaling]]  # an experiment's batch-size view: points, fits


def batch_sizes(data: ExperimentData) -> BatchSizes | None:
    """The points and per-optimizer fits of an experiment's batch-size view; None unless its arms ran at two or more
    global batch sizes (a batch-scaling study)."""
    points = scaling_points([data], experiment_runs([data]))
    if len({p.global_batch_size for p in points}) < 2:
        return None
    return points, scaling_fits(points)


def batch_study_view(data: ExperimentData, sizes: BatchSizes | None, figure: Figure | None) -> str:
    """An experiment whose arms ran at two or more global batch sizes (`sizes`, as `batch_sizes` reads them): the
    comparison page's batch-size view of its own arms (`figure`: `figures.scaling_figure` of them), and the verdict
    at each batch size."""
    if sizes is None:
        return ""
    points, fits = sizes
    margin = data.verdict.margin if data.verdict else DEFAULT_MARGIN
    drawn = img(figure, BATCH_FIGURE) if figure is not None else ""
    verdicts = verdicts_by_batch(points, margin, data.declared_batch_sizes) if batch_study(data.compare) else ""
    return ("<h2>Batch sizes</h2>" + scaling_notes([data]) + scaling_table(points) + drawn
            + fit_section(points, fits) + verdicts)  # fmt: skip


def fmt_steps(evidence: ArmSummary, batch: int) -> str:
    """Mean optimizer steps to target (samples / batch) with the interval's: `96.7 (90.1 to 103)`, `–` without."""
    if evidence.mean is None:
        return "–"
    steps = fmt_fit(evidence.mean / batch)
    if evidence.low is None:
        return steps
    return f"{steps} ({fmt_fit(evidence.low / batch)} to {fmt_fit(evidence.high / batch)})"


def fmt_fit(value: float | None) -> str:
    """A fitted quantity (samples, steps, batch sizes): whole numbers from 100 on, 3 significant digits below, ∞."""
    return "–" if value is None else "∞" if math.isinf(value) else fmt_noise(value)


def fmt_estimate(estimate: Estimate | None) -> str:
    """`value (low to high)`, the 95 % interval; 0 or ∞ where it is open."""
    if estimate is None:
        return "–"
    return f"{fmt_fit(estimate.value)} ({fmt_fit(estimate.low)} to {fmt_fit(estimate.high)})"


def fit_section(points: Sequence[ScalingPoint], fits: dict[str, BatchScaling]) -> str:
    rows = []
    for name, fit in fits.items():
        mine = [p for p in points if p.optimizer == name]
        fields = [("fit_runs", _fit_runs(fit)), ("fit_e_min", fmt_estimate(fit.e_min)),
                  ("fit_b_crit", fmt_estimate(fit.b_crit)), ("fit_s_min", fmt_estimate(fit.s_min)),
                  ("fit_well", fmt_estimate(fit.well)), ("fit_well_measured", well_measured(fit)),
                  ("fit_noise", _fit_noise(mine)), ("fit_note", fit.reason or fit.note or "")]  # fmt: skip
        rows.append(cell(name, cls="l") + "".join(cell(text, field, name, "l" if field == "fit_note" else "")
                                                 for field, text in fields))  # fmt: skip
    head = ["optimizer", "runs fitted", "E_min: samples to target, small batch (95 %)", "B_crit (95 %)",
            "S_min: steps to target, unlimited batch (95 %)", f"largest batch within {WELL:g}× E_min: B_crit / 2",
            f"largest measured batch within {WELL:g}× the smallest mean", "measured noise scale", "note"]  # fmt: skip
    return ("<h2>Where the batch stops scaling</h2><p>Per optimizer, samples to target E against global batch size B "
            "fitted with E(B) = E_min (1 + B / B_crit) (McCandlish et al. 2018: steps to target S = E / B = S_min "
            "(1 + B_crit / B), B_crit = E_min / S_min), by least squares on ln E over all its points' runs "
            "(dashed in the figure). Intervals: 95 % profile likelihood; an end at 0 or ∞ means the measured batches "
            f"do not bound it. Below B_crit / 2 a batch needs at most {WELL:g}× the samples of a small batch "
            "(scaling well); far above B_crit, about as many steps as an unlimited one. Runs that missed the target "
            "have no samples to target: they are left out and counted, which flatters the batch sizes where they "
            "happened. The measured rule reads the means alone: the largest batch whose mean is within "
            f"{WELL:g}× the smallest (with that mean's 95 % t interval). B_crit and the measured noise scale "
            "B_simple answer the same question in two ways (they agree up to a curvature factor); the fit needs "
            "runs at 3 or more batch sizes.</p>" + html_table(head, rows, left=1))  # fmt: skip


def _fit_runs(fit: BatchScaling) -> str:
    hits = fit.runs - fit.misses
    sizes = sum(1 for p in fit.points if p.hits)
    missed = f"; {fit.misses} missed (left out)" if fit.misses else ""
    return f"{hits} of {fit.runs} at {sizes} batch size(s){missed}"


def well_measured(fit: BatchScaling) -> str:
    p, low = fit.well_measured, fit.smallest
    if p is None:
        return "–"
    missed = f"; {p.misses} of {p.runs} missed" if p.misses else ""
    return (f"{p.batch:,.0f}: {fmt_samples(p.mean)} ({fmt_interval(p.low, p.high)}), smallest {fmt_samples(low.mean)} "
            f"at {low.batch:,.0f}{missed}")  # fmt: skip


def _fit_noise(points: Sequence[ScalingPoint]) -> str:
    """The points' median noise scales, per batch size: `16: 12.3; 64: 40.1`, `≥` where a lower bound."""
    measured = [p for p in points if p.noise_scale is not None]
    if not measured:
        return "–"
    return "; ".join(f"{p.global_batch_size:,}: {'≥ ' if p.noise_lower_bounds else ''}{fmt_noise(p.noise_scale)}"
                     for p in measured)  # fmt: skip
