"""The comparison report, built from a real tiny experiment run by `hpo run` (ADAM vs LAMB on the tiny trainer
with gradient accumulation, so the noise scale is measured, and 2 confirmation seeds per arm). Every number the
page shows is read back from its HTML and checked against a computation made here from the stored records
(scipy's t quantile, numpy medians), not through hpo.report or hpo.evidence.verdict.
"""

from __future__ import annotations

import base64
import contextlib
import io
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main
from hpo.report.bands import band_over_trials, best_so_far
from hpo.report.data import Dimension, TrialRow
from hpo.report.importance import rank_importance
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from tests.hpo.engine.test_study import tiny_overrides
from tests.hpo.evidence.independent import arm_evidence
from tests.sessionwide import built_once

EXPERIMENT = "report-demo"
TARGET = 0.015  # the experiment's target MLM accuracy
EVERY = 16  # its evaluation interval in samples (tiny_overrides' eval.every_samples)
_BUILT: dict[str, str] = {}  # one experiment per test session, shared with tests/server/test_report_page.py


def make_report_experiment(tmp_path_factory) -> str:
    """The database URL of the finished tiny experiment (run once per session, for every worker; this worker's copy):
    one tuning trial per arm and three confirmation seeds each, 8 trials (about 40 s); the seeds give hits and misses
    in both arms."""
    if "url" not in _BUILT:
        copy = tmp_path_factory.mktemp("report") / "hpo.db"
        shutil.copyfile(built_once(tmp_path_factory, "report-experiment", _run_report_experiment), copy)
        _BUILT["url"] = f"sqlite:///{copy}"
    return _BUILT["url"]


def _run_report_experiment(directory: Path) -> Path:
    overrides = {"batch.global_batch_size": 16, "eval.target_mlm_accuracy": TARGET, "budget.max_samples": 64}
    spec = {
        "name": EXPERIMENT, "base_config": {}, "description": "ADAM vs LAMB, tiny",
        "overrides": tiny_overrides(directory / "data", **overrides),
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]},
                  "optimizer.lr": {"float": [1.0e-3, 1.0e2], "log": True},
                  "schedule.warmup_steps": {"int": [0, 2]}},
        "compare": ["optimizer.name"], "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 2, "max_parallel": 2, "trial_timeout_s": 120, "confirm_seeds": 3},
        "resources": {"gpus": "none", "cpu_slots": 2},
    }  # fmt: skip
    path = directory / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    url = f"sqlite:///{directory / 'hpo.db'}"
    err = io.StringIO()  # `hpo run` in this process: no interpreter start
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["--db", url, "run", str(path), "--run-dir", str(directory / "run"), "--quiet"])
    assert code == 0, err.getvalue()
    return directory / "hpo.db"


def hpo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpo", *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))  # fmt: skip


@pytest.fixture(scope="module")
def report_db(tmp_path_factory) -> str:
    return make_report_experiment(tmp_path_factory)


@pytest.fixture(scope="module")
def report_html(report_db, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("html")
    assert main(["--db", report_db, "report", EXPERIMENT, "-o", str(out)]) == 0
    return (out / f"{EXPERIMENT}.html").read_text()


# --------------------------------------------------------------------------- reading the page back


class Page(HTMLParser):
    """The tagged cells (data-arm, data-field) -> text, every table as rows of cell texts, and the images."""

    def __init__(self, html: str):
        super().__init__()
        self.cells: dict[tuple[str | None, str], str] = {}
        self.tables: list[list[list[str]]] = []
        self.images: list[dict[str, str]] = []
        self._open: list[tuple[str | None, str] | None] = []
        self._text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs)
        if tag == "table":
            self.tables.append([])
        if tag == "tr" and self.tables:
            self.tables[-1].append([])
        if tag in ("td", "th", "pre", "p", "div", "b", "span"):
            self._open.append((attrs.get("data-arm"), attrs["data-field"]) if "data-field" in attrs else None)
            self._text = [] if tag in ("td", "th") or "data-field" in attrs else self._text

    def handle_data(self, data):
        self._text.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th", "pre", "p", "div", "b", "span") and self._open:
            key = self._open.pop()
            text = "".join(self._text).strip()
            if key is not None:
                self.cells[key] = text
            if tag in ("td", "th") and self.tables and self.tables[-1]:
                self.tables[-1][-1].append(text)


