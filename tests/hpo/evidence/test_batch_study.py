"""A batch-size study's question answered at each batch size (`Evidence.batch_verdicts`, `Evidence.deciding`): the
verdict there judges a lucky pick and spends the error over the looks as the experiment's verdict does, and the
confirmation rounds go on while it is "not yet" there, against numbers computed here (scipy's Welch interval, the
spending function's increments by hand).

Experiments are written straight through the storage API as `hpo run` leaves them: per arm (optimizer, batch size)
one tuning trial (its best) and confirmation runs of its configuration, each hitting the target between two
evaluations (its curve stored around the target) or missing it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy import stats

from hpo.evidence.confirmations import rounds_note, runs_to_queue, stored_evidence, stored_winner_at
from hpo.evidence.verdict import ALPHA, ArmRuns, Outcome, decide, pool
from hpo.experiment import experiment_from_dict, spec_from_stored, stored_form
from hpo.report.data import load_experiment
from hpo.report.scaling import batch_verdicts, experiment_runs, scaling_points
from hpo.storage import SqlStorage
from hpo.storage.base import MetricPoint
from hpo.trials import TrialKind, TrialResult, TrialSpec, TrialState
from tests.hpo.evidence.test_confirmations import BUDGET, EVERY, curve

# (optimizer, batch) -> (tuning, confirmations): samples to target, None a miss, nan a failed trial
Arms = dict[tuple[str, int], tuple[float, list[float | None]]]


def study_file(confirm_seeds) -> dict:
    """The experiment file of a batch-size study of AdamW and LAMB at global batch 32 and 64, as a mapping."""
    return {
        "name": "study", "base_config": "demo_cpu",
        "overrides": {"eval.every_samples": EVERY, "budget.max_samples": BUDGET, "eval.target_mlm_accuracy": 0.12},
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]}, "batch.global_batch_size": {"choice": [32, 64]},
                  "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}},
        "objective": {"metric": "samples_to_target", "direction": "minimize"},
        "compare": ["optimizer.name", "batch.global_batch_size"],
        "tuner": {"name": "random", "seed": 0}, "budget": {"trials": 4, "confirm_seeds": confirm_seeds},
        "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip


def study(db_file: Path, confirm_seeds, arms: Arms) -> tuple[SqlStorage, int]:
    """A batch-size study (`study_file`) in a new database, its trials as `arms` says."""
    spec = experiment_from_dict(study_file(confirm_seeds), "study.yaml")
    storage = SqlStorage(f"sqlite:///{db_file}", upgrade=True)
    eid = storage.create_experiment("study", stored_form(spec, db_file.parent), spec.direction)
    for (optimizer, batch), (tuning, confirmations) in arms.items():
        params = {"optimizer.name": optimizer, "batch.global_batch_size": batch, "optimizer.lr": 1e-3}
        arm = f"optimizer.name={optimizer},batch.global_batch_size={batch}"
        for seed, samples in [(None, tuning), *enumerate(confirmations, start=1001)]:
            kind = TrialKind.TUNING if seed is None else TrialKind.CONFIRMATION
            trial_id = storage.create_trial(eid, TrialSpec(None, params, arm, 1.0, (), batch, kind, seed))
            storage.mark_trial_running(trial_id, pid=1, host="h")
            if samples is not None and math.isnan(samples):  # the trial failed (a crash: no outcome)
                storage.finish_trial(trial_id, TrialResult(TrialState.FAILED, reason="exit code 1"))
                continue
            if samples is None:
                missed = TrialResult(TrialState.COMPLETED, objective=float(BUDGET), best_mlm_accuracy=0.11,
                                     metrics={"samples": BUDGET})  # fmt: skip
                storage.finish_trial(trial_id, missed)
                continue
            points = curve(samples)
            storage.add_metrics(trial_id, [MetricPoint(i, s, {"mlm_accuracy": a}) for i, (s, a) in enumerate(points)])
            storage.finish_trial(trial_id, TrialResult(TrialState.COMPLETED, objective=float(points[1][0]),
                                                       samples_to_target=points[1][0], best_mlm_accuracy=0.13,
                                                       metrics={"samples": BUDGET}))  # fmt: skip
    return storage, eid


def welch(a: list[float], b: list[float], confidence: float) -> tuple[float, float, float]:
    """exp of scipy's Welch interval of mean(ln a) - mean(ln b)."""
    xa, xb = [math.log(s) for s in a], [math.log(s) for s in b]
    result = stats.ttest_ind(xa, xb, equal_var=False)
    low, high = result.confidence_interval(confidence)
    return math.exp(sum(xa) / len(xa) - sum(xb) / len(xb)), math.exp(low), math.exp(high)


