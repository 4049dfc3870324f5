"""The report, `hpo report --png` and `hpo status` where there is little or nothing to show: no finished trial,
an arm whose runs all missed, confirmation runs beside the tuning budget, and noise-scale estimates that are
only lower bounds. Experiments are written straight through the storage API (no trainer runs), so every
count the pages should show is known here by construction.
"""

from __future__ import annotations

import re
import shlex
import statistics
from datetime import UTC, datetime
from html import escape, unescape

import numpy as np
import pytest

from hpo.cli.main import main
from hpo.errors import HpoError
from hpo.experiment import experiment_from_dict, stored_form
from hpo.report.data import NOISE_CHECKED_RATIO, NOISE_UNDEFINED_SHARE, big_batch, lower_bound_reason
from hpo.report.html import experiment_report
from hpo.storage import SqlStorage
from hpo.storage.base import MetricPoint, MetricRecord
from hpo.storage.noise import late_noise
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from tests.hpo.report.test_report import Page, table_with

MAX_SAMPLES = 512
ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"


def test_an_experiment_named_compare_among_several_is_refused_before_any_page_is_written(tmp_path, capsys):
    """Its page would be compare.html, which the comparison of several then wrote over without a word."""
    storage, eid, url = make_experiment(tmp_path, name="compare")
    add_trial(storage, eid, ADAMW, "reached")
    storage.create_experiment("other", storage.get_experiment(eid).spec, "minimize")
    out = tmp_path / "html"
    assert main(["--db", url, "report", "compare", "other", "-o", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: hpo report: an experiment named compare shares its page's name, compare.html, ")
    assert not out.exists()
    assert main(["--db", url, "report", "compare", "-o", str(out)]) == 0  # on its own it has the name to itself
    assert [p.name for p in out.iterdir()] == ["compare.html"]


def test_a_database_that_goes_away_while_a_report_reads_leaves_no_page_or_directory(tmp_path, capsys, monkeypatch):
    """The names are checked, then the database goes away as the second experiment is read (its read fails as the
    storage's retry layer fails it): the report had made the -o directory and written the first page."""
    import hpo.report.data as data_module
    from hpo.errors import DatabaseUnavailableError

    storage, eid, url = make_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "reached")
    storage.create_experiment("other", storage.get_experiment(eid).spec, "minimize")
    real, calls = data_module.load_experiment, []

    def read_then_lose_the_database(storage, name, **kwargs):
        calls.append(name)
        if len(calls) == 2:
            raise DatabaseUnavailableError(f"cannot use the database {url}: connection refused")
        return real(storage, name, **kwargs)

    monkeypatch.setattr(data_module, "load_experiment", read_then_lose_the_database)
    out = tmp_path / "html"
    assert main(["--db", url, "report", "edge", "other", "-o", str(out)]) == 1
    error = capsys.readouterr().err
    assert calls == ["edge", "other"] and "connection refused" in error and "Traceback" not in error
    assert not out.exists()


def make_experiment(tmp_path, name="edge", trials=4, confirm_seeds=1, compare=True,
                    metric="samples_to_target") -> tuple[SqlStorage, int, str]:  # fmt: skip
    """An experiment row exactly as `hpo run` writes it (no trial yet): tiny trainer, accumulation 16 = 2 x 8."""
    space = {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}}
    if compare:
        space["optimizer.name"] = {"choice": ["adamw", "lamb"]}
    data = {
        "name": name, "base_config": {}, "description": "edge cases",
        "overrides": {"batch.global_batch_size": 16, "batch.micro_batch_size": 8, "eval.target_mlm_accuracy": 0.5,
                      "budget.max_samples": MAX_SAMPLES, "device": "cpu"},
        "space": space, "compare": ["optimizer.name"] if compare else [], "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": trials, "max_parallel": 1, "confirm_seeds": confirm_seeds},
        "objective": {"metric": metric},
        "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip
    spec = experiment_from_dict(data, f"{name}.yaml", base_dir=tmp_path)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    storage = SqlStorage(url, upgrade=True)
    return storage, storage.create_experiment(name, stored_form(spec, tmp_path / "run"), spec.direction), url


