"""The report pages: self-contained HTML (inline CSS, figures as data: URIs, no script, nothing fetched).

Every number on a page comes from `hpo.report.data` (the database) or from a computation on it named where it is
shown. Table cells that carry the report's key numbers are tagged `data-arm`/`data-field` so tests and scripts
can read them back. `link` turns an experiment name into the address of its report: a file name for `hpo report`,
the API path in the server.
"""

from __future__ import annotations

import shlex
import statistics
from collections import Counter
from collections.abc import Sequence
from html import escape

from hpo.engine.progress import experiment_progress, trials_done
from hpo.engine.settle import seen_status
from hpo.evidence.verdict import DEFAULT_MARGIN, Outcome
from hpo.experiment.arms import BATCH_STUDY_NOTE, batch_study
from hpo.mlperf import IMPORT_VERDICT_NOTE, imported_line
from hpo.nni.config import replaced_by_resume
from hpo.report import figures
from hpo.report.batch_view import (
    BATCH_FIGURE,
    BatchSizes,
    batch_sizes,
    batch_study_view,
    fit_section,
    scaling_notes,
    scaling_table,
    verdicts_by_batch,
)
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
from hpo.report.markup import (
    Link,
    cell,
    fmt_accuracy,
    fmt_interval,
    fmt_noise,
    fmt_objective,
    fmt_samples,
    fmt_trial_noise,
    html_table,
    img,
    page,
    tagged,
)
from hpo.report.scaling import ScalingPoint, experiment_runs, scaling_fits, scaling_points
from hpo.storage.base import Storage
from hpo.trials import TrialState

SMALL_ARM = 10  # fewer tuning trials per arm than this: the page says the experiment is small
LISTED_TRIALS = 500  # more trials than this: the trial table lists each arm's best and the confirmation runs only
LISTED_BEST = 10  # tuning trials per arm listed then
LISTED_CHAINS = 50  # promoted configurations listed per arm (multi-fidelity), those that went furthest first

# --------------------------------------------------------------------------- one experiment


def experiment_report(storage: Storage, name: str, *, hpo_command: str = "hpo", index: str | None = None) -> str:
    """The report of one experiment (see the package docstring)."""
    return experiment_page(load_experiment(storage, name), hpo_command=hpo_command, index=index)


