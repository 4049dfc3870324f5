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

from hpo.cli.main import main as hpo_main
from hpo.storage import SqlStorage
from hpo.trials import TrialKind, TrialState
from tests.hpo.simulation.conftest import EVERY, MAX_SAMPLES, accuracy, write_table
from tests.server.conftest import api_in_process

TARGET = 0.12
SCALE, GPU_RATE, GPUS = 256.0, 350.0, 8  # the defaults of runner.simulation (a100) and the file's gpus_per_trial


def experiment_file(directory: Path, name: str, tuner: str = "random", trials: int = 200, slots: int = 64,
                    space: dict | None = None, compare=("optimizer.name",), overrides: dict | None = None,
                    **budget) -> Path:  # fmt: skip
    write_table(directory / "curves.jsonl")
    spec = {
        "name": name,
        "base_config": str(Path(__file__).resolve().parents[3] / "trainer/configs/demo_cpu.yaml"),
        "overrides": {"budget.max_samples": MAX_SAMPLES, "budget.max_time_s": None, "eval.every_samples": EVERY,
                      "eval.target_mlm_accuracy": TARGET, "batch.micro_batch_size": 4, **(overrides or {})},
        "space": space or {"optimizer.name": {"choice": ["adamw", "lamb"]},
                           "optimizer.lr": {"float": [1.0e-4, 1.0e-1], "log": True},
                           "schedule.warmup_steps": {"choice": [0, 40]}},
        "compare": list(compare),
        "tuner": {"name": tuner, "seed": 0},
        "budget": {"trials": trials, "confirm_seeds": 2, "max_parallel": slots, **budget},
        "resources": {"gpus_per_trial": GPUS},
        "runner": {"name": "simulated", "simulation": {"table": "curves.jsonl"}},
    }  # fmt: skip
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def hpo_run_stopped_after(url: str, path: Path, run_dir: Path, stop_after: int | None) -> int:
    """`hpo run` in this process; with `stop_after`, the study stops (as SIGTERM asks it) once that many trials
    have finished. Returns its exit code."""
    from hpo.engine import local as local_engine

    original = local_engine.Study.run

    def run_then_stop(study):
        handle = study._handle

        def counting(exits):
            handle(exits)
            done = [t for t in study.storage.list_trials(study.experiment_id) if t.state.finished]
            if len(done) >= stop_after:
                study.stop_reason = study.stop_reason or "the controller was terminated (SIGTERM)"

        study._handle = counting
        return original(study)

    if stop_after:
        local_engine.Study.run = run_then_stop
    try:
        return hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(run_dir)])
    finally:
        local_engine.Study.run = original


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


def test_each_trial_records_its_micro_batch_and_target_as_a_real_trial_does(simulated):
    """The result's micro batch feeds the report's noise-scale big batch (hpo.report.data._big_batch)."""
    _, url, _ = simulated
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("sim-exp").id)
    assert {(t.metrics["micro_batch_size"], t.metrics["target_mlm_accuracy"]) for t in trials} == {(4, TARGET)}


