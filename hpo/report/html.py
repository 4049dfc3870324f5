"""The report pages: self-contained HTML (inline CSS, figures as data: URIs, no script, nothing fetched).

Every number on a page comes from `hpo.report.data` (the database) or from a computation on it named where it is
shown. Table cells that carry the report's key numbers are tagged `data-arm`/`data-field` so tests and scripts
can read them back. `link` turns an experiment name into the address of its report: a file name for `hpo report`,
the API path in the server.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Callable, Sequence
from html import escape

from hpo.engine.liveness import liveness
from hpo.engine.progress import experiment_progress, trials_done
from hpo.evidence.batch_scaling import WELL, BatchScaling, Estimate
from hpo.evidence.verdict import ALPHA, DEFAULT_MARGIN, ArmSummary, Outcome
from hpo.experiment.arms import BATCH_STUDY_NOTE, batch_study
from hpo.mlperf import imported_line
from hpo.report import figures
from hpo.report.data import (
    BEST_DRAWN,
    MAX_DRAWN,
    NOISE_CHECKED_RATIO,
    NOISE_UNDEFINED_SHARE,
    OUTCOMES,
    ArmRungs,
    ExperimentData,
    RungStep,
    TrialRow,
    load_experiment,
    top_trials,
)
from hpo.report.importance import MAX_TRIALS, MIN_TRIALS, Importance, rank_importance
from hpo.report.scaling import ScalingPoint, batch_verdicts, experiment_runs, scaling_fits, scaling_points
from hpo.storage.base import Storage

SMALL_ARM = 10  # fewer tuning trials per arm than this: the page says the experiment is small
LISTED_TRIALS = 500  # more trials than this: the trial table lists each arm's best and the confirmation runs only
LISTED_BEST = 10  # tuning trials per arm listed then
LISTED_CHAINS = 50  # promoted configurations listed per arm (multi-fidelity), those that went furthest first
Link = Callable[[str], str]

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1240px;color:#1b1b1b;
padding:0 16px;line-height:1.4}
h1{margin-bottom:2px}h2{margin-top:34px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#555;margin-top:0}.verdict{font-size:1.25em;padding:12px 16px;border-left:6px solid #3b75af;
background:#f2f6fb;margin:16px 0}.verdict.none{border-color:#b40426;background:#fbf2f2}
.note{padding:8px 12px;background:#fff8e1;border-left:4px solid #e0a800;margin:8px 0}
table{border-collapse:collapse;margin:8px 0;font-size:0.92em}th,td{border:1px solid #ddd;padding:4px 8px;
text-align:right;vertical-align:top}th{background:#f5f5f5}td.l,th.l{text-align:left}
img{max-width:100%;height:auto;display:block;margin:8px 0}code,pre{background:#f5f5f5;padding:2px 5px}
pre{padding:8px;overflow-x:auto}.bar{background:#3b75af;height:10px;display:inline-block}
details summary{cursor:pointer;font-weight:600}.muted{color:#777}
"""


# --------------------------------------------------------------------------- formatting


