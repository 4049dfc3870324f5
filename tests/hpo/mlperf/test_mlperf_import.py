"""`hpo import mlperf` and `hpo import rcp` (hpo/mlperf/): MLPerf result files and mlperf-logging's RCP file read into
imported experiments that status, trials, best --per-arm (with the verdict), the report, the batch-size view and the
API read like any other.

The result files are our own trainer's logs (three seconds-long CPU runs with `log.mlperf`, checked against their
JSON-lines reports), hand-written files in tmp_path (ranks, repeated keys, misses, an optimizer named only on the
command line, a broken line), and excerpts of MLCommons' published BERT results (`tests/hpo/mlperf/results/`, its
README says which and from where: Samsung's ADAM and NVIDIA's LAMB at global batch 16,384, the epoch_num 1
convention of training 0.7 to 2.0, a planned train_samples, a refused log), checked against what the test reads from
their lines itself; the RCP file is the one mlperf-logging ships. Nothing is downloaded.
"""

from __future__ import annotations

import html
import importlib.util
import json
import math
import re
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from hpo.cli import main
from hpo.evidence.batch_scaling import fit_batch_scaling
from hpo.evidence.verdict import ArmRuns, decide
from hpo.experiment import spec_from_stored
from hpo.experiment.arms import trial_config
from hpo.mlperf import HASH_KEY, IMPORT_VERDICT_NOTE, UNSELECTED_KEY, imported
from hpo.mlperf.logs import ResultFileError, read_result_file
from hpo.mlperf.rcp import read_rcp_file
from hpo.report.batch_view import fmt_estimate
from hpo.report.html import comparison_report, experiment_report
from hpo.report.scaling import confirmation_runs
from hpo.storage import SqlStorage
from hpo.storage import retry as retry_module
from hpo.storage.base import ExperimentStatus
from hpo.trials import TrialKind, TrialState
from tests.hpo.engine.test_study import make_spec, run_study
from tests.trainer.conftest import make_train_overrides
from tests.trainer.test_mlperf_log import majority_token_shards, train_logged
from trainer.config import load_config
from trainer.report import JsonLinesReporter, read_jsonl
from trainer.train import train

RCP_DIR = Path(importlib.util.find_spec("mlperf_logging.rcp_checker").submodule_search_locations[0])
RCP_BERT = RCP_DIR / "training_5.0.0" / "rcps_bert.json"
T0 = 1_700_000_000_000  # time_ms of the hand-written runs' first line


def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'hpo.db'}"


def trials_by_file(storage: SqlStorage, name: str) -> dict[str, object]:
    record = storage.get_experiment_by_name(name)
    return {Path(t.metrics["mlperf"]["file"]).name: t for t in storage.list_trials(record.id)}


# --------------------------------------------------------------------------- our trainer's logs


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory) -> tuple[Path, list[tuple[Path, Path, object]]]:
    """Three real CPU runs of the tiny model (AdamW seeds 1 and 2, LAMB seed 1), each writing its MLPerf log into
    results/1xCPU/bert/result_N.txt and its JSON-lines report: (results dir, [(log, report, config)])."""
    root = tmp_path_factory.mktemp("trainer-runs")
    runs = []
    for i, (optimizer, seed) in enumerate([("adamw", 1), ("adamw", 2), ("lamb", 1)]):
        directory = root / f"run{i}"
        log = root / "results" / "1xCPU" / "bert" / f"result_{i}.txt"
        overrides = {**majority_token_shards(directory), "optimizer.name": optimizer, "optimizer.lr": 1e-2,
                     "seed": seed, "eval.target_mlm_accuracy": 0.5, "budget.max_samples": 32,
                     "eval.every_samples": 16, "log.mlperf": str(log)}  # fmt: skip
        cfg = load_config(None, make_train_overrides(directory, **overrides))
        reporter = JsonLinesReporter(cfg.log.jsonl)
        try:
            train(cfg, reporter)
        finally:
            reporter.close()
        runs.append((log, Path(cfg.log.jsonl), cfg))
    return root / "results", runs


def test_our_trainers_logs_import_as_their_reports_say(trainer_runs, tmp_path, capsys):
    results, runs = trainer_runs
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(results), "--name", "tiny", "--target", "0.5"]) == 0
    assert "3 run(s) imported" in capsys.readouterr().out
    storage = SqlStorage(db)
    record = storage.get_experiment_by_name("tiny")
    spec = spec_from_stored(record)  # the stored spec loads like any experiment's
    assert spec.compare == ["optimizer.name", "batch.global_batch_size"]
    assert imported(record)["kind"] == "mlperf" and imported(record)["runs"] == 3
    by_file = trials_by_file(storage, "tiny")
    for log, report, cfg in runs:
        final = next(r for r in read_jsonl(report) if r["kind"] == "final")
        evals = [(r["samples"], r["mlm_accuracy"]) for r in read_jsonl(report) if r.get("event") == "eval"]
        trial = by_file[log.name]
        assert trial.state is TrialState.COMPLETED and final["status"] in ("reached_target", "budget_exhausted")
        assert trial.samples_to_target == final["samples_to_target"]
        assert trial.best_mlm_accuracy == final["best_mlm_accuracy"]
        assert trial.global_batch_size == cfg.batch.global_batch_size and trial.seed == cfg.seed
        assert trial.params["optimizer.name"] == cfg.optimizer.name
        for key in ("lr", "eps", "beta1", "beta2", "weight_decay"):
            assert trial.params[f"optimizer.{key}"] == getattr(cfg.optimizer, key)
        assert trial.params["schedule.total_steps"] == 4 and trial.params["budget.max_samples"] == 32
        curve = [(m.samples, m.value) for m in storage.get_metrics(trial.id, "mlm_accuracy")]
        assert curve == evals and curve  # mlm_accuracy at samples = epoch_num, as the trial's own reports
        assert trial.worker.startswith("1xCPU-")  # the system it ran on (submission_platform)
    # per configuration the first file is the tuning trial, the other seed its confirmation run; each arm holds one
    # configuration, so nothing was picked on a run's outcome: its tuning trial is evidence too (`unselected`)
    assert [by_file[f"result_{i}.txt"].kind for i in range(3)] == [TrialKind.TUNING, TrialKind.CONFIRMATION,
                                                                    TrialKind.TUNING]  # fmt: skip
    assert by_file["result_1.txt"].params == by_file["result_0.txt"].params
    assert [by_file[f"result_{i}.txt"].metrics.get(UNSELECTED_KEY) for i in range(3)] == [True, None, True]

    # the same files again add nothing
    assert main(["--db", db, "import", "mlperf", str(results), "--name", "tiny", "--target", "0.5"]) == 0
    assert "0 run(s) imported, 3 already there" in capsys.readouterr().out
    assert storage.count_trials(record.id) == 3

    # status, trials, best --per-arm, report work on it and say it was imported
    assert main(["--db", db, "status"]) == 0
    assert "imported (mlperf): 3 run(s) in 2 configuration(s)" in capsys.readouterr().out
    assert main(["--db", db, "status", "tiny"]) == 0
    status = capsys.readouterr().out
    assert "tiny: finished" in status and "imported: 3 run(s) from 3 file(s)" in status and "verdict now" in status
    # not yet (one run for LAMB): more runs come from more result files, not from tuning or confirmation runs
    assert status.splitlines()[status.splitlines().index(next(x for x in status.splitlines() if x.startswith(
        "verdict now"))) + 1] == IMPORT_VERDICT_NOTE  # fmt: skip
    assert main(["--db", db, "trials", "tiny"]) == 0
    assert "confirmation (seed 2)" in capsys.readouterr().out
    assert main(["--db", db, "best", "tiny", "--per-arm"]) == 0
    best = yaml.safe_load(capsys.readouterr().out)
    assert best["verdict"]["outcome"] == "not yet"  # two runs for AdamW, one for LAMB
    assert best["optimizer.name=adamw,batch.global_batch_size=8"]["evidence"]["runs"] == 2
    assert best["optimizer.name=lamb,batch.global_batch_size=8"]["evidence"]["runs"] == 1
    assert main(["--db", db, "resume", "tiny"]) == 2
    assert "was imported" in capsys.readouterr().err
    page = experiment_report(storage, "tiny")
    assert "data-field=imported" in page and "Imported experiment" in page
    assert f"<p class=note data-field=import_note>{html.escape(IMPORT_VERDICT_NOTE)}</p>" in page


def test_runs_of_two_clipping_strategies_import_as_two_configurations_and_compare_by_clipping(tmp_path, capsys):
    """The trainer's log names its clipping (it did not: a bucketwise run was stored as a confirmation run of the
    none run's configuration); `--compare clipping` makes them arms, and a log that does not name it is refused."""
    logs = {}
    for strategy in ("none", "bucketwise"):
        directory = tmp_path / strategy
        _, logs[strategy] = train_logged(directory, **majority_token_shards(directory), **{
            "optimizer.name": "adamw", "optimizer.lr": 1e-2, "clipping.strategy": strategy,
            "clipping.max_norm": 0.5, "eval.target_mlm_accuracy": 0.72})  # fmt: skip
    db = db_url(tmp_path)
    files = [str(logs["none"]), str(logs["bucketwise"])]
    assert main(["--db", db, "import", "mlperf", *files, "--name", "clip", "--compare", "optimizer,clipping"]) == 0
    assert "(2 configuration(s) in 2 arm(s))" in capsys.readouterr().out
    storage = SqlStorage(db)
    trials = {t.params["clipping.strategy"]: t for t in storage.list_trials(storage.get_experiment_by_name("clip").id)}
    assert set(trials) == {"none", "bucketwise"} and {t.kind for t in trials.values()} == {TrialKind.TUNING}
    assert trials["bucketwise"].params["clipping.max_norm"] == 0.5 and "clipping.max_norm" not in trials["none"].params
    assert trials["bucketwise"].arm == "optimizer.name=adamw,clipping.strategy=bucketwise"
    published = str(NVIDIA_16K)  # MLPerf submissions name no clipping strategy
    assert main(["--db", db, "import", "mlperf", published, "--name", "n", "--optimizer", "lamb", "--compare",
                 "clipping"]) == 2  # fmt: skip
    assert "no opt_gradient_clipping event, which --compare clipping needs" in capsys.readouterr().err


