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
    assert row["forecast"]["n"] == row["outcome"]["n"] == 1
    assert row["forecast"]["gpu_h"] > 0 and row["outcome"]["gpu_h"] > 0
