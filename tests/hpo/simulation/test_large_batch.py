"""The large-batch table (a budget, evaluation interval, warmup and learning rates per global batch size) on the
simulated cluster: read exactly at grid points at every batch size, partial tables refused by what they lack, and
the batch_scaling_simulated preset (optimizer x global batch size) validated and run through `hpo run`.

Everything runs on the hand-written table of conftest (`write_large_batch_table`, the real table's plan with
formula curves). Only the last test reads hpo/simulation/tables/large_batch.jsonl, which is still being generated: it
checks
that the preset follows the table's plan, runs the preset there when the table has every run the preset needs, and
is skipped, naming what is missing, before.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main as hpo_main
from hpo.engine.local import print_summary
from hpo.errors import HpoError
from hpo.experiment import experiment_from_dict, load_experiment, spec_from_stored
from hpo.experiment.arms import arm_dimensions, arm_plans, trial_config
from hpo.runners.simulated import SimulatedRunner, table_gaps
from hpo.simulation.surrogate import Config, Surrogate
from hpo.simulation.table import CurveTable, load_table
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from search_spaces import preset_path
from tests.hpo.simulation.conftest import (
    EVERY,
    LARGE_PLAN,
    MAX_SAMPLES,
    large_accuracy,
    write_large_batch_table,
    write_table,
)

PRESET = preset_path("batch_scaling_simulated")
REAL_TABLE = Path(__file__).resolve().parents[3] / "hpo/simulation/tables/large_batch.jsonl"
TARGET = 0.12


def preset_on(table: Path, directory: Path, **changes) -> Path:
    """The preset as shipped, reading `table` (and with `changes` to its top-level sections), written beside it."""
    data = yaml.safe_load(PRESET.read_text())
    data["base_config"] = str(PRESET.parent / data["base_config"])
    data["runner"]["simulation"]["table"] = str(table)
    data.update(changes)
    path = directory / "batch_scaling_simulated.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def expected_curve(optimizer: str, lr: float, batch: int, seed: int) -> list[tuple[int, float]]:
    """The curve of (optimizer, lr) at `batch` with recorded seed `seed`, from the formulas: each evaluation of the
    batch size's interval up to its budget, blended in log(lr) between the two neighbouring grid rates."""
    plan = LARGE_PLAN[batch]
    lrs = plan["lr"][optimizer]
    points = range(plan["every"], plan["max_samples"] + 1, plan["every"])
    i = max(k for k in range(len(lrs)) if lrs[k] <= lr * (1 + 1e-9))
    if math.isclose(lr, lrs[i], rel_tol=1e-9):
        return [(s, large_accuracy(optimizer, lrs[i], batch, seed, s)) for s in points]
    w = (math.log(lr) - math.log(lrs[i])) / (math.log(lrs[i + 1]) - math.log(lrs[i]))
    return [(s, (1 - w) * large_accuracy(optimizer, lrs[i], batch, seed, s)
             + w * large_accuracy(optimizer, lrs[i + 1], batch, seed, s)) for s in points]  # fmt: skip


# ------------------------------------------------------------------------------------------------ the table
def test_each_batch_size_has_its_own_budget_and_evaluation_interval(tmp_path):
    table = load_table(write_large_batch_table(tmp_path / "large.jsonl"))
    assert table.per_batch and table.batch_sizes() == [128, 512, 1024, 2048]
    assert [table.max_samples_for(b) for b in (128, 512, 1024, 2048)] == [49_152, 163_840, 327_680, 393_216]
    assert [table.eval_every_for(b) for b in (128, 512, 1024, 2048)] == [2_048, 8_192, 16_384, 16_384]
    with pytest.raises(HpoError, match=r"budget.max_samples per global batch size .*\[128, 512, 1024, 2048\]"):
        table.max_samples  # noqa: B018 (there is no single budget to give)
    with pytest.raises(HpoError, match=r"no batch.global_batch_size=256; .* in \[128, 512, 1024, 2048\]"):
        table.max_samples_for(256)
    one = load_table(write_table(tmp_path / "curves.jsonl"))  # the one-budget format: the same at every batch
    assert not one.per_batch and one.max_samples == MAX_SAMPLES and one.eval_every == EVERY
    assert {one.max_samples_for(b) for b in (32, 128, 4096)} == {MAX_SAMPLES}
    assert {one.eval_every_for(b) for b in (32, 128, 4096)} == {EVERY}