# slow: test_our_trainers_logs_import_as_their_reports_say imports our trainer's logs (samples to target,
# hyperparameters, curves) by default; tests/hpo/trial/test_trial_config.py makes each trial's log.mlperf its own
@pytest.mark.slow
def test_the_logs_of_three_hpo_trials_import_as_the_database_recorded_them(tmp_path, capsys):
    # A real experiment (random search, local runner, 3 trials of the tiny model) with `log.mlperf` relative: each
    # trial writes its own MLPerf log in its directory. Imported into another database, every run comes back with
    # the samples to target, hyperparameters and accuracy curve the experiment recorded for that trial.
    # On the majority-token data AdamW passes accuracy 0.5 within the 32 samples, sooner at a larger rate.
    space = {"optimizer.lr": {"float": [1e-4, 3e-2], "log": True}, "optimizer.beta2": {"float": [0.95, 0.999]}}
    overrides = {
        **majority_token_shards(tmp_path / "majority"),
        "optimizer.name": "adamw",
        "budget.max_samples": 32,
        "eval.every_samples": 16,
        "eval.target_mlm_accuracy": 0.5,
        "log.mlperf": "mlperf/result_0.txt",
    }
    spec = make_spec(tmp_path, tuner="random", trials=3, space=space, **overrides)  # fmt: skip
    storage, experiment_id, status = run_study(tmp_path, spec)
    trials = storage.list_trials(experiment_id)
    assert status is ExperimentStatus.FINISHED and [t.state for t in trials] == [TrialState.COMPLETED] * 3
    logs = {t.number: tmp_path / "run" / "trials" / f"{t.number:05d}" / "mlperf" / "result_0.txt" for t in trials}
    assert all(log.is_file() for log in logs.values())
    assert len({t.params["optimizer.lr"] for t in trials}) == 3
    assert sorted(t.samples_to_target for t in trials) == [16, 32, 32]  # at the first and at the second evaluation

    db = f"sqlite:///{tmp_path / 'imported.db'}"
    target = str(spec.resolved_base()["eval"]["target_mlm_accuracy"])
    assert main(["--db", db, "import", "mlperf", *map(str, logs.values()), "--name", "again", "--target", target]) == 0
    assert "3 run(s) imported" in capsys.readouterr().out
    again = SqlStorage(db)
    by_path = {Path(t.metrics["mlperf"]["file"]).resolve(): t for t in again.list_trials(
        again.get_experiment_by_name("again").id)}  # fmt: skip
    assert len(by_path) == 3
    for original in trials:
        twin = by_path[logs[original.number].resolve()]
        cfg = trial_config(spec, original.params)
        assert twin.samples_to_target == original.samples_to_target
        assert twin.best_mlm_accuracy == pytest.approx(original.best_mlm_accuracy, rel=1e-12)
        assert twin.global_batch_size == cfg.batch.global_batch_size
        assert twin.params["optimizer.name"] == "adamw"
        assert twin.params["optimizer.lr"] == pytest.approx(original.params["optimizer.lr"], rel=1e-12)
        assert twin.params["optimizer.beta2"] == pytest.approx(original.params["optimizer.beta2"], rel=1e-12)
        recorded = [(m.samples, m.value) for m in storage.get_metrics(original.id, "mlm_accuracy")]
        assert recorded and [(m.samples, m.value) for m in again.get_metrics(twin.id, "mlm_accuracy")] == recorded


# --------------------------------------------------------------------------- hand-written result files


def mllog(key: str, value=None, *, t: int = 0, event: str = "POINT_IN_TIME", prefix: str = "", **metadata) -> str:
    body = {"namespace": "", "time_ms": T0 + t, "event_type": event, "key": key, "value": value,
            "metadata": {"file": "run_pretraining.py", "lineno": 1, **metadata}}  # fmt: skip
    return prefix + ":::MLLOG " + json.dumps(body)


def run_lines(*, optimizer: str | None = "lamb", batch: int = 256, lr: float = 0.002, seed: int = 1,
              evals=((1000, 0.70), (2000, 0.73)), status: str | None = "success", train_samples: int | None = None,
              org: str = "ACME", platform: str = "8xA100", steps: int = 40, **metadata) -> list[str]:  # fmt: skip
    """The MLLOG lines of one BERT run (as MLPerf's reference writes them); `metadata` goes on every line."""
    lines = [mllog("cache_clear", True, **metadata), mllog("init_start", event="INTERVAL_START", **metadata)]
    settings = {"submission_benchmark": "bert", "submission_org": org, "submission_platform": platform,
                "submission_division": "closed", "seed": seed, "global_batch_size": batch,
                "opt_base_learning_rate": lr, "opt_lamb_epsilon": 1e-6, "opt_lamb_beta_1": 0.9,
                "opt_lamb_beta_2": 0.999, "opt_lamb_weight_decay_rate": 0.01, "opt_learning_rate_warmup_steps": 0,
                "num_warmup_steps": 0, "start_warmup_step": 0, "opt_learning_rate_training_steps": steps}  # fmt: skip
    if optimizer is not None:
        settings["opt_name"] = optimizer
    lines += [mllog(key, value, t=1, **metadata) for key, value in settings.items()]
    lines += [mllog("init_stop", event="INTERVAL_END", t=2, **metadata),
              mllog("run_start", event="INTERVAL_START", t=10, **metadata)]  # fmt: skip
    for i, (samples, accuracy) in enumerate(evals):
        lines.append(mllog("eval_accuracy", accuracy, t=1000 * (i + 1), epoch_num=samples, **metadata))
    if status is not None:
        end = 1000 * len(evals) + 1
        lines += [mllog("run_stop", event="INTERVAL_END", t=end, status=status, **metadata),
                  mllog("train_samples", train_samples or evals[-1][0], t=end, **metadata)]  # fmt: skip
    return lines


def interpolated(curve, target: float = 0.72) -> float:
    """Samples to target between the last evaluation below it and the first at or above it (the verdict's reading,
    written out here)."""
    for (s0, a0), (s1, a1) in zip(curve, curve[1:], strict=False):
        if a0 < target <= a1:
            return s0 + (target - a0) / (a1 - a0) * (s1 - s0)
    raise AssertionError(f"the curve {curve} does not cross {target}")


def write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_several_ranks_repeated_keys_and_other_lines_are_read_as_published(tmp_path, capsys):
    # every event from ranks 2, 0 and 1; the ranks' curves differ, rank 0's is the run's
    ranks = [
        line
        for rank in (2, 0, 1)
        for line in run_lines(rank=rank, evals=((1000, 0.70 + rank / 100), (2000, 0.73 + rank / 100)))
    ]
    noise = ["Beginning trial 1 of 1", "vm.drop_caches = 3", "+ torchrun --nproc_per_node=8 run_pretraining.py "
             "--train_batch_size=32 --learning_rate=0.002 --max_samples_termination=4500000"]  # fmt: skip
    repeated = [mllog("opt_base_learning_rate", 0.002, t=3, rank=0), mllog("global_batch_size", 256, t=3)]
    prefixed = [f"0: {line}" for line in ranks]  # `srun -l` puts the task id before every line
    path = write(tmp_path / "r" / "result_0.txt", noise + prefixed + repeated)
    run = read_result_file(path)
    assert [(e.samples, e.accuracy) for e in run.evaluations] == [(1000, 0.70), (2000, 0.73)]  # rank 0's curve
    assert run.reached and run.samples_to_target == 2000 and run.optimizer == "lamb" and run.seed == 1
    assert run.hyperparameters["optimizer.lr"] == 0.002 and run.global_batch_size == 256
    assert run.budget == 40 * 256  # the training steps are less than --max_samples_termination
    assert run.system == "8xA100" and run.submitter == "ACME"
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(tmp_path / "r"), "--name", "ranks"]) == 0
    storage = SqlStorage(db)
    (trial,) = storage.list_trials(storage.get_experiment_by_name("ranks").id)
    assert [m.value for m in storage.get_metrics(trial.id, "mlm_accuracy")] == [0.70, 0.73]
    assert [m.value for m in storage.get_metrics(trial.id, "time_s")] == [0.99, 1.99]  # from run_start
    assert trial.duration_s == pytest.approx(1.991) and trial.time_to_target_s == pytest.approx(1.991)


def test_a_setting_logged_twice_with_different_values_is_a_named_error(tmp_path):
    path = write(tmp_path / "result_0.txt", [*run_lines(), mllog("global_batch_size", 512, t=5)])
    with pytest.raises(ResultFileError, match=r"result_0\.txt:\d+: global_batch_size is logged again with another"):
        read_result_file(path)


