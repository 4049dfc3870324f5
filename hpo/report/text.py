"""The batch-size view as text lines for the terminal: what the report's "Batch sizes" section shows for an
experiment whose arms span global batch sizes (a batch-scaling study), so a benchmark can quote a command's output.

`hpo report` prints `study_lines` after writing the pages; `hpo import rcp` prints the `fit_line` of its reference
curve. The numbers are the page's (`scaling.scaling_points`, `scaling_fits`, `batch_verdicts`), formatted alike.
"""

from __future__ import annotations

from hpo.evidence.batch_scaling import WELL, BatchScaling
from hpo.evidence.verdict import DEFAULT_MARGIN
from hpo.experiment.arms import batch_study
from hpo.report.batch_view import fmt_estimate, fmt_steps, shared_note, well_measured
from hpo.report.data import ExperimentData
from hpo.report.markup import fmt_interval, fmt_noise, fmt_samples
from hpo.report.scaling import ScalingPoint, batch_verdicts, experiment_runs, scaling_fits, scaling_points


def point_line(p: ScalingPoint) -> str:
    """`lamb at batch 512: 3 of 3 runs reached the target; samples 49,504 (95 % ...); steps 96.7 (...); noise ...`."""
    ev = p.evidence
    text = f"{p.optimizer} at batch {p.global_batch_size:,}: {ev.hits} of {ev.runs} run(s) reached the target"
    if ev.mean is not None:
        text += (f"; samples to target {fmt_samples(ev.mean)} ({fmt_interval(ev.low, ev.high)}), optimizer steps "
                 f"{fmt_steps(ev, p.global_batch_size)}")  # fmt: skip
    if p.noise_scale is not None:
        bound = "≥ " if p.noise_lower_bounds else ""
        text += (f"; noise scale {bound}{fmt_noise(p.noise_scale)} ({fmt_noise(p.noise_low)} to "
                 f"{fmt_noise(p.noise_high)}, {p.noise_trials} trials), batch / noise scale "
                 f"{p.global_batch_size / p.noise_scale:.2g}x")  # fmt: skip
    return text


def fit_line(series: str, fit: BatchScaling) -> str:
    """The fit of one optimizer (or import): E_min, B_crit, S_min with their 95 % intervals, where the batch stops
    scaling well by the fit and by the means alone."""
    if not fit.fitted:
        return f"fit of {series}: none ({fit.reason})"
    note = f"; {fit.note}" if fit.note else ""
    missed = f", {fit.misses} missed (left out)" if fit.misses else ""
    return (f"fit of {series} (hpo.evidence.batch_scaling, {fit.runs - fit.misses} runs at {len(fit.points)} batch "
            f"sizes{missed}): E_min {fmt_estimate(fit.e_min)}, B_crit "
            f"{fmt_estimate(fit.b_crit)}, S_min {fmt_estimate(fit.s_min)} steps; within {WELL:g}x E_min up to "
            f"B_crit / 2 = {fmt_estimate(fit.well)} (95 % intervals); measured, the largest batch within {WELL:g}x "
            f"the smallest mean: {well_measured(fit)}{note}")  # fmt: skip


def study_lines(data: ExperimentData) -> list[str]:
    """The batch-size view of one experiment as lines; none when its arms do not span two batch sizes."""
    points = scaling_points([data], experiment_runs([data]))
    if len({p.global_batch_size for p in points}) < 2:
        return []
    margin = data.verdict.margin if data.verdict else DEFAULT_MARGIN
    verdicts = batch_verdicts(points, margin, data.declared_batch_sizes) if batch_study(data.compare) else {}
    lines = [f"batch sizes of {data.name} (each arm's best configuration's confirmation runs):"]
    lines += [f"  {point_line(p)}" for p in points]
    lines += [f"  {fit_line(series, fit)}" for series, fit in scaling_fits(points).items()]
    shared = shared_note(next(iter(verdicts.values())).shared) if verdicts else ""
    lines += [f"  verdict at batch {batch:,} ({shared}): {verdict.line}"
              for batch, verdict in verdicts.items()]  # fmt: skip
    return lines