def add_trial(storage, eid, arm, outcome, lr=1e-3, kind=TrialKind.TUNING, points=()) -> int:
    """One trial: `reached` (at 256 samples), `missed`, `failed`, `running` or `queued`; `points` its metrics."""
    params = {"optimizer.lr": lr} | ({"optimizer.name": arm.split("=")[1]} if arm else {})
    seed = 7 if kind is TrialKind.CONFIRMATION else None
    spec = TrialSpec(None, params, arm=arm, global_batch_size=16, kind=kind, seed=seed)
    trial_id = storage.create_trial(eid, spec)
    if outcome == "queued":
        return trial_id
    storage.mark_trial_running(trial_id, pid=1, host="h")
    if points:
        storage.add_metrics(trial_id, list(points))
    if outcome == "reached":
        result = TrialResult(TrialState.COMPLETED, objective=256.0, samples_to_target=256, best_mlm_accuracy=0.55,
                             metrics={"samples": 256})  # fmt: skip
    elif outcome == "missed":
        result = TrialResult(TrialState.COMPLETED, objective=2.0 * MAX_SAMPLES, best_mlm_accuracy=0.3,
                             metrics={"samples": MAX_SAMPLES})  # fmt: skip
    elif outcome == "failed":
        result = TrialResult(TrialState.FAILED, reason="crashed")
    else:
        return trial_id
    storage.finish_trial(trial_id, result)
    return trial_id


def report(storage, name="edge") -> tuple[str, Page]:
    html = experiment_report(storage, name)
    return html, Page(html)


def curve(noise: list[float | None], accuracy: float = 0.55) -> list[MetricPoint]:
    """One point per step (16 samples each): an evaluation every 4 steps and the noise-scale estimator's record;
    None: a measured step without an estimate (only the big batch's norm reported)."""
    points = []
    for step, value in enumerate(noise, start=1):
        values = {"grad_sq_norm_big": 1.0, "grad_sq_norm_small": 2.0}
        if value is not None:
            values["noise_scale"] = value
        if step % 4 == 0:
            values["mlm_accuracy"] = accuracy * step / len(noise)
        points.append(MetricPoint(step, 16 * step, values))
    return points


# --------------------------------------------------------------------------- nothing finished yet


def test_nothing_finished_says_so_instead_of_empty_plots_and_counts_what_is_planned(tmp_path):
    storage, eid, _ = make_experiment(tmp_path, trials=4, confirm_seeds=1)  # 4 tuning + 1 per arm: 6 planned
    storage.claim_controller(eid, "h", 1, stale_after_s=60.0)  # a live controller (heartbeat now)
    add_trial(storage, eid, ADAMW, "running")
    html, page = report(storage)
    assert page.images == []
    assert page.cells[(None, "finished")] == "0" and page.cells[(None, "planned")] == "6"
    assert page.cells[(None, "progress")] == "0/4 tuning trials done, 0/2 confirmation runs"
    said = "Nothing to draw yet: no trial has finished (0 of 6 planned; created: 1 running)."
    assert html.count(said) == 5  # outcomes, best so far, learning curves, noise scale, hyperparameters
    assert page.cells[(None, "noise")] == said
    assert "reported a noise scale" not in html and "it needs two batch sizes" not in html
    assert "The experiment is live: these numbers will change as trials finish." in html


def test_an_interrupted_experiments_report_gives_its_trials_states_as_last_recorded(tmp_path):
    """Its controller is gone (no heartbeat): a trial stored as running may be running no more; the report says the
    states are the last recorded, and how to take the experiment over."""
    storage, eid, _ = make_experiment(tmp_path, trials=4, confirm_seeds=1)
    add_trial(storage, eid, ADAMW, "running")
    html, page = report(storage)
    said = "Nothing to draw yet: no trial has finished (0 of 6 planned; created: 1 running, as last recorded)."
    assert html.count(said) == 5 and "these numbers will change" not in html
    note = ("The experiment is interrupted: its controller stopped heartbeating, and its trials' states are those last "
            "recorded; `hpo resume edge` takes it over and finishes it.")  # fmt: skip
    assert escape(note) in html