def test_aborted_and_unfinished_runs_are_misses(tmp_path, capsys):
    d = tmp_path / "runs"
    write(d / "result_0.txt", run_lines(seed=1))
    aborted = run_lines(seed=2, status="aborted", evals=((1000, 0.6), (2000, 0.65)), train_samples=10240)
    write(d / "result_1.txt", aborted)
    write(d / "result_2.txt", run_lines(seed=3, status=None, evals=((1000, 0.6),)))
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "misses"]) == 0
    storage = SqlStorage(db)
    trials = trials_by_file(storage, "misses")
    aborted, unfinished = trials["result_1.txt"], trials["result_2.txt"]
    assert aborted.state is TrialState.COMPLETED and aborted.samples_to_target is None
    assert "aborted" in aborted.reason and aborted.objective > 40 * 256  # a miss ranks after every hit
    assert unfinished.state is TrialState.FAILED and unfinished.samples_to_target is None
    assert "without run_stop" in unfinished.reason
    assert trials["result_0.txt"].kind is TrialKind.TUNING  # the first run that ended is the tuning trial
    assert {aborted.kind, unfinished.kind} == {TrialKind.CONFIRMATION}
    # all three are evidence: the hit read between its evaluations (0.70 at 1,000, 0.73 at 2,000), two misses
    hit = 1000 + 1000 * (0.72 - 0.70) / (0.73 - 0.70)
    (runs,) = confirmation_runs(storage, "misses").values()
    assert runs[0] == pytest.approx(hit, rel=1e-12) and runs[1:] == (None, None)


def test_an_unfinished_first_run_is_not_its_configurations_tuning_trial(tmp_path, capsys):
    d = tmp_path / "runs"
    write(d / "result_0.txt", run_lines(seed=1, status=None))
    write(d / "result_1.txt", run_lines(seed=2))
    assert main(["--db", db_url(tmp_path), "import", "mlperf", str(d), "--name", "late"]) == 0
    trials = trials_by_file(SqlStorage(db_url(tmp_path)), "late")
    assert (trials["result_0.txt"].kind, trials["result_1.txt"].kind) == (TrialKind.CONFIRMATION, TrialKind.TUNING)


def test_an_adam_run_named_only_on_its_command_line(tmp_path, capsys):
    d = tmp_path / "runs"
    command = "+ python run_pretraining.py --train_batch_size=32 --optimizer=adam --opt_lamb_beta_1=0.9"
    write(d / "result_0.txt", [command, *run_lines(optimizer=None, seed=1)])
    run = read_result_file(d / "result_0.txt")
    assert run.optimizer == "adamw" and run.optimizer_source == "the command line (line 1)"
    write(d / "result_1.txt", run_lines(optimizer=None, seed=2))  # named nowhere
    with pytest.raises(ResultFileError, match=r"result_1\.txt: the optimizer is not named.*--optimizer"):
        read_result_file(d / "result_1.txt")
    assert read_result_file(d / "result_1.txt", default_optimizer="lamb").optimizer == "lamb"
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "adam", "--optimizer", "lamb"]) == 0
    trials = trials_by_file(SqlStorage(db), "adam")
    assert trials["result_0.txt"].params["optimizer.name"] == "adamw"
    assert trials["result_0.txt"].arm == "optimizer.name=adamw,batch.global_batch_size=256"
    assert trials["result_0.txt"].metrics["mlperf"]["logged"].get("opt_name") is None


def test_a_broken_line_is_a_named_error_and_nothing_is_written(tmp_path, capsys):
    d = tmp_path / "runs"
    write(d / "result_0.txt", run_lines(seed=1))
    lines = run_lines(seed=2)
    lines[7] = lines[7][:-5]  # a line cut short
    write(d / "result_1.txt", lines)
    db_file = tmp_path / "hpo.db"
    assert main(["--db", f"sqlite:///{db_file}", "import", "mlperf", str(d), "--name", "broken"]) == 2
    err = capsys.readouterr().err
    assert "result_1.txt:8: a broken :::MLLOG line" in err
    assert not db_file.exists()  # every file is read before the database is opened
    write(d / "result_1.txt", [line for line in run_lines(seed=2) if '"global_batch_size"' not in line])
    assert main(["--db", f"sqlite:///{db_file}", "import", "mlperf", str(d), "--name", "broken"]) == 2
    assert "result_1.txt: no global_batch_size event" in capsys.readouterr().err
    assert not db_file.exists()


def test_a_second_import_adds_nothing_and_other_files_are_refused(tmp_path, capsys):
    d = tmp_path / "runs"
    for seed in (1, 2, 3):
        write(d / f"result_{seed}.txt", run_lines(seed=seed))
    db = db_url(tmp_path)
    args = ["--db", db, "import", "mlperf", str(d), "--name", "twice"]
    assert main(args) == 0 and main(args) == 0
    assert "0 run(s) imported, 3 already there" in capsys.readouterr().out
    storage = SqlStorage(db)
    record = storage.get_experiment_by_name("twice")
    assert storage.count_trials(record.id) == 3
    assert len({t.metrics[HASH_KEY] for t in storage.list_trials(record.id)}) == 3
    write(d / "result_4.txt", run_lines(seed=4))
    assert main(args) == 2
    assert "holds an import of other files" in capsys.readouterr().err
    assert storage.count_trials(record.id) == 3


def test_a_second_import_that_adds_nothing_writes_nothing(tmp_path, capsys):
    """The same files again leave the database as it was, the experiment's end time (the API's ended_at) included."""
    import sqlite3

    d = tmp_path / "runs"
    for seed in (1, 2):
        write(d / f"result_{seed}.txt", run_lines(seed=seed))
    db_file = tmp_path / "hpo.db"
    args = ["--db", f"sqlite:///{db_file}", "import", "mlperf", str(d), "--name", "again"]
    assert main(args) == 0

    def dump() -> list[str]:
        with sqlite3.connect(db_file) as connection:
            return list(connection.iterdump())

    before = dump()
    assert main(args) == 0
    assert "0 run(s) imported, 2 already there" in capsys.readouterr().out
    assert dump() == before
    # part of its files: it said "0 run(s) imported, 1 already there" with that one file's arms and target alone,
    # as if the experiment were that
    assert main([*args[:4], str(d / "result_1.txt"), *args[5:]]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0] == ("experiment again: these files are 1 of its 2 runs, all already there: it is unchanged (`hpo "
                       "status again` shows the whole experiment); these files:")  # fmt: skip
    assert said[1].startswith("experiment again: 0 run(s) imported, 1 already there (1 configuration(s) in 1 arm(s))")
    assert dump() == before


def test_an_imported_experiments_export_says_its_runs_ran_elsewhere(tmp_path, capsys):
    """Its export wrote the trainer's default data paths beside a submission's batch as if the run had been ours."""
    d = tmp_path / "runs"
    for seed in (1, 2):
        write(d / f"result_{seed}.txt", run_lines(seed=seed))
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "theirs"]) == 0
    capsys.readouterr()
    assert main(["--db", db, "export", "theirs"]) == 0
    said = ("# imported (hpo import mlperf): the hyperparameters of a run of MLPerf's, trained on its submitter's "
            "cluster; set data.train and data.eval to your shards, and export with --nodes and --gpus-per-node for "
            "your ranks")  # fmt: skip
    assert said in capsys.readouterr().out.splitlines()
    assert main(["--db", db, "export", "theirs", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["provenance"]["imported"] == "mlperf"


def test_the_verdict_reads_every_run_of_each_arm(tmp_path, capsys):
    """Three ADAM and three LAMB runs: per arm the first file is stored as the tuning trial, but nothing picked it
    (its arm holds one configuration), so the verdict's evidence is all three runs, interpolated between
    evaluations as for any experiment."""
    d = tmp_path / "runs"
    curves = {"adam": [((1000, 0.60), (2000, 0.70), (3000, 0.721)), ((1000, 0.61), (2000, 0.69), (3000, 0.73)),
                       ((1000, 0.60), (2000, 0.71), (3000, 0.725))],
              "lamb": [((1000, 0.70), (2000, 0.74)), ((1000, 0.69), (2000, 0.73)),
                       ((1000, 0.71), (2000, 0.722))]}  # fmt: skip
    for optimizer, runs in curves.items():
        for seed, evals in enumerate(runs, 1):
            write(d / optimizer / f"result_{seed}.txt", run_lines(optimizer=optimizer, seed=seed, evals=evals))
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "verdict"]) == 0
    capsys.readouterr()
    assert main(["--db", db, "best", "verdict", "--per-arm"]) == 0
    best = yaml.safe_load(capsys.readouterr().out)
    evidence = [ArmRuns(f"optimizer.name={name},batch.global_batch_size=256",
                        tuple(interpolated(evals) for evals in runs), 40 * 256)
                for name, runs in (("adamw", curves["adam"]), ("lamb", curves["lamb"]))]  # fmt: skip
    expected = decide(evidence)
    assert best["verdict"]["line"] == expected.line
    assert best["verdict"]["runs_per_arm"] == {"optimizer.name=adamw,batch.global_batch_size=256": 3,
                                               "optimizer.name=lamb,batch.global_batch_size=256": 3}  # fmt: skip
    for name in ("adamw", "lamb"):
        arm = best[f"optimizer.name={name},batch.global_batch_size=256"]
        assert arm["trial"] in (0, 3)  # the first file of each arm
    storage = SqlStorage(db)
    comparison = comparison_report(storage, ["verdict"])
    assert "adamw (verdict, imported)" in comparison  # a line of its own in the batch-size view


def test_compare_by_system_and_arms_without_runs(tmp_path, capsys):
    d = tmp_path / "runs"
    write(d / "a" / "result_0.txt", run_lines(platform="8xA100", batch=256))
    write(d / "b" / "result_0.txt", run_lines(platform="8xH100", batch=512))
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "systems", "--compare", "system"]) == 0
    storage = SqlStorage(db)
    spec = spec_from_stored(storage.get_experiment_by_name("systems"))
    assert spec.compare == ["log.mlperf_submission.platform"]
    assert {t.arm for t in storage.list_trials(storage.get_experiment_by_name("systems").id)} == {
        "log.mlperf_submission.platform=8xA100", "log.mlperf_submission.platform=8xH100"}  # fmt: skip
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "cells"]) == 0  # optimizer x batch: 2 of 2 arms
    assert "note:" not in capsys.readouterr().out
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "bad", "--compare", "colour"]) == 2
    assert "--compare 'colour'" in capsys.readouterr().err


