"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no pyplot: its global state is
not safe in the server's worker threads) and returned as base64 PNG for an `<img src="data:...">`.

Misses are drawn as misses: an `x` on a strip above the plotted values labelled "missed" (or at the sample
budget), never at their penalty value, so a penalty never stretches an axis. Points are drawn for at most
MAX_DRAWN trials per arm (hpo.report.data.drawn_positions); lines, bands and error bars use every trial.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from hpo.evidence.batch_scaling import WELL, BatchScaling
from hpo.report.bands import Band, band_over_cost, band_over_trials
from hpo.report.data import MAX_DRAWN, ArmData, Dimension, ExperimentData, TrialRow, drawn_positions
from hpo.report.scaling import ScalingPoint, optimizers, scaling_fits

DPI = 90
FILE_DPI = 150
MISS_COLOR = "#b40426"
MAX_EFFECT_PANELS = 12
FIXED = "_hpo_fixed_margins"  # set on a figure laid out by `fixed_margins`


def png(fig: Figure) -> str:
    """The figure as a base64 PNG."""
    return base64.b64encode(png_bytes(fig)).decode("ascii")


def png_bytes(fig: Figure, dpi: int = DPI) -> bytes:
    """The figure as PNG file contents (`hpo report --png` asks for FILE_DPI: sharp on slides and in papers). A
    figure without fixed margins (`fixed_margins`) is laid out as it draws (bbox_inches="tight" draws it twice)."""
    buffer = io.BytesIO()
    if fig.get_layout_engine() is None and not getattr(fig, FIXED, False):
        fig.set_layout_engine("tight")
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def fixed_margins(
    fig: Figure, *, note: bool = False, right: float = 0.65, top: float = 0.5, wspace: float = 1.3, hspace: float = 0.75
) -> None:
    """Margins in inches, the same at every figure size, instead of a tight layout: measuring the tick labels for
    one costs as much as drawing the figure (about 0.9 s of the five figures of a 10,000-trial report). Room for
    tick labels and an axis label on the left, the "missed" strip's label on the right (`right`), the title on
    top (`top`), and with `note` a line of small text under the axes. `wspace`/`hspace`: inches between panels
    (the left panel's "missed" label, the right one's tick labels and axis label)."""
    width, height = fig.get_size_inches()
    bottom = 0.65 + (0.15 if note else 0.0)
    rows, cols = fig.axes[0].get_subplotspec().get_gridspec().get_geometry() if fig.axes else (1, 1)
    left_in = 0.85
    panel_w = (width - left_in - right - (cols - 1) * wspace) / cols
    panel_h = (height - bottom - top - (rows - 1) * hspace) / rows
    fig.subplots_adjust(left=left_in / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=wspace / panel_w, hspace=hspace / panel_h)  # fmt: skip
    setattr(fig, FIXED, True)  # (set_layout_engine("none") leaves a figure without an engine as it is: None)


def arm_colors(labels: Sequence[str]) -> dict[str, str]:
    from matplotlib import colormaps

    palette = colormaps["tab10"].colors
    return {label: _hex(palette[i % len(palette)]) for i, label in enumerate(labels)}


def _hex(rgb) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in rgb[:3])


def _value_label(data: ExperimentData) -> str:
    return {"samples_to_target": "samples to target", "time_to_target_s": "seconds to target"}.get(
        data.metric, data.metric
    )


def best_of(label: str) -> str:
    """`best samples to target`; a name that says best already stays as it is (`best_mlm_accuracy`, not "best
    best_mlm_accuracy")."""
    return label if label.startswith("best") else f"best {label}"


# --------------------------------------------------------------------------- best so far


