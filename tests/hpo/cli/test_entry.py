"""The `hpo` entry point restarts the interpreter with a fixed hash seed for the commands that run a tuner (SMAC3
and ConfigSpace iterate over sets of strings), and only for them."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from hpo.cli.main import NO_TUNER, build_parser, command_of, main
from hpo.interpreter import module_env


@pytest.mark.parametrize("argv, command", [
    (["status"], "status"), (["--db", "sqlite:///x.db", "report", "a", "b"], "report"),
    (["--db", "run", "plan", "f.yaml"], "plan"),  # --db's value is never the command
    (["--help"], None), ([], None), (["--db"], None),
])  # fmt: skip
def test_the_command_is_the_first_word_after_the_global_options(argv, command):
    assert command_of(argv) == command


def test_every_command_is_classified_and_those_that_run_a_tuner_restart_with_the_fixed_seed():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) >= NO_TUNER
    # a new command joins NO_TUNER only when it never proposes a trial (webui: it starts NNI's manager)
    assert set(sub.choices) - NO_TUNER == {"run", "resume", "plan", "serve", "webui"}


def test_ctrl_c_where_no_command_handles_it_exits_130_without_a_traceback(monkeypatch, capsys):
    """While a command's modules load, say: the entry point says so in one line."""
    import importlib

    cli = importlib.import_module("hpo.cli.main")  # the module (the package exports its `main` under that name)

    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "main", interrupted)
    monkeypatch.setattr(cli.sys, "argv", ["hpo", "status"])  # a command without a tuner: no restart
    with pytest.raises(SystemExit) as stopped:
        cli.entry()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


def test_version_prints_the_installed_distributions_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"hpo {version('bert-hpo')}\n"


@pytest.fixture
def own_trainer(tmp_path):
    """A user's project folder with a trainer of its own: a `trainer.py` module and a `trainer/` folder."""
    (tmp_path / "trainer.py").write_text("print('the user trainer')\n")
    (tmp_path / "trainer").mkdir()  # (a folder beside it: a namespace package where the module were absent)
    return tmp_path