def test_the_api_marks_an_imported_experiment(tmp_path):
    from fastapi.testclient import TestClient

    from server.app import create_app
    from server.settings import Settings

    write(tmp_path / "runs" / "result_0.txt", run_lines())
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(tmp_path / "runs"), "--name", "api"]) == 0
    with TestClient(create_app(Settings(database_url=db))) as client:
        body = client.get("/api/v1/experiments/api").json()
        listed = client.get("/api/v1/experiments").json()["items"]
        schema = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert body["imported"] == {"kind": "mlperf", "files": [str((tmp_path / "runs" / "result_0.txt").resolve())],
                                "runs": 1}  # fmt: skip
    assert body["status"] == "finished" and listed[0]["imported"]["kind"] == "mlperf"
    assert "imported" in schema["ExperimentSummaryPublic"]["properties"]


# --------------------------------------------------------------------------- mlperf-logging's RCP file


def test_the_bert_rcp_file_imports_as_reference_arms_by_batch_size(tmp_path, capsys):
    records = read_rcp_file(RCP_BERT)
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "rcp", str(RCP_BERT)]) == 0
    out = capsys.readouterr().out
    assert "fit of lamb (rcp-bert-5-0-0, MLPerf reference)" in out and "B_crit" in out
    storage = SqlStorage(db)
    record = storage.get_experiment_by_name("rcp-bert-5-0-0")
    assert imported(record)["kind"] == "rcp"
    spec = spec_from_stored(record)
    assert spec.compare == ["batch.global_batch_size"]
    trials = storage.list_trials(record.id)
    assert len(trials) == sum(len(r.samples) for r in records)
    for rcp in records:  # one arm per batch size, one run per seed, in the file's order
        mine = sorted((t for t in trials if t.arm == f"batch.global_batch_size={rcp.global_batch_size}"),
                      key=lambda t: t.seed)  # fmt: skip
        assert [t.samples_to_target for t in mine] == list(rcp.samples)
        assert [t.kind for t in mine] == [TrialKind.TUNING] + [TrialKind.CONFIRMATION] * (len(rcp.samples) - 1)
        assert mine[0].params["optimizer.lr"] == rcp.logged["opt_base_learning_rate"]
    # the batch-size view's fit (printed by the import) is hpo.evidence.batch_scaling's on the runs the verdict
    # counts: every
    # seed of every batch size (one record per batch size: nothing was picked)
    direct = fit_batch_scaling([(r.global_batch_size, s) for r in records for s in r.samples])
    assert direct.fitted and direct.runs == sum(len(r.samples) for r in records) == 263
    assert direct.b_crit.low < direct.b_crit.value < direct.b_crit.high < math.inf
    assert direct.e_min.low < direct.e_min.value < direct.e_min.high
    assert f"{direct.runs} runs at {len(records)} batch sizes" in out
    assert f"E_min {fmt_estimate(direct.e_min)}, B_crit {fmt_estimate(direct.b_crit)}" in out
    assert main(["--db", db, "import", "rcp", str(RCP_BERT)]) == 0  # again: nothing added
    assert "0 run(s) imported" in capsys.readouterr().out and storage.count_trials(record.id) == len(trials)


def rcp_record(batch: int, samples: list[int], lr: float = 0.002, benchmark: str = "bert") -> dict:
    return {"Benchmark": benchmark, "Creator": "test", "When": "now", "Platform": "TPU", "BS": batch,
            "Hyperparams": {"opt_base_learning_rate": lr, "opt_epsilon": 1e-6, "opt_learning_rate_training_steps": 100,
                            "num_warmup_steps": 0, "start_warmup_step": 0, "opt_lamb_beta_1": 0.9,
                            "opt_lamb_beta_2": 0.999, "opt_lamb_weight_decay_rate": 0.01,
                            "gradient_accumulation_steps": 1},
            "Epochs to converge": samples}  # fmt: skip


def test_the_reference_curve_beside_an_experiment_on_the_comparison_page(tmp_path, capsys):
    rcp = tmp_path / "training_9.9.9" / "rcps_bert.json"
    rcp.parent.mkdir()
    rcp.write_text(json.dumps({f"bert_ref_{b}": rcp_record(b, [s, round(s * 1.05), round(s * 0.97)])
                               for b, s in ((256, 2_500_000), (2048, 2_700_000), (8192, 4_200_000))}))  # fmt: skip
    write(tmp_path / "runs" / "result_0.txt", run_lines())
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "rcp", str(rcp)]) == 0
    assert main(["--db", db, "import", "mlperf", str(tmp_path / "runs"), "--name", "mine"]) == 0
    storage = SqlStorage(db)
    page = comparison_report(storage, ["mine", "rcp-bert-9-9-9"])
    assert "lamb (rcp-bert-9-9-9, MLPerf reference)" in page and "lamb (mine, imported)" in page
    assert 'data-field="fit_b_crit" data-arm="lamb (rcp-bert-9-9-9, MLPerf reference)"' in page  # its fit row
    assert "MLPerf&#x27;s reference (an RCP import, black squares)" in page


LOCKED_RUNS = {256: [2_500_000, 2_600_000], 2048: [2_700_000, 2_800_000, 2_750_000]}


def locked_rcp_import(tmp_path):
    """An RCP file of LOCKED_RUNS, a migrated SQLite database and another connection to it (to hold a write lock):
    (rcp path, runs, database URL, that connection)."""
    rcp = tmp_path / "training_9.9.9" / "rcps_bert.json"
    rcp.parent.mkdir()
    rcp.write_text(json.dumps({f"bert_ref_{b}": rcp_record(b, samples) for b, samples in LOCKED_RUNS.items()}))
    db = db_url(tmp_path)
    SqlStorage(db, upgrade=True).close()
    holder = sqlite3.connect(tmp_path / "hpo.db", isolation_level=None, check_same_thread=False)
    return rcp, LOCKED_RUNS, db, holder


def imported_samples(db: str) -> list[int]:
    """The samples to target of the imported RCP experiment's trials, sorted."""
    with SqlStorage(db) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("rcp-bert-9-9-9").id)
        return sorted(t.samples_to_target for t in trials)


def test_an_import_waits_for_a_locked_database_when_the_environment_says_so_and_says_that_it_waits(
    tmp_path, capsys, monkeypatch
):
    """With HPO_DATABASE_OUTAGE_S set, an import waits for a database that is away (as `hpo db upgrade` does), but
    it waited without a word: a command that looked hung for as long as the bound. It says that it waits and why,
    then stores every run once."""
    monkeypatch.setattr("hpo.storage.engine.SQLITE_BUSY_TIMEOUT_MS", 50)
    monkeypatch.setenv("HPO_DATABASE_OUTAGE_S", "60")
    rcp, runs, db, holder = locked_rcp_import(tmp_path)
    holder.execute("BEGIN IMMEDIATE")  # another writer: the import's reads answer, its first write waits
    pauses: list[float] = []
    pause = retry_module._pause

    def release_then_pause(seconds, *args):  # the other process ends its write while the import waits
        if not pauses:
            holder.execute("ROLLBACK")
        pauses.append(seconds)
        pause(seconds, *args)

    monkeypatch.setattr(retry_module, "_pause", release_then_pause)
    try:
        assert main(["--db", db, "import", "rcp", str(rcp)]) == 0
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert pauses and err.count("waiting up to 60 s (HPO_DATABASE_OUTAGE_S) for the database: the SQLite database "
                                f"{db} stayed locked by another writer") == 1, err  # fmt: skip
    assert imported_samples(db) == sorted(s for samples in runs.values() for s in samples)


def test_an_import_the_database_cuts_short_says_what_it_kept_and_the_same_command_finishes_it(
    tmp_path, capsys, monkeypatch
):
    """Without HPO_DATABASE_OUTAGE_S an import stops at an outage with the database's error; it did not say that the
    runs it stored are kept and that the same command adds the rest, which a re-run then does."""
    monkeypatch.setattr("hpo.storage.engine.SQLITE_BUSY_TIMEOUT_MS", 50)
    monkeypatch.delenv("HPO_DATABASE_OUTAGE_S", raising=False)
    rcp, runs, db, holder = locked_rcp_import(tmp_path)
    holder.execute("BEGIN IMMEDIATE")  # another writer: the import's reads answer, its first write fails
    try:
        assert main(["--db", db, "import", "rcp", str(rcp)]) == 1
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert f"the SQLite database {db} stayed locked by another writer" in err and "Traceback" not in err
    assert err.rstrip().endswith("; the import stopped there: any runs it stored are kept, and the same command run "
                                 "again once the database answers adds only the runs not stored yet"), err  # fmt: skip
    assert main(["--db", db, "import", "rcp", str(rcp)]) == 0
    assert imported_samples(db) == sorted(s for samples in runs.values() for s in samples)


def test_an_rcp_file_of_another_benchmark_is_a_named_error(tmp_path, capsys):
    rcp = tmp_path / "rcps_resnet.json"
    rcp.write_text(json.dumps({"resnet_ref_256": rcp_record(256, [40, 41], benchmark="resnet")}))
    db_file = tmp_path / "hpo.db"
    assert main(["--db", f"sqlite:///{db_file}", "import", "rcp", str(rcp)]) == 2
    assert "rcps_resnet.json: record resnet_ref_256: Benchmark is 'resnet'" in capsys.readouterr().err
    assert not db_file.exists()


# --------------------------------------------------------------------------- published results (excerpts)

PUBLISHED = Path(__file__).parent / "results"
V20 = PUBLISHED / "training_results_v2.0"
SAMSUNG_16K = V20 / "Samsung" / "results" / "samsung_supercomputer21_dgxa100_n128_pytorch" / "bert"
NVIDIA_16K = V20 / "NVIDIA" / "results" / "dgxa100_n512_ngc22.04_pytorch" / "bert"
ADAM_16K, LAMB_16K = (
    "optimizer.name=adamw,batch.global_batch_size=16384",
    "optimizer.name=lamb,batch.global_batch_size=16384",
)