def test_the_verdict_at_a_batch_size_judges_a_lucky_pick_as_the_experiments_verdict_does(tmp_path):
    """At 64 AdamW's tuning run reached the target at 3,900 samples, sooner than LAMB's runs do, and its own
    confirmation runs missed the target once: LAMB beat a lucky configuration, not AdamW tuned, so the verdict there
    is "not yet" (more tuning trials decide), as the experiment's verdict says of such a pick; the report's verdict
    at each batch size and `hpo export --batch-size 64` read the same. At 32 LAMB wins."""
    arms = {("adamw", 32): (9000, [9000, 9100, 8950]), ("lamb", 32): (6100, [6000, 6050, 5950]),
            ("adamw", 64): (3900, [None, 11000, 11100]), ("lamb", 64): (4100, [4000, 4050, 3950])}  # fmt: skip
    storage, eid = study(tmp_path / "hpo.db", 3, arms)
    with storage:
        spec = spec_from_stored(storage.get_experiment(eid))
        _, verdicts = stored_evidence(storage, eid).batch_verdicts(spec)
        data = load_experiment(storage, "study", with_noise=False)
        exported = {batch: stored_winner_at(storage, eid, spec, batch) for batch in (32, 64)}
    report = batch_verdicts(scaling_points([data], experiment_runs([data])))
    assert {b: v.outcome for b, v in verdicts.items()} == {32: Outcome.WINNER, 64: Outcome.NOT_YET}
    assert verdicts[32].winner == "lamb" and verdicts[64].runs_needed is None
    assert "adamw's configuration missed the target in 1 of 3 confirmation run(s)" in verdicts[64].line
    assert "a lucky seed" in verdicts[64].line
    # without the pick, LAMB's runs at 64 lie below AdamW's (a miss at the budget) by the Welch test at 64's level
    ratio, low, high = welch([4000, 4050, 3950], [BUDGET, 11000, 11100], 1 - ALPHA / 2)
    assert high < 1 and verdicts[64].comparisons[0].ratio == pytest.approx(ratio, rel=2e-3)
    assert {b: v.line for b, v in report.items()} == {b: v.line for b, v in verdicts.items()}
    assert exported == {32: "optimizer.name=lamb,batch.global_batch_size=32", 64: None}


def test_a_pool_of_arms_is_lucky_exactly_where_one_of_its_members_is():
    """Runs of one optimizer at one batch size from two experiments pooled: a lucky pick of either member (a miss
    among its runs and a pick sooner than the leader's runs, or a pick that never reached the target) makes the
    pool's claim one about a pick; a pick without a miss among its member's runs does not."""
    leader = ArmRuns("lamb", (4000.0, 4050.0, 3950.0), BUDGET)
    clean = ArmRuns("adamw", (11000.0, 11100.0), BUDGET, picked=3000.0)  # sooner, but its runs never missed
    lucky = ArmRuns("adamw", (None, 11050.0), BUDGET, picked=3900.0)
    never = ArmRuns("adamw", (None, 11050.0), BUDGET, picked=math.inf)
    late = ArmRuns("adamw", (None, 11050.0), BUDGET, picked=9000.0)  # a miss, but the pick was not ahead of lamb
    for members, is_lucky in (([clean, late], False), ([clean, lucky], True), ([late, never], True)):
        pooled = pool("adamw", members)
        assert pooled.samples_to_target == tuple(s for m in members for s in m.samples_to_target)
        verdict = decide([leader, pooled])
        assert ("a lucky seed" in verdict.line or "never reached it" in verdict.line) is is_lucky, members
        assert (verdict.outcome is Outcome.WINNER) is not is_lucky, verdict.line


def test_the_verdict_at_a_batch_size_spends_the_error_over_the_looks(tmp_path):
    """confirm_seeds auto (rounds of 3, 6, 9, 12): every arm finished round 2 and LAMB at 32 one more run. The
    verdict at each batch size is look 2 of 4 of each arm's first 6 runs, at the spending function's increment for
    look 2 shared over the 2 batch sizes, as the experiment's verdict is asked."""
    lamb_32 = [6000, 6050, 5950, 6100, 5900, 6020, 3000]  # the 7th, past round 2, is not read at look 2
    adamw_32 = [9000, 9100, 8950, 9200, 8900, 9050]
    arms = {("adamw", 32): (9000, adamw_32), ("lamb", 32): (6100, lamb_32),
            ("adamw", 64): (9500, [9500, 9400, 9600, 9450, 9550, 9350]),
            ("lamb", 64): (7000, [7000, 7100, 6900, 7050, 6950, 7150])}  # fmt: skip
    storage, eid = study(tmp_path / "hpo.db", "auto", arms)
    with storage:
        spec = spec_from_stored(storage.get_experiment(eid))
        _, verdicts = stored_evidence(storage, eid).batch_verdicts(spec)
    spent = [ALPHA * math.log1p((math.e - 1) * t) for t in (0.25, 0.5)]  # Lan-DeMets, Pocock type, by hand
    level = (spent[1] - spent[0]) / 2  # look 2's increment, over 2 batch sizes
    (c,) = verdicts[32].comparisons
    assert (verdicts[32].look, verdicts[32].looks) == (2, 4) and c.runs == (6, 6)
    assert c.level == pytest.approx(level, rel=1e-12)
    ratio, low, high = welch(lamb_32[:6], adamw_32, 1 - level)
    assert (c.ratio, c.low, c.high) == pytest.approx((ratio, low, high), rel=2e-3)