def test_unfinished_trials_are_counted_by_state_as_hpo_status_counts_them(tmp_path, capsys):
    """A trial whose controller stopped while it ran is interrupted, as `hpo status` says: the report counted it as
    queued or running."""
    storage, eid, url = make_experiment(tmp_path, trials=4, confirm_seeds=1)  # 6 planned
    add_trial(storage, eid, ADAMW, "queued")
    add_trial(storage, eid, ADAMW, "running", lr=2e-3)
    for lr in (3e-3, 4e-3):
        storage.interrupt_trial(add_trial(storage, eid, LAMB, "running", lr=lr), "its controller stopped")
    assert main(["--db", url, "status", "edge"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("trials: ")]
    status = line.removeprefix("trials: ")
    assert status == "1 queued, 1 running, 2 interrupted"
    html, page = report(storage)
    said = f"Nothing to draw yet: no trial has finished (0 of 6 planned; created: {status}, as last recorded)."
    assert page.cells[(None, "nothing")] == said and "queued or running" not in html
    rows = table_with(page, "outcome")
    column = rows[0].index("outcome")
    shown = [row[column] for row in rows[1:]]
    listed = {f"{n} {state}" for state in ("queued", "running", "interrupted") if (n := shown.count(state))}
    assert listed == set(status.split(", ")) and len(shown) == 4


def test_png_export_of_nothing_finished_writes_no_file_and_says_why(tmp_path, capsys):
    storage, eid, url = make_experiment(tmp_path)
    add_trial(storage, eid, LAMB, "queued")
    out = tmp_path / "figures" / "png"
    assert main(["--db", url, "report", "edge", "-o", str(tmp_path / "html"), "--png", str(out)]) == 0
    assert "no figure for edge: Nothing to draw yet: no trial has finished (0 of 6 planned" in capsys.readouterr().err
    assert not (tmp_path / "figures").exists()


@pytest.mark.parametrize("where,under,why", [("-o", "", "is a file, not a directory"),
                                             ("-o", "sub", "cannot be created (Not a directory)"),
                                             ("--png", "", "is a file, not a directory")])  # fmt: skip
def test_an_output_path_that_is_a_file_or_cannot_be_made_is_named_in_an_error(tmp_path, capsys, where, under, why):
    """`-o` (or `--png`) naming an existing file, or a directory under one: an error naming the path and what to
    give instead, not a traceback; the file is left as it was."""
    storage, eid, url = make_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "reached")
    add_trial(storage, eid, LAMB, "reached")
    afile = tmp_path / "afile"
    afile.write_text("kept")
    path = afile / under if under else afile
    args = ["-o", str(path)] if where == "-o" else ["-o", str(tmp_path / "html"), "--png", str(path)]
    assert main(["--db", url, "report", "edge", *args]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: hpo report {where} {path}: {why}; give a directory that is not a file")
    assert "Traceback" not in error and afile.read_text() == "kept"


@pytest.mark.parametrize("page", ["edge.html", "compare.html"])
def test_a_directory_where_a_page_would_go_is_named_before_any_page_is_written(tmp_path, capsys, page):
    storage, eid, url = make_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "reached")
    storage.create_experiment("other", storage.get_experiment(eid).spec, "minimize")
    (tmp_path / "html" / page).mkdir(parents=True)
    assert main(["--db", url, "report", "edge", "other", "-o", str(tmp_path / "html")]) == 2
    error = capsys.readouterr().err
    assert (
        error == f"error: hpo report: cannot write {tmp_path / 'html' / page} (a directory is there); move it, "
        "or give another directory with -o\n"
    )
    assert [p.name for p in (tmp_path / "html").iterdir()] == [page]  # no page written


def test_a_png_directory_that_only_creating_it_shows_is_refused_before_any_page_is_written(tmp_path, capsys,
                                                                                            monkeypatch):  # fmt: skip
    """A --png folder that passes the checks but cannot be made (/proc, a full or read-only disk: here the making
    fails): refused before any page is written, and the -o folders this run made are removed again."""
    import hpo.cli.report as report_cli

    storage, eid, url = make_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "reached")
    real_directory = report_cli._directory

    def png_fails(option, path):
        if option == "--png":
            raise HpoError(f"hpo report --png {path}: cannot be created (No space left on device)")
        return real_directory(option, path)

    monkeypatch.setattr(report_cli, "_directory", png_fails)
    html = tmp_path / "a" / "b" / "html"
    assert main(["--db", url, "report", "edge", "-o", str(html), "--png", str(tmp_path / "png")]) == 2
    assert "--png" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "png").exists()