def test_the_database_answers_status_best_report_and_the_api(simulated, capsys):
    directory, url, _ = simulated
    assert hpo_main(["--db", url, "status", "sim-exp"]) == 0
    status = capsys.readouterr().out
    assert "200/200 tuning trials done, 4/4 confirmation runs" in status and "simulated" in status
    assert hpo_main(["--db", url, "best", "sim-exp", "--per-arm"]) == 0
    out = capsys.readouterr().out
    best = yaml.safe_load(out)
    assert best.pop("verdict")["runs_per_arm"] == {"optimizer.name=adamw": 2, "optimizer.name=lamb": 2}
    assert set(best) == {"optimizer.name=adamw", "optimizer.name=lamb"} and "# verdict: " in out
    assert all(arm["evidence"]["runs"] == 2 for arm in best.values())
    assert hpo_main(["--db", url, "report", "sim-exp", "-o", str(directory / "report")]) == 0
    page = (directory / "report" / "sim-exp.html").read_text()
    assert "Simulated experiment" in page and "GPU-hours" in page
    with api_in_process(url) as client:  # the API on a uvicorn server in this process (tests/server: `hpo serve`)
        body = client.get("/experiments/sim-exp").json()
        assert body["simulated"] is True and sum(body["trials"].values()) == 204
        assert client.get("/experiments/sim-exp/best", params={"arm": "optimizer.name=lamb"}).status_code == 200
        # a trial's learning curve: a point per optimizer step it recorded, as a trainer's
        with SqlStorage(url) as storage:
            trial = storage.list_trials(storage.get_experiment_by_name("sim-exp").id)[0]
            rows = storage.get_metrics(trial.id)
        points = client.get(f"/experiments/sim-exp/trials/{trial.number}/metrics").json()["points"]
        assert [(p["step"], p["samples"]) for p in points] == sorted({(r.samples // 32, r.samples) for r in rows})
        assert len(points) > 2 and max(p["mlm_accuracy"] or 0 for p in points) == trial.best_mlm_accuracy


def test_hyperband_continues_a_configuration_and_charges_only_new_samples(tmp_path):
    path = experiment_file(tmp_path, "sim-hb", tuner="smac_hyperband", trials=24, slots=8,
                           min_budget=1 / 8, max_budget=1.0, eta=2)  # fmt: skip
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("sim-hb").id)
        by_config: dict = {}
        for t in sorted((t for t in trials if t.kind is TrialKind.TUNING), key=lambda t: t.finished_at):
            by_config.setdefault(tuple(sorted(t.params.items())), []).append(t)
        continued = 0
        for runs in by_config.values():
            trained = 0  # what this configuration's checkpoint holds
            for t in runs:
                samples = t.metrics["samples"]
                evals = [m.samples for m in storage.get_metrics(t.id, "mlm_accuracy")]
                assert all(trained < s <= samples for s in evals)  # only the new part is recorded
                assert t.duration_s == pytest.approx(max(samples - trained, 0) * SCALE / (GPU_RATE * GPUS))
                continued += trained > 0
                trained = max(trained, samples)
    assert continued >= 3  # promotions happened and continued from their checkpoints


def test_a_stopped_simulated_experiment_resumes_where_it_stopped(tmp_path):
    """Stopped halfway (the study's stop, as SIGTERM asks it), then `hpo resume`: the trials created before the stop
    are those an uninterrupted run creates, nothing finished runs again, the interrupted trials run again as a new
    attempt, the total stays the budget, and the simulated clock goes on from where it stopped."""

    def run(directory, stop_after: int | None):
        directory.mkdir()
        path = experiment_file(directory, "sim-resume", trials=40, slots=4)
        url = f"sqlite:///{directory / 'hpo.db'}"
        return url, hpo_run_stopped_after(url, path, directory / "run", stop_after)

    whole, code = run(tmp_path / "whole", None)
    assert code == 0
    parted, code = run(tmp_path / "parted", 15)
    assert code == 1
    with SqlStorage(parted) as storage:
        before = {t.number: t for t in storage.list_trials(storage.get_experiment_by_name("sim-resume").id)}
    interrupted = [n for n, t in before.items() if t.state is TrialState.INTERRUPTED]
    assert interrupted and len(before) < 44
    assert hpo_main(["--db", parted, "resume", "sim-resume", "--quiet"]) == 0
    with SqlStorage(parted) as storage:
        after = {t.number: t for t in storage.list_trials(storage.get_experiment_by_name("sim-resume").id)}
    with SqlStorage(whole) as storage:
        reference = {t.number: t for t in storage.list_trials(storage.get_experiment_by_name("sim-resume").id)}
    assert len(after) == len(reference) == 44 and all(t.state.finished for t in after.values())
    assert {n: after[n].params for n in before} == {n: reference[n].params for n in before}
    for n, t in before.items():
        if t.state.finished and t.state is not TrialState.INTERRUPTED:
            assert (after[n].attempt, after[n].finished_at, after[n].objective) == (t.attempt, t.finished_at,
                                                                                    t.objective)  # fmt: skip
    stopped_at = max(t.finished_at for t in before.values() if t.finished_at)
    for n in interrupted:
        assert after[n].attempt == 1 and after[n].state is not TrialState.INTERRUPTED
        assert after[n].started_at >= stopped_at


SECONDS_A_SAMPLE = SCALE / (GPU_RATE * GPUS)  # one table sample on a slot of the file's 8 A100s


def trial_curve(trial) -> list[tuple[int, float]]:
    p, seed = trial.params, 1234 if trial.seed is None else trial.seed  # None: the base config's seed
    return expected_curve(p["optimizer.name"], p["optimizer.lr"], p["schedule.warmup_steps"], seed)


def test_an_attempt_that_would_outlast_trial_timeout_s_ends_at_it_recorded_as_a_real_timeout(tmp_path):
    """At 400 s a run that has not reached the target by 4,096 samples (375 s) is killed: the evaluations it made
    by then are recorded, the study records it as timed out, scored by the best accuracy it reported; runs that
    reach the target sooner (or diverge, at 3,072 samples) end as before."""
    timeout = 400.0
    path = experiment_file(tmp_path, "sim-timeout", trials=40, slots=8, trial_timeout_s=timeout)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
    states = []
    with SqlStorage(url) as storage:
        for trial in storage.list_trials(storage.get_experiment_by_name("sim-timeout").id):
            if trial.params["optimizer.lr"] >= 10**-1.5:  # diverging neighbour nearer: the surrogate's tests
                continue
            curve = trial_curve(trial)
            hit = next((s for s, a in curve if a >= TARGET), None)
            recorded = storage.get_metrics(trial.id, "mlm_accuracy")
            states.append(trial.state)
            if (hit or MAX_SAMPLES) * SECONDS_A_SAMPLE <= timeout:
                assert (trial.state, trial.samples_to_target) == (TrialState.COMPLETED, hit)
                continue
            made = [(s, a) for s, a in curve if s * SECONDS_A_SAMPLE <= timeout]
            assert [m.samples for m in recorded] == [s for s, _ in made] == [1024, 2048, 3072, 4096]
            assert [m.value for m in recorded] == pytest.approx([a for _, a in made])
            assert trial.state is TrialState.TIMEOUT and trial.samples_to_target is None
            assert trial.reason == "exceeded the trial time limit (budget.trial_timeout_s)"
            assert trial.duration_s == timeout
            assert trial.finished_at - trial.started_at == pytest.approx(timedelta(seconds=timeout),
                                                                         abs=timedelta(milliseconds=1))  # fmt: skip
            gap = min(max((TARGET - max(a for _, a in made)) / TARGET, 0.0), 1.0)
            assert trial.objective == pytest.approx(2.0 * MAX_SAMPLES * (1 + gap))  # penalty_factor x cap x (1 + gap)
    assert states.count(TrialState.TIMEOUT) >= 5 and states.count(TrialState.COMPLETED) >= 5


def test_the_plans_truth_of_a_run_that_would_outlast_trial_timeout_s_is_that_timeout(tmp_path):
    """`full_run` (what `hpo plan` judges outcomes against) ends where an attempt ends: LAMB at lr 1e-4 plateaus
    below the target, so at 400 s it is a timeout scored by its evaluations until then; ADAM at 1e-4 reaches the
    target at 3,072 samples (281 s), within the limit."""
    from hpo.experiment import load_experiment
    from hpo.runners import build_runner

    runner = build_runner(load_experiment(experiment_file(tmp_path, "truth", trial_timeout_s=400.0)))
    try:
        ((missed, evals, _),) = runner.full_runs({"optimizer.name": "lamb", "optimizer.lr": 1e-4,
                                                  "schedule.warmup_steps": 0}, [0])  # fmt: skip
        made = [(s, accuracy("lamb", 1e-4, 0, 32, 0, s)) for s in (1024, 2048, 3072, 4096)]
        assert [s for s, _ in evals] == [s for s, _ in made]
        assert [a for _, a in evals] == pytest.approx([a for _, a in made])
        assert (missed.state, missed.duration_s, missed.samples_to_target) == (TrialState.TIMEOUT, 400.0, None)
        gap = (TARGET - made[-1][1]) / TARGET
        assert missed.objective == pytest.approx(2.0 * MAX_SAMPLES * (1 + gap))
        ((hit, _, _),) = runner.full_runs(
            {"optimizer.name": "adamw", "optimizer.lr": 1e-4, "schedule.warmup_steps": 0}, [0]
        )
        assert (hit.state, hit.samples_to_target) == (TrialState.COMPLETED, 3072)
        assert hit.duration_s == pytest.approx(3072 * SECONDS_A_SAMPLE)
    finally:
        runner.close()


def test_the_trainers_max_time_s_stops_a_simulated_run_at_the_first_step_past_it(tmp_path):
    """budget.max_time_s 300: the run stops after step 103 of 32 samples (3,296 samples, 301.3 s; step 102 ends at
    298.4 s), evaluates there, and ends out of budget, unless it reached the target before."""
    path = experiment_file(tmp_path, "sim-max-time", trials=24, slots=8, overrides={"budget.max_time_s": 300})
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
    stopped = math.ceil(300 / SECONDS_A_SAMPLE / 32) * 32
    assert stopped == 3296 and (stopped - 32) * SECONDS_A_SAMPLE < 300 <= stopped * SECONDS_A_SAMPLE
    ends = []
    with SqlStorage(url) as storage:
        for trial in storage.list_trials(storage.get_experiment_by_name("sim-max-time").id):
            if trial.params["optimizer.lr"] >= 10**-1.5:
                continue
            curve = trial_curve(trial)
            (_, at_3072), (_, at_4096) = curve[2], curve[3]
            made = [*curve[:3], (stopped, at_3072 + (at_4096 - at_3072) * (stopped - 3072) / 1024)]  # linear between
            hit = next((s for s, a in made if a >= TARGET), None)
            recorded = storage.get_metrics(trial.id, "mlm_accuracy")
            assert trial.state is TrialState.COMPLETED and trial.samples_to_target == hit
            assert trial.metrics["samples"] == (hit or stopped)
            assert trial.duration_s == pytest.approx((hit or stopped) * SECONDS_A_SAMPLE)
            assert [m.samples for m in recorded] == [s for s, _ in made if s <= (hit or stopped)]
            assert [m.value for m in recorded] == pytest.approx([a for s, a in made if s <= (hit or stopped)])
            ends.append(trial.metrics["status"] if hit != stopped else "reached_target_at_the_stop")
            if hit is None:
                assert trial.metrics["status"] == "budget_exhausted"
    assert ends.count("budget_exhausted") >= 3 and ends.count("reached_target") >= 3


def test_smac_does_not_rewrite_its_run_history_after_every_tell_on_the_simulated_runner(tmp_path):
    # SMAC writes its whole run history as JSON after every tell; on the simulated runner that was a tenth of a
    # repetition's time (hpo plan), and nothing reads it there: the study replays the database's history. What
    # is left is the empty history SMAC writes when it starts.
    import json

    path = experiment_file(tmp_path, "nohistory", "smac_bo", 8, 4)
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert hpo_main(["--db", url, "run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")]) == 0
    assert SqlStorage(url).count_trials(SqlStorage(url).get_experiment_by_name("nohistory").id) >= 8
    saved = list((tmp_path / "run").rglob("runhistory.json"))
    assert len(saved) == 2 and all(json.loads(p.read_text())["data"] == [] for p in saved)  # one per arm


@pytest.mark.parametrize("every", [EVERY // 2, EVERY + 512])
def test_an_evaluation_interval_off_the_tables_is_refused_before_anything_is_written(tmp_path, every):
    """The table recorded accuracies every EVERY samples: a trial evaluating between them would read accuracies
    interpolated between evaluations, not measured ones."""
    path = experiment_file(tmp_path, "off-grid", trials=2, slots=2, overrides={"eval.every_samples": every})
    db = tmp_path / "hpo.db"
    assert hpo_main(["--db", f"sqlite:///{db}", "run", str(path), "--quiet"]) == 2
    assert not db.exists()
    on_grid = experiment_file(tmp_path, "on-grid", trials=2, slots=2, overrides={"eval.every_samples": 2 * EVERY})
    code = hpo_main(["--db", f"sqlite:///{db}", "run", str(on_grid), "--quiet", "--run-dir", str(tmp_path / "run")])
    assert code == 1  # run, not refused (2): its 2 trials diverge on the table's curves, so no result (1)
    with SqlStorage(f"sqlite:///{db}") as storage:
        (experiment,) = storage.list_experiments()
        assert [t.state.value for t in storage.list_trials(experiment.id)] == ["diverged", "diverged"]


def test_an_experiment_recorded_with_choices_read_as_strings_resumes(tmp_path):
    """Spaces once read `1e-3` in a choice list as the string YAML 1.1 leaves (now the number): an experiment
    recorded then, its trials' parameters strings too, resumes with SMAC3, its stored trials told as they ran, and
    its report draws them."""
    from hpo.experiment import load_experiment, stored_form
    from hpo.trials import TrialResult, TrialSpec

    space = {"optimizer.name": {"choice": ["adamw", "lamb"]}, "optimizer.lr": {"choice": ["1e-3", "1e-2"]}}
    path = experiment_file(
        tmp_path, "old", tuner="smac_bo", trials=4, slots=1, space=space, overrides={"schedule.warmup_steps": 0}
    )
    spec = load_experiment(path)
    stored = stored_form(spec, tmp_path / "run")
    stored["experiment"]["space"]["optimizer.lr"]["choice"] = ["1e-3", "1e-2"]  # as it was recorded then
    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    with SqlStorage(url, upgrade=True) as storage:
        eid = storage.create_experiment("old", stored, spec.direction)
        params = {"optimizer.name": "adamw", "optimizer.lr": "1e-3"}
        trial = storage.create_trial(eid, TrialSpec(None, params, "optimizer.name=adamw"))
        storage.mark_trial_running(trial)
        storage.finish_trial(trial, TrialResult(TrialState.COMPLETED, objective=4096.0, samples_to_target=4096))
    assert hpo_main(["--db", url, "resume", "old", "--quiet"]) == 0
    with SqlStorage(url) as storage:
        trials = storage.list_trials(eid)
    assert [t.state for t in trials if t.kind is TrialKind.TUNING] == [TrialState.COMPLETED] * 4
    assert trials[0].params == params  # the record stays as it ran
    assert hpo_main(["--db", url, "report", "old", "-o", str(tmp_path / "report")]) == 0  # its figures place them


def test_a_bad_curve_table_is_named_with_the_experiment_file_and_its_field(tmp_path, capsys):
    """The error named only the table (`/etc/passwd line 1: not JSON`): which file and field chose it is what to fix."""
    path = experiment_file(tmp_path, "bad-table", trials=2, slots=2)
    (tmp_path / "curves.jsonl").write_text("root:x:0:0:root:/root:/bin/bash\n")
    says = f"{path}: runner.simulation.table: {tmp_path / 'curves.jsonl'} line 1: not JSON (Expecting value)"
    db = tmp_path / "hpo.db"
    for command in (["run", str(path), "--quiet", "--run-dir", str(tmp_path / "run")], ["plan", str(path)]):
        assert hpo_main(["--db", f"sqlite:///{db}", *command]) == 2
        assert says in capsys.readouterr().err
        assert not db.exists()
