"""The pure parts of bench/cost_at_scale/: the cost figures, the median's interval, and the peers' trial model,
which must be the simulated runner's trial (the same samples, samples to target, objective and duration)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from bench.cost_at_scale import __main__ as cli
from bench.cost_at_scale import common, controller_cpu, optuna_peer, synetune_peer, tables
from hpo.cli.main import main as hpo_main
from hpo.experiment import experiment_from_dict
from hpo.plan.forecast import without_progress_series
from hpo.simulation.cost import experiment_cost
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from tests.hpo.simulation.conftest import write_table

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
LR = (1e-4, 1e-1)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def trial(number, start, end, hit=None, *, arm="optimizer.name=adamw", objective=1.0, state=TrialState.COMPLETED,
          kind=TrialKind.TUNING, params=None):  # fmt: skip
    return common.SimTrial(number, arm, params or {"optimizer.lr": number}, kind, at(0), at(start), at(end), state,
                          objective, hit)  # fmt: skip


def test_trials_scale_with_the_slots():
    assert [common.trials_for(s) for s in (1, 8, 10, 64, 1024)] == [20, 20, 20, 128, 2048]
    assert common.trials_for(64, per_slot=1, minimum=100) == 100


def test_first_hit_counts_every_trial_busy_until_the_first_trial_that_reached_the_target_ended():
    trials = [
        trial(0, 0, 3600),  # ran to its budget: a miss, all of its hour counts
        trial(1, 0, 7200, 1024),  # hit, but ended after the first hit
        trial(2, 1800, 5400, 2048),  # the first hit: ends at 1.5 h
        trial(3, 3600, 9000),  # half an hour of it by then
        trial(4, 6000, 8000, 512),  # started after: nothing
    ]
    gpu_h, wall_h = common.first_hit(trials, gpus_per_slot=8)
    assert wall_h == pytest.approx(1.5)
    assert gpu_h == pytest.approx(8 * (1.0 + 1.5 + 1.0 + 0.5))
    assert common.first_hit([trial(0, 0, 10)], 8) is None


def test_the_answer_costs_the_whole_experiment():
    trials = [trial(0, 0, 3600, 1), trial(1, 0, 1800), trial(2, 3600, 7200, kind=TrialKind.CONFIRMATION)]
    cost = experiment_cost(trials, slots=2, gpus_per_slot=8)
    assert cost.gpu_hours == pytest.approx(8 * 2.5) and cost.wall_hours == pytest.approx(2.0)
    assert cost.idle_fraction == pytest.approx(1 - 2.5 / 4)


def test_the_best_trial_of_an_arm_is_picked_as_the_storage_picks_it():
    trials = [
        trial(0, 0, 1, objective=5.0),
        trial(1, 0, 1, objective=3.0),
        trial(2, 0, 1, objective=3.0),  # a tie: the earlier one
        trial(3, 0, 1, objective=1.0, state=TrialState.DIVERGED),  # not completed
        trial(4, 0, 1, objective=None, state=None),  # pruned
        trial(5, 0, 1, objective=0.5, kind=TrialKind.CONFIRMATION),  # not a rival
        trial(6, 0, 1, objective=4.0, arm="optimizer.name=lamb"),
    ]
    best = common.best_per_arm(trials)
    assert best["optimizer.name=adamw"].number == 1 and best["optimizer.name=lamb"].number == 6


def test_the_median_interval_is_the_order_statistics_with_95_percent_coverage():
    values = list(range(1, 51))  # n = 50: ranks 18 and 33 (coverage 0.967; 19 and 32 would cover 0.935)
    assert common.median_interval(values) == (25.5, 18, 33, True)
    coverage = sum(math.comb(50, i) for i in range(18, 33)) / 2**50
    assert coverage >= 0.95 > sum(math.comb(50, i) for i in range(19, 32)) / 2**50
    assert common.median_interval([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0, False)  # n < 6: the range
    assert common.median_interval([1, 2, 3, 4, 5, 6]) == (3.5, 1, 6, True)  # 1 - 2 / 64 >= 0.95
    assert common.median_interval([1, math.inf, math.inf]) == (math.inf, 1, math.inf, False)  # misses: never


def test_a_table_without_progress_series_keeps_every_curve(tmp_path):
    table = write_table(tmp_path / "t.jsonl")
    stripped = without_progress_series(table, tmp_path / "s.jsonl")
    from hpo.simulation.table import load_table

    full, light = load_table(table), load_table(stripped)
    assert [r.curve for r in full.runs] == [r.curve for r in light.runs] and full.meta == light.meta
    assert all(not r.loss and not r.noise_scale for r in light.runs)


def test_the_peers_trial_model_is_the_simulated_runners_trial(tmp_path):
    """A small `hpo run` on the simulated runner; every stored trial equals the model's plan of its parameters."""
    table = write_table(tmp_path / "t.jsonl")
    data = common.experiment("model", table, "random", 3, 32, LR, 8, 20, 2)
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
    model = common.TrialModel(experiment_from_dict(data, "model", base_dir=tmp_path))
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("model").id)
    assert len(trials) == 24
    for stored in trials:
        plan = model.plan(stored.params, stored.seed)
        assert (stored.samples_to_target, stored.objective) == (plan.hit, pytest.approx(plan.objective))
        assert stored.state is (TrialState.DIVERGED if plan.diverged else TrialState.COMPLETED)
        assert stored.duration_s == pytest.approx(model.seconds(plan.samples))


