"""`hpo export` of a finished tiny experiment produces a config the trainer runs as is: through
`python -m trainer --config FILE`, and through the exported torchrun command on 2 gloo ranks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main
from hpo.experiment import experiment_from_dict
from hpo.experiment.arms import trial_config
from hpo.export.production import MLPERF_LOG
from hpo.storage import SqlStorage
from hpo.trials import TrialState
from tests.server.conftest import EXPERIMENT, hpo


def final_record(stdout: str) -> dict:
    """The trainer's last JSON report (its final result)."""
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return lines[-1]


def export_best(url: str, out: Path):
    """`hpo export` (in this process) of the finished experiment to `out`: the best trial's config, checked against
    the database."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["--db", url, "export", EXPERIMENT, "-o", str(out)])
    assert code == 0, err.getvalue()
    assert f"run it with: torchrun --standalone --nnodes 1 --nproc_per_node 1 -m trainer --config {out}" in (
        err.getvalue()
    )
    with SqlStorage(url) as storage:
        record = storage.get_experiment_by_name(EXPERIMENT)
        best = storage.best_trial(record.id)
        trials = storage.list_trials(record.id)
    expected = trial_config(experiment_from_dict(record.spec["experiment"]), best.params).model_dump(mode="json")
    expected["log"]["mlperf"] = MLPERF_LOG  # every export writes an MLPerf log, relative to where the trainer runs
    exported = yaml.safe_load(out.read_text())
    assert exported == expected
    # By hand: the completed trial of the lowest objective (the experiment minimizes), ties to the lowest number,
    # and each of its parameters at its trainer key (the arm's variant suffix dropped) in the file
    completed = [t for t in trials if t.state is TrialState.COMPLETED and t.objective is not None]
    assert record.direction == "minimize" and len(completed) >= 2
    assert best.number == min(completed, key=lambda t: (t.objective, t.number)).number
    for key, value in best.params.items():
        section, name = key.split("@")[0].split(".")
        assert exported[section][name] == pytest.approx(value), key
    assert f"# trial {best.number}, arm {best.arm}" in out.read_text()


def test_export_writes_the_best_trials_config(finished_experiment, tmp_path):
    export_best(finished_experiment("sqlite"), tmp_path / "best.yaml")


@pytest.mark.slow  # the exported config trains in the default suite on two ranks, below, as torchrun runs it
def test_export_then_train_with_python_m_trainer(finished_experiment, tmp_path):
    out = tmp_path / "best.yaml"
    export_best(finished_experiment("sqlite"), out)
    trained = subprocess.run([sys.executable, "-m", "trainer", "--config", str(out), "budget.max_samples=16"],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    final = final_record(trained.stdout)
    assert final["status"] in ("reached_target", "budget_exhausted") and final["world_size"] == 1
    assert (tmp_path / MLPERF_LOG).read_text().count('"key": "run_stop"') == 1


@pytest.mark.distributed
@pytest.mark.slow  # the exported single-process command trains by default (tests/hpo/export)
def test_exported_torchrun_command_runs_on_two_gloo_ranks(finished_experiment, tmp_path):
    url = finished_experiment("sqlite")
    config = tmp_path / "best.yaml"
    made = [hpo("--db", url, "export", EXPERIMENT, "--gpus-per-node", "2", "-o", str(config)),
            hpo("--db", url, "export", EXPERIMENT, "--format", "torchrun", "--gpus-per-node", "2",
                "--config-path", str(config))]  # fmt: skip
    assert all(r.returncode == 0 for r in made), [r.stderr for r in made]
    assert yaml.safe_load(config.read_text())["batch"] == {"global_batch_size": 8, "micro_batch_size": 4}
    command = made[1].stdout.strip().splitlines()[-1]
    assert command == f"torchrun --standalone --nnodes 1 --nproc_per_node 2 -m trainer --config {config}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    ran = subprocess.run(["bash", "-c", made[1].stdout], capture_output=True, text=True, timeout=300, env=env,
                         cwd=tmp_path)  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    final = final_record(ran.stdout)
    assert final["status"] in ("reached_target", "budget_exhausted") and final["world_size"] == 2
    assert ran.stderr.count("finished: ") == 1  # rank 0 alone says how the run ended
    assert (tmp_path / MLPERF_LOG).read_text().count('"key": "run_stop"') == 1  # and writes the MLPerf log


def test_export_to_a_file_name_with_a_line_break_is_refused_before_writing(finished_experiment, tmp_path, capsys):
    url = finished_experiment("sqlite")
    for bad in ("best\u2028.yaml", "best\x85.yaml", "best\x96.yaml", "best\n.yaml"):
        code = main(["--db", url, "export", EXPERIMENT, "-o", str(tmp_path / bad)])
        stderr = capsys.readouterr().err
        assert code == 2 and "config path" in stderr and repr(bad[4]) in stderr, bad
    assert list(tmp_path.iterdir()) == []
    code = main(["--db", url, "export", EXPERIMENT, "-o", str(tmp_path / "b.yaml"), "--config-path", "my 'b'.yaml"])
    stderr = capsys.readouterr().err
    assert code == 0, stderr
    run = stderr.split("run it with: ", 1)[1].splitlines()[0]
    assert shlex.split(run)[-2:] == ["--config", "my 'b'.yaml"]