@pytest.mark.parametrize("batch", [128, 512, 1024, 2048])
def test_a_curve_at_a_grid_point_is_the_recorded_one_at_every_batch_size(tmp_path, batch):
    surrogate = Surrogate(load_table(write_large_batch_table(tmp_path / "large.jsonl")))
    plan = LARGE_PLAN[batch]
    for optimizer, lrs in plan["lr"].items():
        for lr in lrs:
            for seed in (0, 1, 2):
                curve = surrogate.curve(Config(optimizer, lr, plan["warmup_steps"], batch, seed))
                assert curve.evals == tuple(
                    (s, large_accuracy(optimizer, lr, batch, seed, s))
                    for s in range(plan["every"], plan["max_samples"] + 1, plan["every"])
                )
                assert curve.end == plan["max_samples"] and not curve.diverged
    # between grid points: the log-lr blend of the two neighbours, evaluation by evaluation (at its batch's interval)
    lr = math.sqrt(plan["lr"]["lamb"][0] * plan["lr"]["lamb"][1])
    curve = surrogate.curve(Config("lamb", lr, plan["warmup_steps"], batch, 2))
    assert [s for s, _ in curve.evals] == [s for s, _ in expected_curve("lamb", lr, batch, 2)]
    assert [a for _, a in curve.evals] == pytest.approx([a for _, a in expected_curve("lamb", lr, batch, 2)])


def test_a_point_the_table_lacks_is_refused_by_name(tmp_path):
    # partial, as the generator leaves it: seeds 0 and 1 everywhere at batch 128, only seed 0 of AdamW at 512
    def keep(optimizer, lr, batch, seed):
        return batch == 128 and seed < 2 or (batch, optimizer, seed) == (512, "adamw", 0)

    partial = load_table(write_large_batch_table(tmp_path / "partial.jsonl", keep=keep))
    surrogate = Surrogate(partial)
    not_generated = r"optimizer.name=lamb, schedule.warmup_steps=20, batch.global_batch_size=1024 \(a point of the"
    with pytest.raises(HpoError, match=rf"no recorded runs at {not_generated} table's grid\).*--large-batch` resumes"):
        surrogate.curve(Config("lamb", 0.01, 20, 1024))
    with pytest.raises(HpoError, match=r"batch.global_batch_size=512, optimizer.lr=0.001 with seed 1;.*resumes it"):
        surrogate.curve(Config("adamw", 1e-3, 20, 512, seed=1))
    with pytest.raises(HpoError, match=r"schedule.warmup_steps=24; the table has schedule.warmup_steps in \[20\] at "
                       r"batch.global_batch_size=512"):  # fmt: skip
        surrogate.curve(Config("adamw", 1e-3, 24, 512))
    with pytest.raises(HpoError, match=r"batch.global_batch_size=256; the table has batch.global_batch_size in "
                       r"\[128, 512, 1024, 2048\]"):  # fmt: skip
        surrogate.curve(Config("adamw", 1e-3, 20, 256))
    # what an experiment over a range still needs there: the grid rates in it and the neighbours beyond its bounds
    assert partial.gaps("adamw", 24, 128, 5.62e-4, 1.78e-3) == "seed 2 at lr 0.000562, 0.001, 0.00178"
    assert partial.gaps("adamw", 20, 512, 7e-4, 1e-3) == "seeds 1, 2 at lr 0.000562, 0.001"
    assert partial.gaps("lamb", 20, 512, 0.0178, 0.0178) == "seeds 0, 1, 2 at lr 0.0178"
    assert partial.gaps("lamb", 24, 128, 0.00562, 0.0316) == "seed 2 at lr 0.00562, 0.01, 0.0178, 0.0316"