def test_optuna_runs_on_the_same_slots_quotas_and_confirmations(tmp_path):
    table = write_table(tmp_path / "t.jsonl")
    data = common.experiment("optuna", table, "optuna_tpe_median", 0, 32, LR, 4, 20, 2)
    spec = experiment_from_dict(data, "optuna", base_dir=tmp_path)
    model = common.TrialModel(spec)
    trials = optuna_peer.run_optuna("optuna_tpe_median", spec, model, 0, slots=4)
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    assert len(tuning) == 20 and {t.arm for t in tuning} == {"optimizer.name=adamw", "optimizer.name=lamb"}
    assert sum(t.arm == "optimizer.name=lamb" for t in tuning) == 10
    events = sorted([(t.started_at, 1) for t in trials] + [(t.finished_at, -1) for t in trials])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 4
    for t in tuning:  # a trial is charged what it trained: to its planned end, or to where it was pruned
        plan = model.plan(t.params)
        assert (t.finished_at - t.started_at).total_seconds() == pytest.approx(model.seconds(t.samples))
        assert t.samples == plan.samples if t.state is not None else t.samples in [s for s, _ in plan.evals]
    confirmations = [t for t in trials if t.kind is TrialKind.CONFIRMATION]
    assert len(confirmations) == 4
    for arm in ("optimizer.name=adamw", "optimizer.name=lamb"):  # each arm's, once its own tuning is over
        over = max(t.finished_at for t in tuning if t.arm == arm)
        assert all(c.created_at == over <= c.started_at for c in confirmations if c.arm == arm)
    best = common.best_per_arm(trials)
    assert {c.params["optimizer.lr"] for c in confirmations} == {b.params["optimizer.lr"] for b in best.values()}
    row = common.outcome_row(trials, spec, 4)
    assert row["trials"] == 20 and row["answer_wall_h"] > row["first_hit_wall_h"] > 0


def test_a_confirmation_starts_at_the_first_moment_a_slot_is_free_for_its_whole_run():
    busy = [(0, 10), (0, 4), (5, 12)]  # 2 slots: free on [4, 5), then from 10 on
    assert common.first_free(busy, 2, 0.0, 1.0) == 4  # fits in the gap
    assert common.first_free(busy, 2, 0.0, 2.0) == 10  # does not: the next moment both end
    assert common.first_free(busy, 2, 11.0, 5.0) == 11  # one slot is free from 10 on
    assert common.first_free(busy, 3, 0.0, 50.0) == 0


