"""The verdict over stored trials (hpo.evidence.confirmations), against numbers computed here: each run's samples to
target interpolated by hand on its stored curve (tests/hpo/evidence/independent.py), Welch's interval from scipy.

Experiments are written straight through the storage API as `hpo run` leaves them: per arm one tuning trial (its
best) and confirmation runs of its configuration, each hitting the target between two evaluations (the stored
samples to target is the evaluation after, MLPerf's rounding up), a miss, or still running.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from hpo.evidence.confirmations import round_line, runs_to_queue, stored_evidence, stored_verdict
from hpo.evidence.verdict import Outcome, arm_runs, look_level
from hpo.experiment import experiment_from_dict, spec_from_stored, stored_form
from hpo.plan.forecast import DEFAULT_TABLE
from hpo.report.data import load_experiment
from hpo.report.html import experiment_report
from hpo.storage import SqlStorage
from hpo.storage.base import MetricPoint
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from tests.hpo.evidence.independent import interpolated
from tests.hpo.report.test_report import Page

ROOT = Path(__file__).resolve().parents[3]
PRESET = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_simulated.yaml"
TARGET, EVERY, BUDGET = 0.12, 1024, 12288  # the preset's target, evaluation interval and sample budget
ADAMW, LAMB = "optimizer.name=adamw", "optimizer.name=lamb"
RUNNING = "running"


def curve(samples: float) -> list[tuple[int, float]]:
    """Two evaluations around `samples`, the accuracy rising linearly through the target there."""
    low = int(samples // EVERY) * EVERY
    slope = 0.01 / EVERY
    return [(low, TARGET - slope * (samples - low)), (low + EVERY, TARGET + slope * (low + EVERY - samples))]


def write(db_file: Path, confirm_seeds, runs: dict[str, list], tuning: dict[str, float]) -> tuple[SqlStorage, int]:
    """The experiment in a new database: per optimizer a tuning trial hitting at tuning[optimizer] and one
    confirmation trial per entry of runs[optimizer] (samples to target, None for a miss, RUNNING). A hit between
    evaluations stores its curve around the target; one at a multiple of EVERY is stored as read at that evaluation,
    without a curve."""
    data = yaml.safe_load(PRESET.read_text())
    data["base_config"] = str((PRESET.parent / data["base_config"]).resolve())
    data["runner"]["simulation"]["table"] = str(DEFAULT_TABLE)
    data["tuner"] = {"name": "random", "seed": 0}
    data["budget"].update(trials=48, max_parallel=16, confirm_seeds=confirm_seeds)
    spec = experiment_from_dict(data, "stored.yaml")
    storage = SqlStorage(f"sqlite:///{db_file}", upgrade=True)
    eid = storage.create_experiment(spec.name, stored_form(spec, db_file.parent / "run"), spec.direction)
    for optimizer, values in runs.items():
        params = {"optimizer.name": optimizer, "optimizer.lr": 1e-3, "schedule.warmup_steps": 0}
        for seed, samples in [(None, tuning[optimizer]), *enumerate(values, start=1001)]:
            kind = TrialKind.TUNING if seed is None else TrialKind.CONFIRMATION
            trial_id = storage.create_trial(eid, TrialSpec(None, params, f"optimizer.name={optimizer}", 1.0, (), 32,
                                                           kind, seed))  # fmt: skip
            storage.mark_trial_running(trial_id, pid=1, host="h")
            if samples == RUNNING:
                continue
            if samples is None:
                missed = TrialResult(TrialState.COMPLETED, objective=float(BUDGET), best_mlm_accuracy=0.11,
                                     metrics={"samples": BUDGET})  # fmt: skip
                storage.finish_trial(trial_id, missed)
                continue
            stored = samples  # a multiple of EVERY: a hit read at an evaluation, no curve stored
            if samples % EVERY:
                points = curve(samples)
                storage.add_metrics(trial_id, [MetricPoint(i, s, {"mlm_accuracy": a})
                                               for i, (s, a) in enumerate(points)])  # fmt: skip
                stored = points[1][0]  # MLPerf's: the first evaluation at or above the target
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(stored),
                                                       samples_to_target=stored, best_mlm_accuracy=0.13,
                                                       metrics={"samples": BUDGET}))  # fmt: skip
    return storage, eid


def by_hand(storage, trials, arm: str, kind=TrialKind.CONFIRMATION) -> list[float | None]:
    """The arm's finished trials of this kind in number order, interpolated here (None: a miss)."""
    mine = sorted((t for t in trials if t.arm == arm and t.kind is kind and t.state.finished), key=lambda t: t.number)
    return [interpolated(storage, t, TARGET) for t in mine]