def test_a_restarted_command_in_a_folder_with_its_own_trainer_imports_hpos(own_trainer):
    """`python -m hpo` (the restart) put the current folder first on the import path: `hpo run` and `hpo resume` in a
    folder with a `trainer.py` failed with "No module named 'trainer.disk'; 'trainer' is not a package"."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTHONSAFEPATH")}
    env.update(HPO_HOME=str(own_trainer / ".hpo"), PYTHONPATH="")
    hpo = Path(sys.executable).with_name("hpo")
    done = subprocess.run([str(hpo), "resume", "nothere"], cwd=own_trainer, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and "there is no database" in done.stderr, done.stderr[-1500:]
    assert "Traceback" not in done.stderr


def test_an_hpo_module_started_from_such_a_folder_imports_hpos_trainer(own_trainer):
    """The API's plans start `python -m hpo plan` in the server's folder: with `module_env` the folder's own trainer
    stays off the import path (without it, the import fails), and the started interpreter passes that on to its own
    processes (the trials' launcher, the trials: hpo's modules too)."""
    import os
    import subprocess
    import sys

    from hpo.interpreter import module_env

    code = "import trainer.config, os; print(os.environ.get('PYTHONSAFEPATH'))"
    base = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    plain = subprocess.run([sys.executable, "-c", code], cwd=own_trainer, env=base, capture_output=True, text=True)
    assert plain.returncode != 0 and "trainer" in plain.stderr  # the folder's trainer.py stands in
    old = os.getcwd()
    os.chdir(own_trainer)
    try:
        env = module_env(base)
    finally:
        os.chdir(old)
    assert env["PYTHONSAFEPATH"] == "1"
    safe = subprocess.run([sys.executable, "-c", code], cwd=own_trainer, env=env, capture_output=True, text=True)
    assert safe.returncode == 0 and safe.stdout.strip() == "1", safe.stderr[-1500:]


@pytest.mark.parametrize("restarted", [pytest.param(True, marks=pytest.mark.slow), False])  # the restart: above
def test_an_experiment_run_in_a_folder_with_its_own_trainer_trains_hpos(own_trainer, restarted):
    """`hpo run` in an ML project's folder with its own trainer: the trials' launcher (`python -m
    hpo.runners.preload`) and the trials started there imported the folder's package, and every trial failed
    ("No module named 'trainer.config'") after the start checks had passed (here `trainer.py`: a `trainer/`
    package stands in only where hpo is not installed in editable mode, whose finder resolves the submodules).
    Restarted: `hpo` as installed (it restarts for its hash seed); not restarted: with PYTHONHASHSEED=0 already
    set, the runner's own care."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from tests.hpo.engine.test_study import tiny_overrides

    spec = {
        "name": "own", "base_config": {}, "overrides": tiny_overrides(own_trainer / "shards"),
        "space": {"optimizer.lr": {"float": [1e-4, 1e-2], "log": True}}, "tuner": {"name": "random", "seed": 0},
        "budget": {"trials": 2, "max_parallel": 2}, "resources": {"gpus": "none", "cpu_slots": 2},
    }  # fmt: skip
    (own_trainer / "own.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHASHSEED", "PYTHONSAFEPATH")}
    env.update(HPO_HOME=str(own_trainer / ".hpo"), PYTHONPATH="")
    if not restarted:
        env["PYTHONHASHSEED"] = "0"
    hpo = Path(sys.executable).with_name("hpo")
    done = subprocess.run([str(hpo), "run", "own.yaml", "--quiet"], cwd=own_trainer, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    from hpo.storage import SqlStorage

    with SqlStorage(f"sqlite:///{own_trainer / '.hpo' / 'hpo.db'}") as storage:  # the default database: $HPO_HOME's
        trials = storage.list_trials(storage.get_experiment_by_name("own").id)
    assert [t.state.value for t in trials] == ["completed"] * 2, [t.reason for t in trials]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("argv", [["presets"], ["--version"]])
def test_output_that_cannot_be_written_is_one_line_of_error_not_a_traceback(argv, tmp_path):
    """`hpo presets > FILE` on a full disk (/dev/full: every write fails with ENOSPC) printed a traceback."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "hpo", *argv], stdout=full, stderr=subprocess.PIPE, text=True,
                              cwd=tmp_path, env=module_env(dict(os.environ)), timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.endswith("error: cannot write the output: No space left on device (a full disk, or a file that "
                                "cannot grow, behind the standard output)\n")  # fmt: skip
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("argv, says", [
    (["--db", "sqlite:///a.db", "--db", "sqlite:///b.db", "status"],
     "hpo: error: --db given twice (sqlite:///a.db and sqlite:///b.db): give it once"),
    (["report", "e", "-o", "first", "-o", "second"],
     "hpo report: error: -o given twice (first and second): give it once"),
    (["trials", "e", "--state", "failed", "--limit", "3", "--state", "completed"],
     "hpo trials: error: --state given twice (failed and completed): give it once"),
    (["trials", "e", "--db", "sqlite:///a.db"],
     "hpo: error: unrecognized arguments: --db sqlite:///a.db (--db is hpo's own option: it comes before the command, "
     "`hpo --db URL COMMAND ...`)"),
])  # fmt: skip
def test_an_option_given_twice_is_refused_not_its_last_value_taken(argv, says, capsys):
    """argparse kept the last of two values without a word: `hpo --db A --db B status` read B."""
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == says


def test_arguments_that_take_several_values_still_take_them():
    args = build_parser().parse_args(["--db", "sqlite:///a.db", "report", "a", "b", "-o", "out", "--png", "figures"])
    assert (args.names, args.output, args.png, args.db) == (["a", "b"], "out", "figures", "sqlite:///a.db")