# --------------------------------------------------------------------------- arms with nothing measured


def test_an_arm_whose_runs_all_missed_is_named_in_words(tmp_path):
    storage, eid, _ = make_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "reached")
    add_trial(storage, eid, ADAMW, "missed", lr=2e-3)
    add_trial(storage, eid, LAMB, "missed")
    add_trial(storage, eid, LAMB, "missed", lr=2e-3)
    html, page = report(storage)
    assert html.count(f"{LAMB}: all 2 runs missed the target.") == 3  # under each figure of measured values
    assert f"{ADAMW}: all" not in html
    alts = [img["alt"] for img in page.images]
    assert alts == [
        "samples to target per arm",
        "best objective so far per arm",
        "objective against each hyperparameter",
    ]  # fmt: skip  (no evaluations stored: no curves)
    assert "No top trial reported an evaluation: there is no learning curve to draw." in html


def test_when_no_arm_has_a_measured_value_no_figure_of_values_is_drawn(tmp_path):
    storage, eid, _ = make_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "missed")
    add_trial(storage, eid, ADAMW, "failed", lr=2e-3)
    add_trial(storage, eid, LAMB, "missed")
    add_trial(storage, eid, LAMB, "missed", lr=2e-3)
    add_trial(storage, eid, LAMB, "missed", lr=3e-3)
    html, page = report(storage)
    assert page.images == []
    assert html.count(f"{LAMB}: all 3 runs missed the target: nothing to draw.") == 3
    assert html.count(f"{ADAMW}: none of its 2 finished runs has a measured samples_to_target (1 missed, 1 failed)"
                      ": nothing to draw.") == 3  # fmt: skip
    assert page.cells[(None, "progress")] == "5/5 tuning trials done, 0/2 confirmation runs"


@pytest.mark.parametrize(("metric", "header"), [("samples_to_target", "best samples_to_target"),
                                                ("best_mlm_accuracy", "best_mlm_accuracy")])  # fmt: skip
def test_the_outcomes_tables_best_column_says_best_once(tmp_path, metric, header):
    """The column of each arm's best objective read "best best_mlm_accuracy" where the metric's name says best."""
    storage, eid, _ = make_experiment(tmp_path, metric=metric)
    add_trial(storage, eid, ADAMW, "reached")
    add_trial(storage, eid, LAMB, "reached")
    html, page = report(storage)
    (head,) = [table[0] for table in page.tables if table and "best trial" in table[0]]
    assert head[-2] == header and "best best" not in html


# --------------------------------------------------------------------------- hpo status


def test_status_counts_tuning_trials_against_the_budget_and_confirmations_apart(tmp_path, capsys):
    storage, eid, url = make_experiment(tmp_path, trials=3, confirm_seeds=2, compare=False)
    for lr in (1e-3, 2e-3, 3e-3):
        add_trial(storage, eid, None, "reached", lr=lr)
    add_trial(storage, eid, None, "reached", kind=TrialKind.CONFIRMATION)
    add_trial(storage, eid, None, "running", kind=TrialKind.CONFIRMATION)
    assert main(["--db", url, "status"]) == 0
    listing = capsys.readouterr().out
    assert "3/3 tuning trials done, 1/2 confirmation runs" in listing and "4/3" not in listing
    assert main(["--db", url, "status", "edge"]) == 0
    one = capsys.readouterr().out
    assert "trials: 1 running, 4 completed" in one and "3/3 tuning trials done, 1/2 confirmation runs" in one
    page = Page(experiment_report(storage, "edge"))
    assert page.cells[(None, "finished")] == "4" and page.cells[(None, "planned")] == "5"


def test_a_finished_experiment_counts_the_confirmation_runs_it_made_as_hpo_status_does(tmp_path, capsys):
    """confirm_seeds: auto ends when the verdict decides, before its cap: the report said "12/24 confirmation runs"
    of a finished experiment where `hpo status` said 12/12."""
    storage, eid, url = make_experiment(tmp_path, trials=2, confirm_seeds="auto")  # the cap: 12 per arm, 24
    for arm in (ADAMW, LAMB):
        add_trial(storage, eid, arm, "reached")
        for _ in range(3):
            add_trial(storage, eid, arm, "reached", kind=TrialKind.CONFIRMATION)
    page = Page(experiment_report(storage, "edge"))
    assert page.cells[(None, "progress")] == "2/2 tuning trials done, 6/24 confirmation runs"  # running: the cap
    storage.set_experiment_status(eid, "finished")
    page = Page(experiment_report(storage, "edge"))
    assert page.cells[(None, "progress")] == "2/2 tuning trials done, 6/6 confirmation runs"
    assert page.cells[(None, "planned")] == "8"
    assert main(["--db", url, "status", "edge"]) == 0
    assert "2/2 tuning trials done, 6/6 confirmation runs" in capsys.readouterr().out