def test_an_experiment_on_a_partial_table_is_refused_before_anything_is_written(tmp_path):
    table = write_large_batch_table(tmp_path / "partial.jsonl",
                                    keep=lambda optimizer, lr, batch, seed: batch != 1024 or seed == 0)  # fmt: skip
    spec = load_experiment(preset_on(table, tmp_path))
    assert table_gaps(spec, load_table(table)) == [
        "optimizer.name=adamw, schedule.warmup_steps=20, batch.global_batch_size=1024: seeds 1, 2 at lr 0.001, "
        "0.00178, 0.00316",
        "optimizer.name=lamb, schedule.warmup_steps=20, batch.global_batch_size=1024: seeds 1, 2 at lr 0.01, 0.0178, "
        "0.0316",
    ]
    with pytest.raises(HpoError, match=r"lacks runs this experiment needs .*--large-batch` resumes it.*\n  "
                       r"optimizer.name=adamw, .*batch.global_batch_size=1024: seeds 1, 2"):  # fmt: skip
        SimulatedRunner(spec, 64)
    db = tmp_path / "hpo.db"
    assert hpo_main(["--db", f"sqlite:///{db}", "run", str(preset_on(table, tmp_path)), "--quiet"]) == 2
    assert not db.exists()


def test_a_budget_beyond_the_table_at_its_batch_size_is_refused(tmp_path):
    table = write_large_batch_table(tmp_path / "large.jsonl")
    data = yaml.safe_load(preset_on(table, tmp_path).read_text())
    data["space"]["budget.max_samples@b512"] = {"choice": [172_032], "when": {"batch.global_batch_size": 512}}
    spec = experiment_from_dict(data, str(tmp_path / "over.yaml"))
    beyond = r"budget.max_samples 172032 is beyond the curve table's 163840 samples at batch.global_batch_size=512"
    with pytest.raises(HpoError, match=rf"space.budget.max_samples@b512: {beyond} \(arm optimizer.name=adamw,"):
        SimulatedRunner(spec, 64)
    data["space"]["optimizer.lr@lamb_b512"]["float"] = [5.62e-3, 3.16e-2]  # below the table's LAMB rates at 512
    data["space"]["budget.max_samples@b512"]["choice"] = [163_840]
    spec = experiment_from_dict(data, str(tmp_path / "lr.yaml"))
    with pytest.raises(HpoError, match=r"space.optimizer.lr@lamb_b512: optimizer.lr \[0.00562, 0.0316\] is outside "
                       r"the curve table's range \[0.01, 0.0316\] at optimizer.name=lamb"):  # fmt: skip
        SimulatedRunner(spec, 64)


# ------------------------------------------------------------------------------------------------ the preset
def assert_preset_follows(spec, plans: dict) -> None:
    """Each arm of the preset at its batch size's settings in a table's plan (meta grid.batches): every batch size of
    the plan, with its budget, evaluation interval and warmup, and the plan's learning-rate range of the arm's
    optimizer there."""
    arms = arm_plans(spec)
    assert sorted({plan.fixed["batch.global_batch_size"] for plan in arms}) == sorted(int(b) for b in plans)
    for plan in arms:
        optimizer, batch = plan.fixed["optimizer.name"], plan.fixed["batch.global_batch_size"]
        settings = plans[str(batch)]
        (lr_name,) = [name for name in plan.space.names if name.startswith("optimizer.lr@")]
        lrs = settings["lr"][optimizer]
        assert (plan.space[lr_name].low, plan.space[lr_name].high) == pytest.approx((min(lrs), max(lrs)))
        cfg = trial_config(spec, plan.space.sample(plan.index) | plan.fixed)
        assert (cfg.budget.max_samples, cfg.eval.every_samples, cfg.schedule.warmup_steps) == (
            settings["max_samples"], settings["every"], settings["warmup_steps"])  # fmt: skip


