"""The `hpo` command line: bad input writes nothing; inspection commands read what the engine stored."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from hpo.cli.main import main
from hpo.errors import HpoError
from hpo.storage import SqlStorage
from tests.hpo.engine.test_study import tiny_overrides
from tests.trainer.conftest import make_shards


def hpo(capsys, *args: str) -> subprocess.CompletedProcess:
    """`hpo ARGS` in this process (`hpo.cli.main.main`), with its exit code and output: the refusals under test are
    the command's, not its process's (a process of its own would start twice, for the tuner's hash seed)."""
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["hpo", *args], code, out, err)


def test_malformed_experiment_file_exits_2_and_writes_nothing(tmp_path, capsys):
    db_file = tmp_path / "hpo.db"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbase_config: {}\nspace: {optimizer.lrr: {float: [1.0e-4, 1.0e-2]}}\nbudget: {trials: 2}\n")
    result = hpo(capsys, "--db", f"sqlite:///{db_file}", "run", str(bad))
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr and "optimizer.lrr" in result.stderr and "optimizer.lr" in result.stderr
    assert not db_file.exists()  # validation happens before the database is even opened


def test_run_then_inspect(tmp_path, capsys):
    spec = {
        "name": "cli-demo", "base_config": {}, "overrides": tiny_overrides(tmp_path / "data"),
        "space": {"optimizer.name": {"choice": ["adamw", "lamb"]},
                  "optimizer.lr": {"float": [1e-4, 1e-2], "log": True}},
        "compare": ["optimizer.name"], "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 2, "max_parallel": 2}, "resources": {"gpus": "none", "cpu_slots": 2},
    }  # fmt: skip
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["--db", db, "run", str(path), "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr()
    assert "best for optimizer.name=adamw" in out.out and "best for optimizer.name=lamb" in out.out
    assert "trial 0" in out.err and "trials: 2/2 done" in out.err

    assert main(["--db", db, "status", "cli-demo"]) == 0
    status = capsys.readouterr().out
    assert "cli-demo: finished" in status and "2 completed" in status

    assert main(["--db", db, "best", "cli-demo", "--per-arm"]) == 0
    best = yaml.safe_load(capsys.readouterr().out)
    assert best.pop("verdict")["outcome"] in ("winner", "equivalent", "not yet")
    assert set(best) == {"optimizer.name=adamw", "optimizer.name=lamb"}
    stored = SqlStorage(db).best_per_arm(SqlStorage(db).get_experiment_by_name("cli-demo").id)
    assert {arm: t.number for arm, t in stored.items()} == {arm: b["trial"] for arm, b in best.items()}

    assert main(["--db", db, "run", str(path)]) == 2  # the same name again: refused, pointing to what reads it
    assert "already exists (status finished); `hpo status cli-demo`" in capsys.readouterr().err
    assert main(["--db", db, "trials", "nope"]) == 2
    assert "nope" in capsys.readouterr().err
    assert main(["--db", db, "status", ""]) == 2  # an empty name is a name no experiment has, not "list them all"
    assert "no experiment named ''" in capsys.readouterr().err


def small_experiment(tmp_path, **changes) -> str:
    spec = {
        "name": "clean", "base_config": {}, "overrides": tiny_overrides(tmp_path / "data"),
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}}, "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 2, "max_parallel": 1}, "resources": {"gpus": "none", "cpu_slots": 1},
    }  # fmt: skip
    spec.update(changes)
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_read_only_commands_never_create_a_database_or_directory(tmp_path, capsys):
    missing = tmp_path / "typo" / "dir" / "x.db"
    for command in (["status"], ["status", "e"], ["trials", "e"], ["best", "e"], ["export", "e"]):
        assert main(["--db", f"sqlite:///{missing}", *command]) == 2, command
        assert f"there is no database at {missing}" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()


def test_presets_lists_every_shipped_experiment_file_by_the_name_run_and_plan_take(tmp_path, capsys, monkeypatch):
    from search_spaces import PRESETS_DIR, list_presets

    monkeypatch.chdir(tmp_path)
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in lines[:-1]}
    assert list(rows) == list_presets()
    for name, (runner, description) in rows.items():
        spec = yaml.safe_load((PRESETS_DIR / f"{name}.yaml").read_text())
        assert description == spec["description"]
        assert runner == (spec.get("runner") or {}).get("name", spec.get("engine", "local"))
    assert rows["adam_vs_lamb_simulated"][0] == "simulated" and rows["adam_vs_lamb_demo_cpu_nni"][0] == "nni"
    assert f"copy its file from {PRESETS_DIR}" in lines[-1]
    assert list(tmp_path.iterdir()) == []  # it reads no database and writes nothing


