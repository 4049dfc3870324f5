"""bench.plan_forecast: each shape's experiment file is one `hpo plan` takes, on the preset's curve table."""

from __future__ import annotations

import pytest
import yaml

from bench import plan_forecast
from hpo.experiment import load_experiment
from hpo.simulation.table import shipped_table


@pytest.mark.parametrize("shape", list(plan_forecast.SHAPES))
def test_each_shape_is_the_preset_on_its_table(shape, tmp_path):
    path = plan_forecast.shape_file(shape, tmp_path)
    spec = load_experiment(path)
    preset = yaml.safe_load(plan_forecast.PRESET.read_text())
    assert spec.runner.simulation.table == str(shipped_table(preset["runner"]["simulation"]["table"]))
    assert spec.name == f"forecast_{shape.replace('-', '_')}"


def test_a_cell_plans_and_runs_the_demo_shape():
    row = plan_forecast.cell(("demo", 8, 1))
    forecast, outcome = row["forecast"], row["outcome"]
    assert forecast["n"] == outcome["n"] == 1
    for summary in (forecast, outcome):  # one repetition: one outcome, its share 1
        shares = [summary[k] for k in ("right", "wrong", "equivalent", "not_yet")]
        assert sorted(shares) == [0.0, 0.0, 0.0, 1.0], summary
        assert 0 < summary["wall_h"] < summary["gpu_h"]  # 8 slots of one GPU each: GPU-hours above the wall's
    assert forecast["gpu_h"] != outcome["gpu_h"]  # the outcome's seeds are not the forecast's
    assert row["gpu_h_off"] == pytest.approx(forecast["gpu_h"] / outcome["gpu_h"] - 1)
    assert row["right_off"] == forecast["right"] - outcome["right"]