def test_the_preset_compares_optimizer_by_batch_size_at_the_tables_settings(tmp_path):
    table = load_table(write_large_batch_table(tmp_path / "large.jsonl"))
    shipped = load_experiment(PRESET)  # validates as shipped (reading no table)
    assert shipped.compare == ["optimizer.name", "batch.global_batch_size"] and shipped.budget.confirm_seeds == 3
    spec = load_experiment(preset_on(table.path, tmp_path))
    assert len(arm_plans(spec)) == 8 and spec.budget.trials % 8 == 0
    assert_preset_follows(spec, table.meta["grid"]["batches"])
    # the arms tune optimizer.lr alike; what allow_unequal_arms admits is only the table's one-value settings
    dims = arm_dimensions(spec)
    assert {d["optimizer.lr"] for d in dims.values()} == {"float, log"}
    fixed = {k: v for d in dims.values() for k, v in d.items() if k != "optimizer.lr"}
    assert set(fixed) == {"budget.max_samples", "eval.every_samples", "schedule.warmup_steps"}
    assert all(v.startswith("choice [") and "," not in v for d in dims.values() for k, v in d.items()
               if k != "optimizer.lr")  # fmt: skip
    runner = SimulatedRunner(spec, spec.budget.max_parallel)  # the table covers every trial it can propose
    assert "curves from" in runner.describe()


def test_a_run_the_generator_is_still_appending_is_not_read_yet(tmp_path):
    path = write_large_batch_table(tmp_path / "large.jsonl")
    whole = load_table(path)
    text = path.read_text()
    path.write_text(text + text.splitlines()[1][:100])  # the last line half written, no newline yet
    assert load_table(path).runs == whole.runs
    lines = text.splitlines()
    path.write_text("\n".join([lines[0], lines[1][:100], *lines[2:]]) + "\n")  # a broken line that is not the last
    with pytest.raises(HpoError, match=r"large.jsonl line 2: not JSON"):
        load_table(path)


def run_preset(table: Path, directory: Path, **changes) -> tuple[str, list]:
    """`hpo run` of the preset on `table`; the database URL and the stored trials."""
    url = f"sqlite:///{directory / 'hpo.db'}"
    path = preset_on(table, directory, **changes)
    assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(directory / "run")]) == 0
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("batch_scaling_simulated").id)
    return url, trials


def check_trials_read_their_batch_sizes_settings(url: str, trials: list, table) -> None:
    with SqlStorage(url) as storage:
        for trial in trials:
            batch = trial.params["batch.global_batch_size"]
            assert trial.params[f"budget.max_samples@b{batch}"] == table.max_samples_for(batch)
            assert trial.metrics["samples"] <= table.max_samples_for(batch)
            evals = [m.samples for m in storage.get_metrics(trial.id, "mlm_accuracy")]
            assert evals and all(s % table.eval_every_for(batch) == 0 for s in evals)


@pytest.fixture(scope="module")
def on_a_complete_table(tmp_path_factory) -> tuple:
    """The preset with random search instead of SMAC (seconds instead of minutes), everything else as shipped, run
    once for the module on the formula table: (the table, the database URL, the stored trials)."""
    directory = tmp_path_factory.mktemp("complete")
    table = load_table(write_large_batch_table(directory / "large.jsonl"))
    url, trials = run_preset(table.path, directory, tuner={"name": "random", "seed": 0})
    return table, url, trials