# --------------------------------------------------------------------------- the noise scale's lower bound


def test_big_batch_is_one_ranks_accumulated_batch_under_accumulation_else_the_global_batch():
    assert big_batch(256, 32, 2) == 128  # accumulation 4 on each of 2 ranks: each rank's 128 is the big batch
    assert big_batch(256, 128, 2) == 256  # no accumulation: the all-reduced gradient over both ranks
    assert big_batch(16, 8, 1) == 16  # one process, accumulation 2
    assert big_batch(None, 8, 1) is None


def test_the_big_batch_reads_the_micro_batch_the_trainer_recorded_over_the_configured_one(tmp_path):
    """A trial of `batch.micro_batch_size: auto` records the number its trainer chose; a result without one (older
    trainers) is read from the configuration, and `auto` with nothing recorded has no big batch to show."""
    from dataclasses import replace

    from hpo.experiment import spec_from_stored
    from hpo.report.data import _big_batch

    storage, eid, _ = make_experiment(tmp_path)
    spec = spec_from_stored(storage.get_experiment_by_name("edge"))
    trial = replace(storage.get_trial(add_trial(storage, eid, "optimizer.name=lamb", "reached")), gpus=(0, 1))
    assert _big_batch(spec, 8, trial, []) == 16  # 16 = 8 x 2 ranks: no accumulation, the global batch
    recorded = replace(trial, metrics={**trial.metrics, "micro_batch_size": 4})
    assert _big_batch(spec, "auto", recorded, []) == 8  # 4 x 2 ranks x accumulation 2: one rank's batch
    assert _big_batch(spec, "auto", trial, []) is None


def test_lower_bound_flag_on_and_off_against_constructed_estimates():
    big = 64
    assert lower_bound_reason(NOISE_CHECKED_RATIO * big, big, 0.0) is None  # at the checked limit: a value
    assert lower_bound_reason(10.0, big, NOISE_UNDEFINED_SHARE - 0.01) is None
    above = lower_bound_reason(NOISE_CHECKED_RATIO * big + 1, big, 0.0)
    assert above.startswith("4.0x its big batch of 64")
    sparse = lower_bound_reason(10.0, big, NOISE_UNDEFINED_SHARE)
    assert sparse == f"{NOISE_UNDEFINED_SHARE:.0%} of its late steps gave no estimate"
    assert lower_bound_reason(None, big, 0.9) is None


def _records(points: list[MetricPoint], name: str) -> list[MetricRecord]:
    now = datetime.now(UTC)
    return [MetricRecord(1, p.step, p.samples, name, p.values[name], now) for p in points if name in p.values]


def test_late_noise_median_and_share_of_steps_without_an_estimate():
    noise = [5.0, None, 1.0, 2.0, None, 3.0, 40.0, None, 5.0, None]  # steps 1..10, 16 samples each
    points = curve(noise)
    late = late_noise(_records(points, "noise_scale"), _records(points, "grad_sq_norm_big"))
    # the estimates' second half: from half the last estimate's samples (step 9: 144 -> 72, so steps 5 on)
    assert late.value == statistics.median([3.0, 40.0, 5.0])
    # the measured steps' second half: from half of step 10's 160 samples (steps 5..10), 3 of 6 without one
    assert late.undefined == pytest.approx(3 / 6)