def raw_events(path: Path) -> list[dict]:
    """Every MLLOG line of an excerpt as its JSON (an excerpt holds one rank's lines), read here without hpo."""
    return [json.loads(line.split(":::MLLOG", 1)[1]) for line in path.read_text().splitlines() if ":::MLLOG" in line]


def raw_run(path: Path) -> dict:
    """What the test reads from an excerpt itself: batch, accuracies in order with their epoch_num, train_samples
    after the last evaluation, run_start/run_stop times, and the command line's evaluation schedule."""
    events = raw_events(path)
    value = {e["key"]: e["value"] for e in events if e["key"] in ("global_batch_size", "train_samples")}
    times = {e["key"]: e["time_ms"] for e in events if e["key"] in ("run_start", "run_stop")}
    evals = [(e["metadata"]["epoch_num"], e["value"]) for e in events if e["key"] == "eval_accuracy"]
    command = next((line for line in path.read_text().splitlines() if "--eval_iter_samples" in line), "")
    keys = ("eval_iter_start_samples", "eval_iter_samples")
    schedule = [int(re.search(rf"--{k}=(\d+)", command).group(1)) for k in keys] if command else None
    return {"batch": value["global_batch_size"], "end": value.get("train_samples"), "evals": evals,
            "seconds": (times["run_stop"] - times["run_start"]) / 1000, "schedule": schedule}  # fmt: skip


