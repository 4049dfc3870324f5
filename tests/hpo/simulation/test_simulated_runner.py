"""Simulated experiments through the real control plane: `hpo run` with `runner: simulated` drives the real Study,
tuners and storage, and the database answers `hpo status`, `best`, `report` and the API like a real one.

The synthetic table (conftest) makes every outcome computable here: a trial's curve is the log-lr blend of two
formulas, its samples to target the first evaluation at or above the target, its duration its new samples x the
sample scale / the slot's throughput.
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from hpo.cli import main as hpo_main
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from tests.hpo.simulation.conftest import EVERY, MAX_SAMPLES, accuracy, write_table
from tests.server.conftest import start_server, stop_server

TARGET = 0.12
SCALE, GPU_RATE, GPUS = 256.0, 350.0, 8  # the defaults of runner.simulation (a100) and the file's gpus_per_trial


def experiment_file(directory: Path, name: str, tuner: str = "random", trials: int = 200, slots: int = 64,
                    **budget) -> Path:  # fmt: skip
    write_table(directory / "curves.jsonl")
    spec = {
        "name": name,
        "base_config": str(Path(__file__).resolve().parents[3] / "trainer/configs/demo_cpu.yaml"),
        "overrides": {"budget.max_samples": MAX_SAMPLES, "budget.max_time_s": None, "eval.every_samples": EVERY,
                      "eval.target_mlm_accuracy": TARGET, "batch.micro_batch_size": 4},
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]},
                  "optimizer.lr": {"float": [1.0e-4, 1.0e-1], "log": True},
                  "schedule.warmup_steps": {"choice": [0, 40]}},
        "compare": ["optimizer.name"],
        "tuner": {"name": tuner, "seed": 0},
        "budget": {"trials": trials, "confirm_seeds": 2, "max_parallel": slots, **budget},
        "resources": {"gpus_per_trial": GPUS},
        "runner": {"name": "simulated", "simulation": {"table": "curves.jsonl"}},
    }  # fmt: skip
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def expected_curve(optimizer: str, lr: float, warmup: int, seed: int) -> list[tuple[int, float]]:
    """The blended curve of the synthetic table, computed from its formulas (batch 32, the demo config's)."""
    lrs = [1e-4, 1e-3, 1e-2, 1e-1]
    i = max(k for k in range(len(lrs)) if lrs[k] <= lr * (1 + 1e-12))
    seed = seed % 3
    if i == len(lrs) - 1 or math.isclose(lr, lrs[i]):
        return [(s, accuracy(optimizer, lrs[i], warmup, 32, seed, s)) for s in range(EVERY, MAX_SAMPLES + 1, EVERY)]
    w = (math.log(lr) - math.log(lrs[i])) / (math.log(lrs[i + 1]) - math.log(lrs[i]))

    def recorded(lr: float, s: int) -> float:  # lr 1e-1 diverged at 3,072: its last accuracy (2,048) holds after
        return accuracy(optimizer, lr, warmup, 32, seed, min(s, 2048) if lr >= 0.1 else s)

    return [
        (s, (1 - w) * recorded(lrs[i], s) + w * recorded(lrs[i + 1], s)) for s in range(EVERY, MAX_SAMPLES + 1, EVERY)
    ]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """One simulated experiment: 200 random-search trials over two arms on 64 slots, + 2 confirmation seeds."""
    directory = tmp_path_factory.mktemp("sim")
    url = f"sqlite:///{directory / 'hpo.db'}"
    path = experiment_file(directory, "sim-exp")
    code = hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(directory / "run")])
    return directory, url, code


def test_two_hundred_trials_on_64_slots_run_through_the_study(simulated):
    _, url, code = simulated
    assert code == 0
    with SqlStorage(url) as storage:
        experiment = storage.get_experiment_by_name("sim-exp")
        trials = storage.list_trials(experiment.id)
    assert len(trials) == 204 and sum(t.kind is TrialKind.CONFIRMATION for t in trials) == 4
    assert {t.host for t in trials} == {"simulated"}
    assert all(t.state in (TrialState.COMPLETED, TrialState.DIVERGED) for t in trials)
    # never more than 64 at once, and the slots are full while there is work: the first 64 start together
    events = sorted([(t.started_at, 1) for t in trials] + [(t.finished_at, -1) for t in trials])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 64
    assert sum(t.started_at == trials[0].started_at for t in trials) == 64


def test_each_trial_records_what_its_curve_says(simulated):
    _, url, _ = simulated
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("sim-exp").id)
        checked = 0
        for trial in trials:
            p = trial.params
            seed = trial.seed if trial.seed is not None else 1234
            curve = expected_curve(p["optimizer.name"], p["optimizer.lr"], p["schedule.warmup_steps"], seed)
            if p["optimizer.lr"] >= 10**-1.5:  # diverging neighbour nearer: checked by the surrogate's tests
                continue
            hit = next((s for s, a in curve if a >= TARGET), None)
            assert trial.samples_to_target == hit
            trained = hit or MAX_SAMPLES
            assert trial.duration_s == pytest.approx(trained * SCALE / (GPU_RATE * GPUS))
            assert trial.finished_at - trial.started_at == pytest.approx(timedelta(seconds=trial.duration_s),
                                                                         abs=timedelta(milliseconds=1))  # fmt: skip
            recorded = storage.get_metrics(trial.id, "mlm_accuracy")
            assert [m.samples for m in recorded] == [s for s, _ in curve if s <= trained]
            assert [m.value for m in recorded] == pytest.approx([a for s, a in curve if s <= trained])
            stamps = [m.created_at for m in storage.get_metrics(trial.id, "mlm_accuracy")]
            assert stamps == sorted(stamps) and trial.started_at < stamps[0] <= stamps[-1] == trial.finished_at
            checked += 1
    assert checked > 100


def test_the_database_answers_status_best_report_and_the_api(simulated, capsys):
    directory, url, _ = simulated
    assert hpo_main(["--db", url, "status", "sim-exp"]) == 0
    status = capsys.readouterr().out
    assert "200/200 tuning trials done, 4/4 confirmation runs" in status and "simulated" in status
    assert hpo_main(["--db", url, "best", "sim-exp", "--per-arm"]) == 0
    out = capsys.readouterr().out
    best = yaml.safe_load(out)
    assert set(best) == {"optimizer.name=adamw", "optimizer.name=lamb"} and "# verdict: " in out
    assert all(arm["evidence"]["runs"] == 3 for arm in best.values())
    assert hpo_main(["--db", url, "report", "sim-exp", "-o", str(directory / "report")]) == 0
    page = (directory / "report" / "sim-exp.html").read_text()
    assert "Simulated experiment" in page and "GPU-hours" in page
    server = start_server(url, directory)
    try:
        with server.client() as client:
            body = client.get("/experiments/sim-exp").json()
            assert body["simulated"] is True and sum(body["trials"].values()) == 204
            assert client.get("/experiments/sim-exp/best", params={"arm": "optimizer.name=lamb"}).status_code == 200
    finally:
        stop_server(server)