def test_report_shows_a_lower_bound_as_at_least_with_its_reason(tmp_path):
    storage, eid, _ = make_experiment(tmp_path)
    # big batch 16 (one process, accumulation 2): 30 is within 4x; 200 is 12.5x; the third misses every other step
    add_trial(storage, eid, ADAMW, "reached", points=curve([30.0] * 8))
    add_trial(storage, eid, LAMB, "reached", points=curve([200.0] * 8))
    add_trial(storage, eid, LAMB, "reached", lr=2e-3, points=curve([20.0, None] * 4))
    html, page = report(storage)
    trials = next(t for t in page.tables if t and "noise scale" in t[0] and "#" in t[0])
    shown = {int(row[0]): row[trials[0].index("noise scale")] for row in trials[1:]}
    assert shown[0] == "30"
    assert shown[1] == "≥ 200 (lower bound: 12.5x its big batch of 16, where the estimate is checked only up to 4x " \
                       "and reads low)"  # fmt: skip
    # its measured late steps: 64 to 128 samples, steps 4..8, of which 4, 6 and 8 have no estimate: 3 of 5
    assert shown[2] == "≥ 20 (lower bound: 60% of its late steps gave no estimate)"
    assert page.cells[(ADAMW, "noise_median")] == "30"
    lamb = statistics.median([200.0, 20.0])
    bounds = "(lower bound: 2 of 2 trials' estimates are lower bounds)"
    assert page.cells[(LAMB, "noise_median")] == f"≥ {lamb:.0f} {bounds}"
    text = unescape(html)
    assert "under gradient accumulation one rank's accumulated batch" in text
    assert "averaged over masked tokens" in text


# --------------------------------------------------------------------------- PNG export


def test_png_export_writes_the_figures_the_page_embeds_as_valid_pngs(tmp_path, capsys):
    from PIL import Image

    storage, eid, url = make_experiment(tmp_path)
    add_trial(storage, eid, ADAMW, "reached", points=curve([30.0] * 8))
    add_trial(storage, eid, ADAMW, "missed", lr=2e-3, points=curve([25.0] * 8, accuracy=0.3))
    add_trial(storage, eid, LAMB, "reached", points=curve([40.0] * 8))
    add_trial(storage, eid, LAMB, "reached", lr=3e-3, points=curve([35.0] * 8))
    out = tmp_path / "png"
    assert main(["--db", url, "report", "edge", "-o", str(tmp_path / "html"), "--png", str(out)]) == 0
    page = Page((tmp_path / "html" / "edge.html").read_text())
    slugs = {"samples to target per arm": "outcomes", "best objective so far per arm": "best-so-far",
             "learning curves": "learning-curves", "gradient noise scale": "noise-scale",
             "objective against each hyperparameter": "hyperparameters"}  # fmt: skip
    assert sorted(img["alt"] for img in page.images) == sorted(slugs)  # every figure is drawn here
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(f"edge-{slug}.png" for slug in slugs.values())
    printed = capsys.readouterr().out
    for name in written:
        path = out / name
        assert f"wrote {path}" in printed
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            width, height = image.size
            assert width > 500 and height > 300  # 150 dpi: larger than the page's 90 dpi images
            assert len(image.convert("L").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 10  # not blank
    assert len(written) == len(page.images)
    # Run again, it replaces its own pages and figures; a file of the user's under one of their names is kept, and
    # nothing is written (it replaced such a file without a word).
    assert main(["--db", url, "report", "edge", "-o", str(tmp_path / "html"), "--png", str(out)]) == 0
    for mine, option in ((tmp_path / "html" / "edge.html", "-o"), (out / "edge-noise-scale.png", "--png")):
        kept = {path: path.read_bytes() for path in [*out.iterdir(), *(tmp_path / "html").iterdir()]}
        kept[mine] = b"my notes\n"
        mine.write_bytes(kept[mine])
        capsys.readouterr()
        assert main(["--db", url, "report", "edge", "-o", str(tmp_path / "html"), "--png", str(out)]) == 2
        assert capsys.readouterr().err == (f"error: hpo report: {mine} exists and is not a page or figure an earlier "
                                           f"`hpo report` wrote: it is kept; move it away, or give another directory "
                                           f"with {option}\n")  # fmt: skip
        assert {path: path.read_bytes() for path in [*out.iterdir(), *(tmp_path / "html").iterdir()]} == kept
        mine.write_bytes(b"")  # an empty file is replaced: nothing in it to lose
    assert main(["--db", url, "report", "edge", "-o", str(tmp_path / "html"), "--png", str(out)]) == 0
    assert all(path.stat().st_size > 10_000 for path in [*out.iterdir(), *(tmp_path / "html").iterdir()])


SLUGS = {"samples to target per arm": "outcomes", "best objective so far per arm": "best-so-far",
         "learning curves": "learning-curves", "gradient noise scale": "noise-scale",
         "objective against each hyperparameter": "hyperparameters",
         "samples to target and noise scale against batch size": "batch-sizes"}  # fmt: skip


@pytest.mark.slow  # --png of an experiment's page and its figures: test_png_export_writes_the_figures_the_page_embeds
def test_png_export_of_a_batch_size_study_writes_its_batch_size_figure_and_compare_htmls(tmp_path, capsys):
    """A study whose arms span batch sizes (the batch_scaling_simulated preset on the formula table) draws its
    batch-size figure on its page, and compare.html draws one of the experiments compared: --png writes every
    image of every page, NAME-batch-sizes.png and compare-batch-sizes.png among them (they were left out)."""
    from PIL import Image

    from hpo.simulation.table import load_table
    from tests.hpo.simulation.conftest import write_large_batch_table
    from tests.hpo.simulation.test_large_batch import run_preset

    study = "batch_scaling_simulated"
    table = load_table(write_large_batch_table(tmp_path / "large.jsonl"))
    url, _ = run_preset(table.path, tmp_path, tuner={"name": "random", "seed": 0})
    storage, eid, same = make_experiment(tmp_path)  # a second experiment, "edge", in the same database
    assert same == url
    for arm, lr in ((ADAMW, 1e-3), (ADAMW, 2e-3), (LAMB, 1e-3), (LAMB, 3e-3)):
        add_trial(storage, eid, arm, "reached", lr=lr, points=curve([30.0] * 8))
    html, out = tmp_path / "html", tmp_path / "png"
    assert main(["--db", url, "report", study, "edge", "-o", str(html), "--png", str(out)]) == 0
    expected = sorted(f"{name}-{SLUGS[img['alt']]}.png" for name in (study, "edge", "compare")
                      for img in Page((html / f"{name}.html").read_text()).images)  # fmt: skip
    written = sorted(p.name for p in out.iterdir())
    assert written == expected
    assert {f"{study}-batch-sizes.png", "compare-batch-sizes.png"} <= set(written)
    printed = capsys.readouterr().out
    for name in written:
        path = out / name
        assert f"wrote {path}" in printed
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(path) as image:
            image.verify()
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] > 500 and image.size[1] > 300  # 150 dpi: above the page's 90