def table_with(page: Page, header: str) -> list[list[str]]:
    return next(t for t in page.tables if t and header in t[0])


# --------------------------------------------------------------------------- independent numbers


def stored(url: str):
    with SqlStorage(url) as storage:
        record = storage.get_experiment_by_name(EXPERIMENT)
        trials = storage.list_trials(record.id)
        noise = {t.number: [(m.samples, m.value) for m in storage.get_metrics(t.id, "noise_scale")] for t in trials}
    return record, trials, noise


def undefined_by_trial(url: str) -> dict[int, float]:
    """Trial number -> the share of its measured late steps (grad_sq_norm_big reported) without an estimate."""
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name(EXPERIMENT).id)
        return {t.number: undefined_share([(m.step, m.samples) for m in storage.get_metrics(t.id, "grad_sq_norm_big")],
                                          {m.step: m.value for m in storage.get_metrics(t.id, "noise_scale")})
                for t in trials}  # fmt: skip


def undefined_share(measured: list[tuple[int, int]], estimates: dict[int, float]) -> float:
    late = [step for step, s in measured if s is not None and s >= max(s for _, s in measured) / 2]
    empty = [step for step in late if not (estimates.get(step, 0) > 0 and math.isfinite(estimates[step]))]
    return len(empty) / len(late) if late else 0.0


def shown_noise(value: float, undefined: float, big_batch: int = 16) -> str:
    """The report's text for a trial's noise scale: `≥ value (...)` past 4x the big batch (16: one process,
    accumulation 2) or with 20 % or more of its late steps empty."""
    text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    lower = value > 4 * big_batch or undefined >= 0.2
    return f"≥ {text}" if lower else text


def expected_outcome(t) -> str:
    if t.state is TrialState.COMPLETED:
        return "reached" if t.samples_to_target is not None else "missed"
    return t.state.value


def expected_evidence(trials, arm: str, url: str | None = None):
    """The arm's best tuning trial, its confirmation runs, their hits (samples to target interpolated between
    evaluations, tests/hpo/evidence/independent.py), the hits' mean and 95 % t interval."""
    from scipy import stats

    with SqlStorage(url or _BUILT["url"]) as storage:
        best, runs, hits = arm_evidence(storage, trials, arm, TARGET)
    mean = sum(hits) / len(hits) if hits else None
    interval = None
    if len(hits) >= 2:
        sd = statistics.stdev(hits)
        if any(h % EVERY == 0 for h in hits) or len(set(hits)) < len(hits):  # runs the evaluations did not tell apart
            sd = max(sd, EVERY / math.sqrt(12))  # at least a uniform error over one evaluation interval
        half = stats.t.ppf(0.975, len(hits) - 1) * sd / math.sqrt(len(hits))
        interval = (max(mean - half, 0.0), mean + half)  # samples: never below 0
    return best, runs, hits, mean, interval


def late_median(points) -> float | None:
    good = [(s, v) for s, v in points if s is not None and v is not None and math.isfinite(v) and v > 0]
    if not good:
        return None
    half = max(s for s, _ in good) / 2
    return float(statistics.median([v for s, v in good if s >= half]))


# --------------------------------------------------------------------------- the report of a real experiment


