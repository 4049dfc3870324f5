"""scripts/gpu_experiment.sh, the end-to-end experiment of scripts/gpu_checks.sh, on the CPU: the GPU preset with
the hpo tests' tiny trainer and data, on CPU slots, run by the script as it runs on a GPU. Every step it prints is
there (the run, status, trials, best per arm with the verdict, the compliance checker on every trial's log, the
exported config and training from it), and it exits 0 only when every trial's log passed the checker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpo.storage import SqlStorage
from tests.hpo.engine.test_study import tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "search_spaces" / "presets" / "adam_vs_lamb_gpu_check.yaml"


@pytest.mark.slow
def test_the_gpu_experiment_script_runs_the_preset_end_to_end_on_cpu_slots(tmp_path):
    data = yaml.safe_load(PRESET.read_text())
    data["base_config"] = str((PRESET.parent / data["base_config"]).resolve())
    data["overrides"] = {**tiny_overrides(tmp_path / "data"), "log.mlperf": "mlperf.log"}
    data["budget"].update(trials=2, confirm_seeds=2, max_parallel=1)
    data["resources"] = {"gpus": "none", "cpu_slots": 1}
    preset = tmp_path / "adam_vs_lamb_gpu_check.yaml"
    preset.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PRESET": str(preset), "PYTHON": sys.executable,
           "DATA": str(tmp_path / "data")}  # fmt: skip
    (tmp_path / "data" / "meta.json").write_text("{}")  # the tiny shards stand in for the demo corpus
    done = subprocess.run(["bash", "scripts/gpu_experiment.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    steps = [line for line in done.stdout.splitlines() if line.startswith("--- ")]
    assert [s.split()[1] for s in steps] == ["hpo", "hpo", "hpo", "hpo", "the", "hpo", "training"]
    storage = SqlStorage(f"sqlite:///{out / 'experiment.db'}")
    trials = storage.list_trials(storage.get_experiment_by_name(data["name"]).id)
    assert len(trials) == 6 and all(t.state.value == "completed" for t in trials)  # 2 tuning + 2 confirmations each
    logs = sorted((out / "experiment" / "trials").glob("*/mlperf.log"))
    assert len(logs) == 6 and "compliance checker: 6 of 6 trial logs passed" in done.stdout
    assert all(f"{log}: SUCCESS" in done.stdout for log in logs)
    assert "# verdict: " in done.stdout and (out / "best.yaml").is_file()
    assert "finished: " in output.splitlines()[-1]