@pytest.mark.parametrize(
    ("lamb_64", "queued", "note"),
    [
        # at 64 LAMB and AdamW are close: the experiment's verdict names LAMB at 32 (the fewest samples of all), but
        # the question at 64 is open, so every arm gets a second round
        ([8300, 7700, 8900], 6, "verdict at batch 32 winner, at batch 64 not yet"),
        # LAMB wins at each batch size; across batch sizes LAMB at 64 is as fast as at 32, so the experiment's
        # verdict is "not yet": the rounds end all the same
        ([5960, 6040, 6010], 3, "verdict at batch 32 winner, at batch 64 winner"),
    ],
)
def test_the_rounds_of_a_batch_size_study_follow_the_verdict_at_each_batch_size(tmp_path, lamb_64, queued, note):
    arms = {("adamw", 32): (9000, [9000, 9100, 8950]), ("lamb", 32): (3000, [3000, 3010, 2990] if queued == 6
                                                                       else [6000, 6050, 5950]),
            ("adamw", 64): (8000, [8000, 8100, 7900] if queued == 6 else [12000, 12100, 11900]),
            ("lamb", 64): (lamb_64[0], lamb_64)}  # fmt: skip
    storage, eid = study(tmp_path / "hpo.db", "auto", arms)
    with storage:
        spec = spec_from_stored(storage.get_experiment(eid))
        evidence, trials = stored_evidence(storage, eid), storage.list_trials(eid)
        experiment = evidence.verdict(spec)
        deciding = evidence.deciding(spec)
    assert experiment.outcome is (Outcome.WINNER if queued == 6 else Outcome.NOT_YET), experiment.line  # premise
    assert runs_to_queue(spec, trials, [experiment]) == 9 - queued  # the experiment's verdict alone: the other way
    assert runs_to_queue(spec, trials, deciding.values()) == queued
    assert rounds_note(deciding) == f"round 1 of at most 4 done, {note}"


def test_runs_at_one_batch_size_so_far_give_no_verdict_at_each_batch_size(tmp_path, capsys):
    """The file declares 32 and 64, but only the arms at 32 have trials yet: nothing is across batch sizes, so
    `hpo status` prints the experiment's verdict without the verdict at each batch size, as the report does."""
    from hpo.cli.main import main
    from hpo.evidence.confirmations import batch_verdict_lines, shown_batch_verdicts
    from hpo.report.text import study_lines

    arms = {("adamw", 32): (9000, [9000, 9100, 8950]), ("lamb", 32): (6100, [6000, 6050, 5950])}
    storage, eid = study(tmp_path / "hpo.db", 3, arms)
    with storage:
        spec = spec_from_stored(storage.get_experiment(eid))
        lines = batch_verdict_lines(spec, shown_batch_verdicts(spec, stored_evidence(storage, eid)))
        data = load_experiment(storage, "study", with_noise=False)
    assert lines == [] and study_lines(data) == []
    assert main(["--db", f"sqlite:///{tmp_path / 'hpo.db'}", "status", "study"]) == 0
    assert "batch-size study" not in capsys.readouterr().out


def test_a_batch_size_study_compares_the_optimizers_at_each_batch_size_and_nothing_else():
    """Arms of the batch size and the optimizer are a batch-size study; with a third key (a clipping strategy, an
    MLPerf system) the arms of one optimizer at one batch size are not replicates of one configuration, and with
    another key than the optimizer there are no optimizers to compare at a batch size: their verdict is the
    experiment's."""
    from hpo.experiment.arms import batch_study

    assert batch_study(["optimizer.name", "batch.global_batch_size"])
    assert batch_study(["batch.global_batch_size", "optimizer.name"])
    assert not batch_study(["clipping.strategy", "batch.global_batch_size"])
    assert not batch_study(["optimizer.name", "clipping.strategy", "batch.global_batch_size"])
    assert not batch_study(["batch.global_batch_size"]) and not batch_study(["optimizer.name"])