def test_report_numbers_match_the_database(report_db, report_html):
    record, trials, _ = stored(report_db)
    page = Page(report_html)
    arms = ["optimizer.name=adamw", "optimizer.name=lamb"]
    assert sum(t.kind is TrialKind.CONFIRMATION for t in trials) == 6  # 3 seeds x 2 arms really ran
    assert "batch_study_note" not in report_html  # one batch size: the verdict is the question's answer
    for arm in arms:
        tuning = [t for t in trials if t.arm == arm and t.kind is TrialKind.TUNING]
        assert page.cells[(arm, "tuning")] == str(len(tuning))
        for outcome in ("reached", "missed", "diverged", "failed", "timeout"):
            assert page.cells[(arm, outcome)] == str(sum(expected_outcome(t) == outcome for t in tuning)), outcome
        best, runs, hits, mean, interval = expected_evidence(trials, arm)
        assert page.cells[(arm, "best_trial")] == str(best.number)
        shown_best = f"{best.objective:,.6g}" if best.samples_to_target is not None else "missed"
        assert page.cells[(arm, "best_objective")] == shown_best
        assert page.cells[(arm, "runs")] == str(len(runs))
        assert page.cells[(arm, "hits")] == str(len(hits))
        assert page.cells[(arm, "hit_rate")] == f"{len(hits) / len(runs):.0%}"
        assert page.cells[(arm, "mean")] == (f"{mean:,.0f}" if mean is not None else "–")
        assert page.cells[(arm, "interval")] == (f"{interval[0]:,.0f} to {interval[1]:,.0f}" if interval else "–")
        assert page.cells[(arm, "runs_trials")] == ", ".join(str(t.number) for t in runs)
    never_always = all(len(expected_evidence(trials, a)[2]) < len(expected_evidence(trials, a)[1]) for a in arms)
    if never_always:  # no arm reached the target in every run: neither a winner nor equivalent
        assert page.cells[(None, "verdict")].startswith("not yet")
    assert page.cells[(None, "finished")] == str(sum(t.state.finished for t in trials))


def test_report_noise_scale_per_trial_and_arm_matches_the_stored_curves(report_db, report_html):
    _, trials, noise = stored(report_db)
    undefined = undefined_by_trial(report_db)
    page = Page(report_html)
    rows = table_with(page, "noise scale")[1:]  # the "All trials" table: one row per trial
    head = table_with(page, "noise scale")[0]
    assert [int(r[0]) for r in rows] == sorted(t.number for t in trials)
    measured = 0
    for row in rows:
        expected = late_median(noise[int(row[0])])
        shown = row[head.index("noise scale")]
        measured += expected is not None
        if expected is None:
            assert shown == "–"
        else:
            assert shown.split(" (lower bound")[0] == shown_noise(expected, undefined[int(row[0])])
    assert measured >= 3  # accumulation (16 = 2 x 8) measures it in every trial that trains past its first steps
    for arm in ("optimizer.name=adamw", "optimizer.name=lamb"):
        values = [late_median(noise[t.number]) for t in trials if t.arm == arm]
        values = [v for v in values if v is not None]
        median = statistics.median(values)
        assert page.cells[(arm, "noise_trials")] == str(len(values))
        numbers = [t.number for t in trials if t.arm == arm and late_median(noise[t.number]) is not None]
        bounds = sum(shown_noise(late_median(noise[n]), undefined[n]).startswith("≥") for n in numbers)
        text = f"{median:,.0f}" if median >= 100 else f"{median:.3g}"
        assert page.cells[(arm, "noise_median")].split(" (lower bound")[0] == (f"≥ {text}" if bounds else text)
        assert page.cells[(arm, "batch")] == "16"


def test_report_is_self_contained_with_every_figure_and_says_it_is_small(report_db, report_html):
    page = Page(report_html)
    alts = [img["alt"] for img in page.images]
    for figure in ("samples to target per arm", "best objective so far per arm", "learning curves",
                   "gradient noise scale", "objective against each hyperparameter"):  # fmt: skip
        assert figure in alts
    for img in page.images:
        assert img["src"].startswith("data:image/png;base64,")
        data = base64.b64decode(img["src"].split(",", 1)[1])
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "http://" not in report_html and "https://" not in report_html  # nothing to fetch
    assert "Small experiment: 1 tuning trial(s)" in report_html
    for arm in ("optimizer.name=adamw", "optimizer.name=lamb"):
        assert page.cells[(arm, "importance")].startswith("too few trials to rank")


def test_report_export_commands_export_each_arms_best(report_db, report_html, tmp_path, monkeypatch):
    _, trials, _ = stored(report_db)
    page = Page(report_html)
    for arm in ("optimizer.name=adamw", "optimizer.name=lamb"):
        command = shlex.split(page.cells[(arm, "export")])
        assert command[:3] == ["hpo", "--db", report_db] and command[3] == "export"
        monkeypatch.chdir(tmp_path)
        assert main(command[1:]) == 0
        exported = yaml.safe_load((tmp_path / command[-1]).read_text())
        best = expected_evidence(trials, arm)[0]
        assert exported["optimizer"]["name"] == best.params["optimizer.name"]
        assert exported["optimizer"]["lr"] == pytest.approx(best.params["optimizer.lr"])