def best_so_far_figure(data: ExperimentData) -> Figure:
    """Best measured objective against trials and against training samples (GPU-hours when trials ran on GPUs)."""
    fig = Figure(figsize=(12, 4.2))
    by_trials, by_cost = fig.subplots(1, 2)
    colors = arm_colors([a.label for a in data.arms])
    ran = [t for a in data.arms for t in a.tuning if t.outcome != "unfinished"]
    gpu = bool(ran) and all(t.gpus for t in ran)
    bands: dict = {by_trials: [], by_cost: []}
    for arm in data.arms:
        rows = [t for t in arm.tuning if t.outcome != "unfinished"]
        values = [t.value for t in rows]
        costs = [(t.duration_s or 0) * t.gpus / 3600 if gpu else t.samples for t in rows]
        bands[by_trials].append((band_over_trials(values, data.direction), colors[arm.label], arm.label))
        bands[by_cost].append((band_over_cost(values, costs, data.direction), colors[arm.label], arm.label))
        _draw_trials(by_trials, rows, drawn_positions(rows, data.direction), colors[arm.label])
    for ax, drawn in bands.items():
        _fit_limits(ax, [b for b, _, _ in drawn], [t.value for t in ran if t.value is not None])
        for band, color, label in drawn:
            _draw_band(ax, band, color, label)
    _miss_strip(by_trials)
    by_trials.xaxis.get_major_locator().set_params(integer=True)
    by_trials.set_xlabel("tuning trials of the arm, in the order they ran")
    by_cost.set_xlabel("GPU-hours used by the arm's trials" if gpu else "training samples used by the arm's trials")
    for ax in (by_trials, by_cost):
        ax.set_ylabel(f"{best_of(_value_label(data))} so far")
        ax.grid(alpha=0.3)
    by_trials.legend(loc="best", fontsize=8)
    fig.suptitle("Best so far per arm (line), 95 % bootstrap band over trial order (shaded); x: a missed trial")
    _points_note(fig, data)
    return fig


def _points_note(fig: Figure, data: ExperimentData, **margins) -> None:
    """Lay the figure out (`fixed_margins`), with a line at its foot where some arm has more tuning trials than are
    drawn as points."""
    note = any(len(a.tuning) > MAX_DRAWN for a in data.arms)
    fixed_margins(fig, note=note, **margins)
    if note:
        fig.text(0.5, 0.05 / fig.get_size_inches()[1], f"points: at most {MAX_DRAWN:,} trials per arm, its best and a "
                 "fixed stride over the rest", ha="center", va="bottom", fontsize=8, color="#555555")  # fmt: skip


def _fit_limits(ax, bands: Sequence[Band], values: Sequence[float]) -> None:
    """Y limits around every finite value drawn (an open band side is then drawn to the edge)."""
    finite = [v for b in bands for arr in (b.best, b.low, b.high) for v in arr[np.isfinite(arr)]] + list(values)
    if not finite:
        return
    low, high = min(finite), max(finite)
    pad = max((high - low) * 0.08, abs(high) * 0.05, 1e-9)
    ax.set_ylim(low - pad, high + pad)


def _draw_band(ax, band: Band, color: str, label: str) -> None:
    if not len(band.x):
        return
    bottom, top = ax.get_ylim()
    low = np.where(np.isneginf(band.low), bottom, band.low)
    high = np.where(np.isposinf(band.high), top, band.high)
    shown = np.isfinite(low) & np.isfinite(high)
    ax.fill_between(band.x, low, high, where=shown, color=color, alpha=0.18, step="post", linewidth=0)
    ax.step(band.x, band.best, where="post", color=color, label=label, linewidth=2)
    ax.set_ylim(bottom, top)


def _draw_trials(ax, rows: Sequence[TrialRow], shown: Sequence[int], color: str) -> None:
    """The trials at positions `shown`, each at its place in the order, its value as a faint dot; misses and
    failures as an x on the top strip."""
    measured = [(i + 1, rows[i].value) for i in shown if rows[i].value is not None]
    if measured:
        ax.scatter(*zip(*measured, strict=True), s=12, color=color, alpha=0.45, linewidths=0)
    missed = [i + 1 for i in shown if rows[i].value is None]
    ax.scatter(missed, [1.02] * len(missed), transform=ax.get_xaxis_transform(), marker="x", s=22,
               color=color, clip_on=False)  # fmt: skip


def _miss_strip(ax) -> None:
    ax.text(1.0, 1.02, " missed", transform=ax.transAxes, va="center", ha="left", fontsize=8, color=MISS_COLOR)


# --------------------------------------------------------------------------- learning curves


def learning_curves_figure(data: ExperimentData) -> Figure:
    """Masked-LM accuracy of each arm's top trials against samples and against training time, with the target."""
    fig = Figure(figsize=(12, 4.2))
    by_samples, by_time = fig.subplots(1, 2)
    colors = arm_colors([a.label for a in data.arms])
    styles = ("-", "--", ":")
    for arm in data.arms:
        for rank, row in enumerate(data.top(arm)):
            curve = data.curves.get(row.number)
            if curve is None or not curve.mlm_accuracy:
                continue
            label = f"{arm.label}: trial {row.number}"
            style = dict(color=colors[arm.label], linestyle=styles[rank % len(styles)], marker=".", label=label)
            by_samples.plot(curve.eval_samples, curve.mlm_accuracy, **style)
            by_time.plot(curve.eval_time_s, curve.mlm_accuracy, **style)
    for ax, xlabel in ((by_samples, "training samples"), (by_time, "training seconds (evaluation included)")):
        ax.axhline(data.target_mlm_accuracy, color="black", linewidth=1, linestyle="-.", label="target")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("masked-LM accuracy (eval set)")
        ax.grid(alpha=0.3)
    by_samples.legend(loc="best", fontsize=7)
    fig.suptitle(f"Learning curves of the top {len(styles)} tuning trials per arm; dash-dot: the target")
    fixed_margins(fig, right=0.3)
    return fig