# a full SMAC run of the preset; by default tests/hpo/engine/test_signals.py::test_ctrl_c_that_compiled_code_swallows_
# while_the_tuners_load_still_stops_the_run runs `hpo run adam_vs_lamb_simulated` by name outside the presets' folder,
# and test_a_batch_size_studys_run_status_and_best_per_arm_show_the_verdict_at_each_batch_size runs a shipped
# simulated preset to its end
@pytest.mark.slow
def test_a_preset_is_run_by_name_from_any_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["--db", db, "run", "adam_vs_lamb_simulated", "--quiet"]) == 0, capsys.readouterr().err
    assert main(["--db", db, "status", "adam_vs_lamb_simulated"]) == 0
    assert "finished" in capsys.readouterr().out


def test_an_unknown_preset_name_says_where_to_look(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["--db", db, "run", "adam_vs_lamb_simulatd"]) == 2
    assert capsys.readouterr().err == ("error: adam_vs_lamb_simulatd: the experiment file does not exist, and no "
                                       "shipped preset is named so (`hpo presets` lists them)\n")  # fmt: skip


def test_a_preset_name_says_it_does_not_read_its_namesake_yaml_in_the_working_folder(tmp_path, capsys, monkeypatch):
    from search_spaces import PRESETS_DIR

    monkeypatch.chdir(tmp_path)
    (tmp_path / "adam_vs_lamb_simulated.yaml").write_text("name: mine\n")
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    # refused after the file is read (--port is NNI's): nothing runs, and the note comes first
    assert main(["--db", db, "run", "adam_vs_lamb_simulated", "--port", "8000"]) == 2
    err = capsys.readouterr().err.splitlines()
    shipped = PRESETS_DIR / "adam_vs_lamb_simulated.yaml"
    assert err[0] == (f"note: adam_vs_lamb_simulated is the shipped preset {shipped}; adam_vs_lamb_simulated.yaml "
                      "in this folder is not read (give ./adam_vs_lamb_simulated.yaml to read it)")  # fmt: skip
    assert err[1].startswith("error: --port applies to engine: nni") and "adam_vs_lamb_simulated" in err[1]
    assert main(["--db", db, "run", "./adam_vs_lamb_simulated.yaml", "--port", "8000"]) == 2  # the user's own file
    assert "note:" not in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adam_vs_lamb_simulated.yaml"]