def simulated_run(rng, dims: int, ratio: float, b_small: int = 8, accumulation: int = 2, steps: int = 200):
    """The trainer's estimator on Gaussian gradients whose noise scale is known: |G|² = 1, tr(Σ) = ratio x B_big,
    so B_simple = ratio x B_big; `dims` dimensions (few: heavy-tailed norms). Returns (estimate / truth, flag)."""
    from trainer.noise_scale import NoiseScaleEstimator

    big = b_small * accumulation
    truth = ratio * big
    gradient = np.ones(dims) / np.sqrt(dims)
    estimator, estimates, measured = NoiseScaleEstimator(0.95), [], []
    now = datetime.now(UTC)
    for step in range(1, steps + 1):
        micro = gradient + rng.normal(0.0, np.sqrt(truth / dims / b_small), size=(accumulation, dims))
        small_sq, big_sq = float((micro * micro).sum(1).mean()), float((micro.mean(0) ** 2).sum())
        value = estimator.update(small_sq, big_sq, b_small, big).noise_scale
        measured.append(MetricRecord(1, step, big * step, "grad_sq_norm_big", big_sq, now))
        if value is not None:
            estimates.append(MetricRecord(1, step, big * step, "noise_scale", value, now))
    late = late_noise(estimates, measured)
    return late.value / truth, lower_bound_reason(late.value, big, late.undefined)


