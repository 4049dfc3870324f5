"""bench.commands: the experiment it stores is the simulated preset at N trials on 1,024 slots with the random tuner,
and its table marks each goal met or missed."""

from __future__ import annotations

import yaml

from bench import commands
from hpo.experiment import load_experiment


def test_the_experiment_is_the_simulated_preset_with_n_trials_random_search_and_1024_slots(tmp_path):
    name, path = commands.experiment_file(10_000, tmp_path)
    spec = load_experiment(path)  # valid as written, its base config found from the temporary directory
    preset = yaml.safe_load(commands.PRESET.read_text())
    assert name == spec.name == "sim10000"
    assert (spec.budget.trials, spec.budget.max_parallel) == (10_000, 1024)
    assert (spec.tuner.name, spec.tuner.seed, spec.tuner.options) == ("random", preset["tuner"]["seed"], {})
    assert preset["tuner"]["options"]  # the preset's own (SMAC) options are what was removed
    assert spec.runner.name == "simulated" and list(spec.compare) == preset["compare"]
    assert spec.budget.confirm_seeds == preset["budget"]["confirm_seeds"]


def test_the_table_marks_each_goal_at_its_scale():
    timings = [commands.Timing("status NAME", [0.9, 1.2, 0.8]), commands.Timing("report NAME", [4.0, 4.5, 6.0], 1.2),
               commands.Timing("--help", [0.1, 0.1, 0.1])]  # fmt: skip
    rows = commands.table(timings, 10_000).splitlines()[2:]
    assert rows[0].startswith("| `hpo status NAME` | 0.90 s | 0.80 s | 1.20 s | 3 |  | <= 1 s | yes |")
    assert rows[1].endswith("| 1.20 MB | <= 5 s | **no** (page) |")  # 4.5 s is in time, the page is not
    assert rows[2].endswith("|  |  |  |")  # no goal
    at_100k = commands.table(timings, 100_000).splitlines()[2:]
    assert "<= 2 s | yes" in at_100k[0] and "<= 15 s" in at_100k[1]
    assert commands.table(timings, 2000).splitlines()[2].endswith("|  |  |  |")  # goals only at 10,000 and 100,000