def test_comparison_report_shows_each_arm_at_its_batch_size(report_db, tmp_path):
    _, trials, noise = stored(report_db)
    assert main(["--db", report_db, "report", EXPERIMENT, EXPERIMENT, "-o", str(tmp_path)]) == 0
    assert not (tmp_path / "compare.html").exists()  # one distinct experiment: nothing to compare
    from hpo.report.html import comparison_report

    with SqlStorage(report_db) as storage:
        page = Page(comparison_report(storage, [EXPERIMENT]))
    for arm, optimizer in (("optimizer.name=adamw", "adamw"), ("optimizer.name=lamb", "lamb")):
        key = f"{EXPERIMENT}/{arm}"
        best, runs, hits, mean, interval = expected_evidence(trials, arm)
        assert page.cells[(key, "batch")] == "16"
        assert page.cells[(key, "hits")] == f"{len(hits)} of {len(runs)}"
        assert page.cells[(key, "mean")] == (f"{mean:,.0f}" if mean is not None else "–")
        assert page.cells[(key, "interval")] == (f"{interval[0]:,.0f} to {interval[1]:,.0f}" if interval else "–")
        assert optimizer in [row[0] for row in table_with(page, "optimizer")]
    assert any(img["alt"].startswith("samples to target and noise scale") for img in page.images)