def scheduled(run: dict, first: int, every: int) -> list[tuple[int, float]]:
    """The curve of an epoch_num-1 run: evaluation k at the first step (of `batch` samples) at or past first + k x
    every (NVIDIA's run_pretraining.py)."""
    batch = run["batch"]
    return [(-(-(first + k * every) // batch) * batch, acc) for k, (_, acc) in enumerate(run["evals"])]


def stored_curve(storage: SqlStorage, trial) -> list[tuple[int, float]]:
    return [(m.samples, m.value) for m in storage.get_metrics(trial.id, "mlm_accuracy")]


def test_samsungs_adam_against_nvidias_lamb_at_16384_in_one_import(tmp_path, capsys):
    """Samsung's 10 ADAM runs (open division, `--optimizer=FusedAdam`, every evaluation at epoch_num 1) and NVIDIA's 10
    LAMB runs (closed division, no optimizer named) in one command with --optimizer lamb: Samsung's stay ADAM, every
    run is evidence (10 per arm), the verdict is the one the runs' own lines give, and each run carries its
    wall-clock and its system's accelerators."""
    db = db_url(tmp_path)
    args = [
        "--db",
        db,
        "import",
        "mlperf",
        str(SAMSUNG_16K),
        str(NVIDIA_16K),
        "--name",
        "bert16k",
        "--optimizer",
        "lamb",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    storage = SqlStorage(db)
    trials = storage.list_trials(storage.get_experiment_by_name("bert16k").id)
    samsung = [t for t in trials if "Samsung" in t.metrics["mlperf"]["file"]]
    nvidia = [t for t in trials if "NVIDIA" in t.metrics["mlperf"]["file"]]
    assert len(samsung) == len(nvidia) == 10
    assert {t.arm for t in samsung} == {ADAM_16K} and {t.arm for t in nvidia} == {LAMB_16K}
    assert {t.metrics["mlperf"]["optimizer_named_by"] for t in samsung} == {"the command line (line 1)"}
    assert {t.metrics["mlperf"]["optimizer_named_by"] for t in nvidia} == {"--optimizer"}

    runs = {}
    for trial in trials:
        run = raw_run(Path(trial.metrics["mlperf"]["file"]))
        curve = scheduled(run, *run["schedule"]) if run["schedule"] else run["evals"]
        assert stored_curve(storage, trial) == curve
        assert trial.samples_to_target == run["end"] == curve[-1][0]  # the last evaluation is at train_samples
        accelerators = 1024 if trial in samsung else 4096  # 128 and 512 DGX A100 of 8 GPUs (systems/*.json)
        assert trial.metrics["mlperf"]["accelerators"] == accelerators
        assert trial.metrics["mlperf"]["wall_clock_s"] == pytest.approx(run["seconds"], abs=1e-9)
        assert trial.metrics["mlperf"]["accelerator_hours"] == pytest.approx(accelerators * run["seconds"] / 3600)
        runs.setdefault(trial.arm, []).append((interpolated(curve), accelerators * run["seconds"] / 3600))

    assert main(["--db", db, "best", "bert16k", "--per-arm"]) == 0
    best = yaml.safe_load(capsys.readouterr().out)
    assert best["verdict"]["runs_per_arm"] == {ADAM_16K: 10, LAMB_16K: 10}
    expected = decide([ArmRuns(arm, tuple(s for s, _ in runs[arm]), 1) for arm in (ADAM_16K, LAMB_16K)])
    assert best["verdict"]["line"] == expected.line and expected.winner == ADAM_16K
    for arm in (ADAM_16K, LAMB_16K):  # the summary's accelerator-hours per run: the mean over the arm's runs
        hours = sum(h for _, h in runs[arm]) / len(runs[arm])
        assert f"arm {arm}: 10 run(s), 10 reached the target" in out and f": {hours:,.3g} accelerator-hours" in out
    assert main(["--db", db, "status", "bert16k"]) == 0
    status = capsys.readouterr().out
    assert f"arm {ADAM_16K}: per run 22.3 s on 1,024 accelerators" in status
    costs = next(line for line in status.splitlines() if line.startswith("imported: "))  # arms as the summary has them
    assert out.index(f"arm {ADAM_16K}:") < out.index(f"arm {LAMB_16K}:")
    assert costs.index(f"arm {ADAM_16K}:") < costs.index(f"arm {LAMB_16K}:"), costs
    assert f"runs per arm: {ADAM_16K} 10, {LAMB_16K} 10 of 10" in status  # every run counts, as the verdict reads
    assert "batch-size study" not in status  # one batch size: nothing across
    # The report says the same: 20 runs held, none planned beyond them (it said "20 of 22 planned", a tuning run
    # counted among the confirmation seeds), each arm's 10 runs listed as its evidence, and no note of a batch-size
    # study with one batch size.
    assert main(["--db", db, "report", "bert16k", "-o", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "bert16k.html").read_text()
    assert "data-field=planned>20<" in page and "2/2 tuning trials done, 18/18 confirmation runs" in page
    for arm in (ADAM_16K, LAMB_16K):
        listed = re.search(f'runs_trials" data-arm="{re.escape(arm)}">([^<]*)<', page).group(1).split(", ")
        assert sorted(int(n) for n in listed) == sorted(t.number for t in trials if t.arm == arm)
    assert "its own run is evidence too" in page and "batch_study_note" not in page


def test_the_epoch_num_1_convention_places_evaluations_by_the_schedule(tmp_path):
    """Logs whose every eval_accuracy says epoch_num 1 (training 0.7 to 2.0) import: samples to target from
    train_samples at run_stop, the evaluations placed by the command line's schedule (0.7: from 3,000,000 every
    500,000) or, without one, by MLPerf BERT's interval for the batch size (1.1 at batch 448: floor(0.05 x (230.23 x
    448 + 3,000,000) / 25,000) x 25,000 = 150,000 samples)."""
    v07 = PUBLISHED / "training_results_v0.7" / "NVIDIA" / "results" / "dgx1_ngc20.06_pytorch" / "bert" / "result_0.txt"
    v11 = (
        PUBLISHED
        / "training_results_v1.1"
        / "NVIDIA"
        / "results"
        / "dgxa100_ngc21.09_pytorch"
        / "bert"
        / "result_0.txt"
    )
    for path, schedule, source in (
        (v07, (3_000_000, 500_000), "command line"),
        (v11, (150_000, 150_000), "mlperf rule"),
    ):
        raw = raw_run(path)
        assert {epoch for epoch, _ in raw["evals"]} == {1} and len(raw["evals"]) > 1
        assert (raw["schedule"] is not None) == (source == "command line")
        run = read_result_file(path, default_optimizer="lamb")
        expected = scheduled(raw, *schedule)
        assert [(e.samples, e.accuracy) for e in run.evaluations] == expected and run.curve == source
        assert run.samples_to_target == raw["end"] == expected[-1][0]
    assert read_result_file(v11, "lamb").hardware.accelerators == 8
    db = db_url(tmp_path)
    for name, path in (("epoch1_v07", v07), ("epoch1_v11", v11)):  # 0.7 trained to 0.712, 1.1 to 0.720: apart
        assert main(["--db", db, "import", "mlperf", str(path), "--name", name, "--optimizer", "lamb"]) == 0
    storage = SqlStorage(db)
    for name in ("epoch1_v07", "epoch1_v11"):
        (trial,) = storage.list_trials(storage.get_experiment_by_name(name).id)
        raw = raw_run(Path(trial.metrics["mlperf"]["file"]))
        assert stored_curve(storage, trial) == scheduled(raw, *(raw["schedule"] or (150_000, 150_000)))
        assert trial.metrics["mlperf"]["curve"].startswith("the logged command line" if raw["schedule"] else "MLPerf")


def test_a_planned_train_samples_is_not_the_samples_at_the_end(tmp_path):
    """Google logs train_samples before run_start (the planned 6,508,544 samples); its samples to target is the last
    evaluation's epoch_num (what MLPerf's RCP checker reads). Graphcore logs train_samples as a one-element list."""
    google = V20 / "Google" / "results" / "cloud-tpu-v4-8192-TF" / "bert" / "result_0.txt"
    raw = raw_run(google)
    run = read_result_file(google, "lamb")
    assert raw["end"] == 6_508_544 and run.train_samples is None
    assert run.samples_to_target == raw["evals"][-1][0] == 4_780_367
    assert any("train_samples 6508544 at line" in note and "not read" in note for note in run.notes)
    graphcore = PUBLISHED / "training_results_v1.1/Graphcore/results/ipu-pod128-POPART-closed/bert/result_0.txt"
    (value,) = raw_run(graphcore)["end"]
    assert read_result_file(graphcore, "lamb").samples_to_target == value == 3_872_218


def test_a_log_without_the_samples_at_the_target_is_refused_by_name(tmp_path, capsys):
    google = PUBLISHED / "training_results_v0.7/Google/results/tpu-v3-8192-TF/bert/result_0.txt"
    db_file = tmp_path / "hpo.db"
    assert (
        main(["--db", f"sqlite:///{db_file}", "import", "mlperf", str(google), "--name", "g", "--optimizer", "lamb"])
        == 2
    )
    err = capsys.readouterr().err
    assert re.search(r"tpu-v3-8192-TF/bert/result_0\.txt:\d+: eval_accuracy's epoch_num counts epochs or steps", err)
    assert "no train_samples follows the evaluations" in err and not db_file.exists()


def test_an_optimizer_name_the_importer_does_not_know_is_an_error_and_nothing_is_written(tmp_path, capsys):
    """Samsung's runs with FusedAdam swapped for a name the importer does not know, imported with NVIDIA's and
    --optimizer lamb: the name is an error naming file, line and name, never read as LAMB, and nothing is written."""
    copy = tmp_path / "samsung"
    for path in SAMSUNG_16K.glob("result_*.txt"):
        write(
            copy / path.name,
            path.read_text().replace("--optimizer=FusedAdam", "--optimizer=FusedNovoGrad").splitlines(),
        )
    db_file = tmp_path / "hpo.db"
    args = [
        "--db",
        f"sqlite:///{db_file}",
        "import",
        "mlperf",
        str(copy),
        str(NVIDIA_16K),
        "--name",
        "x",
        "--optimizer",
        "lamb",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(r"samsung/result_0\.txt:1: the logged command line names optimizer 'FusedNovoGrad'", err)
    assert not db_file.exists()


@pytest.mark.parametrize(("name", "trainer"), [("FusedAdam", "adamw"), ("apex.optimizers.FusedAdam", "adamw"),
                                               ("AdamW", "adamw"), ("adam", "adamw"), ("FusedLAMB", "lamb"),
                                               ("DistributedFusedLAMB", "lamb"), ("Lamb", "lamb"), ("LAMB", "lamb"),
                                               ("fused_lamb", "lamb"), ("SGD", None), ("Adafactor", None)])  # fmt: skip
def test_optimizer_names_as_submitters_write_them(tmp_path, name, trainer):
    path = write(tmp_path / "result_0.txt", run_lines(optimizer=name))
    if trainer is None:
        with pytest.raises(ResultFileError, match=rf"result_0\.txt:\d+: opt_name '{name}' is not an optimizer"):
            read_result_file(path, default_optimizer="lamb")
    else:
        assert read_result_file(path, default_optimizer="lamb").optimizer == trainer


def test_opt_name_and_a_command_line_that_disagree_are_an_error(tmp_path):
    path = write(tmp_path / "result_0.txt", ["+ python run_pretraining.py --optimizer=FusedAdam", *run_lines()])
    with pytest.raises(
        ResultFileError, match=r"names different optimizers \(lamb by opt_name.*FusedAdam by the command"
    ):
        read_result_file(path)


def test_a_logged_value_the_trainer_cannot_take_is_left_out_with_a_note(tmp_path, capsys):
    """Baidu's PaddlePaddle logs of training 2.0 say opt_learning_rate_training_steps 0 (they trained ~900 steps): the
    run imports, that value is left out of its configuration, and the import says so."""
    baidu = V20 / "Baidu" / "results" / "IPU_POD16_PaddlePaddle" / "bert" / "result_0.txt"
    assert [e["value"] for e in raw_events(baidu) if e["key"] == "opt_learning_rate_training_steps"] == [0]
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(baidu), "--name", "baidu", "--optimizer", "lamb"]) == 0
    out = capsys.readouterr().out
    assert "note: 1 run(s): opt_learning_rate_training_steps 0 is not a value the trainer takes" in out
    (trial,) = trials_by_file(SqlStorage(db), "baidu").values()
    assert "schedule.total_steps" not in trial.params and trial.params["optimizer.lr"] == 0.0035
    assert trial.samples_to_target == raw_run(baidu)["end"]


def test_evaluations_that_carry_their_own_samples(tmp_path):
    """Google's open-division JAX logs of training 1.1 give every evaluation epoch_num 1 and its samples in its own
    metadata (train_samples_since_beginning), with train_samples only before run_start."""
    jax = PUBLISHED / "training_results_v1.1/Google/results/tpu-v4-2048-JAX/bert/result_0.txt"
    evals = [e for e in raw_events(jax) if e["key"] == "eval_accuracy"]
    assert {e["metadata"]["epoch_num"] for e in evals} == {1}
    run = read_result_file(jax, "lamb")
    expected = [(e["metadata"]["train_samples_since_beginning"], e["value"]) for e in evals]
    assert [(e.samples, e.accuracy) for e in run.evaluations] == expected and run.curve == "metadata"
    assert run.samples_to_target == expected[-1][0] and run.train_samples is None


def test_equal_intervals_when_no_schedule_fits_are_said_to_be_approximate(tmp_path, capsys):
    # epoch_num 1 at every evaluation, and train_samples 2,000: MLPerf's interval at batch 256 (150,000) does not fit
    lines = run_lines(evals=((1, 0.70), (1, 0.71), (1, 0.73)), train_samples=2_000)
    run = read_result_file(write(tmp_path / "runs" / "result_0.txt", lines))
    assert [e.samples for e in run.evaluations] == [667, 1333, 2000] and run.curve == "equal intervals"
    assert main(["--db", db_url(tmp_path), "import", "mlperf", str(tmp_path / "runs"), "--name", "eq"]) == 0
    assert "equal intervals in evaluation order up to train_samples (approximate)" in capsys.readouterr().out


def test_an_arm_with_several_configurations_leaves_out_the_runs_that_picked_its_best(tmp_path, capsys):
    # ADAM at two learning rates in one arm (compare by optimizer): each rate's first run is its tuning trial, the
    # arm's best is picked on them (2,000 against 3,000 samples), so neither counts; LAMB's one rate: all three count
    d = tmp_path / "runs"
    for seed in (1, 2, 3):
        write(d / "adam_a" / f"result_{seed}.txt", run_lines(optimizer="adam", lr=0.001, seed=seed))
        write(d / "lamb" / f"result_{seed}.txt", run_lines(seed=seed))
    slower = ((1000, 0.70), (2000, 0.71), (3000, 0.73))
    for seed in (1, 2):
        write(d / "adam_b" / f"result_{seed}.txt", run_lines(optimizer="adam", lr=0.003, seed=seed, evals=slower))
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "two", "--compare", "optimizer"]) == 0
    assert "note: arm optimizer.name=adamw holds 2 configurations" in capsys.readouterr().out
    trials = SqlStorage(db).list_trials(SqlStorage(db).get_experiment_by_name("two").id)
    assert [t.metrics.get(UNSELECTED_KEY) for t in trials if t.kind is TrialKind.TUNING] == [None, None, True]
    assert main(["--db", db, "best", "two", "--per-arm"]) == 0
    best = yaml.safe_load(capsys.readouterr().out)
    assert best["optimizer.name=adamw"]["params"]["optimizer.lr"] == 0.001
    assert best["verdict"]["runs_per_arm"] == {"optimizer.name=adamw": 2, "optimizer.name=lamb": 3}


def three_runs_to_import(tmp_path: Path):
    """Three logs of one configuration in tmp_path/runs, a database URL, and the plan of their import as `cut`."""
    from hpo.mlperf.importer import plan_mlperf
    from hpo.mlperf.logs import read_result_files, result_files

    d = tmp_path / "runs"
    for seed in (1, 2, 3):
        write(d / f"result_{seed}.txt", run_lines(seed=seed))
    plan = plan_mlperf(read_result_files(result_files([str(d)]), None), "cut", ["optimizer", "global_batch_size"], None)
    return d, db_url(tmp_path), plan


def test_an_import_cut_short_is_told_to_run_the_same_import_again_which_finishes_it(tmp_path, capsys):
    """What a killed `hpo import` leaves (its experiment row, running, with no controller): status and resume said
    `hpo resume`, which then refused it as imported; the same import again finishes it."""
    d, db, plan = three_runs_to_import(tmp_path)
    with SqlStorage(db, upgrade=True) as storage:
        storage.create_experiment(plan.name, plan.stored, plan.spec.direction)  # where a SIGKILL stopped it
    assert main(["--db", db, "status", "cut"]) == 0
    out = capsys.readouterr().out
    assert "cut: interrupted" in out and "hpo resume" not in out
    assert "the import stopped before it finished: run the same `hpo import mlperf` command again to finish it" in out
    assert "imported: 0 of 3 run(s) from 3 file(s)" in out  # it holds none of them yet
    assert main(["--db", db, "report", "cut", "-o", str(tmp_path / "reports")]) == 0
    assert "imported: 0 of 3 run(s) from 3 file(s)" in (tmp_path / "reports" / "cut.html").read_text()
    capsys.readouterr()
    assert main(["--db", db, "resume", "cut"]) == 2
    assert ("experiment cut is an import (hpo import mlperf) that stopped before it finished: run the same `hpo "
            "import mlperf` command again to finish it") in capsys.readouterr().err  # fmt: skip
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "cut"]) == 0
    with SqlStorage(db) as storage:
        record = storage.get_experiment_by_name("cut")
        assert record.status is ExperimentStatus.FINISHED and storage.count_trials(record.id) == 3