# --------------------------------------------------------------------------- samples to target


def outcomes_figure(data: ExperimentData) -> Figure:
    """Every finished run's measured value per arm (tuning o, confirmation ◆), the verdict's mean and 95 %
    interval, and the runs that missed (x above the budget line)."""
    fig = Figure(figsize=(max(8, 2.2 * len(data.arms) + 2), 4.2))
    ax = fig.subplots()
    colors = arm_colors([a.label for a in data.arms])
    rng = np.random.default_rng(0)
    for i, arm in enumerate(data.arms):
        _arm_strip(ax, i, arm, colors[arm.label], rng, data.direction)
    ax.set_xticks(range(len(data.arms)), [a.label for a in data.arms], fontsize=8)
    ax.set_xlim(-0.6, len(data.arms) - 0.4)
    ax.set_ylabel(_value_label(data))
    if data.metric == "samples_to_target":
        ax.axhline(data.max_samples, color=MISS_COLOR, linewidth=1, linestyle=":")
        ax.text(-0.55, data.max_samples, f" sample budget {data.max_samples:,}", va="bottom", fontsize=8,
                color=MISS_COLOR)  # fmt: skip
    _miss_strip(ax)
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(
        "Per arm: o tuning trial, ◆ confirmation seed, bar: mean and 95 % interval; x: missed/failed", fontsize=10
    )
    _points_note(fig, data)
    return fig