def fmt_samples(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def fmt_objective(value: float | None) -> str:
    return "–" if value is None else f"{value:,.6g}"


def fmt_accuracy(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def fmt_noise(value: float | None) -> str:
    """Noise scales span orders of magnitude: whole numbers from 100 on, 3 significant digits below."""
    return "–" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def fmt_trial_noise(t: TrialRow) -> str:
    """A trial's noise scale: the value, or `≥ value (lower bound: why)` where it is only a lower bound."""
    reason = t.noise_lower_bound
    return fmt_noise(t.noise_scale) if reason is None else f"≥ {fmt_noise(t.noise_scale)} (lower bound: {reason})"


def fmt_interval(low: float | None, high: float | None) -> str:
    return "–" if low is None or high is None else f"{low:,.0f} to {high:,.0f}"


def _td(text: str, field: str | None = None, arm: str | None = None, cls: str = "") -> str:
    attrs = (f' data-field="{escape(field)}"' if field else "") + (f' data-arm="{escape(arm)}"' if arm else "")
    return f"<td{attrs}{f' class={cls!r}' if cls else ''}>{escape(text)}</td>"


def _tagged(arm: str, label: str, fields: Sequence[tuple[str, str]]) -> str:
    """A row: the arm's label, then one cell per (field, text), each tagged with the arm and its field."""
    return _td(label, cls="l") + "".join(_td(text, field, arm) for field, text in fields)


def _table(head: Sequence[str], rows: Sequence[str], left: int = 1) -> str:
    cells = "".join(f"<th{' class=l' if i < left else ''}>{escape(h)}</th>" for i, h in enumerate(head))
    return f"<table><tr>{cells}</tr>{''.join(f'<tr>{r}</tr>' for r in rows)}</table>"


def _img(fig, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{figures.png(fig)}">' if fig is not None else ""


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{escape(title)}</title>"
            f"<meta name=viewport content='width=device-width,initial-scale=1'><style>{CSS}</style></head>"
            f"<body>{body}</body></html>")  # fmt: skip


# --------------------------------------------------------------------------- one experiment


def experiment_report(storage: Storage, name: str, *, hpo_command: str = "hpo", index: str | None = None) -> str:
    """The report of one experiment (see the package docstring)."""
    return experiment_page(load_experiment(storage, name), hpo_command=hpo_command, index=index)


def experiment_page(data: ExperimentData, *, hpo_command: str = "hpo", index: str | None = None) -> str:
    """The report of one experiment as `load_experiment` read it."""
    importance = {arm.label: rank_importance(arm.tuning, _tuned(data), data.direction) for arm in data.arms}
    drawn = report_figures(data)
    parts = [
        _header(data, index),
        _notes(data),
        _verdict_section(data),
        _batch_study(data),
        _outcomes_section(data, drawn),
        _rungs_section(data),
        _best_so_far_section(data, drawn),
        _curves_section(data, drawn),
        _noise_section(data, drawn),
        _effects_section(data, drawn, importance),
        _best_configs_section(data, hpo_command),
        _trials_section(data),
    ]
    return _page(f"{data.name}: comparison report", "".join(parts))


def _tuned(data: ExperimentData):
    return [d for d in data.dimensions if d.name not in data.compare]


def _header(data: ExperimentData, index: str | None) -> str:
    back = f'<p><a href="{escape(index)}">all experiments</a></p>' if index else ""
    finished = sum(1 for t in data.trials if t.outcome != "unfinished")
    arms = ", ".join(a.label for a in data.arms)
    simulated = (f"<p class=warn data-field=simulated><b>Simulated experiment</b>: its trials read learning curves "
                 f"from a recorded table instead of training; times are simulated. {escape(data.simulated)}.</p>"
                 if data.simulated else "")  # fmt: skip
    simulated += _imported(data)
    return (f"{back}<h1>{escape(data.name)}</h1>{simulated}<p class=sub>{escape(data.description)}</p>"
            f"<p>Objective: <b>{escape(data.metric)}</b> ({escape(data.direction)}), target masked-LM accuracy "
            f"{data.target_mlm_accuracy:g}, at most {data.max_samples:,} training samples per trial. Tuner "
            f"{escape(data.tuner)}; {data.trials_budget} tuning trials over {len(data.arms)} arm(s) ({escape(arms)})"
            f", confirmation runs per arm: {escape(data.confirmation_plan)}. Status: <b data-field=liveness>"
            f"{escape(data.liveness)}</b>, <span data-field=finished>{finished}</span> of "
            f"<span data-field=planned>{_planned(data)}</span> planned trials finished "
            f"(<span data-field=progress>{escape(_progress(data))}</span>).</p>{_nni_webui(data)}")  # fmt: skip


def _imported(data: ExperimentData) -> str:
    """An imported experiment (hpo.mlperf) says so first: its trials are runs read from files, not run here."""
    if not data.imported:
        return ""
    files = data.imported.get("files") or []
    shown = ", ".join(str(f) for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (f"<p class=warn data-field=imported><b>Imported experiment</b>: {escape(imported_line(data.imported))}. "
            "Per configuration its first run in file order is the tuning trial and the others are its confirmation "
            "runs; all of them are the verdict's evidence where the configuration is alone in its arm (nothing was "
            f"picked). Read from {escape(shown)}.</p>")  # fmt: skip


def _nni_webui(data: ExperimentData) -> str:
    """engine: nni: a link to the NNI web UI of each NNI experiment, where it was last served (it answers while
    the experiment runs that arm, or after `hpo webui NAME` reopens it, which stores the new address)."""
    if not data.nni_webui:
        return ""
    links = []
    for link in data.nni_webui:
        url, nni_id = str(link.get("url", "")), str(link.get("nni_experiment", ""))
        if not url.startswith(("http://", "https://")):
            continue
        arm = f"{link['arm']}: " if link.get("arm") else ""
        links.append(f'{escape(arm)}<a data-field=nni_webui href="{escape(url)}">{escape(url)}</a> '
                     f"(NNI experiment {escape(nni_id)})")  # fmt: skip
    if not links:
        return ""
    return (f"<p>NNI web UI: {'; '.join(links)}. It answers while the experiment runs that NNI experiment; "
            f"<code>hpo webui {escape(shlex.quote(data.name))}</code> on the controller's machine reopens it "
            "(and updates these links).</p>")  # fmt: skip


def _planned(data: ExperimentData) -> int:
    """The trials the experiment plans: its tuning budget and confirm_seeds per arm (more if more were created)."""
    tuning = max(data.trials_budget, _count(data, "tuning"))
    return tuning + max(data.planned_confirmations, _count(data, "confirmation"))


def _count(data: ExperimentData, kind: str, finished: bool = False) -> int:
    return sum(1 for t in data.trials if t.kind == kind and (not finished or t.outcome != "unfinished"))


def _progress(data: ExperimentData) -> str:
    tuning, confirmation = _count(data, "tuning"), _count(data, "confirmation")
    return trials_done(_count(data, "tuning", True), max(data.trials_budget, tuning),
                       _count(data, "confirmation", True), max(data.planned_confirmations, confirmation))  # fmt: skip


def _nothing_finished(data: ExperimentData) -> str | None:
    """What every figure says while no trial has finished (None once one has)."""
    if any(t.outcome != "unfinished" for t in data.trials):
        return None
    waiting = len(data.trials)
    return (f"Nothing to draw yet: no trial has finished (0 of {_planned(data)} planned; "
            f"{waiting} created and queued or running).")  # fmt: skip


def _arms_without_values(data: ExperimentData) -> list[str]:
    """For each arm whose finished runs have no measured objective, what happened to them, in words."""
    lines = []
    for arm in data.arms:
        done = [t for t in arm.trials if t.outcome != "unfinished"]
        if any(t.value is not None for t in done):
            continue
        if not done:
            lines.append(f"{arm.label}: no run has finished yet")
            continue
        outcomes = {o: sum(t.outcome == o for t in done) for o in OUTCOMES if any(t.outcome == o for t in done)}
        if list(outcomes) == ["missed"]:
            lines.append(f"{arm.label}: all {len(done)} runs missed the target")
        else:
            detail = ", ".join(f"{n} {o}" for o, n in outcomes.items())
            lines.append(f"{arm.label}: none of its {len(done)} finished runs has a measured {data.metric} ({detail})")
    return lines


# slug (the PNG's file name): the image's alt text, the drawing, whether it needs a run with a measured objective
FIGURES = {
    "outcomes": ("samples to target per arm", figures.outcomes_figure, True),
    "best-so-far": ("best objective so far per arm", figures.best_so_far_figure, True),
    "learning-curves": ("learning curves", figures.learning_curves_figure, False),
    "noise-scale": ("gradient noise scale", figures.noise_figure, False),
    "hyperparameters": ("objective against each hyperparameter", figures.effects_figure, True),
}


def report_figures(data: ExperimentData) -> dict:
    """The figures of the report by slug (what the page embeds and `hpo report --png` writes); one with nothing to
    draw is left out, and the page says why in words."""
    if _nothing_finished(data):
        return {}
    measured = len(_arms_without_values(data)) < len(data.arms)
    curves = any(c.mlm_accuracy for c in data.curves.values())
    drawn = {}
    for slug, (_, draw, needs_value) in FIGURES.items():
        if (needs_value and not measured) or (slug == "learning-curves" and not curves):
            continue
        fig = draw(data)
        if fig is not None:
            drawn[slug] = fig
    return drawn


def experiment_pngs(storage: Storage, name: str) -> tuple[dict[str, bytes], str | None]:
    """The report's figures as PNG files (slug -> contents), and why there are none when there are none."""
    data = load_experiment(storage, name)
    drawn = report_figures(data)
    if drawn:
        return {slug: figures.png_bytes(fig, figures.FILE_DPI) for slug, fig in drawn.items()}, None
    why = _nothing_finished(data) or "; ".join(_arms_without_values(data)) or "nothing was measured"
    return {}, why


def _figure_or_words(data: ExperimentData, drawn: dict, slug: str) -> str:
    """The figure, or in words why there is nothing to draw; arms with nothing measured are named under it."""
    nothing = _nothing_finished(data)
    if nothing:
        return f"<p class=note data-field=nothing>{escape(nothing)}</p>"
    empty = _arms_without_values(data)
    if slug not in drawn:
        return "".join(f"<p class=note data-field=empty>{escape(line)}: nothing to draw.</p>" for line in empty)
    notes = "".join(f"<p class=note data-field=empty>{escape(line)}.</p>" for line in empty)
    return _img(drawn[slug], FIGURES[slug][0]) + notes


def _notes(data: ExperimentData) -> str:
    """What the page cannot claim at this scale, said before any number."""
    notes = []
    sizes = [len(a.tuning) for a in data.arms]
    if min(sizes, default=0) < SMALL_ARM:
        notes.append(f"Small experiment: {min(sizes, default=0)} tuning trial(s) in the smallest arm. The best-so-far "
                     "bands are wide, one lucky trial can decide an arm's best, and hyperparameter importance is "
                     f"only ranked from {MIN_TRIALS} trials per arm on.")  # fmt: skip
    if data.confirm_seeds == 0:
        notes.append(
            "No confirmation seeds: the verdict has no runs. An arm's best tuning trial was selected as the best of "
            "its arm, so it flatters its arm and is not evidence; budget.confirm_seeds: auto (or ≥ 2) re-runs it."
        )
    elif data.confirm_seeds == 1:
        notes.append("One confirmation seed: a comparison needs at least 2 runs per arm.")
    if data.liveness in ("live", "interrupted"):
        notes.append(f"The experiment is {data.liveness}: these numbers will change as trials finish.")
    if data.to_target:
        notes.append("A run that missed the target is shown as a miss (x), never at its penalized objective.")
    large = _large_experiment(data)
    if large:
        notes.append(large)
    return "".join(f"<p class=note>{escape(n)}</p>" for n in notes)


def _large_experiment(data: ExperimentData) -> str | None:
    """What a large experiment's page shows of its trials (None when it shows all of them)."""
    largest = max((len(a.tuning) for a in data.arms), default=0)
    said = []
    if largest > MAX_DRAWN:
        said.append(f"figures draw at most {MAX_DRAWN:,} tuning trials per arm as points (its {BEST_DRAWN} best and "
                    "a fixed stride over the rest)")  # fmt: skip
    if largest > MAX_TRIALS:
        said.append(f"the importance surrogate is fitted on {MAX_TRIALS:,} trials per arm (a fixed stride)")
    if len(data.trials) > LISTED_TRIALS:
        said.append(f"the trial table lists each arm's {LISTED_BEST} best tuning trials and every confirmation run")
    if not said:
        return None
    return (f"Large experiment: {len(data.trials):,} trials. The verdict, the best configurations, the counts, the "
            f"best-so-far lines and bands and the medians use every trial; {'; '.join(said)}.")  # fmt: skip


def _verdict_section(data: ExperimentData) -> str:
    if data.verdict is None:
        return _evidence_table(data, "<h2>Evidence</h2><p>The experiment compares nothing (no arms).</p>")
    verdict = data.verdict
    cls = "verdict" if verdict.outcome is not Outcome.NOT_YET else "verdict none"
    look = f" (look {verdict.look} of {verdict.looks})" if verdict.looks > 1 else ""
    line = (f"<div class='{cls}' data-field=verdict data-outcome='{verdict.outcome.value}'>{escape(verdict.line)}"
            f"</div><p>Outcome: <b data-field=outcome>{escape(verdict.outcome.value)}</b>{escape(look)}; margin "
            f"<span data-field=margin>±{100 * verdict.margin:g} %</span>; "
            f"<span data-field=round>{escape(data.confirmation_round)}</span>"
            + (f"; about <span data-field=runs_needed>{verdict.runs_needed}</span> runs per arm would likely decide"
               if verdict.runs_needed else "") + ".</p>")  # fmt: skip
    if batch_study(data.compare):
        line += f"<p class=note data-field=batch_study_note>This is {escape(BATCH_STUDY_NOTE)}, below.</p>"
    return _evidence_table(data, f"<h2>Verdict</h2>{line}")


def _evidence_table(data: ExperimentData, head: str) -> str:
    rows = []
    for arm in data.arms:
        ev = arm.evidence
        if ev is None:
            continue
        runs = [t.number for t in arm.trials if t.kind == "confirmation" and arm.best and t.params == arm.best.params]
        rate = "–" if ev.hit_rate is None else f"{ev.hit_rate:.0%}"
        fields = [
            ("runs", str(ev.runs)),
            ("hits", str(ev.hits)),
            ("hit_rate", rate),
            ("mean", fmt_samples(ev.mean)),
            ("interval", fmt_interval(ev.low, ev.high)),
            ("runs_trials", ", ".join(map(str, runs)) or "–"),
        ]
        rows.append(_tagged(arm.label, arm.label, fields))
    table = _table(["arm", "runs", "reached target", "hit rate", "mean samples to target", "95 % interval",
                    "trials"], rows)  # fmt: skip
    return (f"{head}<p>Per arm, from the confirmation runs of its best configuration ({escape(data.confirmation_plan)}"
            f"; the best tuning trial itself was selected, so it is not evidence). Samples to target interpolated "
            f"between evaluations. Mean over the runs that reached the target; 95 % interval mean ± t(0.975, n−1)·s/√n "
            f"over those n runs (none below 2). The verdict compares arms on the log scale (Welch) and counts a miss "
            f"at its budget, the least it would have needed.</p>{table}")  # fmt: skip


def _outcomes_section(data: ExperimentData, drawn: dict) -> str:
    rows = []
    for arm in data.arms:
        counts = arm.counts()
        best = arm.best
        best_text = "–" if best is None else "missed" if best.value is None else fmt_objective(best.value)
        fields = [("tuning", str(len(arm.tuning)))] + [(o.replace(" ", "_"), str(counts[o])) for o in OUTCOMES]
        fields += [("best_objective", best_text), ("best_trial", "–" if best is None else str(best.number))]
        rows.append(_tagged(arm.label, arm.label, fields))
    head = ["arm", "tuning trials", *OUTCOMES, f"best {data.metric}", "best trial"]
    return (f"<h2>Samples to target and outcomes</h2>"
            f"<p>Tuning trials per outcome: reached the target, missed it (used the whole sample budget), diverged, "
            f"failed, timed out, failed on bad data (not the hyperparameters' fault), unfinished. The best is the "
            f"storage's best tuning trial of the arm (what <code>hpo export</code> exports); a miss there means no "
            f"trial of the arm reached the target and its objective is the penalty.</p>"
            f"{_table(head, rows)}"
            f"{_figure_or_words(data, drawn, 'outcomes')}")  # fmt: skip


def _rungs_section(data: ExperimentData) -> str:
    """Multi-fidelity experiments only: per arm, each budget's trials and which configurations were promoted."""
    if not data.rungs:
        return ""
    parts = [
        f"<h2>Rungs</h2><p>The tuner ({escape(data.tuner)}) ran tuning trials at several budgets, each a fraction "
        f"of the {data.max_samples:,} training samples: a rung is one budget. A promoted configuration runs again "
        "at the next rung as a new trial with the same parameters, continuing from its checkpoint. Per rung, the "
        "trials run at it and how many of them were promoted; then each promoted configuration's trials, rung by "
        "rung (a miss or a failure shows its outcome, never its penalized objective).</p>"
    ]
    for arm in data.arms:
        if arm.label in data.rungs:
            heading = f"<h3>{escape(arm.label)}</h3>" if data.compare else ""
            parts.append(heading + _arm_rungs(data.rungs[arm.label]))
    return "".join(parts)


def _arm_rungs(arm: ArmRungs) -> str:
    rows = []
    for rung in arm.rungs:
        key = f"rung_{rung.samples}"
        fields = [(f"{key}_budget", f"{rung.budget:.4g}"), (f"{key}_trials", str(rung.trials)),
                  (f"{key}_promoted", str(rung.promoted))]  # fmt: skip
        rows.append(_tagged(arm.arm, f"{rung.samples:,}", fields))
    table = _table(["rung (samples)", "budget (fraction)", "trials", "promoted to a larger budget"], rows)
    if not arm.chains:
        return table + "<p>No configuration was promoted.</p>"
    chains = []
    for chain in arm.chains[:LISTED_CHAINS]:
        rungs = " → ".join(f"{step.samples:,}" for step in chain)
        steps = " → ".join(_step(step, first=i == 0) for i, step in enumerate(chain))
        chains.append(_td(rungs, cls="l") + _td(steps, f"chain_{chain[0].number}", arm.arm, "l"))
    head = ["rungs (samples)", "trials, rung by rung (samples, outcome: objective)"]
    more = len(arm.chains) - len(chains)
    listed = f"; {len(chains)} listed, those that reached the largest budget first" if more else ""
    return (f"{table}<details><summary>{len(arm.chains):,} promoted configuration(s){listed}</summary>"
            f"{_table(head, chains, left=2)}</details>")  # fmt: skip


def _step(step: RungStep, first: bool) -> str:
    """`trial #3 (1,365 samples, missed)` first, then `#9 (4,096, reached: 3,072)`."""
    outcome = step.outcome if step.value is None else f"{step.outcome}: {fmt_objective(step.value)}"
    return f"trial #{step.number} ({step.samples:,} samples, {outcome})" if first else (
        f"#{step.number} ({step.samples:,}, {outcome})")  # fmt: skip


def _best_so_far_section(data: ExperimentData, drawn: dict) -> str:
    return ("<h2>Best so far</h2><p>The best measured objective after each tuning trial, per arm, against trials "
            "and against the training samples the arm used. The band: 95 % of 200 bootstrap resamples of the arm's "
            "trials in random order; where it reaches the top, some resamples have no hit yet.</p>"
            + _figure_or_words(data, drawn, "best-so-far"))  # fmt: skip


def _curves_section(data: ExperimentData, drawn: dict) -> str:
    return (
        "<h2>Learning curves</h2><p>Masked-LM accuracy on the eval set of each arm's top tuning trials (the best "
        "measured objective first, then the misses closest to the target), against training samples and "
        "against training time.</p>" + _curves_or_words(data, drawn)
    )


def _curves_or_words(data: ExperimentData, drawn: dict) -> str:
    if "learning-curves" not in drawn:
        said = _nothing_finished(data) or "No top trial reported an evaluation: there is no learning curve to draw."
        return f"<p class=note data-field=nothing>{escape(said)}</p>"
    return _img(drawn["learning-curves"], FIGURES["learning-curves"][0])


def _noise_section(data: ExperimentData, drawn: dict) -> str:
    fig = drawn.get("noise-scale")
    head = "<h2>Gradient noise scale</h2>"
    if fig is None:
        why = _nothing_finished(data) or (
            "No finished trial reported a noise scale: it needs two batch sizes, i.e. several ranks or gradient "
            "accumulation (batch.global_batch_size above batch.micro_batch_size), log.noise_scale on, and a run "
            "that trains past its first steps.")  # fmt: skip
        return f"{head}<p data-field=noise>{escape(why)}</p>"
    rows = []
    for arm in data.arms:
        measured = [t for t in arm.trials if t.noise_scale is not None]
        if not measured:
            rows.append(_td(arm.label, cls="l") + _td("–") * 4)
            continue
        median = statistics.median(t.noise_scale for t in measured)
        bounds = sum(1 for t in measured if t.noise_lower_bound)
        batches = arm.global_batch_sizes
        ratio = f"{batches[0] / median:.2g}×" if len(batches) == 1 else "–"
        shown = fmt_noise(median) if not bounds else f"≥ {fmt_noise(median)} (lower bound: {bounds} of {len(measured)}"\
            " trials' estimates are lower bounds)"  # fmt: skip
        fields = [("noise_trials", str(len(measured))), ("noise_median", shown),
                  ("batch", ", ".join(f"{b:,}" for b in batches)), ("batch_ratio", ratio)]  # fmt: skip
        rows.append(_tagged(arm.label, arm.label, fields))
    table = _table(["arm", "trials measured", "noise scale (median)", "global batch", "batch / noise scale"], rows)
    return (head + "<p>B_simple = tr(Σ)/|G|² (McCandlish et al. 2018), estimated from the gradient norms at two batch "
            "sizes and smoothed over steps; a trial's value is the median over the second half of its training "
            "(it is noisiest early). A batch several times the noise scale buys diminishing returns: more samples "
            "per step no longer mean proportionally fewer steps. B_simple differs from the critical batch size by a "
            "curvature factor, and short runs measure it early in training: read it as an order of magnitude.</p>"
            f"<p class=note>{escape(NOISE_TRUST)}</p>" + table + _img(fig, FIGURES["noise-scale"][0]))  # fmt: skip


NOISE_TRUST = (
    "Where the noise scale can be trusted: the estimator's big batch (the global batch; under gradient accumulation "
    "one rank's accumulated batch) must not sit far below it. Checked against a closed form, the estimate is within "
    f"10 % up to {NOISE_CHECKED_RATIO:g}× the big batch; far above, it is heavy-tailed and reads low (median 0.34 to "
    "0.5× the truth, 20 to 45 % of the steps without an estimate). A trial whose estimate exceeds "
    f"{NOISE_CHECKED_RATIO:g}× its big batch, or whose late steps gave no estimate {NOISE_UNDEFINED_SHARE:.0%} of "
    "the time or more, is shown as ≥ N: a lower bound, not a value. Units: the batch sizes count sequences while "
    "the masked-LM loss is averaged over masked tokens, so B_simple is in sequences only approximately (a sequence "
    "weighs by its masked tokens)."
)


def _effects_section(data: ExperimentData, drawn: dict, importance: dict[str, Importance]) -> str:
    parts = ["<h2>Hyperparameters</h2><p>The measured objective against each tuned hyperparameter (tuning trials; "
             "misses on the top strip), and per arm a ranking by permutation importance on a random-forest surrogate "
             "fitted to the rank of each trial's objective (misses rank below every hit): how much the surrogate's "
             "R² drops when the parameter is shuffled. Out-of-bag R² at or below 0 means the surrogate explains "
             "nothing and the ranking is noise.</p>",
             _figure_or_words(data, drawn, "hyperparameters")]  # fmt: skip
    for arm in data.arms:
        imp = importance[arm.label]
        parts.append(f"<h3>{escape(arm.label)}</h3>")
        if imp.reason:
            parts.append(f"<p data-field=importance data-arm='{escape(arm.label)}'>{escape(imp.reason)}.</p>")
            continue
        top = max((m for _, m, _ in imp.ranking), default=0.0) or 1.0
        rows = [_td(str(i + 1)) + _td(name, cls="l") + _td(f"{mean:.3f} ± {std:.3f}", "importance", arm.label)
                + f"<td class=l><span class=bar style='width:{max(0.0, mean) / top * 200:.0f}px'></span></td>"
                for i, (name, mean, std) in enumerate(imp.ranking)]  # fmt: skip
        fitted = f"{imp.trials:,} of {imp.usable:,} usable trials (a fixed stride in trial order)" if imp.usable \
            else f"{imp.trials} trials"  # fmt: skip
        parts.append(f"<p>{fitted}; surrogate out-of-bag R² {imp.oob_r2:.2f}"
                     + (" — it explains nothing: do not read the ranking." if imp.oob_r2 <= 0 else ".") + "</p>"
                     + _table(["rank", "parameter", "R² drop", ""], rows, left=2))  # fmt: skip
    return "".join(parts)


def _best_configs_section(data: ExperimentData, hpo_command: str) -> str:
    parts = ["<h2>Best configuration per arm</h2>"]
    for arm in data.arms:
        best = arm.best
        parts.append(f"<h3>{escape(arm.label)}</h3>")
        if best is None:
            parts.append("<p>No completed tuning trial.</p>")
            continue
        status = (f"reached the target at {fmt_samples(best.samples_to_target)} samples" if best.value is not None
                  else f"missed the target (best accuracy {fmt_accuracy(best.best_mlm_accuracy)}; objective "
                       f"{fmt_objective(best.objective)} is the penalty)")  # fmt: skip
        rows = [_td(k, cls="l") + _td(_param(v), cls="l") for k, v in best.params.items()]
        arm_flag = f" --arm {shlex.quote(arm.label)}" if data.compare else ""
        out = f"best-{_slug(arm.label)}.yaml" if data.compare else "best.yaml"
        command = f"{hpo_command} export {shlex.quote(data.name)}{arm_flag} -o {out}"
        parts.append(f"<p>Trial {best.number}: {escape(status)}.</p>{_table(['parameter', 'value'], rows, left=2)}"
                     f"<pre data-field=export data-arm='{escape(arm.label)}'>{escape(command)}</pre>")  # fmt: skip
    return "".join(parts)


def _param(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in label.split("=")[-1]).strip("-") or "arm"


def _trials_section(data: ExperimentData) -> str:
    listed = listed_trials(data)
    rows = [_trial_row(t) for t in listed]
    head = ["#", "arm", "kind", "seed", "outcome", "objective", "samples to target", "best accuracy",
            "samples", "global batch", "noise scale", "parameters", "reason"]  # fmt: skip
    if len(listed) == len(data.trials):
        return (f"<h2>All trials</h2><details><summary>{len(rows)} trials</summary>"
                f"{_table(head, rows, left=0)}</details>")  # fmt: skip
    every = f"hpo trials {shlex.quote(data.name)}"
    return (f"<h2>Trials</h2><p data-field=listed>{len(rows):,} of {len(data.trials):,} trials listed: each arm's "
            f"{LISTED_BEST} best tuning trials and every confirmation run. The counts per outcome are in the "
            f"outcomes table above; <code>{escape(every)}</code> lists all of them (<code>--arm</code>, "
            f"<code>--state</code>; <code>--after N --limit M</code> pages).</p><details><summary>{len(rows):,} "
            f"trials</summary>{_table(head, rows, left=0)}</details>")  # fmt: skip


def listed_trials(data: ExperimentData) -> list[TrialRow]:
    """The trials the table lists, in number order: all of them up to LISTED_TRIALS; above, each arm's
    LISTED_BEST best tuning trials (`top_trials`) and every confirmation run."""
    if len(data.trials) <= LISTED_TRIALS:
        return data.trials
    numbers = {t.number for arm in data.arms for t in top_trials(arm.tuning, data.direction, LISTED_BEST)}
    return [t for t in data.trials if t.number in numbers or t.kind == "confirmation"]


def _trial_row(t: TrialRow) -> str:
    params = ", ".join(f"{k}={_param(v)}" for k, v in t.params.items())
    left = [t.arm, t.kind, "–" if t.seed is None else str(t.seed), t.outcome]
    right = [fmt_objective(t.objective), fmt_samples(t.samples_to_target), fmt_accuracy(t.best_mlm_accuracy),
             fmt_samples(t.samples), fmt_samples(t.global_batch_size), fmt_trial_noise(t)]  # fmt: skip
    return (_td(str(t.number)) + "".join(_td(v, cls="l") for v in left) + "".join(_td(v) for v in right)
            + _td(params, cls="l") + _td(t.reason or "", cls="l"))  # fmt: skip


# --------------------------------------------------------------------------- several experiments


def comparison_report(storage: Storage, names: Sequence[str], *, link: Link | None = None,
                      index: str | None = None) -> str:  # fmt: skip
    """Several experiments: samples to target and the noise scale against global batch size per optimizer, and
    per optimizer where the batch stops scaling (hpo.evidence.batch_scaling)."""
    experiments = [load_experiment(storage, name) for name in names]
    return comparison_page(experiments, scaling_points(experiments, experiment_runs(experiments)), link=link,
                           index=index)  # fmt: skip


def comparison_page(experiments: Sequence[ExperimentData], points: Sequence[ScalingPoint], *,
                    link: Link | None = None, index: str | None = None) -> str:  # fmt: skip
    """The comparison page of `experiments` drawn from their scaling points (what `comparison_report` reads)."""
    fits = scaling_fits(points)
    link = link or (lambda name: f"{name}.html")
    back = f'<p><a href="{escape(index)}">all experiments</a></p>' if index else ""
    listing = "".join(f"<li><a href='{escape(link(d.name))}'>{escape(d.name)}</a> — {escape(d.liveness)}; "
                      f"{escape(d.verdict.line if d.verdict else 'no arms')}</li>" for d in experiments)  # fmt: skip
    body = (f"{back}<h1>Comparing {len(experiments)} experiments</h1><ul>{listing}</ul>"
            + _scaling_notes(experiments) + _scaling_table(points)
            + (_img(figures.scaling_figure(points, fits), "samples to target and noise scale against batch size")
               if points else "<p>No arm has a best trial yet.</p>")
            + (_fit_section(points, fits) if points else "")
            + _batch_verdicts(points, DEFAULT_MARGIN))  # fmt: skip
    return _page("comparison report", body)


def _scaling_notes(experiments: Sequence[ExperimentData]) -> str:
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


def _scaling_table(points: Sequence[ScalingPoint]) -> str:
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
        rows.append(_tagged(key, p.optimizer, fields))
    head = ["optimizer", "global batch", "experiment", "arm", "reached target", "mean samples to target",
            "95 % interval", "optimizer steps to target (95 %)", "noise scale", "batch / noise scale"]  # fmt: skip
    return _table(head, rows)


def _batch_verdicts(points: Sequence[ScalingPoint], margin: float) -> str:
    """Per global batch size with two or more optimizers: the verdict between them (`scaling.batch_verdicts`)."""
    verdicts = batch_verdicts(points, margin)
    if not verdicts:
        return ""
    rows = [_td(f"{batch:,}", "batch_verdict_batch", str(batch))
            + _td(verdict.outcome.value, "batch_verdict_outcome", str(batch))
            + _td(verdict.line, "batch_verdict_line", str(batch), "l")
            for batch, verdict in verdicts.items()]  # fmt: skip
    return ("<h2>The verdict at each batch size</h2><p>At each global batch size, the optimizers' runs there (the "
            "best configuration's confirmation runs of each arm) compared by the verdict's rule (Welch on ln samples "
            f"to target; margin ±{100 * margin:g} %). The error is shared over the {len(verdicts)} batch sizes "
            f"(each tested at 1 / {len(verdicts)} of the {100 * ALPHA:g} %), so all of them together name a wrong "
            "winner in at most 5 %.</p>" + _table(["global batch", "outcome", "verdict"], rows))  # fmt: skip


def _batch_study(data: ExperimentData) -> str:
    """An experiment whose arms ran at two or more global batch sizes (a batch-scaling study): the comparison
    page's batch-size view of its own arms, and the verdict at each batch size."""
    points = scaling_points([data], experiment_runs([data]))
    if len({p.global_batch_size for p in points}) < 2:
        return ""
    fits = scaling_fits(points)
    margin = data.verdict.margin if data.verdict else DEFAULT_MARGIN
    return ("<h2>Batch sizes</h2>" + _scaling_notes([data]) + _scaling_table(points)
            + _img(figures.scaling_figure(points, fits), "samples to target and noise scale against batch size")
            + _fit_section(points, fits) + _batch_verdicts(points, margin))  # fmt: skip


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


def _fit_section(points: Sequence[ScalingPoint], fits: dict[str, BatchScaling]) -> str:
    rows = []
    for name, fit in fits.items():
        mine = [p for p in points if p.optimizer == name]
        fields = [("fit_runs", _fit_runs(fit)), ("fit_e_min", fmt_estimate(fit.e_min)),
                  ("fit_b_crit", fmt_estimate(fit.b_crit)), ("fit_s_min", fmt_estimate(fit.s_min)),
                  ("fit_well", fmt_estimate(fit.well)), ("fit_well_measured", well_measured(fit)),
                  ("fit_noise", _fit_noise(mine)), ("fit_note", fit.reason or fit.note or "")]  # fmt: skip
        rows.append(_td(name, cls="l") + "".join(_td(text, field, name, "l" if field == "fit_note" else "")
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
            "runs at 3 or more batch sizes.</p>" + _table(head, rows, left=1))  # fmt: skip


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


# --------------------------------------------------------------------------- the list of experiments


def index_page(storage: Storage, *, link: Link, compare_action: str) -> str:
    """Every experiment with its status, trial counts and a link to its report; a form compares several."""

    rows = []
    for record in storage.list_experiments():
        rows.append(f"<td class=l><input type=checkbox name=name value='{escape(record.name)}'></td>"
                    + f"<td class=l><a href='{escape(link(record.name))}'>{escape(record.name)}</a></td>"
                    + _td(liveness(record), cls="l") + _td(experiment_progress(storage, record), cls="l")
                    + _td(record.spec.get("experiment", {}).get("description", ""), cls="l"))  # fmt: skip
    table = _table(["", "experiment", "status", "trials", "description"], rows, left=4)
    body = ("<h1>Experiments</h1>" + (f"<form method=get action='{escape(compare_action)}'>{table}"
            "<p><button type=submit>Compare the selected experiments</button></p></form>" if rows
            else "<p>No experiments yet: start one with <code>hpo run EXPERIMENT.yaml</code>.</p>"))  # fmt: skip
    return _page("experiments", body)