def test_a_run_an_import_was_writing_when_killed_is_not_counted_as_held(tmp_path, capsys):
    """Killed after one run and while writing the second: the experiment holds one of its 3 runs (the second's
    half-written trial is written again as another trial by the next import), so status and the report say `1 of
    3` (they counted the half-written trial: `2 of 3`), and after the import again, `3`."""
    from hpo.mlperf.importer import _Clock, _write_run
    from hpo.trials import TrialSpec

    d, db, plan = three_runs_to_import(tmp_path)
    with SqlStorage(db, upgrade=True) as storage:
        experiment_id = storage.create_experiment(plan.name, plan.stored, plan.spec.direction)
        _write_run(storage, experiment_id, plan.runs[0], _Clock())
        run = plan.runs[1]  # where a SIGKILL stopped it: the second run's trial created, not finished
        spec = TrialSpec(None, run.params, run.arm, 1.0, (), run.global_batch_size, run.kind, run.seed)
        trial_id = storage.create_trial(experiment_id, spec)
        storage.mark_trial_running(trial_id, None, worker=run.worker)
    for held in ("1 of 3", "3"):
        assert main(["--db", db, "status", "cut"]) == 0
        assert f"imported: {held} run(s) from 3 file(s)" in capsys.readouterr().out
        assert main(["--db", db, "report", "cut", "-o", str(tmp_path / "reports")]) == 0
        assert f"imported: {held} run(s) from 3 file(s)" in (tmp_path / "reports" / "cut.html").read_text()
        assert main(["--db", db, "import", "mlperf", str(d), "--name", "cut"]) == 0
        capsys.readouterr()
    with SqlStorage(db) as storage:  # the half-written trial, interrupted, beside the 3 runs
        assert storage.count_trials(experiment_id) == 4


def test_an_import_cut_short_is_not_finished_by_importing_part_of_its_files_again(tmp_path, capsys):
    """The same import with only the files it had stored marked the experiment finished (its other runs never came,
    and status no longer said to run the import again); it stays unfinished and the import says why."""
    from hpo.mlperf.importer import _Clock, _write_run

    d, db, plan = three_runs_to_import(tmp_path)
    with SqlStorage(db, upgrade=True) as storage:
        experiment_id = storage.create_experiment(plan.name, plan.stored, plan.spec.direction)
        _write_run(storage, experiment_id, plan.runs[0], _Clock())  # where a SIGKILL stopped it: one run of three
    assert Path(plan.runs[0].source).name == "result_1.txt"
    assert main(["--db", db, "import", "mlperf", str(d / "result_1.txt"), "--name", "cut"]) == 0
    out = capsys.readouterr().out
    assert ("experiment cut is not finished: 2 run(s) of the import that created it are in none of these files; run "
            "that import again (its files, its options) to finish it") in out  # fmt: skip
    with SqlStorage(db) as storage:
        assert storage.get_experiment_by_name("cut").status is not ExperimentStatus.FINISHED
    assert main(["--db", db, "status", "cut"]) == 0
    assert "the import stopped before it finished" in capsys.readouterr().out
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "cut"]) == 0  # all its files: finished
    assert "is not finished" not in capsys.readouterr().out
    with SqlStorage(db) as storage:
        record = storage.get_experiment_by_name("cut")
        assert record.status is ExperimentStatus.FINISHED and storage.count_trials(record.id) == 3


def test_an_imports_verdicts_at_each_batch_size_share_the_error_over_the_batch_sizes_compared(tmp_path):
    """Runs of ADAM and LAMB at 256 and of LAMB alone at 512: the import's arms are every combination of the logged
    values, but ADAM at 512 has no run and never will (an import holds all its runs), so the verdict at 256 is the
    only one and has the whole level (a study that runs declares its batch sizes: their runs are to come)."""
    from hpo.evidence.confirmations import stored_evidence
    from hpo.evidence.verdict import ALPHA
    from hpo.experiment import spec_from_stored
    from hpo.experiment.arms import declared_batch_sizes
    from hpo.report.data import load_experiment
    from hpo.report.scaling import batch_verdicts, experiment_runs, scaling_points

    d = tmp_path / "runs"
    slower = ((1000, 0.70), (2000, 0.71), (3000, 0.73))
    for seed in (1, 2, 3):
        write(d / "adam" / f"result_{seed}.txt", run_lines(optimizer="adam", seed=seed, evals=slower))
        write(d / "lamb" / f"result_{seed}.txt", run_lines(seed=seed, evals=((1000, 0.70), (2000 + seed, 0.73))))
        write(d / "lamb_512" / f"result_{seed}.txt", run_lines(batch=512, seed=seed))
    db = db_url(tmp_path)
    compare = "optimizer,global_batch_size"
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "b", "--compare", compare]) == 0
    with SqlStorage(db) as storage:
        record = storage.get_experiment_by_name("b")
        spec = spec_from_stored(record)
        _, verdicts = stored_evidence(storage, record.id).batch_verdicts(spec)
        data = load_experiment(storage, "b", with_noise=False)
    assert declared_batch_sizes(spec) == (256, 512)  # as a study that runs would declare them
    assert list(verdicts) == [256] and verdicts[256].shared == 1
    assert {c.level for c in verdicts[256].comparisons} == {ALPHA}
    report = batch_verdicts(scaling_points([data], experiment_runs([data])), declared=data.declared_batch_sizes)
    assert {b: (v.outcome, v.shared, [c.level for c in v.comparisons]) for b, v in report.items()} == {
        256: (verdicts[256].outcome, 1, [ALPHA])}  # the report's too  # fmt: skip


# --------------------------------------------------------------------------- what users met


def test_a_run_that_names_no_target_beside_one_of_another_target_is_refused_by_name(tmp_path, capsys):
    """Training 0.7's NVIDIA run names 0.712 on its command line; 2.0's name none and trained to 0.720: read together,
    0.712 was applied to every run (samples to target from their first evaluation at 0.712, without a word). Now a
    run that names none is MLPerf BERT's 0.720, so the two targets are refused, naming a file of each."""
    v07 = PUBLISHED / "training_results_v0.7" / "NVIDIA"
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(v07), str(NVIDIA_16K), "--name", "mixed",
                 "--optimizer", "lamb"]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert "the runs trained to different targets (" in err and "result_0.txt: 0.712; " in err
    assert "result_0.txt: 0.72 (it names none: MLPerf BERT's)" in err and "--target" in err
    assert not (tmp_path / "hpo.db").exists()
    # the runs of 2.0 alone read 0.720, as the summary and status say, and where it came from
    assert main(["--db", db, "import", "mlperf", str(NVIDIA_16K), "--name", "v20", "--optimizer", "lamb"]) == 0
    out = capsys.readouterr().out
    assert "target masked-LM accuracy 0.72 (MLPerf BERT's; the runs log none)" in out
    runs = [raw_run(f) for f in sorted(NVIDIA_16K.glob("result_*.txt"))]
    first = [next(s for s, acc in run["evals"] if acc >= 0.72) for run in runs]  # the test's own reading
    mean = sum(first) / len(first)
    assert f"samples to target {mean:,.0f} on average" in out
    assert main(["--db", db, "status", "v20"]) == 0
    assert "; target 0.72 (MLPerf BERT's; the runs log none)" in capsys.readouterr().out
    assert main(["--db", db, "import", "mlperf", str(v07), "--name", "v07", "--optimizer", "lamb"]) == 0
    assert "target masked-LM accuracy 0.712 (logged by the runs)" in capsys.readouterr().out


def test_what_the_compliance_checker_writes_beside_a_log_is_not_read_as_a_run(tmp_path, capsys):
    """scripts/check_mlperf_logs.sh leaves result_0.txt.checker.txt beside each log: the directory's import read it as
    a result file and failed ("no :::MLLOG line")."""
    d = tmp_path / "trials"
    for n in (0, 1):
        write(d / f"{n:05d}" / "mlperf" / "result_0.txt", run_lines(seed=n + 1))
        write(d / f"{n:05d}" / "mlperf" / "result_0.txt.checker.txt", ["INFO - Running compliance checks", "SUCCESS"])
    assert main(["--db", db_url(tmp_path), "import", "mlperf", str(d), "--name", "trials"]) == 0
    assert "experiment trials: 2 run(s) imported" in capsys.readouterr().out


def test_part_of_a_cut_short_imports_files_is_refused_and_all_of_them_finish_it(tmp_path, capsys):
    """Stopped after one of three runs, the import run again with one run it lacks was refused as "an import of other
    files"; it now says to run it with all its files (read alone, the runs would be grouped otherwise)."""
    from hpo.mlperf.importer import _Clock, _write_run

    d, db, plan = three_runs_to_import(tmp_path)
    with SqlStorage(db, upgrade=True) as storage:
        experiment_id = storage.create_experiment(plan.name, plan.stored, plan.spec.direction)
        _write_run(storage, experiment_id, plan.runs[0], _Clock())
    assert Path(plan.runs[1].source).name == "result_2.txt"
    assert main(["--db", db, "import", "mlperf", str(d / "result_2.txt"), "--name", "cut"]) == 2
    err = capsys.readouterr().err
    assert (
        "experiment 'cut' is an import that stopped before it finished (1 of its 3 runs stored), and these files "
        "are 1 of its runs: run the import again with all its files (the same command) to finish it"
    ) in err
    with SqlStorage(db) as storage:
        assert storage.count_trials(experiment_id) == 1
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "cut"]) == 0
    with SqlStorage(db) as storage:
        record = storage.get_experiment_by_name("cut")
        assert record.status is ExperimentStatus.FINISHED and storage.count_trials(record.id) == 3