def test_the_preset_runs_end_to_end_on_a_complete_table(on_a_complete_table, capsys):
    """Random search instead of SMAC; everything else as shipped. Each trial records what the formulas say at its
    batch size: its evaluations every interval of that batch size, its samples to target the first of them at or
    above the target."""
    table, url, trials = on_a_complete_table
    with SqlStorage(url) as storage:  # the summary `hpo run` prints (--quiet above leaves it out) says where to look
        record = storage.get_experiment_by_name("batch_scaling_simulated")
        print_summary(storage, record.id, spec_from_stored(record), database_url=url)
    assert "(a batch-size study: this verdict compares every arm" in capsys.readouterr().out
    tuning = [t for t in trials if t.kind is TrialKind.TUNING]
    assert len(tuning) == 128 and all(t.state is TrialState.COMPLETED for t in trials)
    assert {t.arm for t in tuning} == {f"optimizer.name={o},batch.global_batch_size={b}"
                                       for o in ("adamw", "lamb") for b in (128, 512, 1024, 2048)}  # fmt: skip
    check_trials_read_their_batch_sizes_settings(url, trials, table)
    for trial in tuning:
        p, batch = trial.params, trial.params["batch.global_batch_size"]
        lr = p[f"optimizer.lr@{p['optimizer.name']}_b{batch}"]
        curve = expected_curve(p["optimizer.name"], lr, batch, 1234 % 3)  # the demo config's seed
        assert trial.samples_to_target == next((s for s, a in curve if a >= TARGET), None)
    confirmations = [t for t in trials if t.kind is TrialKind.CONFIRMATION]
    assert len(confirmations) == 8 * 3  # each arm's best once on each of the table's 3 seeds: no copies
    for arm in {t.arm for t in confirmations}:
        assert sorted(t.seed % 3 for t in confirmations if t.arm == arm) == [0, 1, 2]
    assert hpo_main(["--db", url, "best", "batch_scaling_simulated", "--per-arm"]) == 0


# slow: by default tests/hpo/cli/test_cli.py's
# test_a_batch_size_studys_run_status_and_best_per_arm_show_the_verdict_at_each_batch_size runs the shipped preset
# (SMAC) to the end on the shipped large_batch.jsonl, and test_the_preset_runs_end_to_end_on_a_complete_table checks
# each batch size's budget and evaluations
@pytest.mark.slow
def test_the_preset_runs_end_to_end_on_the_real_table(tmp_path):
    """The preset as shipped (SMAC: about 10 s on 2 cores) on hpo/simulation/tables/large_batch.jsonl (a snapshot of its
    finished lines). The preset must follow the table's plan (its meta line) at once; the table is generated in the
    background, seed by seed, and until it holds every run the preset reads this test is skipped, naming them."""
    if not REAL_TABLE.exists():
        pytest.skip(f"{REAL_TABLE} is not generated yet (python -m bench.curves.generate --large-batch)")
    text = REAL_TABLE.read_text()
    snapshot = tmp_path / REAL_TABLE.name
    snapshot.write_text(text[: text.rfind("\n") + 1])
    meta = json.loads(text.splitlines()[0])
    spec = load_experiment(preset_on(snapshot, tmp_path))
    assert_preset_follows(spec, meta["grid"]["batches"])
    runs = len(snapshot.read_text().splitlines()) - 1
    table = load_table(snapshot) if runs else CurveTable(snapshot, meta, ())
    gaps = table_gaps(spec, table)
    if gaps:
        pytest.skip(f"{REAL_TABLE.name} is still being generated ({runs} run(s) so far); the preset needs: "
                    + " | ".join(gaps))  # fmt: skip
    url, trials = run_preset(snapshot, tmp_path)
    assert len([t for t in trials if t.kind is TrialKind.TUNING]) == 128
    assert all(t.state in (TrialState.COMPLETED, TrialState.DIVERGED) for t in trials)
    check_trials_read_their_batch_sizes_settings(url, trials, table)