def test_the_verdict_at_a_batch_size_shares_the_error_over_the_batch_sizes_declared(tmp_path):
    """The study declares 32 and 64. While only the arms at 32 have runs, the verdict there is already tested at
    half the level (it shares the error with 64's to come), so it is the same verdict once 64's runs arrive: shared
    over the batch sizes compared so far, a winner at 32 could turn to "not yet" when another batch size's runs
    came. The report's verdict at each batch size says over how many batch sizes the error is shared."""
    from hpo.report.text import study_lines

    at_32 = {("adamw", 32): (9000, [9000, 9100, 8950]), ("lamb", 32): (6100, [6000, 6050, 5950])}
    at_64 = {("adamw", 64): (9500, [9500, 9400, 9600]), ("lamb", 64): (7000, [7000, 7100, 6900])}
    verdicts = {}
    for name, arms in (("before", at_32), ("after", at_32 | at_64)):
        storage, eid = study(tmp_path / f"{name}.db", 3, arms)
        with storage:
            spec = spec_from_stored(storage.get_experiment(eid))
            _, verdicts[name] = stored_evidence(storage, eid).batch_verdicts(spec)
            data = load_experiment(storage, "study", with_noise=False)
    (c,) = verdicts["before"][32].comparisons
    assert c.level == pytest.approx(ALPHA / 2, rel=1e-12) and verdicts["before"][32].shared == 2
    _, low, high = welch([6000, 6050, 5950], [9000, 9100, 8950], 1 - ALPHA / 2)
    assert (c.low, c.high) == pytest.approx((low, high), rel=2e-3)
    assert verdicts["after"][32] == verdicts["before"][32]
    assert [v.shared for v in verdicts["after"].values()] == [2, 2]
    assert f"  verdict at batch 32 (the error shared over 2 batch sizes): {verdicts['after'][32].line}" in (
        study_lines(data))  # fmt: skip


def test_an_arm_whose_tuning_found_nothing_does_not_hold_the_rounds_at_other_batch_sizes(tmp_path):
    """confirm_seeds auto. AdamW's only tuning trial at 64 failed: that arm has nothing to confirm, and the
    experiment's verdict says it found nothing; 64 has one optimizer, so no verdict there. At 32 the optimizers are
    close after round 1, so the verdict there is "not yet" and more runs may decide: every arm with a configuration
    gets round 2 (they waited for AdamW at 64's round 1, which never comes, and stopped at the first). Once they
    finish it, the verdict is asked at look 2 and the round line counts the round done."""
    from hpo.evidence.confirmations import batch_verdict_lines, round_line

    arms = {("adamw", 32): (8000, [8000, 8100, 7900]), ("lamb", 32): (8300, [8300, 7700, 8900]),
            ("adamw", 64): (math.nan, []), ("lamb", 64): (7000, [7000, 7100, 6900])}  # fmt: skip
    storage, eid = study(tmp_path / "round1.db", "auto", arms)
    with storage:
        spec = spec_from_stored(storage.get_experiment(eid))
        evidence, trials = stored_evidence(storage, eid), storage.list_trials(eid)
        deciding = evidence.deciding(spec)
    assert deciding[32].outcome is Outcome.NOT_YET and deciding[32].runs_needed is not None
    assert 64 not in deciding and "not yet" in evidence.verdict(spec).line  # one optimizer at 64: nothing there
    assert runs_to_queue(spec, trials, deciding.values(), evidence.best) == 6
    assert rounds_note(deciding).startswith("round 1 of at most 4 done, verdict at batch 32 not yet")
    assert batch_verdict_lines(spec, deciding)[0].endswith(", which the confirmation rounds follow):")  # auto

    arms |= {("adamw", 32): (8000, [8000, 8100, 7900, 8050, 7950, 8000]),
             ("lamb", 32): (8300, [8300, 7700, 8900, 8200, 7800, 8400]),
             ("lamb", 64): (7000, [7000, 7100, 6900, 7050, 6950, 7000])}  # fmt: skip
    storage, eid = study(tmp_path / "round2.db", "auto", arms)
    with storage:
        evidence, trials = stored_evidence(storage, eid), storage.list_trials(eid)
        deciding = evidence.deciding(spec)
        line = round_line(spec, evidence.confirmations, evidence.best)
    assert {(v.look, v.looks) for v in deciding.values()} == {(2, 4)}
    assert [v.comparisons[0].runs for v in (deciding[32],)] == [(6, 6)]
    assert line.startswith("confirmations round 2 of at most 4 (2 finished)"), line