def test_a_lucky_pick_is_judged_on_the_picking_runs_interpolated_samples(tmp_path):
    """AdamW's tuning run reached the target between two evaluations sooner than LAMB's runs do, but its stored
    value (the evaluation after) is later: the pick, read between evaluations as the runs are, was a lucky seed, so
    no winner (hpo status, the report and the study loop read the same verdict)."""
    lamb, adamw = [4300, 4700, 4400, 4500, 4600], [None, 8000, None, 8500, 9000]
    storage, eid = write(tmp_path / "hpo.db", 5, {"lamb": lamb, "adamw": adamw}, {"lamb": 4500, "adamw": 4200})
    with storage:
        record = storage.get_experiment_by_name("adam_vs_lamb_simulated")
        spec, trials = spec_from_stored(record), storage.list_trials(record.id)
        (pick,) = [t for t in trials if t.arm == ADAMW and t.kind is TrialKind.TUNING]
        picked = interpolated(storage, pick, TARGET)
        leader = math.exp(np.mean(np.log(by_hand(storage, trials, LAMB))))
        assert picked < leader < pick.samples_to_target  # the premise: only the interpolated pick is lucky
        evidence = stored_evidence(storage, eid)
        runs = {a.label: a for a in arm_runs(spec, evidence.best, evidence.confirmations, evidence.curves)}
        assert runs[ADAMW].picked == pytest.approx(picked, rel=1e-12)
        verdict = stored_verdict(storage, eid, spec)
        assert verdict.outcome is Outcome.NOT_YET and verdict.runs_needed is None
        assert (f"{ADAMW}'s configuration missed the target in 2 of 5 confirmation run(s) and its tuning run reached "
                f"it sooner than {LAMB} does (a lucky seed)") in verdict.line  # fmt: skip
        assert load_experiment(storage, spec.name, with_noise=False).verdict.line == verdict.line  # the report's


def test_no_further_round_is_queued_when_every_arm_missed_in_some_run(tmp_path):
    """confirm_seeds: auto, round 1 done, each arm missed once: more runs cannot give a winner (it must always
    hit) nor "equivalent" (every arm must), so the study loop queues no second round; while one arm always hit, it
    does."""
    cases = {"both missed": ([5200, 5400, None], 3), "one missed": ([5200, 5400, 5300], 6)}
    for case, (adamw, queued) in cases.items():
        storage, eid = write(tmp_path / f"{case}.db", "auto", {"adamw": adamw, "lamb": [4300, 4500, None]},
                             {"adamw": 5300, "lamb": 4400})  # fmt: skip
        with storage:
            spec = spec_from_stored(storage.get_experiment(eid))
            verdict = stored_verdict(storage, eid, spec)
            assert verdict.outcome is Outcome.NOT_YET and (verdict.look, verdict.looks) == (1, 4), case
            assert (verdict.runs_needed is None) == (case == "both missed"), case
            assert runs_to_queue(spec, storage.list_trials(eid), [verdict]) == queued, case


def welch(a: list[float], b: list[float], confidence: float) -> tuple[float, float, float]:
    """exp of scipy's Welch interval of mean(ln a) - mean(ln b)."""
    low, high = stats.ttest_ind(np.log(a), np.log(b), equal_var=False).confidence_interval(confidence)
    return math.exp(np.mean(np.log(a)) - np.mean(np.log(b))), math.exp(low), math.exp(high)


def test_mid_round_the_verdict_is_the_last_finished_looks_on_that_looks_runs(tmp_path):
    """confirm_seeds: auto (rounds of 3, 6, 9, 12): round 2 under way, AdamW's 6 runs finished, LAMB's sixth still
    running. The verdict is look 1's: each arm's first 3 runs at look 1's level (as `hpo plan` simulates it), not
    every finished run at that level; the round line counts every run. Once round 2 is over: look 2 on all 6."""
    adamw, lamb = [5000, 5600, 4700, 5900, 5200, 5400], [4175, 4775, 4075, 5075, 4375]
    storage, eid = write(tmp_path / "hpo.db", "auto", {"adamw": adamw, "lamb": [*lamb, RUNNING]},
                         {"adamw": 5200, "lamb": 4400})  # fmt: skip
    with storage:
        spec, trials = spec_from_stored(storage.get_experiment(eid)), storage.list_trials(eid)
        hand = {arm: by_hand(storage, trials, arm) for arm in (ADAMW, LAMB)}
        assert [len(hand[ADAMW]), len(hand[LAMB])] == [6, 5]
        verdict = stored_verdict(storage, eid, spec)
        assert (verdict.look, verdict.looks) == (1, 4)
        (c,) = verdict.comparisons
        assert (c.a, c.b, c.runs) == (LAMB, ADAMW, (3, 3))
        expected = welch(hand[LAMB][:3], hand[ADAMW][:3], 1 - look_level(1, 4))
        assert (c.ratio, c.low, c.high) == pytest.approx(expected, rel=1e-9)
        assert verdict.outcome is (Outcome.WINNER if expected[2] < 1 else Outcome.NOT_YET)
        assert [(a.label, a.runs) for a in verdict.arms] == [(ADAMW, 3), (LAMB, 3)]
        assert f"runs per arm: {ADAMW} 6, {LAMB} 6 of up to 12" in round_line(spec, trials)
        # LAMB's sixth run ends: round 2 is over, look 2 reads all 6 runs of each arm at its own level
        (last,) = [t for t in trials if t.state is TrialState.RUNNING]
        storage.finish_trial(last.id, TrialResult(TrialState.COMPLETED, objective=float(BUDGET),
                                                  best_mlm_accuracy=0.11, metrics={"samples": BUDGET}))  # fmt: skip
        verdict = stored_verdict(storage, eid, spec)
        (c,) = verdict.comparisons
        assert (verdict.look, c.runs) == (2, (6, 6))
        censored = [*hand[LAMB], BUDGET]  # the sixth missed: at its budget, which makes AdamW the leader
        assert np.mean(np.log(hand[ADAMW])) < np.mean(np.log(censored)) and (c.a, c.b) == (ADAMW, LAMB)
        assert (c.ratio, c.low, c.high) == pytest.approx(welch(hand[ADAMW], censored, 1 - look_level(2, 4)), rel=1e-9)


