"""The `hpo` command line: bad input writes nothing; inspection commands read what the engine stored."""

from __future__ import annotations

import subprocess
import sys

import yaml

from hpo.cli import main
from hpo.storage import SqlStorage
from tests.hpo.test_study import tiny_overrides


def hpo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpo", *args], capture_output=True, text=True, timeout=300)


def test_malformed_experiment_file_exits_2_and_writes_nothing(tmp_path):
    db_file = tmp_path / "hpo.db"
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbase_config: {}\nspace: {optimizer.lrr: {float: [1.0e-4, 1.0e-2]}}\nbudget: {trials: 2}\n")
    result = hpo("--db", f"sqlite:///{db_file}", "run", str(bad))
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
    assert set(best) == {"optimizer.name=adamw", "optimizer.name=lamb"}
    stored = SqlStorage(db).best_per_arm(SqlStorage(db).get_experiment_by_name("cli-demo").id)
    assert {arm: t.number for arm, t in stored.items()} == {arm: b["trial"] for arm, b in best.items()}

    assert main(["--db", db, "run", str(path)]) == 2  # the same name again: refused, pointing to resume
    assert "hpo resume cli-demo" in capsys.readouterr().err
    assert main(["--db", db, "trials", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


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


def test_read_only_commands_never_create_a_database_or_directory(tmp_path):
    missing = tmp_path / "typo" / "dir" / "x.db"
    for command in (["status"], ["status", "e"], ["trials", "e"], ["best", "e"], ["export", "e"]):
        result = hpo("--db", f"sqlite:///{missing}", *command)
        assert result.returncode == 2, command
        assert f"there is no database at {missing}" in result.stderr
    assert not (tmp_path / "typo").exists()


def test_an_unreachable_dask_scheduler_stops_the_run_before_anything_is_written(tmp_path):
    from hpo.launch import free_port

    db_file = tmp_path / "hpo.db"
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    result = hpo("--db", f"sqlite:///{db_file}", "run", small_experiment(tmp_path), "--runner", "dask",
                 "--scheduler", address)  # fmt: skip
    assert result.returncode == 2
    assert f"cannot reach the Dask scheduler at {address}" in result.stderr
    assert not db_file.exists()


def test_tuner_options_that_would_be_ignored_are_refused(tmp_path):
    db_file = tmp_path / "hpo.db"
    path = small_experiment(tmp_path, tuner={"name": "random", "seed": 0, "options": {"n_initial_configs": 3}})
    result = hpo("--db", f"sqlite:///{db_file}", "run", path)
    assert result.returncode == 2
    assert "tuner.options.n_initial_configs: not an option of random (it takes no options)" in result.stderr
    assert not db_file.exists()


def test_every_command_and_option_has_help():
    from hpo.cli import build_parser

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
