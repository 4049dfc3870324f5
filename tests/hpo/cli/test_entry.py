"""The `hpo` entry point restarts the interpreter with a fixed hash seed for the commands that run a tuner (SMAC3
and ConfigSpace iterate over sets of strings), and only for them."""

from __future__ import annotations

import argparse

import pytest

from hpo.cli.main import NO_TUNER, build_parser, command_of, main


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