def test_runs_that_agree_exactly_keep_the_spread_of_one_evaluation_interval(tmp_path):
    """AdamW's three confirmation runs reached the target between the same two evaluations on identical curves (a
    replayed seed): their samples to target agree exactly, and the arm's interval and the verdict's had zero width.
    The measurement did not tell them apart, so the arm's spread is that of one evaluation interval (EVERY / √12,
    a uniform error over it); LAMB's runs, told apart, keep their own spread."""
    adamw, lamb = [5000.0] * 3, [4300.0, 4500.0, 4650.0]
    storage, eid = write(tmp_path / "hpo.db", 3, {"adamw": adamw, "lamb": lamb}, {"adamw": 5000, "lamb": 4500})
    with storage:
        spec, trials = spec_from_stored(storage.get_experiment(eid)), storage.list_trials(eid)
        hand = {arm: by_hand(storage, trials, arm) for arm in (ADAMW, LAMB)}
        verdict = stored_verdict(storage, eid, spec)
        page = Page(experiment_report(storage, spec.name))
    assert hand[ADAMW] == pytest.approx(adamw) and np.std(hand[ADAMW]) == 0 and hand[LAMB] == pytest.approx(lamb)
    floor = EVERY / math.sqrt(12)  # the standard deviation of a uniform error over one evaluation interval
    summaries = {a.label: a for a in verdict.arms}
    for arm, sd in ((ADAMW, floor), (LAMB, np.std(hand[LAMB], ddof=1))):
        mean = np.mean(hand[arm])
        half = stats.t.ppf(0.975, 2) * sd / math.sqrt(3)
        assert (summaries[arm].low, summaries[arm].high) == pytest.approx((mean - half, mean + half), rel=1e-9)
    assert summaries[ADAMW].high - summaries[ADAMW].low > 1000
    assert summaries[ADAMW].floored == EVERY and summaries[LAMB].floored is None
    assert f"the runs agree closer than one evaluation interval of {EVERY:,} samples" in summaries[ADAMW].describe()
    for arm in (ADAMW, LAMB):  # the report shows the same interval, and says which arm's is the resolution's
        assert page.cells[(arm, "interval")] == f"{summaries[arm].low:,.0f} to {summaries[arm].high:,.0f}"
    assert (ADAMW, "floored") in page.cells and (LAMB, "floored") not in page.cells
    # the verdict: Welch on ln samples, AdamW's variance that of the floor at its geometric mean
    va = np.var(np.log(hand[LAMB]), ddof=1) / 3
    vb = (floor / math.exp(np.mean(np.log(hand[ADAMW])))) ** 2 / 3
    df = (va + vb) ** 2 / (va * va / 2 + vb * vb / 2)
    d = np.mean(np.log(hand[LAMB])) - np.mean(np.log(hand[ADAMW]))
    half = stats.t.ppf(1 - 0.04 / 2, df) * math.sqrt(va + vb)
    (c,) = verdict.comparisons
    assert (c.a, c.b) == (LAMB, ADAMW)
    assert (c.ratio, c.low, c.high) == pytest.approx((math.exp(d), math.exp(d - half), math.exp(d + half)), rel=1e-9)
    assert c.high - c.low > 0.1


def test_while_tuning_goes_on_the_round_line_says_no_round_has_begun(tmp_path):
    """Before any arm's first confirmation run the line said `confirmations round 1 of at most 4 (0 finished)`, as if
    a round were under way; it says none has begun, and when the first begins."""
    storage, eid = write(tmp_path / "hpo.db", "auto", {"adamw": [], "lamb": []}, {"adamw": 5200, "lamb": 4400})
    with storage:
        spec, trials = spec_from_stored(storage.get_experiment(eid)), storage.list_trials(eid)
    assert round_line(spec, trials) == ("confirmations: none yet; each arm's first round (3 runs) starts when its "
                                        "tuning is over (at most 4 rounds, up to 12 runs per arm)")  # fmt: skip