def test_an_unreachable_dask_scheduler_stops_the_run_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """In this process, with a 1 s connection timeout instead of the runner's 10 s (Dask retries until then)."""
    import hpo.runners.dask
    from hpo.trial.launch import free_port

    monkeypatch.setattr(hpo.runners.dask, "CONNECT_TIMEOUT_S", 1)
    db_file = tmp_path / "hpo.db"
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    code = main(["--db", f"sqlite:///{db_file}", "run", small_experiment(tmp_path), "--runner", "dask",
                 "--scheduler", address, "--run-dir", str(tmp_path / "run")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert f"cannot reach the Dask scheduler at {address}" in err
    assert "workers with `dask worker ADDRESS`, or use runner: local" in err  # CPU trials: no GPU resource to declare
    assert not db_file.exists()


def test_a_resume_runs_the_trials_on_the_dask_cluster_the_run_chose_on_the_command_line(tmp_path):
    """`hpo run FILE --runner dask --scheduler X` (the file says local), stopped once its first trial runs (asked
    then, the stop comes before the second trial's end, however fast the trials are): `hpo resume NAME` without the
    options runs the trials left on the same cluster, not on this machine's slots."""
    import distributed

    from hpo.experiment import spec_from_stored

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        address = cluster.scheduler_address

        def stop_once_the_first_trial_runs():
            deadline = time.monotonic() + 120  # a bound, not a timing: the run ends on its own after it
            while time.monotonic() < deadline:
                time.sleep(0.05)
                if not (tmp_path / "hpo.db").exists():  # opened first here, the file would not be new to the run
                    continue
                try:  # the database and the experiment are made by the run
                    with SqlStorage(url) as storage:
                        eid = storage.get_experiment_by_name("clean").id
                        if storage.list_trials(eid):  # created, and soon claimed by its process
                            storage.request_stop(eid)
                            return
                except HpoError:
                    continue

        stopper = threading.Thread(target=stop_once_the_first_trial_runs, daemon=True)
        stopper.start()
        code = main(["--db", url, "run", small_experiment(tmp_path), "--runner", "dask", "--scheduler", address,
                     "--run-dir", str(tmp_path / "run"), "--quiet"])  # fmt: skip
        stopper.join()
        assert code == 1  # stopped: `hpo resume` finishes it
        with SqlStorage(url) as storage:
            record = storage.get_experiment_by_name("clean")
            runner = spec_from_stored(record).runner
            assert (runner.name, runner.scheduler) == ("dask", address)
            assert [t.state.name for t in storage.list_trials(record.id)].count("COMPLETED") < 2
        assert main(["--db", url, "resume", "clean", "--quiet"]) == 0
        workers = set(cluster.scheduler_info["workers"])
    with SqlStorage(url) as storage:
        trials = storage.list_trials(storage.get_experiment_by_name("clean").id)
    assert [t.state.name for t in trials] == ["COMPLETED", "COMPLETED"]
    assert all(t.worker in workers for t in trials), [t.worker for t in trials]


def test_tuner_options_that_would_be_ignored_are_refused(tmp_path, capsys):
    db_file = tmp_path / "hpo.db"
    path = small_experiment(tmp_path, tuner={"name": "random", "seed": 0, "options": {"n_initial_configs": 3}})
    result = hpo(capsys, "--db", f"sqlite:///{db_file}", "run", path, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "tuner.options.n_initial_configs: not an option of random (it takes no options)" in result.stderr
    assert not db_file.exists()


def test_trials_pages_by_number_with_after_and_says_where_the_next_page_starts(tmp_path, capsys):
    from hpo.trials import TrialSpec

    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    with SqlStorage(db, upgrade=True) as storage:
        experiment_id = storage.create_experiment("e", {}, "minimize")
        for number in (0, 1, 2, 4, 7):  # gaps: the key is a trial number, not a position
            storage.create_trial(experiment_id, TrialSpec(number, {"optimizer.lr": 1e-3}))

    def listed(*options: str) -> tuple[list[int], str]:
        assert main(["--db", db, "trials", "e", *options]) == 0
        out = capsys.readouterr()
        return [int(line.split()[0]) for line in out.out.splitlines()[1:]], out.err

    more = "more trials follow: --after {} --limit {} shows the next page\n"
    assert listed("--after", "1", "--limit", "2") == ([2, 4], more.format(4, 2))
    assert listed("--after", "4", "--limit", "2") == ([7], "")  # the last page says nothing more
    assert listed("--after", "7") == ([], "no trial on this page\n")  # past the last: says so
    assert listed("--offset", "1", "--limit", "3") == ([1, 2, 4], more.format(4, 3))
    assert main(["--db", db, "trials", "e", "--after", "1", "--offset", "1"]) == 2
    assert "--after and --offset do not combine" in capsys.readouterr().err
    for bad in (["--after", "-1"], ["--after", "x"], ["--limit", "0"]):
        with pytest.raises(SystemExit) as exit_code:
            main(["--db", db, "trials", "e", *bad])
        assert exit_code.value.code == 2 and bad[0] in capsys.readouterr().err, bad


def test_every_command_and_option_has_help():
    from hpo.cli.main import build_parser

    def walk(parser, path):
        for action in parser._actions:
            if action.dest != "help" and action.__class__.__name__ != "_SubParsersAction":
                assert action.help, f"{' '.join(path)}: {action.dest} has no help text"
            if action.__class__.__name__ == "_SubParsersAction":
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    assert helps.get(name), f"{' '.join(path)} {name} has no help text"
                    walk(sub, [*path, name])

    walk(build_parser(), ["hpo"])


# --------------------------------------------------------------------------- refused before the first trial

PRESETS = Path(__file__).resolve().parents[3] / "search_spaces" / "presets"


def hpo_in(cwd, capsys, monkeypatch, *args: str) -> subprocess.CompletedProcess:
    """`hpo ARGS` (in this process, as `hpo`) with `cwd` as the working folder: relative data paths are read from it."""
    monkeypatch.chdir(cwd)
    return hpo(capsys, *args)


def test_the_gpu_preset_on_a_machine_without_its_data_is_refused_naming_the_gpus_then_the_data(
    tmp_path, capsys, monkeypatch
):
    """adam_vs_lamb.yaml as shipped, started where data/mlperf does not exist: refused, no experiment row; on a
    machine without GPUs for that first (preparing the data would not make it run there), else for the data."""
    from hpo.runners.resources import discover_gpus

    db_file = tmp_path / "hpo.db"
    result = hpo_in(
        tmp_path, capsys, monkeypatch, "--db", f"sqlite:///{db_file}", "run", str(PRESETS / "adam_vs_lamb.yaml")
    )
    assert result.returncode == 2, result.stderr
    if not discover_gpus():
        assert "adam_vs_lamb.yaml: resources.gpus is 'all' but this machine has no GPU" in result.stderr
        assert "`base_config: demo_cpu`, as the *_demo_cpu presets have; `hpo presets` lists them" in result.stderr
    else:
        assert "adam_vs_lamb.yaml: base_config data.train = 'data/mlperf/train'" in result.stderr
        assert "no shard files found for 'data/mlperf/train'" in result.stderr
    assert not db_file.exists()


def test_the_gpu_preset_with_its_data_on_a_machine_short_of_gpus_is_refused_naming_the_gpus(
    tmp_path, capsys, monkeypatch
):
    """adam_vs_lamb.yaml (gpus: all, 8 per trial) with data present: refused for its GPUs, no experiment row."""
    from hpo.runners.resources import discover_gpus

    gpus = discover_gpus()
    preset = yaml.safe_load((PRESETS / "adam_vs_lamb.yaml").read_text())
    train_dir, eval_dir = make_shards(tmp_path / "data", n_train=512)  # the preset's global batch: 448
    preset.update(base_config=str(PRESETS / preset["base_config"]),
                  overrides={"data.train": str(train_dir), "data.eval": str(eval_dir)})  # fmt: skip
    per_trial = max(preset["resources"]["gpus_per_trial"], len(gpus) + 1)  # 8 unless this machine has 8 or more
    preset["resources"]["gpus_per_trial"] = per_trial
    path = tmp_path / "adam_vs_lamb.yaml"
    path.write_text(yaml.safe_dump(preset))
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    result = hpo_in(tmp_path, capsys, monkeypatch, "--db", db, "run", str(path))
    assert result.returncode == 2, result.stderr
    if not gpus:  # the case of the issue: a CPU machine
        assert "resources.gpus is 'all' but this machine has no GPU" in result.stderr
        assert "set `resources.gpus: none` with `cpu_slots`" in result.stderr
    else:
        assert f"resources.gpus_per_trial is {per_trial} but only {len(gpus)} usable GPU(s)" in result.stderr
    assert not (tmp_path / "hpo.db").exists()


def test_the_demo_preset_without_its_data_is_refused_with_how_to_make_it(tmp_path, capsys, monkeypatch):
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    result = hpo_in(tmp_path, capsys, monkeypatch, "--db", db, "run", str(PRESETS / "adam_vs_lamb_demo_cpu.yaml"))
    assert result.returncode == 2, result.stderr
    assert "base_config data.train = 'data/demo/train'" in result.stderr
    # the command an installed hpo has first; `make` only in a checkout, and said so
    assert "make the demo corpus with `python -m trainer.data.demo_corpus --out data/demo`" in result.stderr
    assert "(in a checkout of the project, `make demo-data` runs it)" in result.stderr
    assert not (tmp_path / "hpo.db").exists()


def test_bad_shards_are_refused_before_the_first_trial(tmp_path, capsys):
    """Shards that exist but do not fit the model (token ids past model.vocab_size) fail the trainer's own data
    check at the start, naming the file, the key and the row, with no experiment row."""
    db_file = tmp_path / "hpo.db"
    path = small_experiment(tmp_path, overrides=tiny_overrides(tmp_path / "data", **{"model.vocab_size": 50}))
    result = hpo(capsys, "--db", f"sqlite:///{db_file}", "run", path, "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2, result.stderr
    assert "exp.yaml: overrides.data.train = " in result.stderr  # the file overrides it
    assert "HDF5 key 'input_ids'" in result.stderr and "model.vocab_size = 50" in result.stderr
    assert not db_file.exists()


@pytest.mark.parametrize(
    "preset", sorted(p.name for p in [*PRESETS.glob("*_demo_cpu.yaml"), PRESETS / "adam_vs_lamb_demo_cpu_asha.yaml"])
)
def test_the_demo_presets_pass_the_start_checks_where_the_demo_data_exists(preset, tmp_path, monkeypatch):
    from hpo.engine.local import check_trial_data
    from hpo.experiment import load_experiment
    from hpo.runners import build_runner

    # where the demo presets' base config reads data/demo/{train,eval}; enough sequences for their largest batch
    make_shards(tmp_path / "data" / "demo", n_train=256)
    monkeypatch.chdir(tmp_path)
    spec = load_experiment(PRESETS / preset)
    check_trial_data(spec)
    runner = build_runner(spec)
    try:
        assert "cpu slot 0" in runner.describe()
    finally:
        runner.close()


def test_a_batch_size_studys_run_status_and_best_per_arm_show_the_verdict_at_each_batch_size(tmp_path, capsys):
    """`hpo run` of a batch-size study ends its verdict with the note that it compares arms across batch sizes too,
    and the verdict at each batch size (the report's, read here from the
    report's own data); `hpo status` and `hpo best --per-arm` show the same lines."""
    from hpo.experiment.arms import BATCH_STUDY_NOTE
    from hpo.report.data import load_experiment
    from hpo.report.scaling import batch_verdicts, experiment_runs, scaling_points
    from hpo.storage import SqlStorage

    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    preset = Path(__file__).resolve().parents[3] / "search_spaces" / "presets" / "batch_scaling_simulated.yaml"
    assert main(["--db", db, "run", str(preset), "--run-dir", str(tmp_path / "run")]) == 0
    with SqlStorage(db) as storage:
        data = load_experiment(storage, "batch_scaling_simulated", with_noise=False)
    report = batch_verdicts(scaling_points([data], experiment_runs([data])))
    assert list(report) == [128, 512, 1024, 2048]
    expected = [f"({BATCH_STUDY_NOTE}):"]  # confirm_seeds: 3, one round: no rounds follow the verdicts
    expected += [f"  at batch {batch:,}: {verdict.line}" for batch, verdict in report.items()]
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(expected[0])
    assert lines[start - 1].startswith("verdict: ") and lines[start : start + 5] == expected
    assert main(["--db", db, "status", "batch_scaling_simulated"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(expected[0])
    assert lines[start - 1].startswith("verdict now") and lines[start : start + 5] == expected
    assert main(["--db", db, "best", "batch_scaling_simulated", "--per-arm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-6].startswith("# verdict: ") and lines[-5:] == [f"# {line}" for line in expected]


def test_a_run_whose_every_trial_failed_exits_1_and_says_so(tmp_path, capsys):
    """A finished experiment without a completed trial is no result: `hpo run` exited 0 with every trial failed, and
    a script took it for one."""
    spec = {
        "name": "all-diverge", "base_config": {},
        "overrides": tiny_overrides(tmp_path / "data", **{"optimizer.name": "adamw", "optimizer.eps": 1e-30}),
        "space": {"optimizer.lr": {"float": [1e29, 1e30]}}, "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 2, "max_parallel": 2}, "resources": {"gpus": "none", "cpu_slots": 2},
    }  # fmt: skip
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(spec))
    db = f"sqlite:///{tmp_path / 'hpo.db'}"
    assert main(["--db", db, "run", str(path), "--run-dir", str(tmp_path / "run"), "--quiet"]) == 1
    assert "no trial completed; `hpo trials all-diverge` says why" in capsys.readouterr().err
    storage = SqlStorage(db)
    record = storage.get_experiment_by_name("all-diverge")
    assert record.status == "finished"
    assert {t.state.value for t in storage.list_trials(record.id)} == {"diverged"}
    assert main(["--db", db, "resume", "all-diverge"]) == 1  # `hpo run X || hpo resume X` reads no result either
    assert "is finished: nothing to resume" in capsys.readouterr().err