def experiment_page(data: ExperimentData, *, hpo_command: str = "hpo", index: str | None = None) -> str:
    """The report of one experiment as `load_experiment` read it."""
    importance = {arm.label: rank_importance(arm.tuning, _tuned(data), data.direction) for arm in data.arms}
    sizes = batch_sizes(data)
    drawn = report_figures(data, sizes)
    parts = [
        _header(data, index),
        _notes(data),
        _verdict_section(data),
        batch_study_view(data, sizes, drawn.get(BATCH_SIZES)),
        _outcomes_section(data, drawn),
        _rungs_section(data),
        _best_so_far_section(data, drawn),
        _curves_section(data, drawn),
        _noise_section(data, drawn),
        _effects_section(data, drawn, importance),
        _best_configs_section(data, hpo_command),
        _trials_section(data),
    ]
    return page(f"{data.name}: comparison report", "".join(parts))


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
    # the runs it holds (a run cut short mid-write is written again): fewer where an import was cut short
    line = imported_line(data.imported, sum(1 for t in data.trials if TrialState(t.state).finished))
    return (f"<p class=warn data-field=imported><b>Imported experiment</b>: {escape(line)}. "
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
    """The trials the experiment plans: its tuning budget and confirm_seeds per arm (more if more were created); an
    imported experiment plans nothing beyond the runs it holds."""
    if data.imported:
        return len(data.trials)
    tuning = max(data.trials_budget, _count(data, "tuning"))
    return tuning + max(data.planned_confirmations, _count(data, "confirmation"))


def _count(data: ExperimentData, kind: str, finished: bool = False) -> int:
    """The trials of a kind (`finished`: that ended); an engine: nni tuning trial a resume replaced by a new one is
    none of the budget's (`hpo.nni.config.replaced_by_resume`)."""
    return sum(1 for t in data.trials if t.kind == kind and (not finished or t.outcome != "unfinished")
               and not (data.engine == "nni" and replaced_by_resume(t.kind, t.state, t.reason)))  # fmt: skip


def _progress(data: ExperimentData) -> str:
    tuning, confirmation = _count(data, "tuning"), _count(data, "confirmation")
    if not data.imported:  # an imported experiment holds what it imported, nothing more was planned
        tuning, confirmation = max(data.trials_budget, tuning), max(data.planned_confirmations, confirmation)
    return trials_done(_count(data, "tuning", True), tuning, _count(data, "confirmation", True), confirmation)


def _nothing_finished(data: ExperimentData) -> str | None:
    """What every figure says while no trial has finished (None once one has)."""
    if any(t.outcome != "unfinished" for t in data.trials):
        return None
    recorded = "" if data.liveness == "live" else ", as last recorded"
    return (f"Nothing to draw yet: no trial has finished (0 of {_planned(data)} planned; created: {_by_state(data)}"
            f"{recorded}).")  # fmt: skip


def _by_state(data: ExperimentData) -> str:
    """The trials per stored state in `hpo status`'s order and words: `1 queued, 1 running, 2 interrupted`."""
    counts = Counter(t.state for t in data.trials)
    return ", ".join(f"{counts[s.value]} {s.value}" for s in TrialState if counts[s.value]) or "none yet"


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
BATCH_SIZES = "batch-sizes"  # the slug of the batch-size view's figure (a batch-scaling study; compare.html)


def report_figures(data: ExperimentData, sizes: BatchSizes | None) -> dict:
    """The figures of the report by slug (what the page embeds and `hpo report --png` writes): FIGURES, and where
    the arms span batch sizes (`sizes`: `batch_view.batch_sizes(data)`) the batch-size view's first; one with
    nothing to draw is left out, and the page says why in words."""
    if _nothing_finished(data):
        return {}
    measured = len(_arms_without_values(data)) < len(data.arms)
    curves = any(c.mlm_accuracy for c in data.curves.values())
    drawn = {BATCH_SIZES: figures.scaling_figure(*sizes)} if sizes is not None else {}
    for slug, (_, draw, needs_value) in FIGURES.items():
        if (needs_value and not measured) or (slug == "learning-curves" and not curves):
            continue
        fig = draw(data)
        if fig is not None:
            drawn[slug] = fig
    return drawn


def experiment_pngs(data: ExperimentData) -> tuple[dict[str, bytes], str | None]:
    """The report's figures as PNG files (slug -> contents), and why there are none when there are none."""
    drawn = report_figures(data, batch_sizes(data))
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
    return img(drawn[slug], FIGURES[slug][0]) + notes


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
    if data.liveness == "live":
        notes.append("The experiment is live: these numbers will change as trials finish.")
    elif data.liveness == "interrupted":
        notes.append(f"The experiment is interrupted: its controller stopped heartbeating, and its trials' states are "
                     f"those last recorded; `hpo resume {shlex.quote(data.name)}` takes it over and finishes "
                     "it.")  # fmt: skip
    elif data.liveness == "unresponsive":
        notes.append(
            "The experiment's controller stopped heartbeating but still runs on this machine (stopped with "
            "Ctrl-Z, or unable to write to the database): its trials' states are those last recorded; "
            "`hpo status` says what to do."
        )
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
    if data.imported and verdict.outcome is Outcome.NOT_YET:
        line += f"<p class=note data-field=import_note>{escape(IMPORT_VERDICT_NOTE)}</p>"
    batches = {t.global_batch_size for t in data.trials if t.global_batch_size is not None}
    if batch_study(data.compare) and len(batches) > 1:  # one batch size: nothing across
        line += f"<p class=note data-field=batch_study_note>This is {escape(BATCH_STUDY_NOTE)}, below.</p>"
    return _evidence_table(data, f"<h2>Verdict</h2>{line}")


def _evidence_table(data: ExperimentData, head: str) -> str:
    rows = []
    for arm in data.arms:
        ev = arm.evidence
        if ev is None:
            continue
        runs = [t.number for t in arm.trials if (t.kind == "confirmation" or t.unselected) and arm.best
                and t.params == arm.best.params]  # fmt: skip
        rate = "–" if ev.hit_rate is None else f"{ev.hit_rate:.0%}"
        fields = [
            ("runs", str(ev.runs)),
            ("hits", str(ev.hits)),
            ("hit_rate", rate),
            ("mean", fmt_samples(ev.mean)),
            ("interval", fmt_interval(ev.low, ev.high)),
            ("runs_trials", ", ".join(map(str, runs)) or "–"),
        ]
        rows.append(tagged(arm.label, arm.label, fields))
    table = html_table(["arm", "runs", "reached target", "hit rate", "mean samples to target", "95 % interval",
                    "trials"], rows)  # fmt: skip
    selected = ("the best tuning trial itself was selected, so it is not evidence" if not any(
        t.unselected for arm in data.arms for t in arm.trials) else "a configuration alone in its arm, as an imported "
        "one is, was not selected on its outcome, so its own run is evidence too")  # fmt: skip
    floored = "".join(
        f"<p class=note data-field=floored data-arm='{escape(arm.label)}'>{escape(arm.label)}: its runs agree closer "
        f"than one evaluation interval ({arm.evidence.floored:,.0f} samples) can tell, so its interval is that "
        "resolution's, not their spread's: they were read at the same evaluation, or on identical curves.</p>"
        for arm in data.arms if arm.evidence is not None and arm.evidence.floored is not None)  # fmt: skip
    return (f"{head}<p>Per arm, from the confirmation runs of its best configuration ({escape(data.confirmation_plan)}"
            f"; {selected}). Samples to target interpolated "
            f"between evaluations. Mean over the runs that reached the target; 95 % interval mean ± t(0.975, n−1)·s/√n "
            f"over those n runs (none below 2), s at least the evaluation interval / √12 where the evaluations did not "
            f"tell the runs apart. The verdict compares arms on the log scale (Welch) and counts a miss "
            f"at its budget, the least it would have needed.</p>{table}{floored}")  # fmt: skip


def _outcomes_section(data: ExperimentData, drawn: dict) -> str:
    rows = []
    for arm in data.arms:
        counts = arm.counts()
        best = arm.best
        best_text = "–" if best is None else "missed" if best.value is None else fmt_objective(best.value)
        fields = [("tuning", str(len(arm.tuning)))] + [(o.replace(" ", "_"), str(counts[o])) for o in OUTCOMES]
        fields += [("best_objective", best_text), ("best_trial", "–" if best is None else str(best.number))]
        rows.append(tagged(arm.label, arm.label, fields))
    head = ["arm", "tuning trials", *OUTCOMES, figures.best_of(data.metric), "best trial"]
    return (f"<h2>Samples to target and outcomes</h2>"
            f"<p>Tuning trials per outcome: reached the target, missed it (used the whole sample budget), diverged, "
            f"failed, timed out, failed on bad data (not the hyperparameters' fault), unfinished (queued, running or "
            f"interrupted: the trial table says which). The best is the "
            f"storage's best tuning trial of the arm (what <code>hpo export</code> exports); a miss there means no "
            f"trial of the arm reached the target and its objective is the penalty.</p>"
            f"{html_table(head, rows)}"
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
        rows.append(tagged(arm.arm, f"{rung.samples:,}", fields))
    table = html_table(["rung (samples)", "budget (fraction)", "trials", "promoted to a larger budget"], rows)
    if not arm.chains:
        return table + "<p>No configuration was promoted.</p>"
    chains = []
    for chain in arm.chains[:LISTED_CHAINS]:
        rungs = " → ".join(f"{step.samples:,}" for step in chain)
        steps = " → ".join(_step(step, first=i == 0) for i, step in enumerate(chain))
        chains.append(cell(rungs, cls="l") + cell(steps, f"chain_{chain[0].number}", arm.arm, "l"))
    head = ["rungs (samples)", "trials, rung by rung (samples, outcome: objective)"]
    more = len(arm.chains) - len(chains)
    listed = f"; {len(chains)} listed, those that reached the largest budget first" if more else ""
    return (f"{table}<details><summary>{len(arm.chains):,} promoted configuration(s){listed}</summary>"
            f"{html_table(head, chains, left=2)}</details>")  # fmt: skip


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
    return img(drawn["learning-curves"], FIGURES["learning-curves"][0])


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
            rows.append(cell(arm.label, cls="l") + cell("–") * 4)
            continue
        median = statistics.median(t.noise_scale for t in measured)
        bounds = sum(1 for t in measured if t.noise_lower_bound)
        batches = arm.global_batch_sizes
        ratio = f"{batches[0] / median:.2g}×" if len(batches) == 1 else "–"
        shown = fmt_noise(median) if not bounds else f"≥ {fmt_noise(median)} (lower bound: {bounds} of {len(measured)}"\
            " trials' estimates are lower bounds)"  # fmt: skip
        fields = [("noise_trials", str(len(measured))), ("noise_median", shown),
                  ("batch", ", ".join(f"{b:,}" for b in batches)), ("batch_ratio", ratio)]  # fmt: skip
        rows.append(tagged(arm.label, arm.label, fields))
    table = html_table(["arm", "trials measured", "noise scale (median)", "global batch", "batch / noise scale"], rows)
    return (head + "<p>B_simple = tr(Σ)/|G|² (McCandlish et al. 2018), estimated from the gradient norms at two batch "
            "sizes and smoothed over steps; a trial's value is the median over the second half of its training "
            "(it is noisiest early). A batch several times the noise scale buys diminishing returns: more samples "
            "per step no longer mean proportionally fewer steps. B_simple differs from the critical batch size by a "
            "curvature factor, and short runs measure it early in training: read it as an order of magnitude.</p>"
            f"<p class=note>{escape(NOISE_TRUST)}</p>" + table + img(fig, FIGURES["noise-scale"][0]))  # fmt: skip


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
        rows = [cell(str(i + 1)) + cell(name, cls="l") + cell(f"{mean:.3f} ± {std:.3f}", "importance", arm.label)
                + f"<td class=l><span class=bar style='width:{max(0.0, mean) / top * 200:.0f}px'></span></td>"
                for i, (name, mean, std) in enumerate(imp.ranking)]  # fmt: skip
        fitted = f"{imp.trials:,} of {imp.usable:,} usable trials (a fixed stride in trial order)" if imp.usable \
            else f"{imp.trials} trials"  # fmt: skip
        parts.append(f"<p>{fitted}; surrogate out-of-bag R² {imp.oob_r2:.2f}"
                     + (" — it explains nothing: do not read the ranking." if imp.oob_r2 <= 0 else ".") + "</p>"
                     + html_table(["rank", "parameter", "R² drop", ""], rows, left=2))  # fmt: skip
    return "".join(parts)


def _best_configs_section(data: ExperimentData, hpo_command: str) -> str:
    parts = ["<h2>Best configuration per arm</h2>"]
    files = _export_files([arm.label for arm in data.arms])
    for arm in data.arms:
        best = arm.best
        parts.append(f"<h3>{escape(arm.label)}</h3>")
        if best is None:
            parts.append("<p>No completed tuning trial.</p>")
            continue
        status = (f"reached the target at {fmt_samples(best.samples_to_target)} samples" if best.value is not None
                  else f"missed the target (best accuracy {fmt_accuracy(best.best_mlm_accuracy)}; objective "
                       f"{fmt_objective(best.objective)} is the penalty)")  # fmt: skip
        rows = [cell(k, cls="l") + cell(_param(v), cls="l") for k, v in best.params.items()]
        arm_flag = f" --arm {shlex.quote(arm.label)}" if data.compare else ""
        out = files[arm.label] if data.compare else "best.yaml"
        command = f"{hpo_command} export {shlex.quote(data.name)}{arm_flag} -o {out}"
        parts.append(f"<p>Trial {best.number}: {escape(status)}.</p>{html_table(['parameter', 'value'], rows, left=2)}"
                     f"<pre data-field=export data-arm='{escape(arm.label)}'>{escape(command)}</pre>")  # fmt: skip
    return "".join(parts)


def _param(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _export_files(labels: list[str]) -> dict[str, str]:
    """The file each arm's export command writes, one of its own per arm (the commands run one after another, and
    each replaces a file an earlier export wrote): `best-VALUES.yaml` with every compare value of the arm
    (`best-lamb-512.yaml`), numbered where two arms' values read alike once made file-name safe, in any case: on a
    file system that ignores case (macOS's, Windows') `best-Adam.yaml` and `best-adam.yaml` are one file."""
    files: dict[str, str] = {}
    for label in labels:
        values = "-".join(_slug(part.split("=", 1)[-1]) for part in label.split(","))
        name, n = f"best-{values}.yaml", 2
        while name.casefold() in {taken.casefold() for taken in files.values()}:
            name, n = f"best-{values}-{n}.yaml", n + 1
        files[label] = name
    return files


def _slug(value: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in value).strip("-") or "arm"


def _trials_section(data: ExperimentData) -> str:
    listed = listed_trials(data)
    rows = [_trial_row(t) for t in listed]
    head = ["#", "arm", "kind", "seed", "outcome", "objective", "samples to target", "best accuracy",
            "samples", "global batch", "noise scale", "parameters", "reason"]  # fmt: skip
    if len(listed) == len(data.trials):
        return (f"<h2>All trials</h2><details><summary>{len(rows)} trials</summary>"
                f"{html_table(head, rows, left=0)}</details>")  # fmt: skip
    every = f"hpo trials {shlex.quote(data.name)}"
    return (f"<h2>Trials</h2><p data-field=listed>{len(rows):,} of {len(data.trials):,} trials listed: each arm's "
            f"{LISTED_BEST} best tuning trials and every confirmation run. The counts per outcome are in the "
            f"outcomes table above; <code>{escape(every)}</code> lists all of them (<code>--arm</code>, "
            f"<code>--state</code>; <code>--after N --limit M</code> pages).</p><details><summary>{len(rows):,} "
            f"trials</summary>{html_table(head, rows, left=0)}</details>")  # fmt: skip


def listed_trials(data: ExperimentData) -> list[TrialRow]:
    """The trials the table lists, in number order: all of them up to LISTED_TRIALS; above, each arm's
    LISTED_BEST best tuning trials (`top_trials`) and every confirmation run."""
    if len(data.trials) <= LISTED_TRIALS:
        return data.trials
    numbers = {t.number for arm in data.arms for t in top_trials(arm.tuning, data.direction, LISTED_BEST)}
    return [t for t in data.trials if t.number in numbers or t.kind == "confirmation"]


def _trial_row(t: TrialRow) -> str:
    params = ", ".join(f"{k}={_param(v)}" for k, v in t.params.items())
    shown = t.state if t.outcome == "unfinished" else t.outcome  # queued, running or interrupted, as hpo trials says
    left = [t.arm, t.kind, "–" if t.seed is None else str(t.seed), shown]
    right = [fmt_objective(t.objective), fmt_samples(t.samples_to_target), fmt_accuracy(t.best_mlm_accuracy),
             fmt_samples(t.samples), fmt_samples(t.global_batch_size), fmt_trial_noise(t)]  # fmt: skip
    return (cell(str(t.number)) + "".join(cell(v, cls="l") for v in left) + "".join(cell(v) for v in right)
            + cell(params, cls="l") + cell(t.reason or "", cls="l"))  # fmt: skip


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
    drawn = comparison_figures(points, fits)
    link = link or (lambda name: f"{name}.html")
    back = f'<p><a href="{escape(index)}">all experiments</a></p>' if index else ""
    listing = "".join(f"<li><a href='{escape(link(d.name))}'>{escape(d.name)}</a> — {escape(d.liveness)}; "
                      f"{escape(d.verdict.line if d.verdict else 'no arms')}</li>" for d in experiments)  # fmt: skip
    heading = f"Comparing {len(experiments)} experiments" if len(experiments) != 1 else "Batch sizes of one experiment"
    body = (f"{back}<h1>{escape(heading)}</h1><ul>{listing}</ul>"
            + scaling_notes(experiments) + scaling_table(points)
            + (img(drawn[BATCH_SIZES], BATCH_FIGURE) if drawn else "<p>No arm has a best trial yet.</p>")
            + (fit_section(points, fits) if points else "")
            + verdicts_by_batch(points, DEFAULT_MARGIN, {b for d in experiments for b in d.declared_batch_sizes})
            )  # fmt: skip
    return page("comparison report", body)


def comparison_figures(points: Sequence[ScalingPoint], fits: dict) -> dict:
    """The figures of the comparison page by slug (what it embeds and `hpo report --png` writes as compare-SLUG.png):
    the batch-size view's, where some arm has a best trial (`points`)."""
    return {BATCH_SIZES: figures.scaling_figure(points, fits)} if points else {}


def comparison_pngs(experiments: Sequence[ExperimentData]) -> dict[str, bytes]:
    """The comparison page's figures as PNG files (slug -> contents); none where no arm has a best trial yet."""
    points = scaling_points(experiments, experiment_runs(experiments))
    drawn = comparison_figures(points, scaling_fits(points))
    return {slug: figures.png_bytes(fig, figures.FILE_DPI) for slug, fig in drawn.items()}


# --------------------------------------------------------------------------- the list of experiments


def index_page(storage: Storage, *, link: Link, compare_action: str) -> str:
    """Every experiment with its status, trial counts and a link to its report; a form compares several."""

    rows = []
    for record in storage.list_experiments():
        rows.append(f"<td class=l><input type=checkbox name=name value='{escape(record.name)}'></td>"
                    + f"<td class=l><a href='{escape(link(record.name))}'>{escape(record.name)}</a></td>"
                    + cell(seen_status(record), cls="l") + cell(experiment_progress(storage, record), cls="l")
                    + cell(record.spec.get("experiment", {}).get("description", ""), cls="l"))  # fmt: skip
    table = html_table(["", "experiment", "status", "trials", "description"], rows, left=4)
    body = ("<h1>Experiments</h1>" + (f"<form method=get action='{escape(compare_action)}'>{table}"
            "<p><button type=submit>Compare the selected experiments</button></p></form>" if rows
            else "<p>No experiments yet: start one with <code>hpo run EXPERIMENT.yaml</code>.</p>"))  # fmt: skip
    return page("experiments", body)