def _arm_strip(ax, i: int, arm: ArmData, color: str, rng, direction: str) -> None:
    tuning = [t for t in arm.tuning if t.outcome not in ("unfinished", "bad data")]
    confirmations = [t for t in arm.trials if t.kind != "tuning" and t.outcome not in ("unfinished", "bad data")]
    finished = sorted([tuning[k] for k in drawn_positions(tuning, direction)] + confirmations, key=lambda t: t.number)
    for kind, marker in (("tuning", "o"), ("confirmation", "D")):
        points = [t.value for t in finished if t.kind == kind and t.value is not None]
        ax.scatter(i + rng.uniform(-0.18, 0.18, len(points)), points, marker=marker, s=18, color=color, alpha=0.6)
    missed = [t for t in finished if t.value is None]
    ax.scatter(i + rng.uniform(-0.18, 0.18, len(missed)), [1.02] * len(missed), marker="x", s=22, color=color,
               transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
    ev = arm.evidence
    if ev is not None and ev.mean is not None:
        err = None if ev.low is None else [[ev.mean - ev.low], [ev.high - ev.mean]]
        ax.errorbar([i + 0.3], [ev.mean], yerr=err, fmt="s", color="black", capsize=5, markersize=5)


# --------------------------------------------------------------------------- noise scale


def noise_figure(data: ExperimentData) -> Figure | None:
    """The noise scale over training of each arm's top trials against the trials' global batch size, and every
    trial's late-training noise scale against its global batch size; None when no trial measured it."""
    rows = [t for t in data.trials if t.noise_scale is not None]
    if not rows:
        return None
    fig = Figure(figsize=(12, 4.2))
    over_training, per_trial = fig.subplots(1, 2)
    colors = arm_colors([a.label for a in data.arms])
    for arm in data.arms:
        color = colors[arm.label]
        for row in data.top(arm):
            curve = data.curves.get(row.number)
            if curve is not None and curve.noise_scale:
                over_training.plot(curve.noise_samples, curve.noise_scale, color=color, alpha=0.8, marker=".",
                                   label=f"{arm.label}: trial {row.number}")  # fmt: skip
        for batch in arm.global_batch_sizes:
            over_training.axhline(batch, color=color, linestyle="--", linewidth=1)
        mine = [t for t in rows if t.arm == arm.label and t.global_batch_size]
        mine = [mine[k] for k in drawn_positions(mine, data.direction)]
        for bound, marker in ((False, "o"), (True, "^")):  # ^: only a lower bound (see data.py)
            some = [t for t in mine if bool(t.noise_lower_bound) is bound]
            if not some:
                continue
            per_trial.scatter(
                [t.global_batch_size for t in some],
                [t.noise_scale for t in some],
                color=color,
                s=18,
                alpha=0.7,
                marker=marker,
                label=f"{arm.label}{' (lower bound)' if bound else ''}",
            )
    over_training.set_xlabel("training samples")
    over_training.set_ylabel("noise scale B_simple (smoothed)")
    over_training.set_yscale("log")
    over_training.legend(loc="best", fontsize=7)
    _diagonal(per_trial, [t.global_batch_size for t in rows if t.global_batch_size] + [t.noise_scale for t in rows])
    per_trial.set_xlabel("the trial's global batch size")
    per_trial.set_ylabel("noise scale, median over the 2nd half")
    per_trial.legend(loc="best", fontsize=7)
    for ax in (over_training, per_trial):
        ax.grid(alpha=0.3, which="both")
    fig.suptitle("Gradient noise scale: dashed (left) / diagonal (right) = the global batch size; ^ a lower bound")
    _points_note(fig, data)
    return fig


def _diagonal(ax, values: Sequence[float]) -> None:
    """Log axes and the line batch = noise scale: points below it are trials whose batch exceeds B_simple."""
    low, high = min(values) / 1.5, max(values) * 1.5
    ax.plot([low, high], [low, high], color="gray", linestyle="--", linewidth=1, label="noise scale = batch")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")


# --------------------------------------------------------------------------- hyperparameter effects


def effects_figure(data: ExperimentData) -> Figure | None:
    """The measured objective against each tuned hyperparameter, per arm (misses on the top strip)."""
    dims = [d for d in data.dimensions if d.name not in data.compare][:MAX_EFFECT_PANELS]
    if not dims:
        return None
    cols = min(3, len(dims))
    nrows = math.ceil(len(dims) / cols)
    fig = Figure(figsize=(4 * cols, 3.2 * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, cols)).ravel()
    colors = arm_colors([a.label for a in data.arms])
    rng = np.random.default_rng(0)
    for ax, dim in zip(axes, dims, strict=False):
        for arm in data.arms:
            _effect(ax, dim, arm.tuning, colors[arm.label], rng, data.direction)
        ax.set_title(dim.name, fontsize=9)
        ax.set_ylabel(_value_label(data), fontsize=8)
        ax.grid(alpha=0.3)
        _miss_strip(ax)
    for ax in axes[len(dims) :]:
        ax.set_visible(False)
    for arm in data.arms:  # an empty scatter per arm names the colors
        axes[0].scatter([], [], color=colors[arm.label], label=arm.label)
    axes[0].legend(loc="best", fontsize=7)
    fig.suptitle("Objective against each hyperparameter (tuning trials); x on top: missed or failed")
    _points_note(fig, data, top=0.75, wspace=1.2, hspace=0.9)
    return fig


def _effect(ax, dim: Dimension, rows: Sequence[TrialRow], color: str, rng, direction: str) -> None:
    rows = [t for t in rows if t.outcome not in ("unfinished", "bad data") and dim.name in t.params]
    rows = [rows[k] for k in drawn_positions(rows, direction)]
    if dim.kind == "choice":
        xs = [dim.choices.index(t.params[dim.name]) + rng.uniform(-0.15, 0.15) for t in rows]
        ax.set_xticks(range(len(dim.choices)), [str(c) for c in dim.choices], fontsize=8)
    else:
        xs = [t.params[dim.name] for t in rows]
        if dim.log:
            ax.set_xscale("log")
    hits = [(x, t.value) for x, t in zip(xs, rows, strict=True) if t.value is not None]
    if hits:
        ax.scatter(*zip(*hits, strict=True), s=14, color=color, alpha=0.7)
    missed = [x for x, t in zip(xs, rows, strict=True) if t.value is None]
    ax.scatter(missed, [1.02] * len(missed), marker="x", s=18, color=color, transform=ax.get_xaxis_transform(),
               clip_on=False)  # fmt: skip


# --------------------------------------------------------------------------- several experiments


def scaling_figure(points: Sequence[ScalingPoint], fits: dict[str, BatchScaling] | None = None) -> Figure:
    """Samples to target (mean, 95 % interval, hits/runs) and the measured noise scale against global batch size,
    one line per optimizer; where an optimizer's runs could be fitted (hpo.evidence.batch_scaling; `fits` as
    scaling.scaling_fits gives them), the fitted E(B) = E_min (1 + B / B_crit) dashed over its points, with a
    diamond where it reaches 1.5 E_min (B = B_crit / 2)."""
    fig = Figure(figsize=(12, 4.4))
    stt, noise = fig.subplots(1, 2)
    names = optimizers(points)
    reference = {p.optimizer for p in points if p.reference}  # MLPerf's reference curve (an RCP import): black
    colors = arm_colors([n for n in names if n not in reference]) | dict.fromkeys(reference, "#000000")
    fits = scaling_fits(points) if fits is None else fits
    batches = [p.global_batch_size for p in points]
    for name in names:
        mine = [p for p in points if p.optimizer == name]
        _scaling_line(stt, mine, colors[name], name, "s" if name in reference else "o")
        if fits.get(name) is not None and fits[name].fitted:
            _fitted_curve(stt, fits[name], (min(batches) / 1.5, max(batches) * 1.5), colors[name], name)
        measured = [p for p in mine if p.noise_scale is not None]
        if measured:
            xs = [p.global_batch_size for p in measured]
            ys = [p.noise_scale for p in measured]
            err = [[p.noise_scale - p.noise_low for p in measured], [p.noise_high - p.noise_scale for p in measured]]
            noise.errorbar(xs, ys, yerr=err, color=colors[name], marker="o", capsize=4, label=name)
    measured = [v for p in points for v in (p.noise_low, p.noise_high) if v is not None]
    if measured:
        _diagonal(noise, batches + measured)
    else:
        noise.text(0.5, 0.5, "no noise scale measured\n(needs several ranks or gradient accumulation)",
                   ha="center", va="center", transform=noise.transAxes)  # fmt: skip
    stt.set_xscale("log", base=2)
    means = [p.evidence.mean for p in points if p.evidence.mean]
    if means and max(means) > 100 * min(means):  # e.g. MLPerf's reference beside a tiny model: both readable
        stt.set_yscale("log")
    if batches:  # the misses' x marks need the batch sizes on the axis even when nothing reached the target
        stt.set_xlim(min(batches) / 1.5, max(batches) * 1.5)
    if all(p.evidence.mean is None for p in points):
        stt.text(0.5, 0.5, "no run reached the target\nat any batch size", ha="center", va="center",
                 transform=stt.transAxes)  # fmt: skip
    stt.set_xlabel("global batch size")
    stt.set_ylabel("samples to target (mean over the runs that reached it)")
    if any(p.evidence.mean is None for p in points):  # the strip of the sizes where every run missed
        _miss_strip(stt)
    noise.set_xlabel("global batch size")
    noise.set_ylabel("noise scale B_simple (median; bar: min to max)")
    for ax in (stt, noise):
        ax.grid(alpha=0.3, which="both")
        if ax.get_legend_handles_labels()[0]:  # no noise scale measured: nothing to name
            ax.legend(loc="best", fontsize=8)
    fig.suptitle("Samples to target and the measured noise scale against global batch size, per optimizer")
    return fig


def _scaling_line(ax, points: Sequence[ScalingPoint], color: str, name: str, marker: str = "o") -> None:
    hits = [p for p in points if p.evidence.mean is not None]
    if hits:
        xs = [p.global_batch_size for p in hits]
        ys = [p.evidence.mean for p in hits]
        err = [[p.evidence.mean - p.evidence.low if p.evidence.low is not None else 0 for p in hits],
               [p.evidence.high - p.evidence.mean if p.evidence.high is not None else 0 for p in hits]]  # fmt: skip
        ax.errorbar(xs, ys, yerr=err, color=color, marker=marker, capsize=4, label=name)
        for p in hits:
            ax.annotate(f"{p.evidence.hits}/{p.evidence.runs}", (p.global_batch_size, p.evidence.mean),
                        textcoords="offset points", xytext=(6, 4), fontsize=7, color=color)  # fmt: skip
    missed = [p.global_batch_size for p in points if p.evidence.mean is None]
    ax.scatter(missed, [1.02] * len(missed), marker="x", s=30, color=color, transform=ax.get_xaxis_transform(),
               clip_on=False)  # fmt: skip


def _fitted_curve(ax, fit: BatchScaling, span: tuple[float, float], color: str, name: str) -> None:
    """The fitted samples to target over `span` (dashed), and a diamond at B_crit / 2 where E = 1.5 E_min."""
    xs = np.geomspace(*span, 100)
    ys = [fit.samples(x) for x in xs]
    crit = fit.b_crit.value
    shown = "∞" if math.isinf(crit) else f"{crit:,.0f}" if crit >= 100 else f"{crit:.3g}"
    ax.plot(xs, ys, color=color, linestyle="--", linewidth=1.2, label=f"{name}: fit, B_crit {shown}")
    if span[0] <= fit.well.value <= span[1]:
        ax.plot([fit.well.value], [fit.samples(fit.well.value)], marker="D", color=color, markersize=6,
                linestyle="none", label=f"{name}: {WELL:g} × E_min at B_crit / 2")  # fmt: skip