@pytest.mark.parametrize("dims", [4, 16])
def test_the_flag_is_off_where_the_estimate_holds_and_on_far_above_the_big_batch(dims):
    """40 runs per case of the trainer's own estimator with a known answer. Measured with 50 runs (seeded as
    here): flagged 0 % at 1x the big batch, 0 to 2 % at 2x, 92 to 100 % at 16x and 98 to 100 % at 32x, where the
    median run reads 0.25 to 0.5x the truth. With margin: at most 5 % at 1x and 2x, at least 85 % at 16x and 32x."""
    rng = np.random.default_rng(dims)
    for ratio, at_most, at_least in ((1, 2, 0), (2, 2, 0), (16, 40, 34), (32, 40, 34)):
        runs = [simulated_run(rng, dims, ratio) for _ in range(40)]
        flagged = sum(bool(flag) for _, flag in runs)
        assert at_least <= flagged <= at_most, (ratio, flagged)
    assert statistics.median(read for read, _ in runs) < 0.6  # at 32x: biased low, as the flag says


def test_status_lists_an_experiment_whose_stored_spec_no_longer_validates_from_its_raw_budget(tmp_path, capsys):
    storage, _, url = make_experiment(tmp_path)
    old = {"experiment": {"name": "old", "field_of_an_older_version": 1, "budget": {"trials": 3, "confirm_seeds": 2}},
           "run_dir": str(tmp_path / "old")}  # fmt: skip
    storage.create_experiment("old", old, "minimize")
    assert main(["--db", url, "status"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert any(line.startswith("old ") and "0/3 tuning trials done, 0/2 confirmation runs" in line for line in listing)
    assert any(line.startswith("edge ") and "0/4 tuning trials done, 0/2 confirmation runs" in line for line in listing)


def test_the_reports_curve_of_a_trial_whose_points_are_all_at_step_0_has_a_point_per_sample_count():
    """A simulated trial stored by an earlier version kept every point at step 0: its samples tell them apart."""
    from hpo.report.data import curve_of

    records = [MetricRecord(1, 0, s, "mlm_accuracy", a, None) for s, a in ((256, 0.05), (512, 0.08), (1024, 0.13))]
    records += [MetricRecord(1, 0, s, "noise_scale", n, None) for s, n in ((256, 90.0), (1024, 120.0))]
    curve = curve_of(3, "optimizer.name=lamb", records)
    assert curve.eval_samples == (256.0, 512.0, 1024.0) and curve.mlm_accuracy == (0.05, 0.08, 0.13)
    assert curve.noise_samples == (256.0, 1024.0) and curve.noise_scale == (90.0, 120.0)


def test_export_files_of_arms_whose_values_differ_only_in_case_are_distinct_in_any_case(tmp_path):
    """The page's export commands wrote `best-A100.yaml` and `best-a100.yaml` for arms A100 and a100: one file on a
    file system that ignores case (macOS's, Windows'), where the second export replaced the first. Each arm's file
    is now its own whatever the case."""
    field = "log.mlperf_submission.platform"  # a free string: values differing only in case are different arms
    data = {
        "name": "cased", "base_config": {},
        "overrides": {"device": "cpu", "batch.global_batch_size": 16, "batch.micro_batch_size": 8},
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}, field: {"choice": ["A100", "a100", "B200"]}},
        "compare": [field], "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 3, "max_parallel": 1, "confirm_seeds": 1}, "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip
    spec = experiment_from_dict(data, "cased.yaml", base_dir=tmp_path)
    storage = SqlStorage(f"sqlite:///{tmp_path / 'hpo.db'}", upgrade=True)
    eid = storage.create_experiment("cased", stored_form(spec, tmp_path / "run"), spec.direction)
    for value in ("A100", "a100", "B200"):
        params = {"optimizer.lr": 1e-3, field: value}
        trial = storage.create_trial(eid, TrialSpec(None, params, arm=f"{field}={value}", global_batch_size=16))
        storage.mark_trial_running(trial, pid=1, host="h")
        storage.finish_trial(trial, TrialResult(TrialState.COMPLETED, objective=256.0, samples_to_target=256,
                                                best_mlm_accuracy=0.55, metrics={"samples": 256}))  # fmt: skip
    page = experiment_report(storage, "cased")
    storage.close()
    shown = dict(re.findall(r"<pre data-field=export data-arm='([^']*)'>([^<]*)</pre>", page))
    files = {unescape(arm): shlex.split(unescape(command))[-1] for arm, command in shown.items()}
    assert sorted(files) == [f"{field}={v}" for v in ("A100", "B200", "a100")], files
    assert len({name.casefold() for name in files.values()}) == 3, files
    assert files[f"{field}=B200"] == "best-B200.yaml"  # numbered only where names would clash