def test_a_trial_an_import_was_writing_when_stopped_is_no_run_of_its_counts(tmp_path, capsys):
    """Status counted the half-written trial among the runs and the runs per arm (`4 run(s)`, `4 of 3`) after the
    import again had written its run anew."""
    from hpo.mlperf.importer import _Clock, _write_run
    from hpo.trials import TrialSpec

    d, db, plan = three_runs_to_import(tmp_path)
    with SqlStorage(db, upgrade=True) as storage:
        experiment_id = storage.create_experiment(plan.name, plan.stored, plan.spec.direction)
        _write_run(storage, experiment_id, plan.runs[0], _Clock())
        run = plan.runs[1]  # stopped while writing the second run: its trial created, running
        spec = TrialSpec(None, run.params, run.arm, 1.0, (), run.global_batch_size, run.kind, run.seed)
        storage.mark_trial_running(storage.create_trial(experiment_id, spec), None, worker=run.worker)
    arm = "optimizer.name=lamb,batch.global_batch_size=256"
    for runs, total in ((1, 3), (3, 3)):
        assert main(["--db", db, "status", "cut"]) == 0
        out = capsys.readouterr().out
        assert f"imported (mlperf): {runs} run(s) in 1 configuration(s), {runs} reached the target" in out
        assert f"confirmation runs per arm: {arm} {runs} of {total}" in out
        assert main(["--db", db, "import", "mlperf", str(d), "--name", "cut"]) == 0
        capsys.readouterr()
    assert main(["--db", db, "best", "cut", "--per-arm"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["verdict"]["runs_per_arm"] == {arm: 3}


def test_an_imports_arms_without_runs_are_named_as_such_in_the_verdict(tmp_path, capsys):
    """By optimizer and submitter, ADAM of ACME and LAMB of Beta have no runs: the verdict said their tuning had found
    no configuration and asked for more tuning trials."""
    d = tmp_path / "runs"
    for seed in (1, 2):
        write(d / "acme" / f"result_{seed}.txt", run_lines(optimizer="lamb", seed=seed, org="ACME"))
        write(d / "beta" / f"result_{seed}.txt", run_lines(optimizer="adam", seed=seed, org="Beta"))
    db = db_url(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(d), "--name", "cells", "--compare", "optimizer,submitter"]) == 0
    capsys.readouterr()
    assert main(["--db", db, "status", "cells"]) == 0
    out = capsys.readouterr().out
    empty = ("optimizer.name=adamw,log.mlperf_submission.org=ACME and "
             "optimizer.name=lamb,log.mlperf_submission.org=Beta")  # fmt: skip
    assert f"verdict now: not yet: {empty} have no runs (an import's arms are every combination" in out
    assert "tuning" not in out.split("verdict now:")[1].split("\n")[0]
    assert main(["--db", db, "import", "mlperf", str(d / "acme"), str(d / "beta"), "--name", "two"]) == 0
    capsys.readouterr()
    assert main(["--db", db, "status", "two"]) == 0  # every arm with runs: the verdict as before
    assert "have no runs" not in capsys.readouterr().out


def test_ranks_told_apart_only_by_the_launchers_label_count_once(tmp_path):
    """`srun -l` labels each rank's lines (`0: `, `1: `) and the metadata names no rank: both ranks' evaluations were
    read as the run's (rank 1's a millisecond later, its accuracies its own), an error here, a wrong curve where the
    positions come from the schedule."""
    lines = run_lines(evals=((1000, 0.70), (2000, 0.73)))
    rank1 = run_lines(evals=((1000, 0.71), (2000, 0.74)))
    rank1 = [re.sub(r'"time_ms": (\d+)', lambda m: f'"time_ms": {int(m.group(1)) + 1}', line) for line in rank1]
    pairs = list(zip(lines, rank1, strict=True))
    srun = [line for zero, one in pairs for line in (f"0: {zero}", f"1: {one}")]
    mpi = [line for zero, one in pairs for line in (f"[1,0]<stdout>:{zero}", f"[1,1]<stdout>:{one}")]
    for name, labelled in (("srun", srun), ("mpi", mpi)):
        run = read_result_file(write(tmp_path / name / "result_0.txt", labelled))
        assert [(e.samples, e.accuracy) for e in run.evaluations] == [(1000, 0.70), (2000, 0.73)], name
        assert run.samples_to_target == 2000


def test_a_system_description_with_a_byte_order_mark_or_latin_1_gives_its_count(tmp_path, capsys):
    """Read strictly as UTF-8, such a description lost the accelerator count; a repeat import after the description
    was fixed printed the new cost, which the experiment did not store."""
    root = tmp_path / "Acme"
    write(root / "results" / "sysA" / "bert" / "result_0.txt", run_lines(seed=1))
    description = root / "systems" / "sysA.json"
    description.parent.mkdir()
    db = db_url(tmp_path)
    for name, data in (("bom", b'\xef\xbb\xbf{"number_of_nodes": "2", "accelerators_per_node": "8"}'),
                       ("latin", b'{"number_of_nodes": 2, "accelerators_per_node": 8, '
                                 b'"accelerator_model_name": "Intel\xae X"}')):  # fmt: skip
        description.write_bytes(data)
        assert main(["--db", db, "import", "mlperf", str(root), "--name", name]) == 0
        out = capsys.readouterr().out
        assert "on 16 accelerators" in out and "not readable" not in out, out
    description.write_text('{"number_of_nodes": 4, "accelerators_per_node": 8}')  # the description changed
    assert main(["--db", db, "import", "mlperf", str(root), "--name", "latin"]) == 0
    out = capsys.readouterr().out
    assert "on 16 accelerators" in out and "on 32 accelerators" not in out
    assert "note: the cost above is the one stored when the experiment was imported" in out
    assert main(["--db", db, "status", "latin"]) == 0
    assert "on 16 accelerators" in capsys.readouterr().out


COST_NOTE = "note: the cost above is the one stored when the experiment was imported"
SAMSUNG_SYSTEM = "samsung_supercomputer21_dgxa100_n128_pytorch"


def samsung_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of Samsung's excerpts (results and system description, as published): (its folder, the description)."""
    samsung = shutil.copytree(V20 / "Samsung", tmp_path / "Samsung")
    return samsung, samsung / "systems" / f"{SAMSUNG_SYSTEM}.json"


def halve_the_nodes(description: Path) -> None:
    """The system description changed: 64 nodes of 8 accelerators (512) rather than 128 (1,024)."""
    description.write_text(json.dumps({**json.loads(description.read_text()), "number_of_nodes": "64"}))


def test_an_import_again_with_part_of_its_files_notes_a_cost_only_where_a_system_description_changed(tmp_path, capsys):
    """Samsung's and NVIDIA's runs imported again with part of the files (one submitter's folder, one file, two
    files) said that the system descriptions now gave another cost: the cost per arm of the runs read (fewer, or
    another arm's none) was compared with the stored one (of every run). Nothing changed: no note. A description
    that did change is still noted, with the stored cost."""
    db = db_url(tmp_path)
    both = [str(SAMSUNG_16K), str(NVIDIA_16K)]
    parts = (
        [str(SAMSUNG_16K)],
        [str(NVIDIA_16K / "result_3.txt")],
        [str(SAMSUNG_16K / f"result_{n}.txt") for n in (0, 1)],
    )
    for paths in (both, *parts, list(reversed(both))):
        assert main(["--db", db, "import", "mlperf", *paths, "--name", "bert16k", "--optimizer", "lamb"]) == 0
        out = capsys.readouterr().out
        assert COST_NOTE not in out, out
    assert "0 run(s) imported, 20 already there" in out
    samsung, description = samsung_copy(tmp_path)
    assert main(["--db", db, "import", "mlperf", str(samsung), "--name", "samsung"]) == 0
    capsys.readouterr()
    halve_the_nodes(description)
    one = samsung / "results" / SAMSUNG_SYSTEM / "bert" / "result_0.txt"
    assert main(["--db", db, "import", "mlperf", str(one), "--name", "samsung"]) == 0
    out = capsys.readouterr().out
    assert "0 run(s) imported, 1 already there" in out and COST_NOTE in out
    assert f"arm {ADAM_16K}: 1 run(s), 1 reached the target" in out
    assert "on 1,024 accelerators" in out and "on 512 accelerators" not in out


def test_an_import_cut_short_and_finished_after_a_system_description_changed_notes_the_stored_cost(tmp_path, capsys):
    """Stopped after one of NVIDIA's runs, the import is finished after Samsung's description changed: the runs it
    writes now read the new description, which the stored cost (of every run, from the import that created the
    experiment) does not say, though the run it held reads as its trial keeps: noted; where nothing changed,
    nothing is."""
    from hpo.mlperf.importer import _Clock, _write_run, plan_mlperf
    from hpo.mlperf.logs import read_result_files, result_files

    samsung, description = samsung_copy(tmp_path)
    nvidia = shutil.copytree(V20 / "NVIDIA", tmp_path / "NVIDIA")
    paths = [str(samsung), str(nvidia)]
    plan = plan_mlperf(read_result_files(result_files(paths), "lamb"), "cut", ["optimizer", "global_batch_size"], None)
    first = next(run for run in plan.runs if run.arm == LAMB_16K)
    db = db_url(tmp_path)
    for name, changed in (("same", False), ("changed", True)):
        with SqlStorage(db, upgrade=True) as storage:
            experiment_id = storage.create_experiment(name, plan.stored, plan.spec.direction)
            _write_run(storage, experiment_id, first, _Clock())  # stopped after one run of twenty
        if changed:
            halve_the_nodes(description)
        assert main(["--db", db, "import", "mlperf", *paths, "--name", name, "--optimizer", "lamb"]) == 0
        out = capsys.readouterr().out
        assert "19 run(s) imported, 1 already there" in out
        assert (COST_NOTE in out) is changed, out
        assert "on 1,024 accelerators" in out and "on 512 accelerators" not in out
