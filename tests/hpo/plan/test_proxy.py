"""hpo.plan.proxy: a GPU preset moved onto a learning-curve table keeps its shape (arms, tuner, trials,
confirmations, slots, GPUs per trial) and states what it moved. The expected values are read here from the
files themselves (the preset's YAML, the base config, the table's meta line), not from the module."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main
from hpo.errors import HpoError
from hpo.experiment import experiment_from_dict, load_experiment
from hpo.plan.proxy import table_proxy
from hpo.runners.simulated import SimulatedRunner
from hpo.simulation.table import TABLES, load_table

ROOT = Path(__file__).resolve().parents[3]
PRESETS = ROOT / "search_spaces" / "presets"


def meta(table: str) -> dict:
    return json.loads((TABLES / f"{table}.jsonl").read_text().splitlines()[0])


def moved(preset: str, table: str) -> tuple[dict, list[str], dict]:
    spec = load_experiment(PRESETS / f"{preset}.yaml")
    data, assumptions = table_proxy(spec, spec.self_contained(), load_table(TABLES / f"{table}.jsonl"))
    return data, assumptions, yaml.safe_load((PRESETS / f"{preset}.yaml").read_text())


def test_adam_vs_lamb_keeps_its_shape_and_holds_what_the_table_does_not_vary():
    data, assumptions, file = moved("adam_vs_lamb", "curves")
    grid = meta("curves")["grid"]
    assert set(data["space"]) == {"optimizer.name", "optimizer.lr@lamb", "optimizer.lr@adamw", "schedule.warmup_steps"}
    for label in ("optimizer.lr@lamb", "optimizer.lr@adamw"):
        assert data["space"][label]["float"] == [min(grid["lr"]), max(grid["lr"])]
        assert data["space"][label]["when"] == file["space"][label]["when"]
    assert data["space"]["schedule.warmup_steps"] == {"choice": grid["warmup_steps"]}
    assert data["compare"] == file["compare"] and data["tuner"]["name"] == file["tuner"]["name"] == "smac_hyperband"
    assert data["budget"]["trials"] == file["budget"]["trials"] and data["budget"]["confirm_seeds"] == "auto"
    assert data["resources"]["gpus_per_trial"] == file["resources"]["gpus_per_trial"] == 8
    bert_large = yaml.safe_load((ROOT / "trainer/configs/bert_large.yaml").read_text())
    scale = data["runner"]["simulation"]["sample_scale"]
    assert scale == pytest.approx(bert_large["budget"]["max_samples"] / meta("curves")["fixed"]["budget.max_samples"])
    assert data["base_config"]["budget"]["max_samples"] == meta("curves")["fixed"]["budget.max_samples"]
    assert data["base_config"]["batch"]["global_batch_size"] == min(grid["global_batch_size"])
    assert data["runner"]["simulation"]["assume_no_effect"] == []
    assert any("optimizer.beta1, optimizer.beta2, optimizer.weight_decay" in a for a in assumptions)
    assert any(f"stands for {scale:,.0f} of the file's 8,000,000 samples" in a for a in assumptions)


def test_compared_arms_the_table_does_not_vary_stay_and_read_the_same_curves():
    data, assumptions, file = moved("clipping_strategies", "curves")
    assert data["compare"] == ["clipping.strategy"] and data["space"]["clipping.strategy"] == file["space"][
        "clipping.strategy"]  # fmt: skip
    assert "clipping.max_norm" not in data["space"] and "allow_unequal_arms" not in data
    assert data["runner"]["simulation"]["assume_no_effect"] == ["clipping.strategy"]
    assert data["base_config"]["optimizer"]["name"] == "lamb"  # the file's base optimizer, which it does not tune
    assert any("truly equal" in a for a in assumptions)


def test_compared_batch_sizes_read_the_tables_smallest_to_smallest_with_its_run_length_at_each():
    data, assumptions, file = moved("batch_scaling", "large_batch")
    plans = meta("large_batch")["grid"]["batches"]
    ours = sorted(int(b) for b in plans)
    assert data["space"]["batch.global_batch_size"]["choice"] == ours
    for theirs, b in zip(file["space"]["batch.global_batch_size"]["choice"], ours, strict=True):
        lr = data["space"][f"optimizer.lr@lamb_b{theirs}"]
        assert lr["when"] == {"optimizer.name": "lamb", "batch.global_batch_size": b}
        assert lr["float"] == [min(plans[str(b)]["lr"]["lamb"]), max(plans[str(b)]["lr"]["lamb"])]
        assert data["space"][f"budget.max_samples@b{b}"]["choice"] == [plans[str(b)]["max_samples"]]
    assert any("448 -> 128, 896 -> 512, 1,792 -> 1,024, 3,584 -> 2,048" in a for a in assumptions)
    # One scale, the file's budget over the table's longest run, understated the shorter runs' hours (a full run at
    # table batch 128 stood for 1,000,000 of the file's 8,000,000 samples): each batch size has its own scale, so a
    # full run lasts the file's budget at every one
    lengths = {int(b): plans[b]["max_samples"] for b in plans}
    budget = load_experiment(PRESETS / "batch_scaling.yaml").resolved_base()["budget"]["max_samples"]
    simulation = data["runner"]["simulation"]
    assert simulation["batch_sample_scale"] == {b: pytest.approx(budget / n) for b, n in lengths.items()}
    assert simulation["sample_scale"] == pytest.approx(budget / max(lengths.values()))
    said = [a for a in assumptions if a.startswith("the table's runs are of other lengths at each batch size")]
    assert len(said) == 1 and f"a full run lasts the file's {budget:,} samples at every batch size" in said[0]
    runner = SimulatedRunner(experiment_from_dict(data, "moved", base_dir=ROOT), 1)
    hours = {b: runner._seconds(n, b) / 3600 for b, n in lengths.items()}  # a full run's simulated hours at each
    rate = runner.slot_samples_per_s
    assert hours == {b: pytest.approx(budget / rate / 3600) for b in lengths}, hours


def test_the_plan_of_a_gpu_preset_prints_its_assumptions_its_cost_and_its_chances(capsys):
    assert main(["plan", str(PRESETS / "adam_vs_lamb.yaml"), "--repetitions", "1"]) == 0
    out = capsys.readouterr().out
    assert "the table cannot serve as it is: planned on the simulated runner under these assumptions:" in out
    assert "assumption: held at their best, assumed not to change samples to target" in out
    assert re.search(r"  GPU-hours +[\d,.]+", out) and "wall-clock" in out and "winner optimizer.name=lamb" in out
    assert math.isclose(float(re.search(r"1 table sample = ([\d.]+) samples", out).group(1)), 8_000_000 / 12288,
                        rel_tol=1e-5)  # fmt: skip


def test_a_budget_per_batch_size_is_never_held_and_other_proportions_than_the_tables_are_refused():
    spec = load_experiment(PRESETS / "batch_scaling_demo_cpu.yaml")  # 12,288 samples at batch 32, 49,152 at 128
    budget = meta("curves")["fixed"]["budget.max_samples"]  # one for both batch sizes
    with pytest.raises(HpoError) as refused:
        table_proxy(spec, spec.self_contained(), load_table(TABLES / "curves.jsonl"))
    said = str(refused.value)
    assert "budget.max_samples: the file sets a budget per batch size" in said
    assert f"batch 32 trains 12,288 samples, read from the table's batch 32, whose runs stop at {budget:,} (one " \
           f"table sample = {12288 / budget:g} of the file's)" in said  # fmt: skip
    assert f"batch 128 trains 49,152 samples, read from the table's batch 128, whose runs stop at {budget:,} (one " \
           f"table sample = {49152 / budget:g} of the file's)" in said  # fmt: skip


def test_a_budget_per_batch_size_in_the_tables_proportions_sets_the_scale(tmp_path):
    file = yaml.safe_load((PRESETS / "batch_scaling.yaml").read_text())
    file["base_config"] = str((PRESETS / file["base_config"]).resolve())
    plans = meta("large_batch")["grid"]["batches"]
    ours = sorted(int(b) for b in plans)
    theirs = file["space"]["batch.global_batch_size"]["choice"]  # read smallest to smallest
    for b, t in zip(theirs, ours, strict=True):
        file["space"][f"budget.max_samples@b{b}"] = {"choice": [20 * plans[str(t)]["max_samples"]],
                                                     "when": {"batch.global_batch_size": b}}  # fmt: skip
    file["allow_unequal_arms"] = "each batch size trains its own budget"
    path = tmp_path / "budgets.yaml"
    path.write_text(yaml.safe_dump(file))
    spec = load_experiment(path)
    data, assumptions = table_proxy(spec, spec.self_contained(), load_table(TABLES / "large_batch.jsonl"))
    assert data["runner"]["simulation"]["sample_scale"] == pytest.approx(20)
    assert any("one table sample stands for 20 of the file's samples (its budget at each batch size" in a
               for a in assumptions)  # fmt: skip
    assert not any("budget.max_samples" in a for a in assumptions if a.startswith("held at their best"))
    for b, t in zip(theirs, ours, strict=True):
        assert data["space"][f"budget.max_samples@b{t}"]["choice"] == [plans[str(t)]["max_samples"]]
        assert f"budget.max_samples@b{b}" not in data["space"] or b == t
    lengths = {t: plans[str(t)]["max_samples"] for t in ours}
    pairs = ", ".join(f"{lengths[t]:,} at table batch {t:,} for the file's {20 * lengths[t]:,} at {b:,}"
                      for b, t in zip(theirs, ours, strict=True))  # fmt: skip
    assert f"each batch size trains the file's own budget there, in the table's proportions: {pairs}" in assumptions


def test_a_file_shorter_than_the_tables_runs_says_the_fraction_of_a_sample_one_stands_for(tmp_path):
    """A file that trains 6,144 samples on a table whose runs train 12,288: one table sample stands for 0.5 of the
    file's (it printed "stands for 0", the share rounded to whole samples)."""
    file = yaml.safe_load((PRESETS / "clipping_strategies_demo_cpu.yaml").read_text())
    file["base_config"] = str((PRESETS / file["base_config"]).resolve())
    file.setdefault("overrides", {})["budget.max_samples"] = meta("curves")["fixed"]["budget.max_samples"] // 2
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(file))
    spec = load_experiment(path)
    data, assumptions = table_proxy(spec, spec.self_contained(), load_table(TABLES / "curves.jsonl"))
    assert data["runner"]["simulation"]["sample_scale"] == pytest.approx(0.5)
    assert any("one table sample stands for 0.5 of the file's 6,144 samples" in a for a in assumptions), assumptions