def fmt_fitted(value: float) -> str:
    """The page's text of a fitted quantity: ∞, whole numbers with commas from 100 on, 3 significant digits below."""
    return "∞" if math.isinf(value) else f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def fmt_noise(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def shown_estimate(estimate) -> str:
    return "–" if estimate is None else (f"{fmt_fitted(estimate.value)} ({fmt_fitted(estimate.low)} to "
                                         f"{fmt_fitted(estimate.high)})")  # fmt: skip


def shown_fit(page: Page, optimizer: str, fit) -> None:
    """The page's row of `optimizer` in the fit table shows `fit` (hpo.evidence.batch_scaling's result)."""
    hits, sizes = fit.runs - fit.misses, sum(1 for p in fit.points if p.hits)
    missed = f"; {fit.misses} missed (left out)" if fit.misses else ""
    assert page.cells[(optimizer, "fit_runs")] == f"{hits} of {fit.runs} at {sizes} batch size(s){missed}"
    for field, estimate in (("fit_e_min", fit.e_min), ("fit_b_crit", fit.b_crit), ("fit_s_min", fit.s_min),
                            ("fit_well", fit.well)):  # fmt: skip
        assert page.cells[(optimizer, field)] == shown_estimate(estimate), field
    assert page.cells[(optimizer, "fit_note")] == (fit.reason or fit.note or "")
    well, low = fit.well_measured, fit.smallest
    if well is None:
        assert page.cells[(optimizer, "fit_well_measured")] == "–"
    else:
        interval = "–" if well.low is None else f"{well.low:,.0f} to {well.high:,.0f}"
        missed = f"; {well.misses} of {well.runs} missed" if well.misses else ""
        assert page.cells[(optimizer, "fit_well_measured")] == (
            f"{well.batch:,.0f}: {well.mean:,.0f} ({interval}), smallest {low.mean:,.0f} at {low.batch:,.0f}{missed}"
        )


def test_comparison_report_fits_each_optimizer_with_hpo_batch_scaling(report_db):
    """Both arms ran at one batch size: the fit table says it cannot fit, and the measured rule reads that batch."""
    from hpo.evidence.batch_scaling import fit_batch_scaling
    from hpo.report.html import comparison_report

    _, trials, _ = stored(report_db)
    with SqlStorage(report_db) as storage:
        html = comparison_report(storage, [EXPERIMENT])
    page = Page(html)
    assert "<h2>Where the batch stops scaling</h2>" in html
    for arm, optimizer in (("optimizer.name=adamw", "adamw"), ("optimizer.name=lamb", "lamb")):
        _, runs, hits, _, _ = expected_evidence(trials, arm)
        fit = fit_batch_scaling([(16, s) for s in hits] + [(16, None)] * (len(runs) - len(hits)))
        assert fit.reason.startswith("cannot fit")
        shown_fit(page, optimizer, fit)


def test_comparison_page_draws_and_tabulates_the_fit_of_each_optimizer(report_db):
    """The real experiment's points moved to 5 batch sizes each, with runs drawn from E(B) = E_min (1 + B / B_crit)
    (a miss at the largest): the page's fitted numbers are hpo.evidence.batch_scaling's on the same runs, the figure's
    dashed
    curve is the fitted E(B), and the fits land near the truth."""
    import dataclasses

    import numpy as np

    from hpo.evidence.batch_scaling import fit_batch_scaling
    from hpo.evidence.verdict import ArmRuns, summarize
    from hpo.report import figures
    from hpo.report.data import load_experiment
    from hpo.report.html import comparison_page
    from hpo.report.scaling import scaling_points

    with SqlStorage(report_db) as storage:
        experiments = [load_experiment(storage, EXPERIMENT)]
    rng = np.random.default_rng(11)
    truth = {"adamw": (400.0, 64.0), "lamb": (300.0, 256.0)}  # E_min, B_crit
    points = []
    for real in scaling_points(experiments):
        e_min, b_crit = truth[real.optimizer]
        for batch in (16, 32, 64, 128, 256):
            runs = tuple(e_min * (1 + batch / b_crit) * float(np.exp(rng.normal(0, 0.05))) for _ in range(3))
            runs += (None,) if batch == 256 else ()
            evidence = summarize(ArmRuns(real.arm, runs, real.evidence.max_samples))
            points.append(dataclasses.replace(real, global_batch_size=batch, runs=runs, evidence=evidence))
    page = Page(comparison_page(experiments, points))
    fits = {}
    for optimizer, (e_min, b_crit) in truth.items():
        fit = fit_batch_scaling([(p.global_batch_size, s) for p in points if p.optimizer == optimizer for s in p.runs])
        shown_fit(page, optimizer, fit)
        assert fit.misses == 1 and fit.note is None
        assert fit.e_min.value == pytest.approx(e_min, rel=0.1) and fit.b_crit.value == pytest.approx(b_crit, rel=0.25)
        assert 0 < fit.b_crit.low < fit.b_crit.high < math.inf
        noise = [f"{p.global_batch_size:,}: {'≥ ' if p.noise_lower_bounds else ''}{fmt_noise(p.noise_scale)}"
                 for p in points if p.optimizer == optimizer and p.noise_scale is not None]  # fmt: skip
        assert page.cells[(optimizer, "fit_noise")] == ("; ".join(noise) or "–")
        fits[optimizer] = fit
    fig = figures.scaling_figure(points, fits)
    dashed = [line for line in fig.axes[0].lines if line.get_linestyle() == "--"]
    assert len(dashed) == 2
    for line, optimizer in zip(dashed, sorted(truth), strict=True):
        xs, ys = line.get_xdata(), line.get_ydata()
        assert np.allclose(ys, [fits[optimizer].samples(x) for x in xs])
    assert any(img["alt"].startswith("samples to target and noise scale") for img in page.images)
    unmeasured = [dataclasses.replace(p, noise_scale=None, noise_low=None, noise_high=None) for p in points]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns of a legend asked for where no line has a label
        fig = figures.scaling_figure(unmeasured, fits)
    assert fig.axes[1].get_legend() is None and fig.axes[0].get_legend() is not None

    def labels(fig) -> list[str]:
        return [t.get_text().strip() for t in fig.axes[0].texts]

    assert "missed" not in labels(fig)  # a miss among hits is in the hit count (3/4), not on the strip
    all_missed = dataclasses.replace(points[0], evidence=summarize(ArmRuns(points[0].arm, (None, None), 10**6)))
    assert "missed" in labels(figures.scaling_figure([all_missed, *points[1:]], fits))


def test_report_of_an_unknown_experiment_exits_2_and_writes_nothing(report_db, tmp_path, capsys):
    assert main(["--db", report_db, "report", EXPERIMENT, "nope", "-o", str(tmp_path / "out")]) == 2
    assert "no experiment named 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- the pieces, on known inputs


def test_best_so_far_and_its_bootstrap_band_on_known_values():
    values = [None, 5.0, 3.0]
    assert best_so_far(values, "minimize")[1:].tolist() == [5.0, 3.0] and math.isnan(best_so_far(values, "minimize")[0])
    band = band_over_trials(values, "minimize")
    # P(no hit in k draws) = (1/3)^k > 2.5 % for k <= 3: the band stays open above; P(draw the 3) >= 1/3: low = 3
    assert band.high.tolist() == [math.inf] * 3 and band.low.tolist() == [3.0] * 3
    maximize = band_over_trials([0.2, 0.2, 0.2], "maximize")
    assert maximize.best.tolist() == maximize.low.tolist() == maximize.high.tolist() == [0.2] * 3


def _rows(objectives, params) -> list[TrialRow]:
    return [TrialRow(i, "all", "tuning", None, "reached", o, o, int(o), None, 100, None, 0, 8, p, None)
            for i, (o, p) in enumerate(zip(objectives, params, strict=True))]  # fmt: skip


def test_importance_ranks_the_parameter_that_drives_the_objective():
    import numpy as np

    rng = np.random.default_rng(1)
    a, b = rng.uniform(0, 1, 40), rng.uniform(0, 1, 40)
    rows = _rows(list(1000 + 500 * a), [{"a": x, "b": y} for x, y in zip(a, b, strict=True)])
    dims = [Dimension("a", "float", False), Dimension("b", "float", False)]
    result = rank_importance(rows, dims, "minimize")
    assert result.reason is None and [name for name, _, _ in result.ranking] == ["a", "b"]
    assert result.oob_r2 > 0.5
    assert rank_importance(rows[:9], dims, "minimize").reason.startswith("too few trials to rank: 9 usable")


def test_permutation_drops_equal_scikit_learns_permutation_importance():
    """One predict over all the shuffled copies gives the same drops as scikit-learn's one predict per copy."""
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.inspection import permutation_importance

    from hpo.report.importance import permutation_drops

    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (120, 4))
    y = 3 * x[:, 0] + x[:, 2] ** 2 + rng.normal(0, 0.1, 120)
    forest = RandomForestRegressor(n_estimators=20, random_state=0, min_samples_leaf=2).fit(x, y)
    for seed, repeats in ((0, 5), (7, 3)):
        expected = permutation_importance(forest, x, y, n_repeats=repeats, random_state=seed).importances
        drops = permutation_drops(forest, x, y, repeats, seed)
        assert drops.shape == (4, repeats)
        np.testing.assert_allclose(drops, expected, rtol=0, atol=1e-12)
        assert drops[0].mean() > drops[1].mean()  # the column that drives y matters more than one that does not