@pytest.mark.slow  # needs Syne Tune, a benchmark-only dependency: `make bench-deps`, then `pytest -m slow -k syne`
def test_syne_tune_runs_its_simulator_on_the_surrogate(tmp_path):
    pytest.importorskip("syne_tune", reason="Syne Tune is installed by `make bench-deps`")
    table = write_table(tmp_path / "t.jsonl")
    data = common.experiment("st", table, "synetune_asha", 0, 32, LR, 4, 20, 2)
    spec = experiment_from_dict(data, "st", base_dir=tmp_path)
    model = common.TrialModel(spec)
    trials = synetune_peer.run_synetune("synetune_asha", spec, model, 0, 4, tmp_path)
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    assert len(tuning) == 20 and sum(t.arm == "optimizer.name=lamb" for t in tuning) == 10
    assert len(trials) == 24
    for t in tuning:  # its clock looks for ended trials every simulated second
        assert (t.finished_at - t.started_at).total_seconds() == pytest.approx(model.seconds(t.samples), abs=1.0)


def test_the_cost_table_prints_one_row_per_tuner_and_slot_count(capsys):
    rows = [{"tuner": "random", "slots": 8, "seed": s, "first_hit_gpu_h": None if s == 0 else 1.0 * s,
             "first_hit_wall_h": None if s == 0 else 0.1, "answer_gpu_h": 10.0, "answer_wall_h": 1.0,
             "idle_fraction": 0.25, "winner": "optimizer.name=lamb" if s else None, "trials": 20, "cpu_s": 1.0}
            for s in range(3)]  # fmt: skip
    tables.print_cost_table(rows)
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("| 8 | random | 3 | 20 | 2.0 [1.0-never]* | 0.10 [0.10-never]* (2 hit) | 10.0")
    assert "| 25.0 % [25.0 %-25.0 %]* | lamb 2, none 1 |" in line
    summary = tables.summary_rows(rows)[0]
    assert summary["hits"] == 2 and summary["verdicts"] == {"lamb": 2, "none": 1}


def test_the_controller_cpu_measurement_times_every_decision(tmp_path):
    import argparse

    table = without_progress_series(write_table(tmp_path / "t.jsonl"), tmp_path / "s.jsonl")
    args = argparse.Namespace(run_table=table, batch=32, lr=LR, cpu_slots=8, cpu_limit_s=300.0)
    row = controller_cpu.controller_cpu("random", 30, args, tmp_path)
    assert (row["asked"], row["finished"], row["stopped"], row["slots"]) == (30, 30, False, 8)
    assert row["cpu_s"] >= row["runner_cpu_s"] > 0 and row["loop_ms_per_trial"] > 0


def test_a_run_with_rows_goes_on_where_an_earlier_one_stopped(tmp_path, capsys):
    """--rows: each repetition's row is appended as it ends; a second run of the same set-up runs only the
    repetitions the file lacks, and its table covers them all; another set-up's rows are not reused."""
    table, rows = write_table(tmp_path / "t.jsonl"), tmp_path / "rows.jsonl"
    common = ["--table", str(table), "--slots", "8", "--tuners", "random", "--lr", *map(str, LR), "--cpu-trials"]
    assert cli.main([*common, "--seeds", "2", "--rows", str(rows)]) == 0
    first = rows.read_text().splitlines()
    assert [yaml.safe_load(line)["seed"] for line in first] == [0, 1]
    assert cli.main([*common, "--seeds", "3", "--rows", str(rows)]) == 0
    lines = rows.read_text().splitlines()
    assert lines[:2] == first and [yaml.safe_load(line)["seed"] for line in lines] == [0, 1, 2]
    assert "| 8 | random | 3 |" in capsys.readouterr().out
    assert cli.main([*common, "--seeds", "1", "--confirm", "3", "--rows", str(rows)]) == 0
    assert len(rows.read_text().splitlines()) == 4  # another set-up: its repetition ran again