def pilot_file(tmp_path: Path, space: dict, trials: int) -> Path:
    """A grid over the GPU preset's base config (BERT-large at batch 448): no table serves it as it is."""
    file = {"name": "pilot", "base_config": str(ROOT / "trainer/configs/bert_large.yaml"), "space": space,
            "overrides": {"eval.stop_at_target": False}, "compare": ["optimizer.name"],
            "allow_unequal_arms": "each optimizer has its own grid of learning rates", "tuner": {"name": "grid"},
            "budget": {"trials": trials}, "resources": {"gpus": "none", "cpu_slots": 1}}  # fmt: skip
    path = tmp_path / "pilot.yaml"
    path.write_text(yaml.safe_dump(file))
    return path


def test_a_grid_the_move_onto_the_table_would_change_is_refused_for_that_not_for_choices_it_has(tmp_path, capsys):
    """The pilot of the planning page (3 learning rates x 3 seeds per optimizer, all choices): moved onto the table,
    its learning rates become the table's range and its seeds are held, so the grid would be another; the plan said
    "tuner grid needs every parameter a choice", of a file whose every parameter is one. Now it names what the move
    would change; a grid the move keeps (the compared optimizers alone) is moved, a grid still."""
    space = {"optimizer.name": {"choice": ["adamw", "lamb"]},
             "optimizer.lr@adamw": {"choice": [5.6e-4, 1.0e-3, 1.78e-3], "when": {"optimizer.name": "adamw"}},
             "optimizer.lr@lamb": {"choice": [5.6e-3, 1.0e-2, 1.78e-2], "when": {"optimizer.name": "lamb"}},
             "seed": {"choice": [1, 2, 3]}}  # fmt: skip
    path = pilot_file(tmp_path, space, trials=18)
    assert main(["--db", f"sqlite:///{tmp_path / 'hpo.db'}", "plan", str(path), "--repetitions", "1"]) == 2
    said = capsys.readouterr().err
    assert "needs every parameter a choice" not in said
    moved = re.findall(r"moved onto \S+\.jsonl: ([^;\n]+)", said)
    assert len(moved) == 2 and all(m.startswith("tuner grid: ") for m in moved), said
    assert all("optimizer.lr@adamw, optimizer.lr@lamb, seed" in m for m in moved), said
    assert not (tmp_path / "hpo.db").exists()
    kept = yaml.safe_load(pilot_file(tmp_path, {"optimizer.name": {"choice": ["adamw", "lamb"]}}, trials=2).read_text())
    del kept["allow_unequal_arms"]  # both arms tune nothing
    (tmp_path / "kept.yaml").write_text(yaml.safe_dump(kept))
    spec = load_experiment(tmp_path / "kept.yaml")
    data, _ = table_proxy(spec, spec.self_contained(), load_table(TABLES / "curves.jsonl"))
    assert data["tuner"]["name"] == "grid" and data["space"] == {"optimizer.name": {"choice": ["adamw", "lamb"]}}