def test_fixed_margins_keep_the_labels_and_the_points_note_on_the_canvas():
    """A figure laid out by fixed margins (no tight layout) keeps every axis, its labels and the "points" note on
    the canvas, the note below the axes without touching them (it fell off the canvas once)."""
    from types import SimpleNamespace

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from hpo.report.data import MAX_DRAWN
    from hpo.report.figures import _miss_strip, _points_note

    fig = Figure(figsize=(12, 4.2))
    for ax in fig.subplots(1, 2):
        ax.plot([0, 5000], [2000, 120000])
        ax.set_xlabel("tuning trials of the arm, in the order they ran")
        ax.set_ylabel("best samples to target so far")
        _miss_strip(ax)
    fig.suptitle("a title")
    _points_note(fig, SimpleNamespace(arms=[SimpleNamespace(tuning=[None] * (MAX_DRAWN + 1))]))
    renderer = FigureCanvasAgg(fig).get_renderer()
    canvas = fig.bbox
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]
    note = next(t for t in fig.texts if t.get_text().startswith("points:")).get_window_extent(renderer)
    for box in [*boxes, note]:
        assert canvas.x0 <= box.x0 and box.x1 <= canvas.x1 and canvas.y0 <= box.y0 and box.y1 <= canvas.y1
    assert all(note.y1 < box.y0 for box in boxes)  # below every axis, its tick labels and its x label
    assert boxes[0].x1 < boxes[1].x0  # the left panel's "missed" label clears the right panel's y label