def test_a_simulated_space_may_set_the_run_length_but_nothing_else_the_table_does_not_vary(tmp_path):
    from hpo.errors import ExperimentFileError

    data = yaml.safe_load(preset_on(write_large_batch_table(tmp_path / "large.jsonl"), tmp_path).read_text())
    data["space"]["optimizer.weight_decay"] = {"float": [0.0, 0.1]}
    with pytest.raises(ExperimentFileError, match=r"space.optimizer.weight_decay: the curve table does not vary "
                       r"optimizer.weight_decay.*budget.max_samples and eval.every_samples per arm"):  # fmt: skip
        experiment_from_dict(data, str(tmp_path / "decay.yaml"))


def test_the_report_of_a_study_shows_each_batch_size_its_steps_and_its_verdict(on_a_complete_table, tmp_path, capsys):
    """`hpo report` of the preset's experiment (random search on the formula table): a batch-size view of its own
    arms, with optimizer steps to target (samples / batch), the fit per optimizer, and at each batch size the
    verdict between AdamW and LAMB on their confirmation runs, the error shared over the 4 batch sizes; the page
    checked is the one `hpo report -o` wrote."""
    import re
    from html import escape

    from hpo.evidence.batch_scaling import fit_batch_scaling
    from hpo.evidence.verdict import ArmRuns, decide
    from hpo.experiment.arms import arm_label
    from hpo.report.batch_view import fmt_estimate, fmt_fit
    from hpo.report.scaling import confirmation_runs

    table, url, _ = on_a_complete_table
    capsys.readouterr()
    assert hpo_main(["--db", url, "report", "batch_scaling_simulated", "-o", str(tmp_path / "reports")]) == 0
    out = capsys.readouterr().out.splitlines()
    page = (tmp_path / "reports" / "batch_scaling_simulated.html").read_text()
    with SqlStorage(url) as storage:
        runs = confirmation_runs(storage, "batch_scaling_simulated")
    assert "<h2>Batch sizes</h2>" in page and "<h2>Where the batch stops scaling</h2>" in page
    assert "data-field=batch_study_note>This is a batch-size study: this verdict compares every arm" in page
    assert "optimizer steps to target (95 %)" in page and "<h2>The verdict at each batch size</h2>" in page
    lines = []
    for batch in (128, 512, 1024, 2048):
        arms = [ArmRuns(o, tuple(runs[arm_label({"optimizer.name": o, "batch.global_batch_size": batch})]),
                        table.max_samples_for(batch)) for o in ("adamw", "lamb")]  # fmt: skip
        expected = decide(arms, family=4)  # computed here from the stored runs: 4 batch sizes share the error
        lines.append(f"  verdict at batch {batch:,} (the error shared over 4 batch sizes): {expected.line}")
        shown = re.search(rf'data-field="batch_verdict_line" data-arm="{batch}"[^>]*>([^<]*)<', page)
        assert shown and shown[1] == escape(expected.line), (batch, shown and shown[1], expected.line)
        assert f"{100 * (1 - 0.04 / 4):.3g} % interval" in expected.line, expected.line  # 99 %: 0.04 over 4
        label = arm_label({"optimizer.name": "lamb", "batch.global_batch_size": batch})
        hits = [s for s in runs[label] if s is not None]
        steps = re.search(rf'data-field="steps" data-arm="batch_scaling_simulated/{re.escape(label)}">([^<]*)<', page)
        assert hits and steps and steps[1].startswith(fmt_fit(sum(hits) / len(hits) / batch)), (batch, steps)
    # the terminal prints the same view: each batch size's verdict and each optimizer's fit, as computed here
    assert all(line in out for line in lines), (lines, out)
    for optimizer in ("adamw", "lamb"):
        fit = fit_batch_scaling(
            [
                (b, s)
                for b in (128, 512, 1024, 2048)
                for s in runs[arm_label({"optimizer.name": optimizer, "batch.global_batch_size": b})]
            ]
        )
        (printed,) = [line for line in out if line.startswith(f"  fit of {optimizer} ")]
        assert f"B_crit {fmt_estimate(fit.b_crit)}, S_min {fmt_estimate(fit.s_min)}" in printed, printed
